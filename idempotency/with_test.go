package idempotency_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

var discard = slog.New(slog.DiscardHandler)

// created answers 201 with body, counting its runs.
func created(runs *atomic.Int64, body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprint(w, body)
	})
}

// deadOwner claims key in store as an owner elsewhere that then went silent: its lease
// of a second runs out and is never renewed.
func deadOwner(t *testing.T, store idempotency.Store, key string) {
	t.Helper()
	if _, err := store.Claim(context.Background(), idempotency.ClaimRequest{Key: key, Fingerprint: fingerprintOf("{}"), Lease: time.Second, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
}

// TestWithSharesHeldResponses: a response A holds because the store could not take it
// answers a retry that arrives through B (made from A by With), and B's Shutdown waits
// for it to be stored: the held responses are the group's.
func TestWithSharesHeldResponses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		store := memstore.New()
		a, err := idempotency.New(idempotency.Config{Store: outage{store, &down}, Lease: 3 * time.Second, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		defer shutdown(t, a)
		b, err := a.With(idempotency.Config{Lease: 3 * time.Second, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		defer shutdown(t, b) // the group's Shutdown; A's, deferred above, then has nothing left to do
		var runs atomic.Int64
		ha := a.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			down.Store(true) // the link to the store breaks while the handler works
			w.WriteHeader(http.StatusCreated)
			_, _ = fmt.Fprint(w, "paid through A")
		}))
		hb := b.Handler(created(&runs, "paid through B"))
		if w := post(ha, "k", "{}"); w.Code != http.StatusCreated {
			t.Fatalf("A: %d %q", w.Code, w.Body)
		}
		elapse(10 * time.Second) // the outage outlasts the lease
		w := post(hb, "k", "{}")
		if runs.Load() != 1 || w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "paid through A" {
			t.Fatalf("retry through B during the outage: %d %q %v, %d runs; want A's held answer replayed", w.Code, w.Body, w.Header(), runs.Load())
		}
		down.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := b.Shutdown(ctx); err != nil {
			t.Errorf("B's Shutdown: %v", err)
		}
		rec, err := store.Get(context.Background(), "", "k")
		if err != nil || rec.State != idempotency.StateDone || string(rec.Response.Body) != "paid through A" {
			t.Errorf("after B's Shutdown: %+v, %v; want A's held answer stored", rec, err)
		}
	})
}

// TestWithSharesHealth: B, made from A after A saw the store fail, holds takeovers back
// as A does, for a lease after the failure: a fresh view of the store would take over
// the key of an owner that could not renew during the outage.
func TestWithSharesHealth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 3 * time.Second
		var down atomic.Bool
		store := memstore.New()
		a, err := idempotency.New(idempotency.Config{Store: outage{store, &down}, Lease: lease, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		defer shutdown(t, a)
		var runs atomic.Int64
		ha := a.Handler(created(&runs, "A"))
		deadOwner(t, store, "k")
		down.Store(true)
		if w := post(ha, "other", "{}"); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("A during the outage: %d, want 503", w.Code)
		}
		down.Store(false)
		elapse(2 * time.Second) // k's lease has run out; A saw the failure less than a lease ago
		b, err := a.With(idempotency.Config{Lease: lease, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		defer shutdown(t, b)
		hb := b.Handler(created(&runs, "B"))
		if w := post(hb, "k", "{}"); w.Code != http.StatusConflict || runs.Load() != 0 {
			t.Fatalf("B within a lease of the failure A saw: %d, %d runs; want 409 and none", w.Code, runs.Load())
		}
		elapse(lease)
		if w := post(hb, "k", "{}"); w.Code != http.StatusCreated || w.Body.String() != "B" {
			t.Errorf("B a lease after the failure: %d %q; want the dead owner's key taken over", w.Code, w.Body)
		}
	})
}

// TestWithSharesBodyMemory: MaxBodyMemory bounds the process: a body A holds counts
// against a request through B.
func TestWithSharesBodyMemory(t *testing.T) {
	t.Parallel()
	a, err := idempotency.New(idempotency.Config{Store: memstore.New(), MaxBody: 100, MaxBodyMemory: 100, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, a) })
	b, err := a.With(idempotency.Config{MaxBody: 100, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, b) })
	if got := b.Config().MaxBodyMemory; got != 100 {
		t.Errorf("B's MaxBodyMemory = %d, want A's, 100", got)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	ha := a.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		w.WriteHeader(http.StatusCreated)
	}))
	var runs atomic.Int64
	hb := b.Handler(created(&runs, "B"))
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- post(ha, "big", strings.Repeat("a", 80)) }()
	<-entered
	wantProblem(t, post(hb, "second", strings.Repeat("b", 30)), http.StatusServiceUnavailable, idempotency.ProblemOverloaded)
	close(release)
	wantStatus(t, <-done, http.StatusCreated)
	wantStatus(t, post(hb, "second", strings.Repeat("b", 30)), http.StatusCreated)
	if runs.Load() != 1 {
		t.Errorf("B ran %d times, want 1", runs.Load())
	}
}

// TestWithWakesWaitersAcrossMiddlewares: a duplicate waiting through B (ConflictWait) is
// woken the instant A's owner of the key finishes, not when its poll of the store comes
// round; and Waiting counts the group's waiters.
func TestWithWakesWaitersAcrossMiddlewares(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &countingStore{Store: memstore.New()}
		a, err := idempotency.New(idempotency.Config{Store: store, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		defer shutdown(t, a)
		b, err := a.With(idempotency.Config{Conflict: idempotency.ConflictWait, WaitTimeout: time.Minute, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		defer shutdown(t, b)
		entered, release := make(chan struct{}), make(chan struct{})
		ha := a.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release
			w.WriteHeader(http.StatusCreated)
			_, _ = fmt.Fprint(w, "paid")
		}))
		var runs atomic.Int64
		hb := b.Handler(created(&runs, "B"))
		first := make(chan *httptest.ResponseRecorder, 1)
		go func() { first <- post(ha, "k", "{}") }()
		<-entered
		answer := make(chan *httptest.ResponseRecorder, 1)
		go func() { answer <- post(hb, "k", "{}") }()
		synctest.Wait()
		if a.Waiting() != 1 || b.Waiting() != 1 {
			t.Errorf("Waiting: A %d, B %d; want the group's one waiter on both", a.Waiting(), b.Waiting())
		}
		elapse(5 * time.Second) // the waiter's poll has backed off to its longest interval
		claims, now := store.calls.Load(), time.Now()
		close(release)
		synctest.Wait() // everything the owner's end set going has run; no time has passed
		var w *httptest.ResponseRecorder
		select {
		case w = <-answer:
		default:
			t.Error("the waiter through B was not woken when A's owner finished")
			w = <-answer // its poll of the store finds the answer later
		}
		if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "paid" {
			t.Errorf("the waiter through B: %d %q %v; want A's answer replayed", w.Code, w.Body, w.Header())
		}
		if n := store.calls.Load() - claims; n != 1 || !time.Now().Equal(now) {
			t.Errorf("%d claims and %s after the owner finished; want the waiter's one claim, at once", n, time.Since(now))
		}
		wantStatus(t, <-first, http.StatusCreated)
		if runs.Load() != 0 || a.Waiting() != 0 {
			t.Errorf("B ran %d times, %d still waiting; want none", runs.Load(), a.Waiting())
		}
	})
}

// TestWithWaiterBounds: MaxWaiters bounds the group's waiters together, and each
// middleware's MaxWaitersPerKey is checked against all the waiters of the key.
func TestWithWaiterBounds(t *testing.T) {
	for _, c := range []struct {
		name   string
		a, b   idempotency.Config
		aAgain bool // whether one more duplicate through A still waits
	}{
		{"MaxWaiters is the group's", idempotency.Config{MaxWaiters: 1}, idempotency.Config{}, false},
		{"MaxWaitersPerKey is each one's", idempotency.Config{}, idempotency.Config{MaxWaitersPerKey: 1}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c.a.Store, c.a.Conflict, c.a.Logger = memstore.New(), idempotency.ConflictWait, discard
				a, err := idempotency.New(c.a)
				if err != nil {
					t.Fatal(err)
				}
				defer shutdown(t, a)
				c.b.Conflict, c.b.Logger = idempotency.ConflictWait, discard
				b, err := a.With(c.b)
				if err != nil {
					t.Fatal(err)
				}
				defer shutdown(t, b)
				entered, release := make(chan struct{}), make(chan struct{})
				var once sync.Once
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					once.Do(func() {
						close(entered)
						<-release
					})
					w.WriteHeader(http.StatusCreated)
				})
				ha, hb := a.Handler(h), b.Handler(h)
				answers := make(chan *httptest.ResponseRecorder, 3)
				go func() { answers <- post(ha, "k", "{}") }()
				<-entered
				go func() { answers <- post(ha, "k", "{}") }() // waits through A
				synctest.Wait()
				start := time.Now()
				if w := post(hb, "k", "{}"); w.Code != http.StatusConflict || time.Since(start) != 0 {
					t.Errorf("a duplicate through B past the bound: %d after %s, want 409 at once", w.Code, time.Since(start))
				}
				go func() { answers <- post(ha, "k", "{}") }()
				synctest.Wait()
				want := 1
				if c.aAgain {
					want = 2
				}
				if n := b.Waiting(); n != want {
					t.Errorf("%d waiting after one more duplicate through A, want %d", n, want)
				}
				close(release)
				for range 3 {
					<-answers
				}
			})
		})
	}
}

// uncomparableStore is a store whose values cannot be compared with ==.
type uncomparableStore struct {
	*memstore.Store
	_ func()
}

// TestWithConfig: what With refuses, and what the middleware it returns takes from its
// origin and what from its own Config.
func TestWithConfig(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	a, err := idempotency.New(idempotency.Config{Store: store, MaxWaiters: 10, Logger: discard,
		OnOutcome: func(*http.Request, idempotency.Outcome) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, a) })
	small, err := idempotency.New(idempotency.Config{Store: store, MaxBody: 100, MaxBodyMemory: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, small) })
	odd, err := idempotency.New(idempotency.Config{Store: uncomparableStore{Store: store}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, odd) })
	for _, c := range []struct {
		name string
		from *idempotency.Middleware
		cfg  idempotency.Config
	}{
		{"another store", a, idempotency.Config{Store: memstore.New()}},
		{"another MaxBodyMemory", a, idempotency.Config{MaxBodyMemory: 1 << 20}},
		{"another MaxWaiters", a, idempotency.Config{MaxWaiters: 11}},
		{"negative lease", a, idempotency.Config{Lease: -1}},
		{"ttl <= lease", a, idempotency.Config{Lease: time.Hour, TTL: time.Minute}},
		{"bad key header", a, idempotency.Config{KeyHeader: "Bad Header"}},
		{"unknown conflict policy", a, idempotency.Config{Conflict: "queue"}},
		{"MaxBody over the shared MaxBodyMemory", small, idempotency.Config{}},
		{"an uncomparable store", odd, idempotency.Config{Store: uncomparableStore{Store: store}}},
	} {
		if _, err := c.from.With(c.cfg); err == nil || !strings.HasPrefix(err.Error(), "idempotency: ") {
			t.Errorf("%s: With = %v, want an idempotency: error", c.name, err)
		}
	}

	b, err := a.With(idempotency.Config{Store: store, MaxWaiters: 10, Lease: time.Minute, Methods: []string{"put"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, b) })
	got := b.Config()
	if got.Store != idempotency.Store(store) || got.MaxWaiters != 10 || got.MaxBodyMemory != idempotency.DefaultMaxBodyMemory {
		t.Errorf("B's store %v, MaxWaiters %d, MaxBodyMemory %d; want A's", got.Store, got.MaxWaiters, got.MaxBodyMemory)
	}
	if got.Lease != time.Minute || len(got.Methods) != 1 || got.Methods[0] != http.MethodPut || got.TTL != idempotency.DefaultTTL {
		t.Errorf("B's Lease %s, Methods %v, TTL %s; want its own, with New's defaults", got.Lease, got.Methods, got.TTL)
	}
	if got.Logger != slog.Default() || got.OnOutcome != nil || got.MaxWaitersPerKey != idempotency.DefaultMaxWaitersPerKey {
		t.Error("B took A's Logger or OnOutcome, or not the default MaxWaitersPerKey")
	}
	if _, err := small.With(idempotency.Config{MaxBody: 100, MaxBodyMemory: 100}); err != nil {
		t.Errorf("With the same MaxBodyMemory: %v", err)
	}
}

// TestWithMixedLeasesHoldBackForTheLongest: with middlewares of a 3s and a 30s lease over
// one store, a failure holds takeovers back for 30s, through either: the 30s owner needs
// that long to be sure of a renewal once the store answers again.
func TestWithMixedLeasesHoldBackForTheLongest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		store := memstore.New()
		a, err := idempotency.New(idempotency.Config{Store: outage{store, &down}, Lease: 3 * time.Second, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		defer shutdown(t, a)
		b, err := a.With(idempotency.Config{Lease: 30 * time.Second, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		defer shutdown(t, b)
		var runs atomic.Int64
		ha := a.Handler(created(&runs, "A"))
		deadOwner(t, store, "k")
		down.Store(true)
		if w := post(ha, "other", "{}"); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("during the outage: %d, want 503", w.Code)
		}
		down.Store(false)
		elapse(5 * time.Second) // past A's lease since the failure, within the 30s one
		if w := post(ha, "k", "{}"); w.Code != http.StatusConflict || runs.Load() != 0 {
			t.Fatalf("5s after the failure: %d, %d runs; want 409 and none", w.Code, runs.Load())
		}
		elapse(30 * time.Second)
		if w := post(ha, "k", "{}"); w.Code != http.StatusCreated || runs.Load() != 1 {
			t.Errorf("a longest lease after the failure: %d, %d runs; want the key taken over", w.Code, runs.Load())
		}
	})
}

// pingCounter counts the probe's pings.
type pingCounter struct {
	*memstore.Store
	mu    sync.Mutex
	pings int
}

func (p *pingCounter) Ping(ctx context.Context) error {
	p.mu.Lock()
	p.pings++
	p.mu.Unlock()
	return p.Store.Ping(ctx)
}

// TestWithShorterLeaseSpeedsTheProbe: a middleware with a shorter lease joining a running
// probe brings it to a third of that lease at once. Contact with the store is judged by
// the shortest lease, so a probe left at the longer period would count every gap
// between its pings as an outage and never let a dead owner's key be taken over.
func TestWithShorterLeaseSpeedsTheProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &pingCounter{Store: memstore.New()}
		a, err := idempotency.New(idempotency.Config{Store: store, Lease: 30 * time.Second, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		defer shutdown(t, a)
		var runs atomic.Int64
		post(a.Handler(created(&runs, "A")), "warm-up", "{}") // starts the probe, every 10s
		elapse(30 * time.Second)                              // A's first lease, in which it takes nothing over
		b, err := a.With(idempotency.Config{Lease: 3 * time.Second, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		defer shutdown(t, b) // the group's Shutdown; A's, deferred above, then has nothing left to do
		deadOwner(t, store, "k")
		store.mu.Lock()
		before := store.pings
		store.mu.Unlock()
		elapse(12 * time.Second)
		store.mu.Lock()
		pings := store.pings - before
		store.mu.Unlock()
		if pings < 12 {
			t.Errorf("%d pings in 12s, want one a second (a third of the shortest lease)", pings)
		}
		if w := post(b.Handler(created(&runs, "B")), "k", "{}"); w.Code != http.StatusCreated || w.Body.String() != "B" {
			t.Errorf("a dead owner's key, the store answering throughout: %d %q; want it taken over", w.Code, w.Body)
		}
	})
}

// TestRouteFilesRecords: the records a middleware claims are filed under its
// Config.Route, and one made with With files them under its own, not its root's.
func TestRouteFilesRecords(t *testing.T) {
	store := memstore.New()
	a, err := idempotency.New(idempotency.Config{Store: store, Route: "POST /payments", Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, a)
	b, err := a.With(idempotency.Config{Route: "POST /refunds", Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	none, err := a.With(idempotency.Config{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	for key, m := range map[string]*idempotency.Middleware{"pay": a, "refund": b, "none": none} {
		r := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		m.Handler(created(&runs, "ok")).ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			t.Fatalf("%s: %d", key, w.Code)
		}
	}
	for key, want := range map[string]string{"pay": "POST /payments", "refund": "POST /refunds", "none": ""} {
		rec, err := store.Get(context.Background(), "", key)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Route != want {
			t.Errorf("%s: Route = %q, want %q", key, rec.Route, want)
		}
	}
}
