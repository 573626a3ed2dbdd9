package pgstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// pairTracer is a batchTracer that also counts the pipelines of several statements
// (claims and completions sent together) and the statements they carried.
type pairTracer struct {
	batchTracer
	pipelines, queries atomic.Int64
}

func (c *pairTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	c.pipelines.Add(1)
	c.queries.Add(int64(d.Batch.Len()))
	return ctx
}

func (c *pairTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *pairTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestClaimsAndCompletionsTogether: claims of new keys and completions of others that
// wait together go to PostgreSQL in one round trip, both statements in one implicit
// transaction, and each call gets its own outcome. When the server refuses the
// completion statement (one completion breaks a constraint), the claims made in the
// same transaction are rolled back with it, and both kinds run again apart: every claim
// still wins its key (a claim that had committed would find its own record in progress
// and lose it), and only the refused completion fails.
func TestClaimsAndCompletionsTogether(t *testing.T) {
	t.Parallel()
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refuse=%t", refuse), func(t *testing.T) {
			t.Parallel()
			claimsAndCompletions(t, refuse)
		})
	}
}

func claimsAndCompletions(t *testing.T, refuse bool) {
	ctx := t.Context()
	tracer := &pairTracer{}
	pool := newPool(t, testenv.PostgresURL(t), func(c *pgxpool.Config) {
		c.MaxConns = 1
		c.ConnConfig.Tracer = tracer
	})
	st, schema := newStoreConfig(t, pgstore.Config{Pool: pool, Batch: true})
	table := pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()
	if _, err := pool.Exec(ctx, "ALTER TABLE "+table+" ADD CONSTRAINT no_599 CHECK (status <> 599)"); err != nil {
		t.Fatal(err)
	}
	req := func(key string) idempotency.ClaimRequest {
		return idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}
	const n = 8
	tokens := make([]int64, n)
	for i := range n {
		res, err := st.Claim(ctx, req(fmt.Sprint("done-", i)))
		if err != nil || !res.Claimed {
			t.Fatalf("Claim: %+v, %v", res, err)
		}
		tokens[i] = res.Token
	}
	status := func(i int) int {
		if refuse && i == 0 {
			return 599
		}
		return 201
	}

	claims := make([]idempotency.ClaimResult, n)
	claimErrs, completeErrs := make([]error, n), make([]error, n)
	var calls []func()
	for i := range n {
		calls = append(calls,
			func() { claims[i], claimErrs[i] = st.Claim(ctx, req(fmt.Sprint("new-", i))) },
			func() {
				completeErrs[i] = st.Complete(ctx, idempotency.Completion{Scope: "s", Key: fmt.Sprint("done-", i), Token: tokens[i],
					TTL: time.Hour, Response: idempotency.Response{Status: status(i), Body: []byte(fmt.Sprint("answer ", i))}})
			})
	}
	tracer.pipelines.Store(0)
	tracer.queries.Store(0)
	together(t, st, pool, &tracer.batchTracer, true, calls)

	if p, q := tracer.pipelines.Load(), tracer.queries.Load(); p < 1 || q < 2*p {
		t.Fatalf("%d pipelines of %d statements: the claims and completions did not go together", p, q)
	}
	for i := range n {
		if claimErrs[i] != nil || !claims[i].Claimed {
			t.Errorf("claim new-%d: %+v, %v; want it won", i, claims[i], claimErrs[i])
		}
		rec, err := st.Get(ctx, "s", fmt.Sprint("done-", i))
		if err != nil {
			t.Fatal(err)
		}
		if refuse && i == 0 {
			if completeErrs[i] == nil || rec.State != idempotency.StateInProgress {
				t.Errorf("the refused completion: %v, record %s; want the server's error, in progress", completeErrs[i], rec.State)
			}
			continue
		}
		if completeErrs[i] != nil || rec.State != idempotency.StateDone || rec.Response == nil ||
			string(rec.Response.Body) != fmt.Sprint("answer ", i) {
			t.Errorf("completion done-%d: %v, record %+v", i, completeErrs[i], rec)
		}
	}
}
