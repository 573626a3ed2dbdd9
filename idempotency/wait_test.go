package idempotency_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// waitFixture is a middleware with the wait policy in front of a handler that holds its
// first request until release is closed.
type waitFixture struct {
	mw       *idempotency.Middleware
	h        http.Handler
	entered  chan struct{}
	release  chan struct{}
	outcomes chan idempotency.Outcome
}

func newWaitFixture(t *testing.T, cfg idempotency.Config) *waitFixture {
	f := &waitFixture{entered: make(chan struct{}), release: make(chan struct{}), outcomes: make(chan idempotency.Outcome, 64)}
	cfg.Store, cfg.Conflict, cfg.Logger = memstore.New(), idempotency.ConflictWait, slog.New(slog.DiscardHandler)
	cfg.OnOutcome = func(_ *http.Request, o idempotency.Outcome) { f.outcomes <- o }
	mw, err := idempotency.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mw.Shutdown(context.Background()) })
	var once sync.Once
	f.mw = mw
	f.h = mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first := false
		once.Do(func() { first = true })
		if first {
			close(f.entered)
			<-f.release
		}
		w.WriteHeader(http.StatusCreated)
	}))
	return f
}

func (f *waitFixture) send(ctx context.Context) *httptest.ResponseRecorder {
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/pay", strings.NewReader("{}"))
	r.Header.Set("Idempotency-Key", "k")
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

// At WaitTimeout a waiting duplicate gets today's 409 with Retry-After; the first request
// still finishes, and a duplicate after it gets the replay.
func TestWaitBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newWaitFixture(t, idempotency.Config{WaitTimeout: 2 * time.Second})
		go f.send(t.Context())
		<-f.entered
		start := time.Now()
		w := f.send(t.Context())
		if w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
			t.Fatalf("at the bound: %d %v, want 409 with Retry-After", w.Code, w.Header())
		}
		if waited := time.Since(start); waited != 2*time.Second {
			t.Errorf("waited %s, want the bound, 2s", waited)
		}
		close(f.release)
		synctest.Wait()
		if w := f.send(t.Context()); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Errorf("after the first finished: %d %v, want the replay", w.Code, w.Header())
		}
	})
}

// The caps hold: past MaxWaitersPerKey a duplicate is answered 409 at once, and the
// waiters within the cap get the answer.
func TestWaitCaps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newWaitFixture(t, idempotency.Config{MaxWaitersPerKey: 2})
		go f.send(t.Context())
		<-f.entered
		answers := make(chan *httptest.ResponseRecorder, 5)
		for range 5 {
			go func() { answers <- f.send(t.Context()) }()
		}
		synctest.Wait() // every duplicate is waiting, or answered
		if n := f.mw.Waiting(); n != 2 {
			t.Fatalf("%d waiting, want the cap, 2", n)
		}
		for range 3 {
			if w := <-answers; w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
				t.Errorf("over the cap: %d %v, want 409 with Retry-After at once", w.Code, w.Header())
			}
		}
		close(f.release)
		for range 2 {
			if w := <-answers; w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("within the cap: %d %v, want the replay", w.Code, w.Header())
			}
		}
	})
}

// A waiter whose client leaves stops waiting at once and holds nothing.
func TestWaitClientLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newWaitFixture(t, idempotency.Config{})
		go f.send(t.Context())
		<-f.entered
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			f.send(ctx)
		}()
		synctest.Wait()
		if n := f.mw.Waiting(); n != 1 {
			t.Fatalf("%d waiting, want 1", n)
		}
		cancel()
		<-done
		if n := f.mw.Waiting(); n != 0 {
			t.Errorf("%d still waiting after the client left", n)
		}
		if o := <-f.outcomes; o != idempotency.OutcomeClientGone {
			t.Errorf("the waiter's outcome = %q, want %q", o, idempotency.OutcomeClientGone)
		}
		close(f.release)
	})
}

// The policy is opt-in: by default a duplicate of a request in progress gets 409 at once.
func TestWaitIsOptIn(t *testing.T) {
	cfg, err := idempotency.Config{}.Resolve()
	if err != nil || cfg.Conflict != idempotency.ConflictReject {
		t.Fatalf("default conflict policy = %q, %v; want reject", cfg.Conflict, err)
	}
	if _, err := (idempotency.Config{Conflict: "queue"}).Resolve(); err == nil {
		t.Error("an unknown conflict policy was accepted")
	}
}

// The process-wide cap holds as the per-key one does: past MaxWaiters, over all keys, a
// duplicate is answered 409 with Retry-After at once.
func TestWaitCapTotal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newWaitFixture(t, idempotency.Config{MaxWaiters: 3})
		go f.send(t.Context())
		<-f.entered
		answers := make(chan *httptest.ResponseRecorder, 4)
		for range 4 {
			go func() { answers <- f.send(t.Context()) }()
		}
		synctest.Wait()
		if n := f.mw.Waiting(); n != 3 {
			t.Fatalf("%d waiting, want the cap, 3", n)
		}
		if w := <-answers; w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
			t.Errorf("over the cap: %d %v, want 409 with Retry-After at once", w.Code, w.Header())
		}
		close(f.release)
		for range 3 {
			if w := <-answers; w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("within the cap: %d %v, want the replay", w.Code, w.Header())
			}
		}
	})
}

// A duplicate of a key its owner abandoned (outcome unknown), whose lease outlasts the
// wait, does not wait for nothing: 409 at once, Retry-After the rest of the lease.
func TestWaitAbandonedKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mw, err := idempotency.New(idempotency.Config{Store: memstore.New(), Conflict: idempotency.ConflictWait,
			Lease: 30 * time.Second, WaitTimeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = mw.Shutdown(context.Background()) }()
		runs := 0
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			c, _ := idempotency.ClaimFromContext(r.Context())
			c.Abandon()
			w.WriteHeader(http.StatusGatewayTimeout)
		}))
		send := func() *httptest.ResponseRecorder {
			r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/pay", strings.NewReader("{}"))
			r.Header.Set("Idempotency-Key", "k")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		if w := send(); w.Code != http.StatusGatewayTimeout {
			t.Fatalf("first: %d", w.Code)
		}
		start := time.Now()
		w := send()
		if w.Code != http.StatusConflict || w.Header().Get("Retry-After") != "30" {
			t.Errorf("duplicate of an abandoned key: %d %v, want 409 with Retry-After: 30", w.Code, w.Header())
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("waited %s for a key that cannot move within the wait", waited)
		}
		if runs != 1 {
			t.Errorf("%d executions, want 1", runs)
		}
	})
}
