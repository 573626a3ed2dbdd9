//go:build linux

package pgcluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/harness/pgcluster"
)

// TestSyncFailover: a commit on the primary waits for its synchronous standby while the
// standby's link is cut, and returns once it heals; a write acknowledged by the standby
// survives the loss of the primary and the standby's promotion, and a multi-host URL
// reaches the promoted standby.
func TestSyncFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{Standbys: 1, Sync: true})
	standby := c.Standbys[0]
	if err := c.Primary.Exec(ctx, "CREATE TABLE t (v int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}

	standby.Link().Cut()
	conn, err := pgx.Connect(ctx, c.Primary.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "INSERT INTO t VALUES (2)")
		done <- err
	}()
	var waiting bool
	for !waiting { // the server announces nothing: poll
		if err := c.Primary.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event = 'SyncRep'`, nil, &waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("the commit returned (%v) while the synchronous standby was cut off", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	standby.Link().Restore()
	if err := <-done; err != nil {
		t.Fatalf("the commit after the link healed: %v", err)
	}

	if err := c.Primary.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	mh, err := pgx.Connect(ctx, c.MultiHostURL(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer mh.Close(context.Background())
	var n int
	if err := mh.QueryRow(ctx, "INSERT INTO t VALUES (3) RETURNING (SELECT count(*) FROM t)").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 || mh.PgConn().Conn().RemoteAddr().String() != standby.Addr() {
		t.Errorf("after the promotion: %d rows before the insert, on %s; want 2 on %s", n, mh.PgConn().Conn().RemoteAddr(), standby.Addr())
	}
	if err := c.Primary.Exec(ctx, "SELECT 1"); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the stopped primary answered: %v", err)
	}
}
