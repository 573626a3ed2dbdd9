package sqlitebox_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/sqlitebox"
	"github.com/retrysafe/retrysafe/retry"
)

func open(t *testing.T) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if _, err := db.Exec("CREATE TABLE business (id TEXT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	return db
}

func newInbox(t *testing.T, cfg sqlitebox.InboxConfig) *sqlitebox.Inbox {
	t.Helper()
	in, err := sqlitebox.NewInbox(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := in.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	return in
}

func count(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM business").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func write(ctx context.Context, tx *sql.Tx, m *redeliver.Message) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO business (id) VALUES (?)", m.ID)
	return err
}

func TestInbox(t *testing.T) {
	t.Parallel()
	db := open(t)
	in := newInbox(t, sqlitebox.InboxConfig{DB: db})
	m := &redeliver.Message{ID: "m1", Queue: "q"}
	errBoom := errors.New("boom")
	ran, err := in.Do(t.Context(), m, func(ctx context.Context, tx *sql.Tx) error {
		if err := write(ctx, tx, m); err != nil {
			return err
		}
		return errBoom
	})
	if !ran || !errors.Is(err, errBoom) || count(t, db) != 0 {
		t.Fatalf("failing handler: %v, %v, %d rows", ran, err, count(t, db))
	}
	for i, want := range []bool{true, false} {
		ran, err := in.Do(t.Context(), m, func(ctx context.Context, tx *sql.Tx) error { return write(ctx, tx, m) })
		if err != nil || ran != want {
			t.Fatalf("Do #%d = %v, %v", i, ran, err)
		}
	}
	if seen, err := in.Seen(t.Context(), "q", "m1"); !seen || err != nil || count(t, db) != 1 {
		t.Errorf("seen %v, %v, %d rows", seen, err, count(t, db))
	}
	_, err = in.Do(t.Context(), &redeliver.Message{Queue: "q"}, nil)
	if !errors.Is(err, sqlitebox.ErrNoID) || retry.Retryable(err) {
		t.Errorf("no id: %v", err)
	}
}

func TestInboxConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	db := open(t)
	in := newInbox(t, sqlitebox.InboxConfig{DB: db})
	h := in.Handler(write)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h(t.Context(), &redeliver.Message{ID: strconv.Itoa(i % 4), Queue: "q"}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := count(t, db); n != 4 {
		t.Errorf("%d rows, want 4", n)
	}
}

func TestInboxExpiry(t *testing.T) {
	t.Parallel()
	db := open(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	in := newInbox(t, sqlitebox.InboxConfig{DB: db, Table: "inbox", TTL: time.Hour,
		Clock: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	noop := func(context.Context, *sql.Tx) error { return nil }
	for i := range 3 {
		if _, err := in.Do(t.Context(), &redeliver.Message{ID: strconv.Itoa(i), Queue: "q"}, noop); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := in.DeleteExpired(t.Context(), 0); n != 0 || err != nil {
		t.Fatalf("DeleteExpired = %d, %v", n, err)
	}
	mu.Lock()
	now = now.Add(61 * time.Minute)
	mu.Unlock()
	if n, err := in.DeleteExpired(t.Context(), 2); n != 2 || err != nil {
		t.Fatalf("DeleteExpired(2) = %d, %v", n, err)
	}
	if n, err := in.DeleteExpired(t.Context(), 0); n != 1 || err != nil {
		t.Fatalf("DeleteExpired = %d, %v", n, err)
	}
	if ran, err := in.Do(t.Context(), &redeliver.Message{ID: "0", Queue: "q"}, noop); !ran || err != nil {
		t.Errorf("after expiry: %v, %v", ran, err)
	}
}

func TestNewInbox(t *testing.T) {
	t.Parallel()
	if _, err := sqlitebox.NewInbox(sqlitebox.InboxConfig{}); err == nil {
		t.Error("nil DB accepted")
	}
	if _, err := sqlitebox.NewInbox(sqlitebox.InboxConfig{DB: &sql.DB{}, Table: `x"y`}); err == nil {
		t.Error("bad table accepted")
	}
}
