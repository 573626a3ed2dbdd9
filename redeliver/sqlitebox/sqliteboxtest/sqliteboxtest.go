// Package sqliteboxtest opens, for a test, a SQLite database of its own holding the
// test's business tables and a migrated inbox, both gone when the test ends.
package sqliteboxtest

import (
	"database/sql"
	"path/filepath"
	"testing"

	_ "modernc.org/sqlite" // the "sqlite" driver

	"github.com/retrysafe/retrysafe/redeliver/sqlitebox"
)

// Open returns a new SQLite database in t's temporary directory, with WAL, a busy
// timeout and immediate transactions (as an application shares it between its handler
// and its inbox), each statement of schema run on it, and its inbox migrated.
func Open(t testing.TB, schema ...string) (*sql.DB, *sqlitebox.Inbox) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "app.db")+
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	for _, stmt := range schema {
		if _, err := db.ExecContext(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	box, err := sqlitebox.NewInbox(sqlitebox.InboxConfig{DB: db})
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return db, box
}
