package bench

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// BenchmarkWaitAcrossReplicas measures what the wait conflict policy costs when the
// owner is another replica, which learns of its end only by polling the store: how long
// after the owner's answer is stored its waiters on the other replica answer (the wake
// latency), and how many claims each waiter sends meanwhile. Each iteration: the owner
// holds its key for hold, 10 duplicates wait on the other replica, PostgreSQL store.
//
//	cd bench && go test -run '^$' -bench BenchmarkWaitAcrossReplicas -benchtime 10x
func BenchmarkWaitAcrossReplicas(b *testing.B) {
	const waiters, hold = 10, 500 * time.Millisecond
	schema := testenv.Schema(b, "waitbench")
	store, err := pgstore.New(pgstore.Config{Pool: testenv.PostgresPool(b, 0), Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	var claimsB atomic.Int64
	replica := func(count bool) *idempotency.Middleware {
		cfg := idempotency.Config{Store: store, Conflict: idempotency.ConflictWait, WaitTimeout: time.Minute,
			Logger: slog.New(slog.DiscardHandler)}
		if count {
			cfg.OnStoreCall = func(op idempotency.StoreOp, _ time.Duration, _ error) {
				if op == idempotency.StoreClaim {
					claimsB.Add(1)
				}
			}
		}
		mw, err := idempotency.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = mw.Shutdown(context.Background()) })
		return mw
	}
	a, bb := replica(false), replica(true)
	entered := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		time.Sleep(hold) // the owner's work
		w.WriteHeader(http.StatusCreated)
	})
	ha, hb := a.Handler(h), bb.Handler(h)
	send := func(h http.Handler, key string) int {
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	var lat []time.Duration
	claims0 := claimsB.Load()
	for i := 0; b.Loop(); i++ {
		key := "w-" + strconv.Itoa(i)
		var stored time.Time
		var wg sync.WaitGroup
		wg.Go(func() {
			if code := send(ha, key); code != http.StatusCreated {
				b.Errorf("owner: %d", code)
			}
			stored = time.Now() // the answer is stored before it is sent
		})
		<-entered
		ends := make([]time.Time, waiters)
		for j := range waiters {
			wg.Go(func() {
				if code := send(hb, key); code != http.StatusCreated {
					b.Errorf("waiter: %d", code)
				}
				ends[j] = time.Now()
			})
		}
		wg.Wait()
		for _, e := range ends {
			lat = append(lat, max(0, e.Sub(stored)))
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "wake-p50-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "wake-max-ms")
	b.ReportMetric(float64(claimsB.Load()-claims0)/float64(b.N*waiters), "claims/waiter")
}
