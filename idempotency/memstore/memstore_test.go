package memstore_test

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

func TestConformance(t *testing.T) {
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T, clock func() time.Time) idempotency.Store { return memstore.NewWithClock(clock) },
		Down: func(t *testing.T) idempotency.Store {
			s := memstore.New()
			_ = s.Close()
			return s
		},
	})
}

// TestConformanceColliding runs the contract on a store whose keys all share one hash:
// a record filed in spill, behind another key's, must behave as any other.
func TestConformanceColliding(t *testing.T) {
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T, clock func() time.Time) idempotency.Store { return memstore.NewColliding(clock) },
		Down: func(t *testing.T) idempotency.Store {
			s := memstore.NewColliding(nil)
			_ = s.Close()
			return s
		},
	})
}

// BenchmarkCollectHeld measures what a store of many done records costs each garbage
// collection: one op is a full collection with 100,000 records held. A process pays it
// on every cycle its allocations start, so it falls on every request it serves.
//
//	go test -run '^$' -bench CollectHeld ./idempotency/memstore
func BenchmarkCollectHeld(b *testing.B) {
	const n = 100_000
	ctx := context.Background()
	s := memstore.New()
	resp := idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":1,"amount":1250,"currency":"EUR"}`)}
	for i := range n {
		key := "key-" + strconv.Itoa(i)
		res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "user-1", Key: key, Fingerprint: "fp-" + key,
			Route: "POST /payments", ID: "claim-" + key, Lease: time.Minute, TTL: time.Hour})
		if err != nil || !res.Claimed {
			b.Fatalf("claim %d: %v %+v", i, err, res)
		}
		if err := s.Complete(ctx, idempotency.Completion{Scope: "user-1", Key: key, Token: res.Token, Response: resp, TTL: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	for b.Loop() {
		runtime.GC()
	}
	runtime.KeepAlive(s)
}
