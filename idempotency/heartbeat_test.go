package idempotency_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// extendLog is a store that records when each key's lease was extended, on the
// bubble's clock, and fails the first extension of the keys in failFirst.
type extendLog struct {
	idempotency.Store
	t0        time.Time
	failFirst map[string]bool

	mu    sync.Mutex
	times map[string][]time.Duration
}

var errExtend = errors.New("extend failed")

func (s *extendLog) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error {
	s.mu.Lock()
	s.times[key] = append(s.times[key], time.Since(s.t0))
	fail := s.failFirst[key]
	delete(s.failFirst, key)
	s.mu.Unlock()
	if fail {
		return errExtend
	}
	return s.Store.Extend(ctx, scope, key, token, lease)
}

// Handlers that start, renew and finish at different times share one middleware's
// heartbeat queue: each is renewed every Lease/3 from its own start, on time, and
// never after it finished; a failed renewal is tried again after a second; the queue
// wakes again for a handler that starts after it ran empty.
func TestHeartbeatsOfOverlappingHandlers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testHeartbeatsOfOverlappingHandlers)
}

func testHeartbeatsOfOverlappingHandlers(t *testing.T) {
	s := &extendLog{Store: memstore.New(), t0: time.Now(), failFirst: map[string]bool{"d": true},
		times: map[string][]time.Duration{}}
	// A lease of six seconds: a renewal every two.
	mw, err := idempotency.New(idempotency.Config{Store: s, Lease: 6 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, mw)
	runFor := map[string]time.Duration{
		"a": 1600 * time.Millisecond, // ends before its first renewal
		"b": 6500 * time.Millisecond, // renewed at 3, 5 and 7 (started at 1)
		"c": 2500 * time.Millisecond, // started when the queue has long been empty
		"d": 5500 * time.Millisecond, // its first renewal fails
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(runFor[r.Header.Get("Idempotency-Key")])
		w.WriteHeader(http.StatusCreated)
	}))
	var wg sync.WaitGroup
	start := func(key string) {
		wg.Go(func() {
			r := httptest.NewRequest(http.MethodPost, "/x", nil)
			r.Header.Set("Idempotency-Key", key)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusCreated {
				t.Errorf("key %s: %d", key, w.Code)
			}
		})
	}
	at := func(d time.Duration) { time.Sleep(d - time.Since(s.t0)) }
	start("a")
	at(time.Second)
	start("b")
	at(20 * time.Second)
	start("c")
	at(30 * time.Second)
	start("d")
	wg.Wait()

	sec := func(ss ...float64) []time.Duration {
		var ds []time.Duration
		for _, x := range ss {
			ds = append(ds, time.Duration(x*float64(time.Second)))
		}
		return ds
	}
	want := map[string][]time.Duration{
		"b": sec(3, 5, 7),
		"c": sec(22),
		"d": sec(32, 33, 35), // failed at 32, tried again a second later, then every two
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, key := range []string{"a", "b", "c", "d"} {
		if got := s.times[key]; !slices.Equal(got, want[key]) {
			t.Errorf("key %s renewed at %v, want %v", key, got, want[key])
		}
	}
}
