package idempotencytest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// waitDuplicates is how many duplicates of one request testWaitReplicas sends while the
// first runs, spread over two replicas.
const waitDuplicates = 50

// testWaitReplicas checks the wait conflict policy on s shared by two middlewares (two
// replicas): duplicates of a request in progress, on the owner's replica and on the
// other, all wait and then get its answer, replayed; the handler runs once. The other
// replica's waiters learn of the end through the store alone.
func testWaitReplicas(t *testing.T, s idempotency.Store) {
	var executions atomic.Int64
	entered, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := executions.Add(1)
		if n == 1 {
			close(entered)
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, n)
	})
	replica := func() *idempotency.Middleware {
		mw, err := idempotency.New(idempotency.Config{Store: s, Conflict: idempotency.ConflictWait,
			WaitTimeout: time.Minute, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = mw.Shutdown(context.Background()) })
		return mw
	}
	a, b := replica(), replica()
	ha, hb := a.Handler(h), b.Handler(h)
	send := func(h http.Handler) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Idempotency-Key", "wait-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	answers := make([]*httptest.ResponseRecorder, waitDuplicates+1)
	var wg sync.WaitGroup
	wg.Go(func() { answers[0] = send(ha) })
	<-entered
	for i := 1; i <= waitDuplicates; i++ {
		h := ha
		if i%2 == 0 {
			h = hb
		}
		wg.Go(func() { answers[i] = send(h) })
	}
	// Every duplicate is waiting (none answered 409) before the first is let go.
	deadline := time.Now().Add(30 * time.Second)
	for a.Waiting()+b.Waiting() < waitDuplicates {
		if time.Now().After(deadline) {
			close(release)
			wg.Wait()
			t.Fatalf("%d of %d duplicates waiting after 30s", a.Waiting()+b.Waiting(), waitDuplicates)
		}
		time.Sleep(5 * time.Millisecond) // polls the counters; nothing waits on this
	}
	close(release)
	wg.Wait()
	if n := executions.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
	replayed := 0
	for i, w := range answers {
		body, _ := io.ReadAll(w.Body)
		if w.Code != http.StatusCreated || string(body) != `{"payment":1}` {
			t.Errorf("answer %d: %d %q, want 201 {\"payment\":1}", i, w.Code, body)
		}
		if w.Header().Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	if replayed != waitDuplicates {
		t.Errorf("%d answers replayed, want %d (every duplicate)", replayed, waitDuplicates)
	}
	if a.Waiting()+b.Waiting() != 0 {
		t.Errorf("%d still waiting", a.Waiting()+b.Waiting())
	}
}
