package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// fakeClock is a settable clock for lease and expiry cases.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// countingStore counts store calls, to prove which requests touch the store.
type countingStore struct {
	idempotency.Store
	calls atomic.Int64
}

func (s *countingStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	s.calls.Add(1)
	return s.Store.Claim(ctx, r)
}

type env struct {
	store *memstore.Store
	clock *fakeClock
	h     http.Handler
	runs  atomic.Int64
}

// newEnv wraps a handler that counts its runs and answers 201 with a body naming the run.
func newEnv(t *testing.T, mod func(*idempotency.Config), h http.HandlerFunc) *env {
	t.Helper()
	e := &env{clock: &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}}
	e.store = memstore.NewWithClock(e.clock.Now)
	if h == nil {
		h = func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Add("Link", "</a>; rel=a")
			w.Header().Add("Link", "</b>; rel=b")
			w.Header().Add("Set-Cookie", "session=s1; Path=/; HttpOnly")
			w.Header().Add("Set-Cookie", "theme=dark")
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(map[string]any{"run": e.runs.Load(), "echo": string(body)})
		}
	}
	cfg := idempotency.Config{Store: e.store}
	if mod != nil {
		mod(&cfg)
	}
	mw, err := idempotency.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, mw) })
	e.h = mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.runs.Add(1)
		h(w, r)
	}))
	return e
}

// shutdown stops mw's background work, failing t if a response was left unstored.
func shutdown(t *testing.T, mw *idempotency.Middleware) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := mw.Shutdown(ctx); err != nil {
		t.Error(err)
	}
}

type reqOpt func(*http.Request)

func withKey(k string) reqOpt  { return func(r *http.Request) { r.Header.Set("Idempotency-Key", k) } }
func withAuth(a string) reqOpt { return func(r *http.Request) { r.Header.Set("Authorization", a) } }

func (e *env) do(method, path, body string, opts ...reqOpt) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	for _, o := range opts {
		o(r)
	}
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	return w
}

func wantStatus(t *testing.T, w *httptest.ResponseRecorder, status int) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body %s", w.Code, status, w.Body)
	}
}

func wantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, typ string) idempotency.Problem {
	t.Helper()
	wantStatus(t, w, status)
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json", ct)
	}
	var p idempotency.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	if p.Status != status || p.Type != typ || p.Title == "" {
		t.Errorf("problem = %+v, want status %d type %s", p, status, typ)
	}
	return p
}

func TestBadKeys(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		values []string
	}{
		{"empty", []string{""}},
		{"blank", []string{"   "}},
		{"empty quoted", []string{`""`}},
		{"256 characters", []string{strings.Repeat("a", 256)}},
		{"256 characters quoted", []string{`"` + strings.Repeat("a", 256) + `"`}},
		{"control character", []string{"abc\x01def"}},
		{"tab inside", []string{"abc\tdef"}},
		{"space inside", []string{"abc def"}},
		{"DEL", []string{"abc\x7f"}},
		{"non-ASCII", []string{"clé"}},
		{"unterminated quote", []string{`"abc`}},
		{"bad escape", []string{`"a\bc"`}},
		{"bare quote inside", []string{`"a"b"`}},
		{"two headers", []string{"a", "b"}},
		{"lone quote", []string{`"`}},
		{"list", []string{`a,b`}},
		{"list of strings", []string{`"a", "b"`}},
		{"parameters", []string{`"a";p=1`}},
		{"bare with quote", []string{`a"b`}},
		{"bare with backslash", []string{`a\b`}},
		{"bare with semicolon", []string{`a;b`}},
		{"garbage after the string", []string{`"a" b`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil, nil)
			r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
			r.Header["Idempotency-Key"] = c.values
			w := httptest.NewRecorder()
			e.h.ServeHTTP(w, r)
			wantProblem(t, w, http.StatusBadRequest, idempotency.ProblemInvalidKey)
			if e.runs.Load() != 0 {
				t.Error("handler ran for an invalid key")
			}
		})
	}
}

func TestMissingKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	wantProblem(t, e.do(http.MethodPost, "/pay", "{}"), http.StatusBadRequest, idempotency.ProblemMissingKey)
	wantProblem(t, e.do(http.MethodPatch, "/pay/1", "{}"), http.StatusBadRequest, idempotency.ProblemMissingKey)
	if e.runs.Load() != 0 {
		t.Error("handler ran without a required key")
	}

	opt := newEnv(t, func(c *idempotency.Config) { c.KeyOptional = true }, nil)
	wantStatus(t, opt.do(http.MethodPost, "/pay", "{}"), http.StatusCreated)
	wantStatus(t, opt.do(http.MethodPost, "/pay", "{}"), http.StatusCreated)
	if opt.runs.Load() != 2 {
		t.Errorf("optional key: handler ran %d times, want 2 (no protection without a key)", opt.runs.Load())
	}
}

func TestValidKeyBoundaries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	for _, k := range []string{"a", strings.Repeat("z", 255), "!~#$%&'()*+-./:<=>?@[]^_`{|}",
		`"!~#$%&'()*+,-./:;<=>?@[]^_` + "`" + `{|}\"\\"`, `"` + strings.Repeat("q", 255) + `"`, ` "padded" `} {
		wantStatus(t, e.do(http.MethodPost, "/pay", "{}", withKey(k)), http.StatusCreated)
	}
}

func TestQuotedAndBareKeysAreOneKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	first := e.do(http.MethodPost, "/pay", `{"amount":1}`, withKey("abc-123"))
	wantStatus(t, first, http.StatusCreated)
	second := e.do(http.MethodPost, "/pay", `{"amount":1}`, withKey(`"abc-123"`))
	wantStatus(t, second, http.StatusCreated)
	if second.Header().Get("Idempotent-Replayed") != "true" || e.runs.Load() != 1 {
		t.Errorf("quoted form did not replay the bare form's response (runs %d)", e.runs.Load())
	}
	// Escapes inside the quoted form are part of the key: "a\"b" is a"b, not ab.
	e.do(http.MethodPost, "/pay", `{}`, withKey(`"a\"b"`))
	if w := e.do(http.MethodPost, "/pay", `{}`, withKey(`"a\"b"`)); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Error(`"a\"b" is not the same key twice`)
	}
	if w := e.do(http.MethodPost, "/pay", `{}`, withKey(`"ab"`)); w.Header().Get("Idempotent-Replayed") == "true" {
		t.Error(`"ab" replayed the answer of "a\"b"`)
	}
}

func TestReplay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	first := e.do(http.MethodPost, "/pay?x=1", `{"amount":100}`, withKey("k1"))
	wantStatus(t, first, http.StatusCreated)
	if first.Header().Get("Idempotent-Replayed") != "" {
		t.Error("first execution marked as replayed")
	}
	for range 3 {
		again := e.do(http.MethodPost, "/pay?x=1", `{"amount":100}`, withKey("k1"))
		wantStatus(t, again, http.StatusCreated)
		if got := again.Header().Get("Idempotent-Replayed"); got != "true" {
			t.Errorf("Idempotent-Replayed = %q", got)
		}
		if again.Body.String() != first.Body.String() {
			t.Errorf("replayed body %q, want %q", again.Body, first.Body)
		}
		if got := again.Header().Values("Link"); len(got) != 2 || got[1] != "</b>; rel=b" {
			t.Errorf("multi-valued header not kept: %q", got)
		}
		if got := again.Header().Values("Set-Cookie"); !slices.Equal(got, []string{"session=s1; Path=/; HttpOnly", "theme=dark"}) {
			t.Errorf("replayed Set-Cookie = %q, want both, in order", got)
		}
		if again.Header().Get("Content-Type") != "application/json" {
			t.Errorf("Content-Type = %q", again.Header().Get("Content-Type"))
		}
	}
	if e.runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", e.runs.Load())
	}
}

func TestMismatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	wantStatus(t, e.do(http.MethodPost, "/pay", `{"amount":100}`, withKey("k")), http.StatusCreated)
	wantProblem(t, e.do(http.MethodPost, "/pay", `{"amount":999}`, withKey("k")), http.StatusUnprocessableEntity, idempotency.ProblemMismatch)
	// The same key on another route is a mismatch, never the other route's response.
	wantProblem(t, e.do(http.MethodPost, "/refund", `{"amount":100}`, withKey("k")), http.StatusUnprocessableEntity, idempotency.ProblemMismatch)
	wantProblem(t, e.do(http.MethodPost, "/pay?dry=1", `{"amount":100}`, withKey("k")), http.StatusUnprocessableEntity, idempotency.ProblemMismatch)
	wantProblem(t, e.do(http.MethodPatch, "/pay", `{"amount":100}`, withKey("k")), http.StatusUnprocessableEntity, idempotency.ProblemMismatch)
	if e.runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", e.runs.Load())
	}
}

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idempotency.Config) { c.CanonicalJSON = true }, nil)
	wantStatus(t, e.do(http.MethodPost, "/pay", `{"a":1,"b":[1,2]}`, withKey("k")), http.StatusCreated)
	w := e.do(http.MethodPost, "/pay", "{ \"b\": [1, 2],\n \"a\": 1 }", withKey("k"))
	if w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("reordered JSON did not replay: %d %s", w.Code, w.Body)
	}
	wantStatus(t, e.do(http.MethodPost, "/pay", `{"a":1.0,"b":[1,2]}`, withKey("k")), http.StatusUnprocessableEntity)

	raw := newEnv(t, nil, nil)
	raw.do(http.MethodPost, "/pay", `{"a":1,"b":2}`, withKey("k"))
	wantStatus(t, raw.do(http.MethodPost, "/pay", `{"b":2,"a":1}`, withKey("k")), http.StatusUnprocessableEntity)
}

func TestScopes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	a := e.do(http.MethodPost, "/pay", `{}`, withKey("k"), withAuth("Bearer alice"))
	b := e.do(http.MethodPost, "/pay", `{}`, withKey("k"), withAuth("Bearer bob"))
	anon := e.do(http.MethodPost, "/pay", `{}`, withKey("k"))
	for _, w := range []*httptest.ResponseRecorder{a, b, anon} {
		wantStatus(t, w, http.StatusCreated)
		if w.Header().Get("Idempotent-Replayed") != "" {
			t.Error("a response was replayed into another scope")
		}
	}
	if e.runs.Load() != 3 {
		t.Errorf("handler ran %d times, want 3 (one per scope)", e.runs.Load())
	}
	if w := e.do(http.MethodPost, "/pay", `{}`, withKey("k"), withAuth("Bearer bob")); w.Body.String() != b.Body.String() {
		t.Errorf("bob's replay = %s, want bob's response %s", w.Body, b.Body)
	}

	custom := newEnv(t, func(c *idempotency.Config) {
		c.Scope = func(r *http.Request) string { return r.Header.Get("X-Tenant") }
	}, nil)
	for _, tenant := range []string{"t1", "t2", "t1"} {
		custom.do(http.MethodPost, "/pay", `{}`, withKey("k"), func(r *http.Request) { r.Header.Set("X-Tenant", tenant) })
	}
	if custom.runs.Load() != 2 {
		t.Errorf("custom scope: handler ran %d times, want 2", custom.runs.Load())
	}
}

func TestUnkeyedMethodsNeverTouchTheStore(t *testing.T) {
	t.Parallel()
	cs := &countingStore{Store: memstore.New()}
	mw, err := idempotency.New(idempotency.Config{Store: cs})
	if err != nil {
		t.Fatal(err)
	}
	var runs int
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs++ }))
	for _, m := range []string{"GET", "HEAD", "PUT", "DELETE", "OPTIONS"} {
		r := httptest.NewRequest(m, "/x", nil)
		r.Header.Set("Idempotency-Key", "k")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	if cs.calls.Load() != 0 || runs != 5 {
		t.Errorf("store calls %d, runs %d; want 0 and 5", cs.calls.Load(), runs)
	}
	mw2, _ := idempotency.New(idempotency.Config{Store: cs, Methods: []string{"put"}})
	r := httptest.NewRequest("PUT", "/x", nil)
	w := httptest.NewRecorder()
	mw2.Handler(http.NotFoundHandler()).ServeHTTP(w, r)
	wantStatus(t, w, http.StatusBadRequest) // PUT is keyed now: key required
}

func TestBodyLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idempotency.Config) { c.MaxBody = 10 }, nil)
	wantStatus(t, e.do(http.MethodPost, "/pay", "0123456789", withKey("fits")), http.StatusCreated)
	wantProblem(t, e.do(http.MethodPost, "/pay", "0123456789X", withKey("big")), http.StatusRequestEntityTooLarge, idempotency.ProblemBodyTooLarge)
	// Without a Content-Length (chunked), the limit holds while reading.
	r := httptest.NewRequest(http.MethodPost, "/pay", io.MultiReader(strings.NewReader("01234"), strings.NewReader("56789XY")))
	r.ContentLength = -1
	r.Header.Set("Idempotency-Key", "chunked")
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	wantProblem(t, w, http.StatusRequestEntityTooLarge, idempotency.ProblemBodyTooLarge)
	for _, k := range []string{"big", "chunked"} {
		if _, err := e.store.Get(context.Background(), "", k); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("a record was stored for the oversized request %q: %v", k, err)
		}
	}
	if e.runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", e.runs.Load())
	}
}

func TestInFlightConflict(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	e := newEnv(t, nil, func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		w.WriteHeader(http.StatusCreated)
	})
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- e.do(http.MethodPost, "/pay", "{}", withKey("k")) }()
	<-entered
	w := e.do(http.MethodPost, "/pay", "{}", withKey("k"))
	wantProblem(t, w, http.StatusConflict, idempotency.ProblemInFlight)
	if w.Header().Get("Retry-After") == "" {
		t.Error("409 without Retry-After")
	}
	close(release)
	wantStatus(t, <-done, http.StatusCreated)
	wantStatus(t, e.do(http.MethodPost, "/pay", "{}", withKey("k")), http.StatusCreated)
	if e.runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", e.runs.Load())
	}
}

func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	// The first run holds its key until the duplicates have been answered, so that they
	// all arrive while it is in flight.
	release := make(chan struct{})
	var started atomic.Int64
	e := newEnv(t, nil, func(w http.ResponseWriter, r *http.Request) {
		if started.Add(1) == 1 {
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	})
	var wg sync.WaitGroup
	codes := make(chan int, 50)
	for range 50 {
		wg.Go(func() { codes <- e.do(http.MethodPost, "/pay", "{}", withKey("k")).Code })
	}
	// A duplicate of a key in flight is answered at once, so 49 answers come while the
	// first run holds the key. Should they not come, the first run is let go after 10s
	// and the statuses below say what the duplicates got.
	var got []int
	timeout := time.After(10 * time.Second)
answers:
	for len(got) < 49 {
		select {
		case c := <-codes:
			got = append(got, c)
		case <-timeout:
			break answers
		}
	}
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		got = append(got, c)
	}
	for _, c := range got {
		if c != http.StatusCreated && c != http.StatusConflict {
			t.Errorf("a duplicate got %d, want 201 (run or replay) or 409", c)
		}
	}
	if e.runs.Load() != 1 {
		t.Errorf("handler ran %d times for 50 duplicates, want 1", e.runs.Load())
	}
}

func TestStoredAndReleasedStatuses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status   int
		released bool
	}{
		{200, false}, {201, false}, {204, false}, {400, false}, {404, false}, {422, false},
		{500, false}, {502, false}, // the endpoint started executing: stored (Stripe's rule)
		{429, true}, {503, true}, // the work was not done: released
	}
	for _, c := range cases {
		status := c.status
		e := newEnv(t, nil, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(status)
		})
		wantStatus(t, e.do(http.MethodPost, "/x", "{}", withKey("k")), status)
		w := e.do(http.MethodPost, "/x", "{}", withKey("k"))
		wantStatus(t, w, status)
		replayed := w.Header().Get("Idempotent-Replayed") == "true"
		if replayed == c.released || (e.runs.Load() == 2) != c.released {
			t.Errorf("status %d: replayed=%v runs=%d, want released=%v", status, replayed, e.runs.Load(), c.released)
		}
	}
}

func TestImplicitOK(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(w http.ResponseWriter, r *http.Request) {})
	wantStatus(t, e.do(http.MethodPost, "/x", "{}", withKey("k")), http.StatusOK)
	w := e.do(http.MethodPost, "/x", "{}", withKey("k"))
	if w.Code != http.StatusOK || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay of an implicit 200: %d %v", w.Code, w.Header())
	}
}

func TestPanicReleasesKey(t *testing.T) {
	t.Parallel()
	var panics atomic.Bool
	panics.Store(true)
	e := newEnv(t, nil, func(w http.ResponseWriter, r *http.Request) {
		if panics.Load() {
			panic("boom")
		}
		w.WriteHeader(http.StatusCreated)
	})
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the handler's panic was swallowed")
			}
		}()
		e.do(http.MethodPost, "/x", "{}", withKey("k"))
	}()
	if _, err := e.store.Get(context.Background(), "", "k"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("key not released after a panic: %v", err)
	}
	panics.Store(false)
	wantStatus(t, e.do(http.MethodPost, "/x", "{}", withKey("k")), http.StatusCreated)
	if e.runs.Load() != 2 {
		t.Errorf("runs = %d, want 2", e.runs.Load())
	}
}

// A real server: the client disconnects while the handler runs. A handler that finishes
// its work anyway must have its response stored (the retry replays it); one that gives
// up without answering must release the key (the retry executes).
func TestClientDisconnects(t *testing.T) {
	t.Parallel()
	for _, finishes := range []bool{true, false} {
		name := map[bool]string{true: "handler finishes", false: "handler gives up"}[finishes]
		t.Run(name, func(t *testing.T) {
			entered := make(chan struct{}, 1)
			returned := make(chan struct{}, 1)
			store := memstore.New()
			var runs atomic.Int64
			// The middleware reports a request's outcome once it has stored or released
			// its key.
			outcomes := make(chan idempotency.Outcome, 2)
			mw, _ := idempotency.New(idempotency.Config{Store: store,
				OnOutcome: func(_ *http.Request, o idempotency.Outcome) { outcomes <- o }})
			srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() { returned <- struct{}{} }()
				n := runs.Add(1)
				if n > 1 {
					w.WriteHeader(http.StatusCreated)
					return
				}
				entered <- struct{}{}
				<-r.Context().Done() // the client is gone
				if finishes {
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write([]byte("paid"))
				}
			})))
			defer srv.Close()

			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.WriteString(conn, "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}")
			<-entered
			_ = conn.Close()
			<-returned

			// The completion or release runs after the handler; wait for the outcome,
			// which is reported after it.
			select {
			case <-outcomes:
			case <-time.After(10 * time.Second):
				t.Fatal("no outcome reported for the first request 10s after its handler returned")
			}
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader("{}"))
			req.Header.Set("Idempotency-Key", "k")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if finishes {
				if resp.Header.Get("Idempotent-Replayed") != "true" || string(body) != "paid" || runs.Load() != 1 {
					t.Errorf("retry after disconnect: %d %q replayed=%q runs=%d; want the stored response",
						resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"), runs.Load())
				}
			} else if resp.StatusCode != http.StatusCreated || runs.Load() != 2 {
				t.Errorf("retry after an abandoned request: %d runs=%d; want a new execution", resp.StatusCode, runs.Load())
			}
		})
	}
}

func TestPanicAfterAbandonKeepsKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(w http.ResponseWriter, r *http.Request) {
		c, _ := idempotency.ClaimFromContext(r.Context())
		c.Abandon()
		panic(http.ErrAbortHandler)
	})
	func() {
		defer func() { _ = recover() }()
		e.do(http.MethodPost, "/x", "{}", withKey("k"))
	}()
	rec, err := e.store.Get(context.Background(), "", "k")
	if err != nil || rec.State != idempotency.StateInProgress {
		t.Fatalf("record after an abandoned request panicked: %+v, %v; want in progress until its lease", rec, err)
	}
	wantStatus(t, e.do(http.MethodPost, "/x", "{}", withKey("k")), http.StatusConflict)
}

func TestLargeResponseKeepsKey(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("x"), 100)
	e := newEnv(t, func(c *idempotency.Config) { c.MaxResponse = 64 }, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(big[:50])
		_, _ = w.Write(big[50:])
	})
	first := e.do(http.MethodPost, "/x", "{}", withKey("k"))
	if first.Code != http.StatusCreated || first.Body.Len() != 100 {
		t.Fatalf("the client did not get the whole large response: %d, %d bytes", first.Code, first.Body.Len())
	}
	w := e.do(http.MethodPost, "/x", "{}", withKey("k"))
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" ||
		w.Header().Get("Idempotent-Body-Omitted") != "true" || w.Body.Len() != 0 {
		t.Errorf("replay of an unstored body: %d %v %d bytes", w.Code, w.Header(), w.Body.Len())
	}
	if e.runs.Load() != 1 {
		t.Errorf("handler ran %d times: a too-large response released the key", e.runs.Load())
	}
}

func TestLeaseTakeoverAfterCrash(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	// A process claimed the key and died: its record is in progress with a lease.
	fp := idempotency.Fingerprint(http.MethodPost, "/pay", "", "application/json", []byte("{}"), false)
	res, err := e.store.Claim(ctx, idempotency.ClaimRequest{Key: "k", Fingerprint: fp,
		Lease: 30 * time.Second, TTL: time.Hour})
	if err != nil || !res.Claimed {
		t.Fatal(res, err)
	}
	wantStatus(t, e.do(http.MethodPost, "/pay", "{}", withKey("k")), http.StatusConflict)
	e.clock.Advance(31 * time.Second)
	wantStatus(t, e.do(http.MethodPost, "/pay", "{}", withKey("k")), http.StatusCreated)
	// The dead owner's late completion is rejected; the new response stands.
	err = e.store.Complete(ctx, idempotency.Completion{Key: "k", Token: res.Token, Response: idempotency.Response{Status: 500}, TTL: time.Hour})
	if !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("stale completion: %v, want ErrLeaseLost", err)
	}
	w := e.do(http.MethodPost, "/pay", "{}", withKey("k"))
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("after takeover: %d", w.Code)
	}
}

// A handler slower than the lease keeps its key: the middleware renews the lease, so a
// retry in the meantime is told 409, never executed a second time.
//
// The test runs in a synctest bubble: the lease, its renewals and the store's clock are
// on the bubble's virtual time, so the handler outlasts three leases in no real time and
// no stall of the machine can make a renewal late.
func TestHeartbeatKeepsSlowHandlersLease(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testHeartbeatKeepsSlowHandlersLease)
}

func testHeartbeatKeepsSlowHandlersLease(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	store := memstore.New()
	// A lease of a second, renewed every third of it.
	mw, _ := idempotency.New(idempotency.Config{Store: store, Lease: time.Second})
	defer shutdown(t, mw) // the store probe's goroutine must end within the bubble
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(entered)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	}))
	do := func() int {
		r := httptest.NewRequest(http.MethodPost, "/x", nil)
		r.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	done := make(chan int)
	go func() { done <- do() }()
	<-entered
	elapse(3500 * time.Millisecond) // more than three leases
	if code := do(); code != http.StatusConflict {
		t.Errorf("retry during a slow handler got %d, want 409", code)
	}
	close(release)
	if code := <-done; code != http.StatusCreated {
		t.Errorf("slow handler's answer %d", code)
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", runs.Load())
	}
}

func TestClaimHandle(t *testing.T) {
	t.Parallel()
	type action func(*idempotency.Claim)
	cases := []struct {
		name  string
		act   action
		state idempotency.State // "" means released (no record)
	}{
		{"release", (*idempotency.Claim).Release, ""},
		{"abandon", (*idempotency.Claim).Abandon, idempotency.StateInProgress},
		{"none", func(*idempotency.Claim) {}, idempotency.StateDone},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil, func(w http.ResponseWriter, r *http.Request) {
				cl, ok := idempotency.ClaimFromContext(r.Context())
				if !ok || cl.Key != "k" || cl.Token <= 0 {
					t.Errorf("ClaimFromContext = %+v, %v", cl, ok)
					return
				}
				c.act(cl)
				w.WriteHeader(http.StatusCreated)
			})
			wantStatus(t, e.do(http.MethodPost, "/x", "{}", withKey("k")), http.StatusCreated)
			rec, err := e.store.Get(context.Background(), "", "k")
			switch {
			case c.state == "" && !errors.Is(err, idempotency.ErrNotFound):
				t.Errorf("record %+v, %v; want released", rec, err)
			case c.state != "" && (err != nil || rec.State != c.state):
				t.Errorf("record %+v, %v; want state %s", rec, err, c.state)
			}
		})
	}
	// MarkCompleted: the handler's own transaction completed the key; the middleware
	// must not complete it again (a second Complete would fail and be logged).
	var e *env
	e = newEnv(t, nil, func(w http.ResponseWriter, r *http.Request) {
		cl, _ := idempotency.ClaimFromContext(r.Context())
		resp := idempotency.Response{Status: http.StatusAccepted, Body: []byte("from tx")}
		if err := e.store.Complete(r.Context(), cl.Completion(resp)); err != nil {
			t.Error(err)
		}
		cl.MarkCompleted()
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte("from tx"))
	})
	wantStatus(t, e.do(http.MethodPost, "/x", "{}", withKey("k")), http.StatusAccepted)
	w := e.do(http.MethodPost, "/x", "{}", withKey("k"))
	if w.Code != http.StatusAccepted || w.Body.String() != "from tx" || e.runs.Load() != 1 {
		t.Errorf("replay after in-handler completion: %d %q runs %d", w.Code, w.Body, e.runs.Load())
	}
}

func TestFlusherAndResponseController(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(http.Flusher); !ok {
			t.Error("wrapped writer is not an http.Flusher")
		}
		_, _ = w.Write([]byte("part1 "))
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("ResponseController.Flush: %v", err)
		}
		_, _ = w.Write([]byte("part2"))
	})
	// A response is held until it is stored: a Flush before that sends nothing early.
	w := e.do(http.MethodPost, "/x", "{}", withKey("k"))
	if w.Flushed || w.Body.String() != "part1 part2" {
		t.Errorf("flushed=%v body=%q; want the whole body, sent once stored", w.Flushed, w.Body)
	}
	if again := e.do(http.MethodPost, "/x", "{}", withKey("k")); again.Body.String() != "part1 part2" {
		t.Errorf("replay of a flushed response: %q", again.Body)
	}
}

func TestHandlerSeesBody(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	w := e.do(http.MethodPost, "/x", `{"amount":7}`, withKey("k"))
	if !strings.Contains(w.Body.String(), `{\"amount\":7}`) {
		t.Errorf("handler did not receive the body: %s", w.Body)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]idempotency.Config{
		"no store":       {},
		"negative lease": {Store: memstore.New(), Lease: -1},
		"ttl <= lease":   {Store: memstore.New(), Lease: time.Hour, TTL: time.Minute},
	} {
		if _, err := idempotency.New(cfg); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}
