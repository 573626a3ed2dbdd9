package sqlitestore

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// The store counts its requests in flight (claimed and not yet completed, released or
// abandoned), which its batches gather for: every way a request ends takes it off,
// and a claim that claims nothing never counts.
func TestInFlightRequests(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, Config{Path: filepath.Join(t.TempDir(), "f.db"), Batch: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	inFlight := func(want int, after string) {
		t.Helper()
		if got := s.inflight.Count(); got != want {
			t.Errorf("after %s: %d requests in flight, want %d", after, got, want)
		}
	}
	req := func(key string) idempotency.ClaimRequest {
		return idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
	}
	tokens := map[string]int64{}
	for _, key := range []string{"complete", "release", "abandon", "tx"} {
		res, err := s.Claim(ctx, req(key))
		if err != nil || !res.Claimed {
			t.Fatalf("Claim %s: %+v, %v", key, res, err)
		}
		tokens[key] = res.Token
	}
	inFlight(4, "four claims")
	if res, err := s.Claim(ctx, req("complete")); err != nil || res.Claimed {
		t.Fatalf("Claim of a key in progress: %+v, %v; want the record", res, err)
	}
	inFlight(4, "a claim that found a record")
	if err := s.Extend(ctx, "s", "complete", tokens["complete"], time.Minute); err != nil {
		t.Fatal(err)
	}
	inFlight(4, "a renewal")
	done := idempotency.Completion{Scope: "s", Key: "complete", Token: tokens["complete"],
		Response: idempotency.Response{Status: 201}, TTL: time.Hour}
	if err := s.Complete(ctx, done); err != nil {
		t.Fatal(err)
	}
	inFlight(3, "a completion")
	if err := s.Release(ctx, "s", "release", tokens["release"]); err != nil {
		t.Fatal(err)
	}
	inFlight(2, "a release")
	if err := s.Abandon(ctx, "s", "abandon", tokens["abandon"]); err != nil {
		t.Fatal(err)
	}
	inFlight(1, "an abandonment")
	tctx := idempotency.NewContext(ctx, idempotency.NewClaim("s", "tx", "f", tokens["tx"], time.Hour))
	if _, err := s.WithTx(tctx, func(context.Context, *sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201}, nil
	}); err != nil {
		t.Fatal(err)
	}
	inFlight(0, "a completion in the handler's transaction")
	if err := s.Complete(ctx, done); err != nil {
		t.Fatal(err)
	}
	inFlight(0, "a completion sent again")
}
