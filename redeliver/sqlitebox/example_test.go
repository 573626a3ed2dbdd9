package sqlitebox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/sqlitebox"
)

// A handler wrapped by an inbox writes once per message id: the redelivered duplicate
// is acknowledged without running again.
func Example() {
	dir, _ := os.MkdirTemp("", "sqlitebox-example")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE grants (id TEXT PRIMARY KEY)"); err != nil {
		panic(err)
	}
	inbox, err := sqlitebox.NewInbox(sqlitebox.InboxConfig{DB: db})
	if err != nil {
		panic(err)
	}
	if err := inbox.Migrate(ctx); err != nil {
		panic(err)
	}
	handler := inbox.Handler(func(ctx context.Context, tx *sql.Tx, m *redeliver.Message) error {
		fmt.Println("granting", m.ID)
		_, err := tx.ExecContext(ctx, "INSERT INTO grants (id) VALUES (?)", m.ID)
		return err
	})
	m := &redeliver.Message{ID: "grant-42", Queue: "emitter.access"}
	fmt.Println(handler(ctx, m)) // the first delivery
	fmt.Println(handler(ctx, m)) // the broker's duplicate
	var n int
	_ = db.QueryRowContext(ctx, "SELECT count(*) FROM grants").Scan(&n)
	fmt.Println(n, "row")
	// Output:
	// granting grant-42
	// <nil>
	// <nil>
	// 1 row
}
