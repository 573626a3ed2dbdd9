package gateway_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
)

// TestSkewedReplicasAgree: two replicas on one shared store whose clocks disagree by
// decades. Replica A runs in a synctest bubble, whose clock reads the year 2000; replica
// B reads the real clock. A claims a key and works on it: B must not take over its live
// lease. A completes it: B must replay it, not run it again as expired. Leases and expiry
// are decided on the store's clock, so the replicas' clocks do not matter.
func TestSkewedReplicasAgree(t *testing.T) {
	// Each replica has its own client of the one store (the server's clock decides):
	// A's is made inside the bubble, whose goroutines must not share a pool with B's.
	kinds := []struct {
		name   string
		shared func(t *testing.T) string // the schema or prefix both replicas use
		open   func(t *testing.T, shared string, owner bool) idempotency.Store
	}{
		{"postgres", func(t *testing.T) string { return testenv.Schema(t, "skew") },
			func(t *testing.T, schema string, _ bool) idempotency.Store {
				return openPostgresShared(t, schema, nil)
			}},
		{"redis", func(t *testing.T) string { return testenv.Name("skew") },
			func(t *testing.T, prefix string, owner bool) idempotency.Store {
				return openRedisPrefix(t, prefix+":", nil, owner)
			}},
	}
	// The one-host stores use the process clock: one host, one clock.
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			shared := kind.shared(t)
			storeB := kind.open(t, shared, true)
			key := testenv.Name("skew")
			var runs atomic.Int64
			// answered is closed once A has its answer: the middleware stores an answer
			// before it sends it, so A's record is done by then.
			claimed, release, answered := make(chan struct{}), make(chan struct{}), make(chan struct{})
			newReplica := func(store idempotency.Store) (*idempotency.Middleware, http.Handler) {
				mw, err := idempotency.New(idempotency.Config{Store: store, Lease: 30 * time.Second, TTL: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				return mw, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) == 1 {
						close(claimed)
						<-release
					}
					w.WriteHeader(http.StatusCreated)
				}))
			}
			do := func(h http.Handler) *httptest.ResponseRecorder {
				r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
				r.Header.Set("Idempotency-Key", key)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			mwB, b := newReplica(storeB)
			defer mwB.Shutdown(context.Background())
			type result struct{ during, after *httptest.ResponseRecorder }
			got := make(chan result, 1)
			go func() { // replica B, on the real clock
				<-claimed
				during := do(b)
				close(release)
				<-answered
				got <- result{during, do(b)}
			}()
			synctest.Test(t, func(t *testing.T) {
				if year := time.Now().Year(); year > 2001 {
					t.Fatalf("the bubble's clock reads %d", year)
				}
				mwA, a := newReplica(kind.open(t, shared, false))
				w := do(a)
				close(answered)
				if w.Code != http.StatusCreated {
					t.Errorf("replica A: %d %s", w.Code, w.Body)
				}
				if err := mwA.Shutdown(context.Background()); err != nil {
					t.Error(err)
				}
			})
			r := <-got
			if r.during.Code != http.StatusConflict {
				t.Errorf("replica B during A's request: %d, want 409 (a takeover of a live lease)", r.during.Code)
			}
			if r.after.Code != http.StatusCreated || r.after.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("replica B after A's answer: %d replayed=%q, want the replay", r.after.Code, r.after.Header().Get("Idempotent-Replayed"))
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("the request ran %d times, want 1", n)
			}
		})
	}
}
