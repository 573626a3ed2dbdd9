package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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

var errDown = errors.New("store unreachable")

// elapse lets d pass on the clock of the test's synctest bubble, then waits until every
// goroutine of the bubble is blocked again. Inside a bubble time is virtual: the sleep
// takes no real time and only moves the clock on, firing in order every timer due
// meanwhile (renewals, probes, retries of held answers); once elapse returns, what those
// timers started has run as far as it can. Call it from the bubble's one goroutine that
// waits on synctest (the test's, or a store call the test makes on it).
func elapse(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// outage is a store whose every call fails while its network is down: the link
// between the middleware and the store, cut.
type outage struct {
	idempotency.Store
	down *atomic.Bool
}

func (o outage) fail(ctx context.Context) error {
	if o.down.Load() {
		return errDown
	}
	return ctx.Err()
}

func (o outage) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := o.fail(ctx); err != nil {
		return idempotency.ClaimResult{}, err
	}
	return o.Store.Claim(ctx, r)
}

func (o outage) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error {
	if err := o.fail(ctx); err != nil {
		return err
	}
	return o.Store.Extend(ctx, scope, key, token, lease)
}

func (o outage) Complete(ctx context.Context, c idempotency.Completion) error {
	if err := o.fail(ctx); err != nil {
		return err
	}
	return o.Store.Complete(ctx, c)
}

func (o outage) Ping(ctx context.Context) error { return o.fail(ctx) }

// post sends a keyed POST to h and returns the recorder.
func post(h http.Handler, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// seenWriter records whether anything of the response reached the client.
type seenWriter struct {
	http.ResponseWriter
	seen atomic.Bool
}

func (w *seenWriter) WriteHeader(code int) { w.seen.Store(true); w.ResponseWriter.WriteHeader(code) }
func (w *seenWriter) Write(p []byte) (int, error) {
	w.seen.Store(true)
	return w.ResponseWriter.Write(p)
}

// completeHook calls before on every Complete.
type completeHook struct {
	idempotency.Store
	before func()
}

func (s completeHook) Complete(ctx context.Context, c idempotency.Completion) error {
	s.before()
	return s.Store.Complete(ctx, c)
}

// TestResponseHeldUntilStored: the client sees nothing of an answer before it is
// stored, so a client never holds an answer its retry could not get again.
func TestResponseHeldUntilStored(t *testing.T) {
	t.Parallel()
	w := &seenWriter{ResponseWriter: httptest.NewRecorder()}
	var completes atomic.Int64
	store := completeHook{Store: memstore.New(), before: func() {
		completes.Add(1)
		if w.seen.Load() {
			t.Error("the client saw the answer before it was stored")
		}
	}}
	mw, err := idempotency.New(idempotency.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, mw) })
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("paid"))
		w.(http.Flusher).Flush()
	}))
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
	r.Header.Set("Idempotency-Key", "k")
	h.ServeHTTP(w, r)
	rec := w.ResponseWriter.(*httptest.ResponseRecorder)
	if completes.Load() != 1 || rec.Code != http.StatusCreated || rec.Body.String() != "paid" || rec.Header().Get("Content-Length") != "4" {
		t.Errorf("completes %d, answer %d %q %v", completes.Load(), rec.Code, rec.Body, rec.Header())
	}
}

// TestLargeResponseStoredWhenPastTheLimit: an answer larger than the stored-response
// limit is completed (without its body) as soon as it passes the limit, while the
// handler still writes, and Claim.Stored says so.
func TestLargeResponseStoredWhenPastTheLimit(t *testing.T) {
	t.Parallel()
	var e *env
	e = newEnv(t, func(c *idempotency.Config) { c.MaxResponse = 64 }, func(w http.ResponseWriter, r *http.Request) {
		c, _ := idempotency.ClaimFromContext(r.Context())
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(bytes.Repeat([]byte("a"), 50))
		if rec, _ := e.store.Get(r.Context(), "", "k"); rec.State != idempotency.StateInProgress {
			t.Errorf("stored before the limit was passed: %+v", rec)
		}
		_, _ = w.Write(bytes.Repeat([]byte("b"), 50))
		select {
		case <-c.Stored():
		default:
			t.Error("Claim.Stored not closed after the limit was passed")
		}
		if rec, _ := e.store.Get(r.Context(), "", "k"); rec.State != idempotency.StateDone || !rec.Response.BodyOmitted {
			t.Errorf("not completed without its body once past the limit: %+v", rec)
		}
		_, _ = w.Write(bytes.Repeat([]byte("c"), 50))
	})
	w := e.do(http.MethodPost, "/x", "{}", withKey("k"))
	if w.Code != http.StatusCreated || w.Body.Len() != 150 {
		t.Errorf("client got %d and %d bytes, want 201 and 150", w.Code, w.Body.Len())
	}
}

// TestStoreDownAtCompletion: the store is unreachable when the answer is to be stored.
// The client gets its answer; a retry that reaches this process meanwhile is answered
// from the held answer, never executed; once the store answers, the answer is stored.
func TestStoreDownAtCompletion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		store := memstore.New()
		var outcomes []idempotency.Outcome
		var mu sync.Mutex
		mw, err := idempotency.New(idempotency.Config{Store: outage{store, &down}, Lease: 3 * time.Second,
			Logger:    slog.New(slog.DiscardHandler),
			OnOutcome: func(_ *http.Request, o idempotency.Outcome) { mu.Lock(); outcomes = append(outcomes, o); mu.Unlock() }})
		if err != nil {
			t.Fatal(err)
		}
		runs := 0
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			down.Store(true) // the link to the store breaks while the handler works
			w.WriteHeader(http.StatusCreated)
			_, _ = fmt.Fprintf(w, "payment %d", runs)
		}))
		if w := post(h, "k", "{}"); w.Code != http.StatusCreated || w.Body.String() != "payment 1" {
			t.Fatalf("first: %d %q", w.Code, w.Body)
		}
		elapse(10 * time.Second) // the outage lasts longer than the lease
		w := post(h, "k", "{}")
		if runs != 1 || w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "payment 1" {
			t.Fatalf("retry during the outage: %d %q %v, %d runs", w.Code, w.Body, w.Header(), runs)
		}
		if w := post(h, "k", `{"other":1}`); w.Code != http.StatusUnprocessableEntity {
			t.Errorf("another request under the held key: %d, want 422", w.Code)
		}
		down.Store(false)
		elapse(2 * time.Second) // the held answer is retried at least every second
		rec, err := store.Get(context.Background(), "", "k")
		if err != nil || rec.State != idempotency.StateDone || string(rec.Response.Body) != "payment 1" {
			t.Fatalf("after the store came back: %+v, %v; want the answer stored", rec, err)
		}
		if w := post(h, "k", "{}"); runs != 1 || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry after the store came back: %d %v, %d runs", w.Code, w.Header(), runs)
		}
		if err := mw.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if outcomes[0] != idempotency.OutcomeStoredLater {
			t.Errorf("outcomes %v, want stored-later first", outcomes)
		}
	})
}

// TestShutdownReportsUnstored: answers still held when Shutdown's time runs out are
// logged by key, and Shutdown says how many there were.
func TestShutdownReportsUnstored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		var logs bytes.Buffer
		var logMu sync.Mutex
		mw, err := idempotency.New(idempotency.Config{Store: outage{memstore.New(), &down},
			Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))})
		if err != nil {
			t.Fatal(err)
		}
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			down.Store(true)
			w.WriteHeader(http.StatusCreated)
		}))
		post(h, "held-key", "{}")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = mw.Shutdown(ctx)
		if err == nil || !strings.Contains(err.Error(), "1 responses not stored") {
			t.Errorf("Shutdown = %v, want an error counting 1 response", err)
		}
		logMu.Lock()
		defer logMu.Unlock()
		if !strings.Contains(logs.String(), "not stored before shutdown") || !strings.Contains(logs.String(), "held-key") {
			t.Errorf("log does not name the key:\n%s", logs.String())
		}
	})
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// holdingReplica returns a replica's middleware over store and its handler, which
// answers 201, counts the executions of key "k" in runs, and holds the first of them
// until release is closed.
func holdingReplica(t *testing.T, store idempotency.Store, lease time.Duration, runs *atomic.Int64, release <-chan struct{}) (*idempotency.Middleware, http.Handler) {
	t.Helper()
	mw, err := idempotency.New(idempotency.Config{Store: store, Lease: lease, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return mw, mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "k" && runs.Add(1) == 1 {
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	}))
}

// TestNoTakeoverAfterAnOutage: two replicas on one store, which goes away for longer
// than the lease while replica A runs a request. When it returns, replica B must not
// take the key over beside A (whose heartbeats failed meanwhile): it answers 409 until A
// has had a lease to renew. B either knew of the outage (its probe saw it), or knows
// nothing recent (no probe yet), or was not running (started after the store returned:
// a process knows nothing of the lease before its first claim); all three hold back.
// Once B has heard the store answer for a lease, a dead owner's key is taken over.
func TestNoTakeoverAfterAnOutage(t *testing.T) {
	for _, tc := range []struct {
		name        string
		warm, later bool
	}{{"B probing", true, false}, {"B not probing", false, false}, {"B started after the outage", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const lease = 3 * time.Second
				var down atomic.Bool
				store := memstore.New()
				var runs atomic.Int64
				release := make(chan struct{})
				newReplica := func() (*idempotency.Middleware, http.Handler) {
					return holdingReplica(t, outage{store, &down}, lease, &runs, release)
				}
				mwA, a := newReplica()
				var mwB *idempotency.Middleware
				var b http.Handler
				if !tc.later {
					mwB, b = newReplica()
				}
				if tc.warm {
					post(b, "warm-up", "{}") // starts B's probe
				}
				first := make(chan int)
				go func() { first <- post(a, "k", "{}").Code }()
				synctest.Wait()
				down.Store(true)
				elapse(3 * lease)
				down.Store(false)
				if tc.later {
					mwB, b = newReplica()
					elapse(lease / 10)
				}
				if w := post(b, "k", "{}"); w.Code != http.StatusConflict {
					t.Errorf("retry on B after the outage: %d, want 409", w.Code)
				}
				close(release)
				if code := <-first; code != http.StatusCreated {
					t.Errorf("A: %d", code)
				}
				if w := post(b, "k", "{}"); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
					t.Errorf("retry on B after A finished: %d %v", w.Code, w.Header())
				}
				if runs.Load() != 1 {
					t.Errorf("%d executions of the key, want 1", runs.Load())
				}
				// Once the store has answered for a lease, a dead owner's key is taken over.
				if _, err := store.Claim(context.Background(), idempotency.ClaimRequest{Key: "dead", Fingerprint: fingerprintOf("{}"), Lease: time.Second, TTL: time.Hour}); err != nil {
					t.Fatal(err)
				}
				elapse(2 * lease)
				if w := post(b, "dead", "{}"); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
					t.Errorf("takeover of a dead owner's key a lease after the outage: %d", w.Code)
				}
				for _, mw := range []*idempotency.Middleware{mwA, mwB} {
					if err := mw.Shutdown(context.Background()); err != nil {
						t.Error(err)
					}
				}
			})
		})
	}
}

func fingerprintOf(body string) string {
	return idempotency.Fingerprint(http.MethodPost, "/pay", "", "", []byte(body), false)
}

// TestConflictRetryAfter: a 409 for a key whose owner is working says "soon"; for a key
// whose owner gave up (abandoned), when its lease ends.
func TestConflictRetryAfter(t *testing.T) {
	t.Parallel()
	var abandon atomic.Bool
	e := newEnv(t, nil, func(w http.ResponseWriter, r *http.Request) {
		if abandon.Load() {
			c, _ := idempotency.ClaimFromContext(r.Context())
			c.Abandon()
			w.WriteHeader(http.StatusGatewayTimeout)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	abandon.Store(true)
	wantStatus(t, e.do(http.MethodPost, "/x", "{}", withKey("gone")), http.StatusGatewayTimeout)
	e.clock.Advance(10 * time.Second)
	w := e.do(http.MethodPost, "/x", "{}", withKey("gone"))
	if w.Code != http.StatusConflict || w.Header().Get("Retry-After") != "20" {
		t.Errorf("409 for an abandoned key 10s into a 30s lease: %d Retry-After %q, want 20", w.Code, w.Header().Get("Retry-After"))
	}
	// A live owner: claimed by someone else, still working.
	if _, err := e.store.Claim(context.Background(), idempotency.ClaimRequest{Key: "busy", Fingerprint: fingerprintOf("{}"), Lease: 30 * time.Second, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
	r.Header.Set("Idempotency-Key", "busy")
	rw := httptest.NewRecorder()
	e.h.ServeHTTP(rw, r)
	if rw.Code != http.StatusConflict || rw.Header().Get("Retry-After") != "1" {
		t.Errorf("409 for a working owner: %d Retry-After %q, want 1", rw.Code, rw.Header().Get("Retry-After"))
	}
}

// blockingClaim is a store whose Claim waits for its context, as a claim waiting for a
// pool connection does.
type blockingClaim struct{ idempotency.Store }

func (blockingClaim) Claim(ctx context.Context, _ idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	<-ctx.Done()
	return idempotency.ClaimResult{}, ctx.Err()
}

// TestClientGoneDuringClaim: a client that leaves while its claim waits is reported as
// gone, not as a store failure (no ERROR log, no 503 counted against the store).
func TestClientGoneDuringClaim(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var mu sync.Mutex
	var got idempotency.Outcome
	mw, err := idempotency.New(idempotency.Config{Store: blockingClaim{memstore.New()},
		Logger:    slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)),
		OnOutcome: func(_ *http.Request, o idempotency.Outcome) { got = o }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, mw) })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	for _, c := range []struct {
		ctx  context.Context
		want idempotency.Outcome
	}{{ctx, idempotency.OutcomeDeadline}, {canceled(), idempotency.OutcomeClientGone}} {
		r := httptest.NewRequestWithContext(c.ctx, http.MethodPost, "/pay", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", "k")
		mw.Handler(http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), r)
		if got != c.want {
			t.Errorf("outcome %q, want %q", got, c.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a client that left was logged as an error:\n%s", logs.String())
	}
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// TestBodyMemoryCeiling: a request whose body would pass the ceiling on body bytes in
// memory is answered 503 with Retry-After before anything is claimed.
func TestBodyMemoryCeiling(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e := newEnv(t, func(c *idempotency.Config) { c.MaxBody = 100; c.MaxBodyMemory = 100 }, func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() {
			close(entered)
			<-release
		})
		w.WriteHeader(http.StatusCreated)
	})
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- e.do(http.MethodPost, "/x", strings.Repeat("a", 80), withKey("big")) }()
	<-entered
	w := e.do(http.MethodPost, "/x", strings.Repeat("b", 30), withKey("second"))
	wantProblem(t, w, http.StatusServiceUnavailable, idempotency.ProblemOverloaded)
	if w.Header().Get("Retry-After") == "" {
		t.Error("no Retry-After on the 503")
	}
	if _, err := e.store.Get(context.Background(), "", "second"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("a refused request claimed its key: %v", err)
	}
	close(release)
	wantStatus(t, <-done, http.StatusCreated)
	wantStatus(t, e.do(http.MethodPost, "/x", strings.Repeat("b", 30), withKey("second")), http.StatusCreated)
}

// slowBody delivers its bytes only after the request's deadline has passed.
type slowBody struct {
	ctx  context.Context
	data io.Reader
}

func (b slowBody) Read(p []byte) (int, error) {
	<-b.ctx.Done()
	return b.data.Read(p)
}

// TestDeadlinePassesWhileTheBodyArrives: a request whose deadline passes while its body
// arrives is a 504 of its own kind, not a store failure.
func TestDeadlinePassesWhileTheBodyArrives(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/pay", slowBody{ctx, strings.NewReader("{}")})
	r.Header.Set("Idempotency-Key", "k")
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	wantProblem(t, w, http.StatusGatewayTimeout, idempotency.ProblemDeadlineExceeded)
	if e.runs.Load() != 0 {
		t.Error("the handler ran")
	}
}

// TestFingerprintUsesTheEscapedPath: /pay/x%2Fy and /pay/x/y are two requests.
func TestFingerprintUsesTheEscapedPath(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	wantStatus(t, e.do(http.MethodPost, "/pay/x%2Fy", "{}", withKey("k")), http.StatusCreated)
	wantProblem(t, e.do(http.MethodPost, "/pay/x/y", "{}", withKey("k")), http.StatusUnprocessableEntity, idempotency.ProblemMismatch)
}

// TestNonCanonicalMethod: "post" is refused rather than let through unkeyed.
func TestNonCanonicalMethod(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	for _, m := range []string{"post", "Post", "pATCH"} {
		wantProblem(t, e.do(m, "/pay", "{}", withKey("k")), http.StatusBadRequest, idempotency.ProblemInvalidMethod)
		wantProblem(t, e.do(m, "/pay", "{}"), http.StatusBadRequest, idempotency.ProblemInvalidMethod)
	}
	wantStatus(t, e.do("get", "/pay", ""), http.StatusCreated) // not a keyed method in any case
	if e.runs.Load() != 1 {
		t.Errorf("%d runs, want 1", e.runs.Load())
	}
}

// TestTrailersReplayed: trailers are stored and replayed after the body.
func TestTrailersReplayed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("data"))
		w.Header().Set("X-Sum", "\xde\xad")
		w.Header().Set(http.TrailerPrefix+"X-Late", "late")
	})
	for i, want := range []string{"", "true"} {
		res := e.do(http.MethodPost, "/x", "{}", withKey("k")).Result()
		b, _ := io.ReadAll(res.Body)
		if string(b) != "data" || res.Header.Get("Idempotent-Replayed") != want ||
			res.Trailer.Get("X-Sum") != "\xde\xad" || res.Trailer.Get("X-Late") != "late" {
			t.Errorf("answer %d: %q %v trailer %q", i, b, res.Header, res.Trailer)
		}
		if res.Header.Get("X-Sum") != "" {
			t.Errorf("answer %d: the trailer was sent as a header too", i)
		}
	}
}

// lateTakeover delays every claim that may take a key over: a partition that holds the
// claim, or a client library that sends it again once the link is back.
type lateTakeover struct {
	*memstore.Store // a Pinger: the probe keeps the middleware in touch
	delay           time.Duration
}

func (s lateTakeover) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if !r.NoTakeover {
		elapse(s.delay) // the claim reaches the store delay late
	}
	return s.Store.Claim(ctx, r)
}

// TestLateTakeoverTakesNothing: a takeover claim that reaches the store late takes
// nothing over: it was decided on what its sender knew when it sent it.
func TestLateTakeoverTakesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 3 * time.Second
		store := memstore.New()
		late := &lateTakeover{Store: store, delay: lease}
		mw, err := idempotency.New(idempotency.Config{Store: late, Lease: lease, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		runs := 0
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			w.WriteHeader(http.StatusCreated)
		}))
		post(h, "warm-up", "{}") // starts the store probe, which keeps the middleware in touch
		// An owner claimed the key and went silent; its lease has run out.
		if _, err := store.Claim(context.Background(), idempotency.ClaimRequest{Key: "k", Fingerprint: fingerprintOf("{}"), Lease: lease, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		elapse(lease + time.Second)
		runs = 0
		if w := post(h, "k", "{}"); w.Code != http.StatusConflict || runs != 0 {
			t.Errorf("a takeover delivered a lease late: %d, %d runs; want 409 and none", w.Code, runs)
		}
		// Delivered in time, once the store has answered promptly for a lease, it takes over.
		late.delay = 0
		elapse(2 * lease)
		if w := post(h, "k", "{}"); w.Code != http.StatusCreated || runs != 1 {
			t.Errorf("a takeover in time: %d, %d runs; want 201 and 1", w.Code, runs)
		}
		if err := mw.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
}

// TestShortBodyNeitherStoredNorWhole: a handler whose body falls short of its declared
// Content-Length gave an answer cut short: it is not stored (the key is left to its
// lease), and the client does not get it as a whole one.
func TestShortBodyNeitherStoredNorWhole(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	mw, err := idempotency.New(idempotency.Config{Store: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, mw) })
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("only part"))
	})))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "short")
	res, err := http.DefaultClient.Do(req)
	if err == nil {
		var b []byte
		b, err = io.ReadAll(res.Body)
		res.Body.Close()
		if err == nil {
			t.Errorf("the client got %d %q as a whole answer", res.StatusCode, b)
		}
	}
	rec, err := store.Get(context.Background(), "", "short")
	if err != nil || rec.State != idempotency.StateInProgress || !rec.Abandoned {
		t.Errorf("record %+v, %v; want in progress, abandoned", rec, err)
	}
}

// lostLease is a store on which every renewal finds the key taken over.
type lostLease struct{ *memstore.Store }

func (lostLease) Extend(context.Context, string, string, int64, time.Duration) error {
	return idempotency.ErrLeaseLost
}

// TestDetach: the work a handler detaches outlives its client, and ends when the key is
// taken over.
func TestDetach(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 3 * time.Second
		for _, lost := range []bool{false, true} {
			var store idempotency.Store = memstore.New()
			if lost {
				store = lostLease{memstore.New()}
			}
			mw, err := idempotency.New(idempotency.Config{Store: store, Lease: lease, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			var cause error
			working := make(chan struct{}) // closed once the handler has detached its work
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ctx, cancel := idempotency.Detach(r.Context())
				defer cancel()
				close(working)
				if ctx.Done() == r.Context().Done() {
					t.Error("Detach returned the request's own context")
				}
				select {
				case <-ctx.Done():
					cause = context.Cause(ctx)
				case <-time.After(2 * lease): // the client left long ago
				}
				w.WriteHeader(http.StatusCreated)
			}))
			ctx, leave := context.WithCancel(context.Background())
			r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/pay", strings.NewReader("{}"))
			r.Header.Set("Idempotency-Key", "k")
			go func() {
				<-working // the client leaves while the detached work runs
				leave()
			}()
			h.ServeHTTP(httptest.NewRecorder(), r)
			switch {
			case !lost && cause != nil:
				t.Errorf("the detached work ended with %v when its client left", cause)
			case lost && !errors.Is(cause, idempotency.ErrLeaseLost):
				t.Errorf("the detached work of a key taken over ended with %v, want ErrLeaseLost", cause)
			}
			if err := mw.Shutdown(context.Background()); err != nil {
				t.Error(err)
			}
		}
		// Without a claim, the context is the caller's own.
		ctx := context.Background()
		if d, cancel := idempotency.Detach(ctx); d != ctx {
			t.Error("Detach without a claim changed the context")
		} else {
			cancel()
		}
	})
}

// TestDoneThenAborted: a handler that completes its key (in its transaction) and then
// panics is reported as what happened: stored, then aborted; its retry replays.
func TestDoneThenAborted(t *testing.T) {
	t.Parallel()
	var got idempotency.Outcome
	var runs atomic.Int64
	var e *env
	e = newEnv(t, func(c *idempotency.Config) {
		c.OnOutcome = func(_ *http.Request, o idempotency.Outcome) { got = o }
	}, func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) > 1 {
			t.Error("the handler ran again")
		}
		c, _ := idempotency.ClaimFromContext(r.Context())
		resp := idempotency.Response{Status: http.StatusCreated, Header: http.Header{}, Body: []byte("paid")}
		if err := e.store.Complete(r.Context(), c.Completion(resp)); err != nil { // as WithTx does
			t.Fatal(err)
		}
		c.MarkCompleted()
		panic(http.ErrAbortHandler)
	})
	func() {
		defer func() { _ = recover() }()
		e.do(http.MethodPost, "/x", "{}", withKey("k"))
	}()
	if got != idempotency.OutcomeDoneAborted {
		t.Errorf("outcome %q, want %q", got, idempotency.OutcomeDoneAborted)
	}
	if w := e.do(http.MethodPost, "/x", "{}", withKey("k")); w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "paid" {
		t.Errorf("retry: %d %v %q", w.Code, w.Header(), w.Body)
	}
}

// TestHijack: a keyed request's writer is an http.Hijacker that refuses (its response is
// stored), so an unchecked assertion gets an error, not a panic; an unkeyed request's
// writer is the server's own, and hijacks.
func TestHijack(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.Config{Store: memstore.New(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, mw) })
	errs := make(chan error, 2)
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := w.(http.Hijacker).Hijack()
		errs <- err
		if err == nil {
			_, _ = io.WriteString(c, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
			_ = c.Close()
			return
		}
		w.WriteHeader(http.StatusConflict)
	})))
	defer srv.Close()
	for _, keyed := range []bool{true, false} {
		method := http.MethodGet
		if keyed {
			method = http.MethodPost
		}
		req, _ := http.NewRequest(method, srv.URL, strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		herr := <-errs
		switch {
		case keyed && !errors.Is(herr, idempotency.ErrHijackKeyed):
			t.Errorf("keyed Hijack: %v, want ErrHijackKeyed", herr)
		case !keyed && (herr != nil || res.StatusCode != http.StatusNoContent):
			t.Errorf("unkeyed Hijack: %v, status %d", herr, res.StatusCode)
		}
	}
}

// completeTwice is a store whose Complete is sent twice, as a client library resends a
// script whose answer was lost: the first stores, the second finds it done.
type completeTwice struct{ *memstore.Store }

func (s completeTwice) Complete(ctx context.Context, c idempotency.Completion) error {
	if err := s.Store.Complete(ctx, c); err != nil {
		return err
	}
	return s.Store.Complete(ctx, c) // ErrLeaseLost: already done
}

// TestCompletionSentTwice: a completion that the store took, but whose answer says the
// lease was lost (it was sent again), is reported as executed, not as lost.
func TestCompletionSentTwice(t *testing.T) {
	t.Parallel()
	var got idempotency.Outcome
	mw, err := idempotency.New(idempotency.Config{Store: completeTwice{memstore.New()}, Logger: slog.New(slog.DiscardHandler),
		OnOutcome: func(_ *http.Request, o idempotency.Outcome) { got = o }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, mw) })
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	if w := post(h, "k", "{}"); w.Code != http.StatusCreated || got != idempotency.OutcomeExecuted {
		t.Errorf("%d, outcome %q; want 201 and executed", w.Code, got)
	}
}
