package pgstore_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// A 422 (another payload) or a 409 is decided without the stored response: the claim
// statement does not even read a stored body that PostgreSQL keeps out of line (TOAST).
// The table's TOAST block counters (pg_statio_all_tables) stay still for such claims,
// single and batched, and move for a replay, which does read it.
func TestLostClaimReadsNoStoredBody(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%t", batch), func(t *testing.T) {
			t.Parallel()
			leanClaims(t, batch)
		})
	}
}

func leanClaims(t *testing.T, batch bool) {
	ctx := t.Context()
	tracer := &batchTracer{}
	// One connection: the counters this backend has not reported yet are flushed by
	// pg_stat_force_next_flush on that same connection.
	pool := newPool(t, testenv.PostgresURL(t), func(c *pgxpool.Config) {
		c.MaxConns = 1
		c.ConnConfig.Tracer = tracer
	})
	st, schema := newStoreConfig(t, pgstore.Config{Pool: pool, Batch: batch})
	var (
		on      bool
		version int
	)
	if err := pool.QueryRow(ctx, "SELECT current_setting('track_counts')::bool, current_setting('server_version_num')::int").Scan(&on, &version); err != nil {
		t.Fatal(err)
	}
	if !on {
		t.Skip("track_counts is off: the server keeps no block counters")
	}
	if version < 150000 {
		t.Skipf("PostgreSQL %d: reading this backend's block counters at once needs pg_stat_force_next_flush (15 and later)", version)
	}
	table := pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()
	toastBlocks := func() int64 {
		t.Helper()
		if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(toast_blks_read, 0) + coalesce(toast_blks_hit, 0) +
			coalesce(tidx_blks_read, 0) + coalesce(tidx_blks_hit, 0)
			FROM pg_statio_all_tables WHERE relid = $1::regclass`, table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Records with multi-megabyte bodies of random bytes, which PostgreSQL can only
	// keep in the TOAST table; and one in progress.
	const keys = 6
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range keys {
		key := fmt.Sprint("big-", i)
		res, err := st.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		if err != nil || !res.Claimed {
			t.Fatalf("Claim: %+v, %v", res, err)
		}
		body := make([]byte, 2<<20)
		for j := range body {
			body[j] = byte(rng.Uint32())
		}
		if err := st.Complete(ctx, idempotency.Completion{Scope: "s", Key: key, Token: res.Token, TTL: time.Hour,
			Response: idempotency.Response{Status: 200, Body: body}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: "busy", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}

	// claims makes the claims of fps at once (in one batch with Config.Batch), on
	// big-i for the i-th, and checks they all lost.
	claims := func(fps ...string) []idempotency.ClaimResult {
		t.Helper()
		results := make([]idempotency.ClaimResult, len(fps))
		errs := make([]error, len(fps))
		calls := make([]func(), len(fps))
		for i, fp := range fps {
			calls[i] = func() {
				results[i], errs[i] = st.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: fmt.Sprint("big-", i),
					Fingerprint: fp, Lease: time.Minute, TTL: time.Hour})
			}
		}
		together(t, st, pool, tracer, batch, calls)
		for i := range fps {
			if errs[i] != nil || results[i].Claimed || results[i].Existing == nil {
				t.Fatalf("claim %d: %+v, %v; want the existing record", i, results[i], errs[i])
			}
		}
		return results
	}

	for round := 0; ; round++ {
		before := toastBlocks()
		tracer.reset()
		mismatched := make([]string, keys)
		for i := range mismatched {
			mismatched[i] = "other"
		}
		for i, r := range claims(mismatched...) {
			if r.Existing.Response != nil {
				t.Errorf("mismatch %d: the existing record carries its response", i)
			}
		}
		if _, err := st.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: "busy", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		most := tracer.most.Load()
		if got := toastBlocks() - before; got != 0 {
			t.Errorf("claims with another payload read %d TOAST blocks, want 0", got)
		}
		if !batch || most == keys {
			t.Logf("round %d: %d batched statements, at most %d claims in one", round, tracer.n.Load(), most)
			break
		}
		if round == 4 {
			t.Fatalf("the %d claims did not go in one batch in 5 rounds (at most %d did)", keys, most)
		}
	}

	// The control: a replay reads the body, and the counters see it.
	before := toastBlocks()
	fps := make([]string, keys)
	for i := range fps {
		fps[i] = "fp"
	}
	for i, r := range claims(fps...) {
		if r.Existing.Response == nil || len(r.Existing.Response.Body) != 2<<20 {
			t.Fatalf("replay %d: no body", i)
		}
	}
	if got := toastBlocks() - before; got < keys*100 {
		t.Errorf("replays read %d TOAST blocks; the counters do not see body reads, so the check above proves nothing", got)
	}
}
