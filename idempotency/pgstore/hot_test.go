package pgstore_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// tableStats is what PostgreSQL's statistics count on the records table: the rows
// updated, those of them updated HOT, and the sequential scans.
type tableStats struct{ upd, hot, seqScans int64 }

// statsOf returns the tableStats of the records table in schema once every backend of
// pool has flushed its counts: the pool has one connection, which is asked to flush as
// soon as it is idle, and the counts are read by the next statement.
func statsOf(t *testing.T, pool *pgxpool.Pool, schema string) tableStats {
	t.Helper()
	ctx := t.Context()
	if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
	var s tableStats
	if err := pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd, seq_scan FROM pg_stat_user_tables
		WHERE schemaname = $1 AND relname = 'retrysafe_idempotency'`, schema).Scan(&s.upd, &s.hot, &s.seqScans); err != nil {
		t.Fatal(err)
	}
	return s
}

// usualAnswer is an answer of the gateway's usual size.
func usualAnswer() idempotency.Response {
	return idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"},
		"Date": {"Sat, 05 Dec 2026 12:00:00 GMT"}, "X-Request-Id": {"4f6c2d9e-8a57-4bd2-9a51-0c8e1f3b7a66"}},
		Body: []byte(`{"id":"pay_0123456789","amount":1250,"currency":"EUR","status":"succeeded","user":"u1"}` + strings.Repeat(" ", 40))}
}

// completeMany claims n new keys, named prefix and a number, and completes each with
// resp, from 8 goroutines, so that claims and completions go in batches when the store
// batches.
func completeMany(t *testing.T, st *pgstore.Store, prefix string, n int, resp idempotency.Response) {
	t.Helper()
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for g := range 8 {
		wg.Go(func() {
			for i := g; i < n; i += 8 {
				key := fmt.Sprintf("%s%06d-%s", prefix, i, strings.Repeat("k", 24))
				r, err := st.Claim(ctx, idempotency.ClaimRequest{Scope: "user-1", Key: key, Fingerprint: strings.Repeat("f", 64),
					Lease: time.Minute, TTL: time.Hour, ID: fmt.Sprint("claim-", prefix, i)})
				if err != nil || !r.Claimed {
					errs <- fmt.Errorf("claim %s = %+v, %v", key, r, err)
					return
				}
				if err := st.Complete(ctx, idempotency.Completion{Scope: "user-1", Key: key, Token: r.Token, Response: resp, TTL: time.Hour}); err != nil {
					errs <- fmt.Errorf("complete %s: %v", key, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// A completion changes no indexed column and finds room on its page, so PostgreSQL
// makes it a HOT update: no index entry added, the old version pruned in place. The
// statistics count the updates: nearly all HOT (a few may land on a page the claims
// filled first).
func TestCompletionsAreHOT(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			t.Parallel()
			pool := newPool(t, testenv.PostgresURL(t), func(c *pgxpool.Config) { c.MaxConns = 1 })
			st, schema := newStoreConfig(t, pgstore.Config{Pool: pool, Batch: batch})
			const n = 400
			completeMany(t, st, "key-", n, usualAnswer())
			s := statsOf(t, pool, schema)
			upd, hot := s.upd, s.hot
			if upd < n {
				t.Fatalf("the statistics count %d updates, want at least the %d completions", upd, n)
			}
			if hot < upd*9/10 {
				t.Errorf("%d of %d updates were HOT, want at least 90%%", hot, upd)
			}
		})
	}
}

// The janitor deletes a record once its expiry has passed, counted from its completion
// (kept_until), not from its claim (expires_at, which the completion leaves as it was):
// between the two the record still replays and stays.
func TestJanitorKeepsRecordUntilCompletionsExpiry(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var mu sync.Mutex
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	st, _ := newStoreConfig(t, pgstore.Config{Pool: newPool(t, testenv.PostgresURL(t), nil), Clock: clock})
	req := idempotency.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: 30 * time.Second, TTL: time.Minute}
	r, err := st.Claim(ctx, req)
	if err != nil || !r.Claimed {
		t.Fatalf("claim = %+v, %v", r, err)
	}
	advance(10 * time.Second)
	if err := st.Complete(ctx, idempotency.Completion{Scope: "s", Key: "k", Token: r.Token,
		Response: idempotency.Response{Status: 201, Body: []byte("done")}, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	rec, err := st.Get(ctx, "s", "k")
	if err != nil {
		t.Fatal(err)
	}
	if want := clock().Add(time.Minute); !rec.ExpiresAt.Equal(want) {
		t.Errorf("ExpiresAt = %v, want the completion's instant plus the TTL, %v", rec.ExpiresAt, want)
	}
	advance(55 * time.Second) // past the claim's TTL, before the completion's
	if n, err := st.DeleteExpired(ctx, 100); err != nil || n != 0 {
		t.Errorf("DeleteExpired 65 s after the claim, 55 s after the completion = %d, %v; want 0", n, err)
	}
	if r, err := st.Claim(ctx, req); err != nil || r.Claimed || r.Existing == nil || r.Existing.Response == nil {
		t.Errorf("claim 55 s after the completion = %+v, %v; want the replay", r, err)
	}
	advance(6 * time.Second)
	if n, err := st.DeleteExpired(ctx, 100); err != nil || n != 1 {
		t.Errorf("DeleteExpired 61 s after the completion = %d, %v; want 1", n, err)
	}
}

// A table of the shape before kept_until (no such column, the default fillfactor),
// with records the previous store wrote, is taken to the new shape by Migrate without
// waiting for the store's reads and writes: the column is added (no rewrite) and the
// fillfactor set for the pages written from then on. The old records keep their expiry,
// the janitor removes them when it passes, and new completions are HOT.
func TestMigrateToHOTCompletions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := newPool(t, testenv.PostgresURL(t), func(c *pgxpool.Config) { c.MaxConns = 1 })
	_, schema := newStore(t, pool)
	table := pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()
	seq := pgx.Identifier{schema, "retrysafe_idempotency_token_seq"}.Sanitize()
	if _, err := pool.Exec(ctx, "ALTER TABLE "+table+" DROP COLUMN kept_until, RESET (fillfactor)"); err != nil {
		t.Fatal(err)
	}
	// As the previous store wrote them: one done and live, one done and expired, one in
	// progress; the completion set expires_at.
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (scope, key, fingerprint, state, token, created_at, lease_until,
		expires_at, completed_at, status, headers, header, body) VALUES
		('\x73', '\x6c697665', '\x6670', 'done', nextval('`+seq+`'), now(), now(), now() + interval '1 hour', now(), 201, NULL, NULL, 'live'),
		('\x73', '\x6f6c64', '\x6670', 'done', nextval('`+seq+`'), now() - interval '2 hours', now() - interval '2 hours',
			now() - interval '1 hour', now() - interval '2 hours', 201, NULL, NULL, 'old'),
		('\x73', '\x62757379', '\x6670', 'in_progress', nextval('`+seq+`'), now(), now() + interval '1 hour', now() + interval '1 hour',
			NULL, NULL, NULL, NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	reopened, err := pgstore.New(pgstore.Config{Pool: pool, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := reopened.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	var options []string
	if err := pool.QueryRow(ctx, "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass", table).Scan(&options); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(options) != "[fillfactor=50]" {
		t.Errorf("reloptions after Migrate = %q, want fillfactor=50", options)
	}
	replay := idempotency.ClaimRequest{Scope: "s", Key: "live", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	if r, err := reopened.Claim(ctx, replay); err != nil || r.Claimed || string(r.Existing.Response.Body) != "live" {
		t.Errorf("old live record = %+v, %v; want its replay", r, err)
	}
	if n, err := reopened.DeleteExpired(ctx, 100); err != nil || n != 1 {
		t.Errorf("DeleteExpired = %d, %v; want the old expired record", n, err)
	}
	if _, err := reopened.Get(ctx, "s", "old"); err == nil {
		t.Error("the expired old record is still there")
	}
	before := statsOf(t, pool, schema)
	completeMany(t, reopened, "key-", 200, usualAnswer())
	after := statsOf(t, pool, schema)
	upd, hot := after.upd-before.upd, after.hot-before.hot
	if upd < 200 || hot < upd*9/10 {
		t.Errorf("after Migrate, %d of %d updates were HOT, want at least 90%% of at least 200", hot, upd)
	}
}

// Migrate beside a transaction that holds a row of the table (WithTx's, or any long
// one): its ALTER TABLE cannot have the table until that transaction ends, and it does
// not make the writes of the replicas still running the previous version (here their
// claim's INSERT) queue behind it meanwhile. It takes the table once the transaction
// ends.
func TestMigrateBesideLongTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := newPool(t, testenv.PostgresURL(t), nil)
	st, schema := newStore(t, pool)
	table := pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()
	seq := pgx.Identifier{schema, "retrysafe_idempotency_token_seq"}.Sanitize()
	if _, err := st.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: "held", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ALTER TABLE "+table+" DROP COLUMN kept_until"); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, "UPDATE "+table+" SET lease_until = lease_until WHERE key = $1", []byte("held")); err != nil {
		t.Fatal(err)
	}
	migrated := make(chan error, 1)
	go func() { migrated <- st.Migrate(ctx) }()
	// Wait until Migrate has asked for the table's lock at least once.
	for {
		var waits bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE relation = $1::regclass
			AND mode = 'AccessExclusiveLock' AND NOT granted)`, table).Scan(&waits); err != nil {
			t.Fatal(err)
		}
		if waits {
			break
		}
		select {
		case err := <-migrated:
			t.Fatalf("Migrate returned (%v) while a transaction held a row of the table", err)
		case <-time.After(time.Millisecond):
		}
	}
	// The previous version's claims go on while Migrate waits (they would wait as long
	// as the transaction runs if its ALTER TABLE kept its place in the lock queue).
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for i := range 5 {
		if _, err := pool.Exec(cctx, `INSERT INTO `+table+` (scope, key, fingerprint, state, token, created_at, lease_until, expires_at)
			VALUES ('\x73', $1, '\x6670', 'in_progress', nextval('`+seq+`'), now(), now() + interval '1 minute', now() + interval '1 hour')`,
			[]byte(fmt.Sprint("new-", i))); err != nil {
			t.Fatalf("a claim while Migrate waits: %v", err)
		}
	}
	select {
	case err := <-migrated:
		t.Fatalf("Migrate returned (%v) while a transaction held a row of the table", err)
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-migrated; err != nil {
		t.Fatalf("Migrate once the transaction ended: %v", err)
	}
	if r, err := st.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: "new-0", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil || r.Claimed {
		t.Errorf("claim of a key the previous version holds, after Migrate = %+v, %v; want it in progress", r, err)
	}
}

// During a rolling upgrade a store of the schema without kept_until takes over a record
// this store completed, once it expired, and completes it again: it writes expires_at
// and leaves kept_until as the first completion set it, long passed. This store still
// replays the new completion until its expires_at.
func TestCompletionByPreviousVersionAfterExpiry(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := newPool(t, testenv.PostgresURL(t), nil)
	st, schema := newStore(t, pool)
	table := pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()
	seq := pgx.Identifier{schema, "retrysafe_idempotency_token_seq"}.Sanitize()
	req := idempotency.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	r, err := st.Claim(ctx, req)
	if err != nil || !r.Claimed {
		t.Fatalf("claim = %+v, %v", r, err)
	}
	if err := st.Complete(ctx, idempotency.Completion{Scope: "s", Key: "k", Token: r.Token,
		Response: idempotency.Response{Status: 201, Body: []byte("first")}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// An hour later: expired.
	if _, err := pool.Exec(ctx, "UPDATE "+table+` SET created_at = created_at - interval '2 hours',
		lease_until = lease_until - interval '2 hours', expires_at = expires_at - interval '2 hours',
		completed_at = completed_at - interval '2 hours', kept_until = kept_until - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	// The previous version's takeover and completion, the columns it knows.
	var tok int64
	if err := pool.QueryRow(ctx, `UPDATE `+table+` SET state = 'in_progress', token = nextval('`+seq+`'), created_at = now(),
		lease_until = now() + interval '1 minute', expires_at = now() + interval '1 hour', completed_at = NULL,
		status = NULL, header = NULL, headers = NULL, body = NULL, body_omitted = false, abandoned = false
		WHERE key = $1 RETURNING token`, []byte("k")).Scan(&tok); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET state = 'done', status = 200, header = 'null', headers = NULL,
		body = 'again', completed_at = now(), expires_at = now() + interval '1 hour' WHERE key = $1 AND token = $2`,
		[]byte("k"), tok); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Claim(ctx, req); err != nil || r.Claimed || r.Existing == nil || r.Existing.Response == nil ||
		string(r.Existing.Response.Body) != "again" {
		t.Errorf("claim after the previous version's completion = %+v, %v; want its replay", r, err)
	}
	if n, err := st.DeleteExpired(ctx, 100); err != nil || n != 0 {
		t.Errorf("DeleteExpired = %d, %v; want 0", n, err)
	}
}
