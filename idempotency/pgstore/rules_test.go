package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// batchTracer sees the batched statements (those that unnest arrays): how many ran,
// and the most calls one of them carried. It also counts the acquisitions of a pool
// connection in progress, which, while the test holds the pool's only connection, are
// calls waiting for it.
type batchTracer struct {
	n, most   atomic.Int64
	acquiring atomic.Int64
}

func (c *batchTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	c.acquiring.Add(1)
	return ctx
}

func (c *batchTracer) TraceAcquireEnd(context.Context, *pgxpool.Pool, pgxpool.TraceAcquireEndData) {
	c.acquiring.Add(-1)
}

func (c *batchTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	args := d.Args
	if len(args) > 0 {
		if _, ok := args[0].(pgx.QueryExecMode); ok {
			args = args[1:]
		}
	}
	if (strings.Contains(d.SQL, "unnest(") || strings.HasPrefix(d.SQL, pgstore.BatchPrefix)) && len(args) > 0 {
		c.n.Add(1)
		if scopes, ok := args[0].([][]byte); ok {
			for {
				most := c.most.Load()
				if int64(len(scopes)) <= most || c.most.CompareAndSwap(most, int64(len(scopes))) {
					break
				}
			}
		}
	}
	return ctx
}

func (c *batchTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// reset forgets what the tracer saw.
func (c *batchTracer) reset() { c.n.Store(0); c.most.Store(0) }

// together runs calls at once. With hold set (st a Batch store on a pool of one
// connection, traced by tracer), the calls go out while that connection is held, so that
// they go together in batches once it is released. Leaders go first, one after the
// other, each waiting for the connection before the next starts (so that each leads a
// batch of its own rather than joining the previous one): claims and completions on
// keys of their own, pgstore.BatchInFlight of each, which take every slot of the claim
// batches and of the completion batches. The calls then find no slot free and queue;
// the connection is released once the store's batches hold all of them.
func together(t *testing.T, st *pgstore.Store, pool *pgxpool.Pool, tracer *batchTracer, hold bool, calls []func()) {
	t.Helper()
	var wg sync.WaitGroup
	if hold {
		conn, err := pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		claimLead := func() {
			r := idempotency.ClaimRequest{Scope: "lead", Key: testenv.Name("k"), Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
			if _, err := st.Claim(t.Context(), r); err != nil {
				t.Error(err)
			}
		}
		completeLead := func() { // of a key never claimed: refused, after its statement ran
			c := idempotency.Completion{Scope: "lead", Key: testenv.Name("k"), Token: 1, TTL: time.Hour, Response: idempotency.Response{Status: 200}}
			if err := st.Complete(t.Context(), c); !errors.Is(err, idempotency.ErrLeaseLost) {
				t.Errorf("completion of a key never claimed: %v, want ErrLeaseLost", err)
			}
		}
		var leaders []func()
		for range pgstore.BatchInFlight {
			leaders = append(leaders, claimLead, completeLead)
		}
		for i, lead := range leaders {
			wg.Go(lead)
			if !eventually(func() bool { return tracer.acquiring.Load() == int64(i+1) }) {
				t.Errorf("leader %d did not wait for the connection: %d acquisitions in progress", i+1, tracer.acquiring.Load())
			}
		}
		defer func() {
			if !eventually(func() bool { return st.Queued() == len(calls) }) {
				t.Errorf("%d of %d calls queued in a batch", st.Queued(), len(calls))
			}
			conn.Release() // even after a failure: the calls must end
			wg.Wait()
		}()
	}
	start := make(chan struct{})
	for _, f := range calls {
		wg.Go(func() {
			<-start
			f()
		})
	}
	close(start)
	if !hold {
		wg.Wait()
	}
}

// eventually reports whether cond holds within 10 s, polling it. It is for states only
// another process or goroutine can reach, with no event to wait for: PostgreSQL's view
// of its backends, calls parked in a pool or a batch.
func eventually(cond func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// ruleCase is one record's history and the claim made on it afterwards.
type ruleCase struct {
	name string
	// setup runs on a store at the start time; it returns the record's token (0: none).
	setup func(ctx context.Context, s idempotency.Store, key string) (int64, error)
	claim idempotency.ClaimRequest // Scope and Key are filled in
}

// ruleCases covers every branch of the claim rules, on records set up at the start
// and claimed 40 s later.
func ruleCases() []ruleCase {
	inProgress := func(fp string, lease, ttl time.Duration) func(ctx context.Context, s idempotency.Store, key string) (int64, error) {
		return func(ctx context.Context, s idempotency.Store, key string) (int64, error) {
			res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: fp, Lease: lease, TTL: ttl})
			if err == nil && !res.Claimed {
				err = fmt.Errorf("setup claim of %s lost", key)
			}
			return res.Token, err
		}
	}
	done := func(ttl time.Duration) func(ctx context.Context, s idempotency.Store, key string) (int64, error) {
		return func(ctx context.Context, s idempotency.Store, key string) (int64, error) {
			tok, err := inProgress("fp", 30*time.Second, time.Hour)(ctx, s, key)
			if err != nil {
				return 0, err
			}
			return tok, s.Complete(ctx, idempotency.Completion{Scope: "s", Key: key, Token: tok, TTL: ttl,
				Response: idempotency.Response{Status: 201, Header: http.Header{"X": {"\xff"}},
					Trailer: http.Header{"T": {"1"}}, Body: []byte("stored")}})
		}
	}
	abandoned := func(lease time.Duration) func(ctx context.Context, s idempotency.Store, key string) (int64, error) {
		return func(ctx context.Context, s idempotency.Store, key string) (int64, error) {
			tok, err := inProgress("fp", lease, time.Hour)(ctx, s, key)
			if err != nil {
				return 0, err
			}
			return tok, s.Abandon(ctx, "s", key, tok)
		}
	}
	none := func(context.Context, idempotency.Store, string) (int64, error) { return 0, nil }
	req := func(fp string, noTakeover bool) idempotency.ClaimRequest {
		return idempotency.ClaimRequest{Fingerprint: fp, Lease: 30 * time.Second, TTL: time.Hour, NoTakeover: noTakeover}
	}
	return []ruleCase{
		{"absent", none, req("fp", false)},
		{"absent no takeover", none, req("fp", true)},
		{"done replay", done(time.Hour), req("fp", false)},
		{"done mismatch", done(time.Hour), req("other", false)},
		{"done expired", done(10 * time.Second), req("other", false)},
		{"done expired no takeover", done(10 * time.Second), req("fp", true)},
		{"running", inProgress("fp", time.Hour, 2*time.Hour), req("fp", false)},
		{"running mismatch", inProgress("fp", time.Hour, 2*time.Hour), req("other", false)},
		{"running expired", inProgress("fp", time.Hour, 10*time.Second), req("fp", false)},
		{"running expired mismatch", inProgress("fp", time.Hour, 10*time.Second), req("other", false)},
		{"lapsed", inProgress("fp", 30*time.Second, time.Hour), req("fp", false)},
		{"lapsed mismatch", inProgress("fp", 30*time.Second, time.Hour), req("other", false)},
		{"lapsed no takeover", inProgress("fp", 30*time.Second, time.Hour), req("fp", true)},
		{"lapsed expired mismatch", inProgress("fp", 30*time.Second, 35*time.Second), req("other", false)},
		{"lapsed expired no takeover", inProgress("fp", 30*time.Second, 35*time.Second), req("other", true)},
		{"abandoned running", abandoned(time.Hour), req("fp", false)},
		{"abandoned lapsed", abandoned(30 * time.Second), req("fp", false)},
	}
}

// outcome is what a claim and the record after it look like, with tokens replaced by
// how they relate to the setup's token.
type outcome struct {
	Claimed, TookOver   bool
	Existing            *idempotency.Record
	Now                 time.Time
	NewToken, SameToken bool
	After               *idempotency.Record
}

func observe(t *testing.T, s idempotency.Store, key string, setupToken int64, res idempotency.ClaimResult) outcome {
	t.Helper()
	o := outcome{Claimed: res.Claimed, TookOver: res.TookOver, Now: res.Now.UTC()}
	if res.Claimed {
		o.NewToken = res.Token > setupToken
	}
	if res.Existing != nil {
		e := normalized(*res.Existing)
		o.SameToken = res.Existing.Token == setupToken
		o.Existing = &e
	}
	after, err := s.Get(context.Background(), "s", key)
	if err != nil {
		t.Fatalf("Get %s: %v", key, err)
	}
	a := normalized(*after)
	o.After = &a
	return o
}

// normalized is r without its token and attempts (the memory store counts none), its
// times in UTC.
func normalized(r idempotency.Record) idempotency.Record {
	r.Token, r.Attempts = 0, 0
	r.CreatedAt, r.LeaseUntil, r.ExpiresAt = r.CreatedAt.UTC(), r.LeaseUntil.UTC(), r.ExpiresAt.UTC()
	return r
}

// TestClaimRulesMatchMemstore runs every branch of the claim rules on PostgreSQL and on
// the reference store, with the same clock, and compares the outcomes. With Config.Batch
// the claims run at once, so that they share the batched statements.
func TestClaimRulesMatchMemstore(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%t", batch), func(t *testing.T) {
			t.Parallel()
			claimRules(t, batch)
		})
	}
}

func claimRules(t *testing.T, batch bool) {
	ctx := t.Context()
	tracer := &batchTracer{}
	pool := newPool(t, testenv.PostgresURL(t), func(c *pgxpool.Config) {
		c.MaxConns = 1
		c.ConnConfig.Tracer = tracer
	})
	clock := idempotencytest.NewClock()
	pg, _ := newStoreConfig(t, pgstore.Config{Pool: pool, Batch: batch, Clock: clock.Now})
	mem := memstore.NewWithClock(clock.Now)
	cases := ruleCases()
	pgTokens, memTokens := make([]int64, len(cases)), make([]int64, len(cases))
	for i, c := range cases {
		var err error
		if pgTokens[i], err = c.setup(ctx, pg, c.name); err != nil {
			t.Fatalf("%s: setup on PostgreSQL: %v", c.name, err)
		}
		if memTokens[i], err = c.setup(ctx, mem, c.name); err != nil {
			t.Fatalf("%s: setup on memstore: %v", c.name, err)
		}
	}
	clock.Advance(40 * time.Second)
	request := func(c ruleCase) idempotency.ClaimRequest {
		r := c.claim
		r.Scope, r.Key = "s", c.name
		return r
	}

	for round := 0; ; round++ {
		tracer.reset()
		results := make([]idempotency.ClaimResult, len(cases))
		errs := make([]error, len(cases))
		calls := make([]func(), len(cases))
		for i, c := range cases {
			calls[i] = func() { results[i], errs[i] = pg.Claim(ctx, request(c)) }
		}
		together(t, pg, pool, tracer, batch, calls)
		most := tracer.most.Load()
		for i, c := range cases {
			if errs[i] != nil {
				t.Fatalf("%s: Claim: %v", c.name, errs[i])
			}
			want := observe(t, mem, c.name, memTokens[i], claim(t, mem, request(c)))
			got := observe(t, pg, c.name, pgTokens[i], results[i])
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s:\n got %s\nwant %s", c.name, show(got), show(want))
			}
		}
		if !batch || most == int64(len(cases)) || t.Failed() {
			t.Logf("%d claims, %d batched statements", len(cases), tracer.n.Load())
			break
		}
		if round == 4 {
			t.Fatalf("the %d claims did not go in one batch in 5 rounds (at most %d did)", len(cases), most)
		}
		// Not all in one batch: set the records up again under new names and retry.
		for i := range cases {
			cases[i].name = fmt.Sprintf("%s/%d", cases[i].name, round+1)
		}
		clock.Advance(-40 * time.Second)
		for i, c := range cases {
			var err error
			if pgTokens[i], err = c.setup(ctx, pg, c.name); err != nil {
				t.Fatal(err)
			}
			if memTokens[i], err = c.setup(ctx, mem, c.name); err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(40 * time.Second)
	}

	// The winners complete at once (in one batched completion), on the store's clock.
	clock.Advance(time.Second)
	var calls []func()
	for _, c := range cases {
		rec, err := pg.Get(ctx, "s", c.name)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idempotency.StateInProgress {
			continue
		}
		calls = append(calls, func() {
			if err := pg.Complete(ctx, idempotency.Completion{Scope: "s", Key: c.name, Token: rec.Token, TTL: 3 * time.Hour,
				Response: idempotency.Response{Status: 200}}); err != nil {
				t.Errorf("%s: Complete: %v", c.name, err)
			}
		})
	}
	tracer.reset()
	together(t, pg, pool, tracer, batch, calls)
	t.Logf("%d completions, at most %d in one statement", len(calls), tracer.most.Load())
	for _, c := range cases {
		rec, err := pg.Get(ctx, "s", c.name)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State == idempotency.StateDone && rec.Response.Status == 200 && !rec.ExpiresAt.Equal(clock.Now().Add(3*time.Hour)) {
			t.Errorf("%s: completed record expires at %v, want %v", c.name, rec.ExpiresAt, clock.Now().Add(3*time.Hour))
		}
	}
}

// claim makes r on s and fails t on an error.
func claim(t *testing.T, s idempotency.Store, r idempotency.ClaimRequest) idempotency.ClaimResult {
	t.Helper()
	res, err := s.Claim(t.Context(), r)
	if err != nil {
		t.Fatalf("Claim(%q, %q): %v", r.Scope, r.Key, err)
	}
	return res
}

func show(o outcome) string {
	s := fmt.Sprintf("claimed=%t tookOver=%t newToken=%t now=%s", o.Claimed, o.TookOver, o.NewToken, o.Now.Format(time.StampMilli))
	rec := func(r *idempotency.Record) string {
		if r == nil {
			return "nil"
		}
		resp := "nil"
		if r.Response != nil {
			resp = fmt.Sprintf("%+v", *r.Response)
		}
		return fmt.Sprintf("{fp=%s state=%s abandoned=%t created=%s lease=%s expires=%s response=%s}", r.Fingerprint, r.State,
			r.Abandoned, r.CreatedAt.Format(time.StampMilli), r.LeaseUntil.Format(time.StampMilli), r.ExpiresAt.Format(time.StampMilli), resp)
	}
	if o.Existing != nil {
		s += fmt.Sprintf(" existing=%s sameToken=%t", rec(o.Existing), o.SameToken)
	}
	return s + " after=" + rec(o.After)
}

// An in-progress record whose lease runs is never deleted or replaced, whatever its
// expiry, and a renewal that commits while a takeover or a janitor waits for the row
// wins: both re-check the lease on the row as the renewal left it.
func TestRunningLeaseIsKept(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := newPool(t, testenv.PostgresURL(t), nil)
	clock := idempotencytest.NewClock()
	st, schema := newStoreConfig(t, pgstore.Config{Pool: pool, Clock: clock.Now})
	table := pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()

	t.Run("expired", func(t *testing.T) {
		res := claim(t, st, idempotency.ClaimRequest{Scope: "s", Key: "long", Fingerprint: "fp", Lease: time.Hour, TTL: time.Minute})
		clock.Advance(2 * time.Minute) // past its expiry, inside its lease
		if n, err := st.DeleteExpired(ctx, 100); n != 0 || err != nil {
			t.Errorf("DeleteExpired = %d, %v; want 0: the lease runs", n, err)
		}
		for _, fp := range []string{"fp", "other"} {
			again := claim(t, st, idempotency.ClaimRequest{Scope: "s", Key: "long", Fingerprint: fp, Lease: time.Minute, TTL: time.Minute})
			if again.Claimed || again.Existing.Token != res.Token {
				t.Errorf("claim with %s of an expired record whose lease runs: %+v, want the existing record", fp, again)
			}
		}
		clock.Advance(time.Hour) // the lease is over too
		if n, err := st.DeleteExpired(ctx, 100); n != 1 || err != nil {
			t.Errorf("DeleteExpired = %d, %v; want 1", n, err)
		}
	})

	// renewing starts a transaction that moves key's lease (and expiry) an hour on and
	// holds the row until commit is called.
	renewing := func(t *testing.T, key string) (commit func()) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		later := clock.Now().Add(time.Hour)
		if tag, err := tx.Exec(ctx, "UPDATE "+table+" SET lease_until = $1, expires_at = $1 WHERE key = $2", later, []byte(key)); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("renewal: %v, %v", tag, err)
		}
		return func() {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	t.Run("takeover waits for a renewal", func(t *testing.T) {
		res := claim(t, st, idempotency.ClaimRequest{Scope: "s", Key: "renewed", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		clock.Advance(2 * time.Minute) // the lease ran out
		commit := renewing(t, "renewed")
		type result struct {
			res idempotency.ClaimResult
			err error
		}
		got := make(chan result, 1)
		go func() {
			r, err := st.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: "renewed", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
			got <- result{r, err}
		}()
		waitForLockWait(t, pool, schema)
		commit()
		out := <-got
		r := out.res
		if out.err != nil || r.Claimed || r.Existing == nil || r.Existing.Token != res.Token {
			t.Fatalf("takeover behind a renewal: %+v, %v; want the renewed record", r, out.err)
		}
		if !r.Existing.LeaseUntil.Equal(clock.Now().Add(time.Hour)) {
			t.Errorf("existing lease until %v, want the renewed %v", r.Existing.LeaseUntil, clock.Now().Add(time.Hour))
		}
	})

	t.Run("janitor skips a renewal", func(t *testing.T) {
		claim(t, st, idempotency.ClaimRequest{Scope: "s", Key: "swept", Fingerprint: "fp", Lease: time.Minute, TTL: 2 * time.Minute})
		clock.Advance(3 * time.Minute) // lease over and expired
		commit := renewing(t, "swept")
		// The row is locked: the janitor skips it at once rather than wait.
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := st.DeleteExpired(dctx, 100)
		cancel()
		if n != 0 || err != nil {
			t.Errorf("DeleteExpired beside a renewal = %d, %v; want 0, nil", n, err)
		}
		commit()
		if n, err := st.DeleteExpired(ctx, 100); n != 0 || err != nil {
			t.Errorf("DeleteExpired after the renewal = %d, %v; want 0: the lease runs", n, err)
		}
		if _, err := st.Get(ctx, "s", "swept"); err != nil {
			t.Errorf("renewed record: %v", err)
		}
	})
}

// waitForLockWait waits until a statement on schema waits for a lock.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	waiting := func() bool {
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, schema).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	if !eventually(waiting) {
		t.Fatal("no statement waited for the row lock")
	}
}
