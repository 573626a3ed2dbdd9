package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// The store counts its open requests (claimed and not yet completed, released or
// abandoned), which its batches gather for: every way a request ends takes it off,
// and a claim that claims nothing never counts.
func TestOpenRequests(t *testing.T) {
	t.Parallel()
	pool := newPool(t, testenv.PostgresURL(t), nil)
	st, _ := newStoreConfig(t, pgstore.Config{Pool: pool, Batch: true})
	ctx := t.Context()
	open := func(want int, after string) {
		t.Helper()
		if got := st.Open(); got != want {
			t.Errorf("after %s: %d requests open, want %d", after, got, want)
		}
	}
	tokens := map[string]int64{}
	for _, key := range []string{"complete", "release", "abandon", "tx"} {
		res, err := st.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "f", Lease: time.Minute, TTL: time.Hour})
		if err != nil || !res.Claimed {
			t.Fatalf("Claim %s: %+v, %v", key, res, err)
		}
		tokens[key] = res.Token
	}
	open(4, "four claims")
	res, err := st.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: "complete", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour})
	if err != nil || res.Claimed {
		t.Fatalf("Claim of a key in progress: %+v, %v; want the record", res, err)
	}
	open(4, "a claim that found a record")
	if err := st.Extend(ctx, "s", "complete", tokens["complete"], time.Minute); err != nil {
		t.Fatal(err)
	}
	open(4, "a renewal")
	done := idempotency.Completion{Scope: "s", Key: "complete", Token: tokens["complete"],
		Response: idempotency.Response{Status: 201}, TTL: time.Hour}
	if err := st.Complete(ctx, done); err != nil {
		t.Fatal(err)
	}
	open(3, "a completion")
	if err := st.Release(ctx, "s", "release", tokens["release"]); err != nil {
		t.Fatal(err)
	}
	open(2, "a release")
	if err := st.Abandon(ctx, "s", "abandon", tokens["abandon"]); err != nil {
		t.Fatal(err)
	}
	open(1, "an abandonment")
	tctx := idempotency.NewContext(ctx, idempotency.NewClaim("s", "tx", "f", tokens["tx"], time.Hour))
	if _, err := st.WithTx(tctx, func(context.Context, pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201}, nil
	}); err != nil {
		t.Fatal(err)
	}
	open(0, "a completion in the handler's transaction")
	if err := st.Complete(ctx, done); err != nil {
		t.Fatal(err)
	}
	open(0, "a completion sent again")
}
