package memstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// Keys that share a hash: the first is filed in index, the rest in spill. Deleting the
// first leaves the others found; a key filed after that takes the free index entry;
// each keeps its own record and token throughout.
func TestSpillSurvivesIndexDelete(t *testing.T) {
	ctx := context.Background()
	s := NewColliding(nil)
	claim := func(key string) int64 {
		t.Helper()
		res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "fp-" + key, Lease: time.Minute, TTL: time.Hour})
		if err != nil || !res.Claimed {
			t.Fatalf("claim %s: %v %+v", key, err, res)
		}
		return res.Token
	}
	tokens := map[string]int64{"a": claim("a"), "b": claim("b"), "c": claim("c")}
	if len(s.index) != 1 || len(s.spill) != 2 {
		t.Fatalf("index %d, spill %d records; want 1 and 2", len(s.index), len(s.spill))
	}
	if err := s.Delete(ctx, "", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "", "a"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("deleted a: Get says %v, want ErrNotFound", err)
	}
	for _, key := range []string{"b", "c"} { // their hash's index entry is free now
		if rec, err := s.Get(ctx, "", key); err != nil || rec.Key != key || rec.Token != tokens[key] {
			t.Fatalf("Get %s after a's delete: %v %+v", key, err, rec)
		}
	}
	tokens["d"] = claim("d")
	if len(s.index) != 1 || len(s.spill) != 2 {
		t.Fatalf("after a's delete and d's claim: index %d, spill %d records; want 1 and 2", len(s.index), len(s.spill))
	}
	for _, key := range []string{"b", "c", "d"} {
		if err := s.Complete(ctx, idempotency.Completion{Key: key, Token: tokens[key], Response: idempotency.Response{Status: 201}, TTL: time.Hour}); err != nil {
			t.Fatalf("complete %s: %v", key, err)
		}
		rec, err := s.Get(ctx, "", key)
		if err != nil || rec.Key != key || rec.Fingerprint != "fp-"+key || rec.Token != tokens[key] || rec.State != idempotency.StateDone {
			t.Fatalf("Get %s: %v %+v", key, err, rec)
		}
	}
	page, err := s.List(ctx, idempotency.ListFilter{})
	if err != nil || len(page.Records) != 3 {
		t.Fatalf("List: %v, %d records; want b, c, d", err, len(page.Records))
	}
	if err := s.Release(ctx, "", "c", tokens["c"]); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("release of done c: %v, want ErrLeaseLost", err)
	}
	if err := s.Delete(ctx, "", "c"); err != nil {
		t.Fatal(err)
	}
	if len(s.index)+len(s.spill) != 2 {
		t.Fatalf("after c's delete: %d records, want 2", len(s.index)+len(s.spill))
	}
}
