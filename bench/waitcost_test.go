package bench

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// TestWaiterMemory measures what a duplicate waiting for its key (ConflictWait, the
// gateway's default) holds in memory: its request and response, its goroutine's stack,
// its body (1 KiB here; counted in MaxBodyMemory) and the wait's own state, at the
// process-wide ceiling, DefaultMaxWaiters (1024), spread over keys within
// DefaultMaxWaitersPerKey. Past the ceiling a duplicate gets 409 with Retry-After and
// holds nothing. The bound asserted, 64 KiB a waiter, keeps the default ceiling's
// waiters under 64 MiB, beside --max-body-memory's 256 MiB.
//
//	cd bench && go test -run TestWaiterMemory -v
func TestWaiterMemory(t *testing.T) {
	const keys, perKey = 8, idempotency.DefaultMaxWaiters / 8
	body := `{"pad":"` + strings.Repeat("x", 1000) + `"}`
	synctest.Test(t, func(t *testing.T) {
		mw, err := idempotency.New(idempotency.Config{Store: memstore.New(), Conflict: idempotency.ConflictWait,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = mw.Shutdown(context.Background()) }()
		release := make(chan struct{})
		var mu sync.Mutex
		seen := map[string]bool{}
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			first := !seen[r.Header.Get("Idempotency-Key")]
			seen[r.Header.Get("Idempotency-Key")] = true
			mu.Unlock()
			if first {
				<-release
			}
			w.WriteHeader(http.StatusCreated)
		}))
		codes := make(chan int, keys*(perKey+2))
		send := func(key string) {
			r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(body))
			r.Header.Set("Idempotency-Key", key)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			codes <- w.Code
		}
		for k := range keys {
			go send("k" + strconv.Itoa(k))
		}
		synctest.Wait() // the owners hold their keys
		before := inUse()
		for k := range keys {
			for range perKey {
				go send("k" + strconv.Itoa(k))
			}
		}
		synctest.Wait() // every duplicate is waiting
		if n := mw.Waiting(); n != keys*perKey {
			t.Fatalf("%d waiting, want %d", n, keys*perKey)
		}
		per := (inUse() - before) / uint64(keys*perKey)
		t.Logf("%d waiters: %d bytes each (request, recorder, goroutine, %d-byte body, wait state)", keys*perKey, per, len(body))
		if per > 64<<10 {
			t.Errorf("%d bytes a waiter, want at most 64 KiB", per)
		}
		go send("k0") // past the ceiling
		if code := <-codes; code != http.StatusConflict {
			t.Errorf("past the ceiling: %d, want 409", code)
		}
		close(release)
		for range keys * (perKey + 1) {
			if code := <-codes; code != http.StatusCreated {
				t.Errorf("a waiter or an owner got %d, want 201", code)
			}
		}
	})
}

// inUse is the heap and stack memory in use, after a collection.
func inUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}
