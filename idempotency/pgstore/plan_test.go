package pgstore_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// The store's statements, batched or not, look records up by index however the table
// started: here it is new and never analyzed (autovacuum off, or not yet run), the
// connection runs many batches while it is small, and it then grows to 20,000 records
// with no statistics taken. The batched statements' plan cached while the table was
// small (a hash join over a scan of the whole table) scans it on every batch after
// that, until the connection prepares them again, as it does once they are older than
// the replan interval (or once the records this store created have doubled, which
// rows written by others, as here, do not count toward); the statistics count the scans.
func TestStatementsUseTheIndexOnAGrownTable(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{true, false} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			t.Parallel()
			indexOnGrownTable(t, batch)
		})
	}
}

func indexOnGrownTable(t *testing.T, batch bool) {
	ctx := t.Context()
	tracer := &batchTracer{}
	pool := newPool(t, testenv.PostgresURL(t), func(c *pgxpool.Config) {
		c.MaxConns = 1
		c.ConnConfig.Tracer = tracer
		// The plan PostgreSQL caches after a statement's first executions, made at once:
		// whether it would keep planning each execution of a statement instead depends
		// on its estimates of the moment.
		c.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	})
	st, schema := newStoreConfig(t, pgstore.Config{Pool: pool, Batch: batch})
	st.SetReplanAfter(time.Hour)
	table := pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()
	if _, err := pool.Exec(ctx, "ALTER TABLE "+table+" SET (autovacuum_enabled = false)"); err != nil {
		t.Fatal(err)
	}
	seqScans := func() int64 { t.Helper(); return statsOf(t, pool, schema).seqScans }
	answer := idempotency.Response{Status: 201, Body: []byte("ok")}
	claimAndComplete := func(prefix string, keys int) { t.Helper(); completeMany(t, st, prefix, keys, answer) }
	claimAndComplete("small-", 400) // the table is small: each statement runs many times
	if batch && tracer.n.Load() < 20 {
		t.Fatalf("%d batched statements ran while the table was small, want at least 20", tracer.n.Load())
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (scope, key, fingerprint, state, token, created_at, lease_until, expires_at)
		SELECT 's', convert_to('grown-' || g, 'UTF8'), 'fp', 'done', -g, now(), now(), now() + interval '1 hour'
		FROM generate_series(1, 20000) AS g`); err != nil {
		t.Fatal(err)
	}
	before, batches := seqScans(), tracer.n.Load()
	claimAndComplete("stale-", 400)
	ran, scans := tracer.n.Load()-batches, seqScans()-before
	if batch {
		// The plans made while the table was small. PostgreSQL drops every cached plan of
		// a session that fell behind the other sessions' catalog changes (a cache reset:
		// other tests create and drop schemas), so they may be gone already.
		if ran < 10 {
			t.Fatalf("%d batched statements ran on the grown table, want at least 10", ran)
		}
		if scans == 0 {
			t.Logf("%d batched statements on the grown table did not scan it: the plans made on the small one were dropped by a cache reset", ran)
		} else {
			t.Logf("%d batched statements on the grown table with the plans made on the small one scanned it %d times", ran, scans)
		}
		st.SetReplanAfter(0)
		claimAndComplete("replan-", 16) // prepares them again
		st.SetReplanAfter(time.Hour)
		before, batches = seqScans(), tracer.n.Load()
		claimAndComplete("large-", 400)
		ran, scans = tracer.n.Load()-batches, seqScans()-before
		if ran < 10 {
			t.Fatalf("%d batched statements ran on the grown table, want at least 10", ran)
		}
	}
	if scans > 0 {
		t.Errorf("claims and completions (%d batched statements) on the grown table scanned it whole %d times, want 0", ran, scans)
	}
}

// A store that starts on a new table plans its batched statements while the table is
// empty, a hash join over a scan of it, and keeps running them as the table grows
// within the replan interval (here an hour, so that only the table's growth can count):
// the connection prepares them again each time the records the store created have at
// least doubled, so that once the table is past a few pages the plan looks records up
// by index. The answers are 1 KiB, so that a few hundred records fill the pages that
// make an index lookup the cheaper plan.
func TestPlansFollowANewTable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tracer := &batchTracer{}
	pool := newPool(t, testenv.PostgresURL(t), func(c *pgxpool.Config) {
		c.MaxConns = 1
		c.ConnConfig.Tracer = tracer
		c.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan" // as in indexOnGrownTable
	})
	st, schema := newStoreConfig(t, pgstore.Config{Pool: pool, Batch: true})
	st.SetReplanAfter(time.Hour)
	table := pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()
	if _, err := pool.Exec(ctx, "ALTER TABLE "+table+" SET (autovacuum_enabled = false)"); err != nil {
		t.Fatal(err)
	}
	answer := idempotency.Response{Status: 201, Body: []byte(strings.Repeat("x", 1024))}
	before := statsOf(t, pool, schema).seqScans
	completeMany(t, st, "new-", 1200, answer)
	grown, batches := statsOf(t, pool, schema).seqScans, tracer.n.Load()
	if batches < 20 {
		t.Fatalf("%d batched statements ran while the table grew, want at least 20", batches)
	}
	t.Logf("%d batched statements scanned the table %d times while it grew to 1,200 records", batches, grown-before)
	completeMany(t, st, "grown-", 400, answer)
	ran, scans := tracer.n.Load()-batches, statsOf(t, pool, schema).seqScans-grown
	if ran < 10 {
		t.Fatalf("%d batched statements ran on the grown table, want at least 10", ran)
	}
	if scans > 0 {
		t.Errorf("%d batched statements on a table grown from empty to 1,200 records scanned it whole %d times, want 0", ran, scans)
	}
}
