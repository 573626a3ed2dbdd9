//go:build linux

package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/harness/pgcluster"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// syncStore returns a migrated store on the primary of c, on a pool made by
// pgstore.NewPool whose sessions are named app (application_name), so that a test
// finds their backends.
func syncStore(t *testing.T, c *pgcluster.Cluster, app string, batch bool) (*pgstore.Store, *pgxpool.Pool) {
	t.Helper()
	u, err := url.Parse(c.Primary.URL())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	pool, err := pgstore.NewPool(t.Context(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, err := pgstore.New(pgstore.Config{Pool: pool, Schema: testenv.Name("rs"), Batch: batch})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return st, pool
}

// cancelSyncWait waits until a session named app waits for the synchronous standby on
// node, and cancels that wait with pg_cancel_backend: the transaction has committed on
// node, and PostgreSQL reports success with a warning.
func cancelSyncWait(ctx context.Context, t *testing.T, node *pgcluster.Node, app string) {
	t.Helper()
	for delay := time.Millisecond; ; delay = min(2*delay, 20*time.Millisecond) {
		var cancelled bool
		err := node.QueryRow(ctx, `SELECT coalesce(bool_or(pg_cancel_backend(pid)), false) FROM pg_stat_activity
			WHERE wait_event = 'SyncRep' AND application_name = $1`, []any{app}, &cancelled)
		if err != nil {
			t.Errorf("cancelling the wait: %v", err)
			return
		}
		if cancelled {
			return
		}
		select {
		case <-ctx.Done():
			t.Errorf("no session %s waited for the synchronous standby", app)
			return
		case <-time.After(delay): // the server announces nothing: poll
		}
	}
}

// syncWaiters returns how many sessions named app wait for the synchronous standby on
// node.
func syncWaiters(ctx context.Context, t *testing.T, node *pgcluster.Node, app string) int {
	t.Helper()
	var n int
	if err := node.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND application_name = $1`,
		[]any{app}, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func claimReq(key, id string) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "fp", ID: id, Lease: time.Minute, TTL: time.Hour}
}

func completion(key string, token int64) idempotency.Completion {
	return idempotency.Completion{Scope: "s", Key: key, Token: token, TTL: time.Hour,
		Response: idempotency.Response{Status: 201, Body: []byte(key)}}
}

// TestSyncStandbyLost: with the synchronous standby cut off, no write of the store is
// taken as acknowledged. A write whose wait for the standby someone cancels (PostgreSQL
// then reports success with a warning) is an error wrapping ErrNotDurable; a completion
// or claim sent again, which finds its own record, writes it again and so waits for the
// standby too; Ping says ErrNotDurable while the server answers, and nil once the
// standby is back; calls whose deadline ends while they wait leave no backend waiting.
func TestSyncStandbyLost(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{Standbys: 1, Sync: true})
	standby := c.Standbys[0]
	cut := func(t *testing.T) {
		standby.Link().Cut()
		t.Cleanup(func() {
			standby.Link().Restore()
			if err := c.AwaitStreaming(ctx, standby, "sync"); err != nil {
				t.Fatal(err)
			}
		})
	}

	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("cancelled wait/batch=%v", batch), func(t *testing.T) {
			app := testenv.Name("cancelled")
			st, _ := syncStore(t, c, app, batch)
			k1, err := st.Claim(ctx, claimReq("k1", "c1"))
			if err != nil || !k1.Claimed {
				t.Fatalf("claim: %+v %v", k1, err)
			}
			cut(t)
			done := make(chan error, 1)
			go func() { done <- st.Complete(ctx, completion("k1", k1.Token)) }()
			cancelSyncWait(ctx, t, c.Primary, app)
			if err := <-done; !errors.Is(err, idempotency.ErrNotDurable) {
				t.Errorf("a completion whose wait for the standby was cancelled: %v, want ErrNotDurable", err)
			}
			claimed := make(chan error, 1)
			go func() {
				_, err := st.Claim(ctx, claimReq("k2", "c2"))
				claimed <- err
			}()
			cancelSyncWait(ctx, t, c.Primary, app)
			if err := <-claimed; !errors.Is(err, idempotency.ErrNotDurable) {
				t.Errorf("a claim whose wait for the standby was cancelled: %v, want ErrNotDurable", err)
			}
		})
	}

	t.Run("sent again", func(t *testing.T) {
		app := testenv.Name("again")
		st, _ := syncStore(t, c, app, false)
		done, err := st.Claim(ctx, claimReq("done", "c1"))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Complete(ctx, completion("done", done.Token)); err != nil {
			t.Fatal(err)
		}
		busy, err := st.Claim(ctx, claimReq("busy", "c2"))
		if err != nil {
			t.Fatal(err)
		}
		cut(t)
		short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancelShort()
		if err := st.Complete(short, completion("done", done.Token)); err == nil || errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("the completion sent again, with the synchronous standby cut off: %v, want an unknown outcome", err)
		}
		if res, err := st.Claim(short, claimReq("busy", "c2")); err == nil {
			t.Errorf("the claim sent again was granted while the synchronous standby was cut off: %+v", res)
		}
		standby.Link().Restore()
		if err := c.AwaitStreaming(ctx, standby, "sync"); err != nil {
			t.Fatal(err)
		}
		if err := st.Complete(ctx, completion("done", done.Token)); err != nil {
			t.Errorf("the completion sent again with the standby back: %v", err)
		}
		if res, err := st.Claim(ctx, claimReq("busy", "c2")); err != nil || !res.Claimed || res.Token != busy.Token {
			t.Errorf("the claim sent again with the standby back: %+v %v, want granted with token %d", res, err, busy.Token)
		}
	})

	t.Run("ping", func(t *testing.T) {
		app := testenv.Name("ping")
		st, _ := syncStore(t, c, app, false)
		if err := st.Ping(ctx); err != nil {
			t.Fatalf("Ping with the standby streaming: %v", err)
		}
		cut(t)
		if err := st.Ping(ctx); !errors.Is(err, idempotency.ErrNotDurable) {
			t.Errorf("Ping with the synchronous standby cut off: %v, want ErrNotDurable", err)
		}
		standby.Link().Restore()
		testenv.Eventually(t, 20*time.Second, func() bool { return st.Ping(ctx) == nil }, "Ping to succeed with the standby back")
	})

	t.Run("no pile-up", func(t *testing.T) {
		app := testenv.Name("pile")
		st, pool := syncStore(t, c, app, false)
		cut(t)
		for i := range 20 {
			short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
			_, err := st.Claim(short, claimReq(fmt.Sprintf("pile-%d", i), fmt.Sprintf("c%d", i)))
			cancelShort()
			if err == nil {
				t.Fatalf("claim %d acknowledged with the synchronous standby cut off", i)
			}
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return syncWaiters(ctx, t, c.Primary, app) == 0 },
			"the backends of the timed-out claims to stop waiting for the standby (%d wait)", syncWaiters(ctx, t, c.Primary, app))
		var backends int
		if err := c.Primary.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, []any{app}, &backends); err != nil {
			t.Fatal(err)
		}
		if max := int(pool.Config().MaxConns); backends > max {
			t.Errorf("%d backends of the store, more than its pool's %d connections", backends, max)
		}
	})
}

// TestWithTxCommitNotDurable: a handler's transaction whose commit's wait for the
// synchronous standby is cancelled committed on the primary alone. WithTx must not take
// it as stored by reading the record back from the primary: its confirming write waits
// for the standby too, so WithTx reports the outcome unknown and releases the claim.
func TestWithTxCommitNotDurable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{Standbys: 1, Sync: true})
	app := testenv.Name("tx")
	st, pool := syncStore(t, c, app, false)
	if _, err := pool.Exec(ctx, "CREATE TABLE ledger (id text)"); err != nil {
		t.Fatal(err)
	}
	res, err := st.Claim(ctx, claimReq("k", "c"))
	if err != nil {
		t.Fatal(err)
	}
	claim := idempotency.NewClaim("s", "k", "fp", res.Token, time.Hour)
	c.Standbys[0].Link().Cut()
	defer c.Standbys[0].Link().Restore()
	done := make(chan error, 1)
	go func() {
		_, err := st.WithTx(idempotency.NewContext(ctx, claim), func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error) {
			_, err := tx.Exec(ctx, "INSERT INTO ledger VALUES ('k')")
			return idempotency.Response{Status: 201}, err
		})
		done <- err
	}()
	cancelSyncWait(ctx, t, c.Primary, app)
	err = <-done
	if !errors.Is(err, pgstore.ErrCommitUnknown) || !errors.Is(err, idempotency.ErrNotDurable) {
		t.Errorf("WithTx whose commit was not acknowledged: %v, want ErrCommitUnknown and ErrNotDurable", err)
	}
	select {
	case <-claim.Stored():
		t.Error("the claim was marked completed")
	default:
	}
}

// TestFailover: a pool on every node of a cluster (target_session_attrs=read-write)
// follows the promotion of the synchronous standby after the primary is lost. The
// records the primary acknowledged are on the promoted standby, and the store's first
// calls after the promotion are served although the pool's connections to the lost
// primary are broken: a call whose connection broke runs once more on a fresh one.
func TestFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{Standbys: 1, Sync: true})
	cfg, err := pgxpool.ParseConfig(c.MultiHostURL(nil))
	if err != nil {
		t.Fatal(err)
	}
	pgstore.ConfigurePool(cfg)
	// Idle connections are handed out without a ping, as pgxpool does for those used in
	// the last second: the broken ones reach the store.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st, err := pgstore.New(pgstore.Config{Pool: pool, Schema: testenv.Name("rs"), Batch: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	done, err := st.Claim(ctx, claimReq("done", "c1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, completion("done", done.Token)); err != nil {
		t.Fatal(err)
	}
	busy, err := st.Claim(ctx, claimReq("busy", "c2"))
	if err != nil {
		t.Fatal(err)
	}
	// Every connection of the pool in use once, so that all are idle in it.
	conns := make([]*pgxpool.Conn, 0, cfg.MaxConns)
	for range cfg.MaxConns {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
	}
	for _, conn := range conns {
		conn.Release()
	}

	if err := c.Primary.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Standbys[0].Promote(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := st.Get(ctx, "s", "done")
	if err != nil || rec.State != idempotency.StateDone || string(rec.Response.Body) != "done" {
		t.Fatalf("the completed record after the failover: %+v %v", rec, err)
	}
	if res, err := st.Claim(ctx, claimReq("busy", "c2")); err != nil || !res.Claimed || res.Token != busy.Token {
		t.Errorf("the claim sent again after the failover: %+v %v, want granted with token %d", res, err, busy.Token)
	}
	if err := st.Complete(ctx, completion("busy", busy.Token)); err != nil {
		t.Errorf("the completion after the failover: %v", err)
	}
}
