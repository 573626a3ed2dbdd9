package retry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/harness/memnet"
)

// The four ways a call fails. Each server fails the first two executions that way and
// answers 200 to the third.
//
// The read timeout runs in a synctest bubble over in-memory connections: the
// AttemptTimeout's timer is virtual, so it fires only once the server's handler has run
// and is waiting, however slowly a loaded machine gets there. A reset needs a real TCP
// connection (an RST), so the other failures run over loopback, where the AttemptTimeout
// is only an outer bound that no attempt comes near.
func TestTransportFourFailures(t *testing.T) {
	t.Parallel()
	failures := []struct {
		name    string
		fail    func(t *testing.T, w http.ResponseWriter, r *http.Request)
		virtual bool // in a synctest bubble, with a virtual AttemptTimeout of 1s
	}{
		{"read timeout", func(t *testing.T, w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done() // never answers: the client's AttemptTimeout ends it
		}, true},
		{"reset mid-response", func(t *testing.T, w http.ResponseWriter, r *http.Request) {
			hijack(t, w, "HTTP/1.1 200 OK\r\nContent-Le", true)
		}, false},
		{"response lost", func(t *testing.T, w http.ResponseWriter, r *http.Request) {
			hijack(t, w, "", false) // the work is done (counted), the answer never comes
		}, false},
	}
	requests := []struct {
		name     string
		method   string
		key      string
		autoKey  bool
		wantExec int // server-side executions
	}{
		{name: "GET", method: http.MethodGet, wantExec: 3},
		{name: "PUT", method: http.MethodPut, wantExec: 3},
		{name: "POST without key", method: http.MethodPost, wantExec: 1},
		{name: "PATCH without key", method: http.MethodPatch, wantExec: 1},
		{name: "POST with key", method: http.MethodPost, key: "k-1", wantExec: 3},
		{name: "POST with AutoKey", method: http.MethodPost, autoKey: true, wantExec: 3},
	}
	for _, f := range failures {
		for _, rq := range requests {
			check := func(t *testing.T, srv *script, base *counting, attemptTimeout time.Duration) {
				tr := &Transport{Base: base, Policy: testPolicy(newFakeClock()), AutoKey: rq.autoKey, AttemptTimeout: attemptTimeout}
				req := newRequest(t, context.Background(), rq.method, srv.URL, `{"amount":100}`)
				if rq.key != "" {
					req.Header.Set(IdempotencyKeyHeader, rq.key)
				}
				resp, err := tr.RoundTrip(req)
				if got := srv.Executions(); got != rq.wantExec {
					t.Errorf("server executions = %d, want %d", got, rq.wantExec)
				}
				if rq.wantExec == 1 {
					// Written, then lost: never resent blindly.
					if !errors.Is(err, ErrUnknownOutcome) || !errors.Is(err, ErrPlatform) {
						t.Fatalf("err = %v, want ErrUnknownOutcome and ErrPlatform", err)
					}
					if f.name == "read timeout" && !errors.Is(err, ErrAttemptTimeout) {
						t.Errorf("err = %v, want ErrAttemptTimeout", err)
					}
					if base.Attempts() != 1 {
						t.Errorf("attempts = %d, want 1", base.Attempts())
					}
					return
				}
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				if body := readBody(t, resp); resp.StatusCode != 200 || body != "ok" {
					t.Errorf("got %d %q", resp.StatusCode, body)
				}
				for i, b := range srv.Bodies() {
					if b != `{"amount":100}` && f.name != "read timeout" {
						t.Errorf("execution %d got body %q", i+1, b)
					}
				}
				if rq.key != "" || rq.autoKey {
					keys := base.Keys()
					if len(keys) != 3 || keys[0] == "" || keys[0] != keys[1] || keys[1] != keys[2] {
						t.Errorf("keys = %q, want one key on every attempt", keys)
					}
				}
			}
			handler := func(t *testing.T) func(n int, w http.ResponseWriter, r *http.Request) {
				return func(n int, w http.ResponseWriter, r *http.Request) {
					if n <= 2 {
						f.fail(t, w, r)
						return
					}
					io.WriteString(w, "ok")
				}
			}
			t.Run(f.name+"/"+rq.name, func(t *testing.T) {
				t.Parallel()
				if !f.virtual {
					check(t, newScript(t, handler(t)), newBase(t), time.Minute)
					return
				}
				synctest.Test(t, func(t *testing.T) {
					l := memnet.New()
					check(t, newMemScript(t, l, handler(t)), newMemBase(t, l), time.Second)
				})
			})
		}
	}
}

// A refused connection never left the client: every method is retried, POST without a
// key included.
func TestTransportConnectRefused(t *testing.T) {
	t.Parallel()
	addr := closedAddr(t)
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			base := newBase(t)
			tr := &Transport{Base: base, Policy: testPolicy(newFakeClock())}
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), method, "http://"+addr+"/x", "body"))
			if resp != nil {
				t.Fatalf("got a response %d", resp.StatusCode)
			}
			var ex *ExhaustedError
			if !errors.As(err, &ex) || ex.Attempts != 3 {
				t.Fatalf("err = %v, want an *ExhaustedError after 3 attempts", err)
			}
			for _, target := range []error{ErrMaxAttempts, ErrPlatform, syscall.ECONNREFUSED} {
				if !errors.Is(err, target) {
					t.Errorf("err = %v, does not match %v", err, target)
				}
			}
			if errors.Is(err, ErrUnknownOutcome) {
				t.Errorf("a refused request has a known outcome")
			}
			if base.Attempts() != 3 {
				t.Errorf("attempts = %d, want 3", base.Attempts())
			}
		})
	}
}

func TestTransportStatuses(t *testing.T) {
	t.Parallel()
	type answer struct {
		status int
		header map[string]string
	}
	ok := answer{status: 200}
	tests := []struct {
		name      string
		method    string
		ctx       func(context.Context) context.Context
		answers   []answer // by execution; the last repeats
		wantExec  int
		wantCode  int
		wantWaits []time.Duration
		wantAuth  int
	}{
		{name: "401 auth", answers: []answer{{status: 401}}, wantExec: 1, wantCode: 401, wantAuth: 1},
		{name: "403 auth", answers: []answer{{status: 403}}, wantExec: 1, wantCode: 403, wantAuth: 1},
		{name: "404 not found", answers: []answer{{status: 404}}, wantExec: 1, wantCode: 404},
		{name: "404 as success", answers: []answer{{status: 404}}, wantExec: 1, wantCode: 404,
			ctx: func(ctx context.Context) context.Context { return WithStatusClass(ctx, 404, nil) }},
		{name: "404 as platform failure", answers: []answer{{status: 404}}, wantExec: 3, wantCode: 404,
			wantWaits: []time.Duration{0, 0},
			ctx:       func(ctx context.Context) context.Context { return WithStatusClass(ctx, 404, ErrPlatform) }},
		{name: "200 as auth failure", answers: []answer{ok}, wantExec: 1, wantCode: 200, wantAuth: 1,
			ctx: func(ctx context.Context) context.Context { return WithStatusClass(ctx, 200, ErrAuth) }},
		{name: "422 invalid", answers: []answer{{status: 422}}, wantExec: 1, wantCode: 422},
		{name: "429 Retry-After seconds", answers: []answer{{status: 429, header: map[string]string{"Retry-After": "2"}}, ok},
			wantExec: 2, wantCode: 200, wantWaits: []time.Duration{2 * time.Second}},
		{name: "503 Retry-After date", answers: []answer{{status: 503, header: map[string]string{"Retry-After": "+7s"}}, ok},
			wantExec: 2, wantCode: 200, wantWaits: []time.Duration{7 * time.Second}},
		{name: "503 X-RateLimit-Reset epoch", answers: []answer{{status: 503, header: map[string]string{"X-RateLimit-Reset": "+3s epoch"}}, ok},
			wantExec: 2, wantCode: 200, wantWaits: []time.Duration{3 * time.Second}},
		{name: "429 Retry-After too long", answers: []answer{{status: 429, header: map[string]string{"Retry-After": "3600"}}},
			wantExec: 1, wantCode: 429},
		{name: "409 Retry-After", answers: []answer{{status: 409, header: map[string]string{"Retry-After": "1"}}, {status: 201}},
			wantExec: 2, wantCode: 201, wantWaits: []time.Duration{time.Second}},
		{name: "409 without Retry-After", answers: []answer{{status: 409}}, wantExec: 1, wantCode: 409},
		{name: "503 always", answers: []answer{{status: 503}}, wantExec: 3, wantCode: 503, wantWaits: []time.Duration{0, 0}},
		{name: "503 POST without key", method: http.MethodPost, answers: []answer{{status: 503}}, wantExec: 1, wantCode: 503},
		{name: "429 POST without key", method: http.MethodPost, answers: []answer{{status: 429, header: map[string]string{"Retry-After": "1"}}}, wantExec: 1, wantCode: 429},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock()
			srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) {
				a := tc.answers[min(n, len(tc.answers))-1]
				for k, v := range a.header {
					switch {
					case strings.HasSuffix(v, "s epoch"):
						d, _ := time.ParseDuration(strings.TrimSuffix(v, " epoch"))
						v = strconv.FormatInt(clock.Now().Add(d).Unix(), 10)
					case strings.HasPrefix(v, "+"):
						d, _ := time.ParseDuration(v[1:])
						v = clock.Now().Add(d).UTC().Format(http.TimeFormat)
					}
					w.Header().Set(k, v)
				}
				w.WriteHeader(a.status)
				io.WriteString(w, "answer "+strconv.Itoa(n))
			})
			var auth atomic.Int64
			base := newBase(t)
			tr := &Transport{Base: base, Policy: testPolicy(clock),
				OnAuthFailure: func(*http.Request, *http.Response) { auth.Add(1) }}
			ctx := context.Background()
			if tc.ctx != nil {
				ctx = tc.ctx(ctx)
			}
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			resp, err := tr.RoundTrip(newRequest(t, ctx, method, srv.URL, ""))
			if err != nil {
				t.Fatalf("err = %v", err)
			}
			// The last response is returned with its body intact.
			if body := readBody(t, resp); resp.StatusCode != tc.wantCode || body != "answer "+strconv.Itoa(tc.wantExec) {
				t.Errorf("got %d %q, want %d %q", resp.StatusCode, body, tc.wantCode, "answer "+strconv.Itoa(tc.wantExec))
			}
			if got := srv.Executions(); got != tc.wantExec {
				t.Errorf("executions = %d, want %d", got, tc.wantExec)
			}
			if got := int(auth.Load()); got != tc.wantAuth {
				t.Errorf("auth failures = %d, want %d", got, tc.wantAuth)
			}
			if got := clock.Waits(); !equalDurations(got, tc.wantWaits) {
				t.Errorf("waits = %v, want %v", got, tc.wantWaits)
			}
		})
	}
}

func equalDurations(a, b []time.Duration) bool {
	// Waits of 0 never reach the clock.
	var x, y []time.Duration
	for _, d := range a {
		if d != 0 {
			x = append(x, d)
		}
	}
	for _, d := range b {
		if d != 0 {
			y = append(y, d)
		}
	}
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}

// WithStatusClass(ctx, 404, nil) makes a 404 a success for Classify too.
func TestTransportStatusClassSuccess(t *testing.T) {
	t.Parallel()
	srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	tr := &Transport{Base: newBase(t), Policy: testPolicy(newFakeClock())}
	ctx := WithStatusClass(context.Background(), http.StatusNotFound, nil)
	resp, err := tr.RoundTrip(newRequest(t, ctx, http.MethodDelete, srv.URL+"/grants/1", ""))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := Classify(resp, nil); err != nil {
		t.Errorf("Classify = %v, want nil (revoked: already gone)", err)
	}
}

// AutoKey: one key per logical request, the same on every attempt, a UUIDv4, set on a
// clone; a caller's own key is kept.
func TestTransportAutoKey(t *testing.T) {
	t.Parallel()
	srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) })
	base := newBase(t)
	tr := &Transport{Base: base, Policy: testPolicy(newFakeClock()), AutoKey: true, NoBudget: true}
	var reqs []*http.Request
	for range 2 {
		req := newRequest(t, context.Background(), http.MethodPost, srv.URL, "x")
		reqs = append(reqs, req)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	patch := newRequest(t, context.Background(), http.MethodPatch, srv.URL, "x")
	patch.Header.Set(IdempotencyKeyHeader, "mine")
	resp, err := tr.RoundTrip(patch)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	keys := base.Keys()
	if len(keys) != 9 {
		t.Fatalf("keys = %q, want 9 attempts", keys)
	}
	uuid4 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	for i, k := range keys[:6] {
		if !uuid4.MatchString(k) {
			t.Errorf("key %q is not a UUIDv4", k)
		}
		if k != keys[i/3*3] {
			t.Errorf("attempt %d key %q, want the logical request's key %q", i+1, k, keys[i/3*3])
		}
	}
	if keys[0] == keys[3] {
		t.Errorf("two logical requests share the key %q", keys[0])
	}
	for _, k := range keys[6:] {
		if k != "mine" {
			t.Errorf("caller's key replaced by %q", k)
		}
	}
	for _, r := range reqs {
		if k := r.Header.Get(IdempotencyKeyHeader); k != "" {
			t.Errorf("the caller's request was modified: key %q", k)
		}
	}
}

func TestNewKeyUnique(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		k := NewKey()
		if seen[k] || len(k) != 36 {
			t.Fatalf("key %q repeated or malformed", k)
		}
		seen[k] = true
	}
}

// onlyReader hides the type of its reader, so http.NewRequest sets no GetBody.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// Bodies are re-sent intact: rewound with GetBody, or buffered when there is none; a body
// larger than MaxBufferedBody is sent once and not retried.
func TestTransportBodies(t *testing.T) {
	t.Parallel()
	payload := strings.Repeat("0123456789", 100) // 1000 bytes
	tests := []struct {
		name      string
		body      func() io.Reader
		maxBuffer int64
		wantExec  int
		wantCode  int
	}{
		{name: "GetBody", body: func() io.Reader { return strings.NewReader(payload) }, wantExec: 3, wantCode: 201},
		{name: "buffered", body: func() io.Reader { return onlyReader{strings.NewReader(payload)} }, wantExec: 3, wantCode: 201},
		{name: "too large to buffer", body: func() io.Reader { return onlyReader{strings.NewReader(payload)} }, maxBuffer: 100, wantExec: 1, wantCode: 503},
		{name: "never buffer", body: func() io.Reader { return onlyReader{strings.NewReader(payload)} }, maxBuffer: -1, wantExec: 1, wantCode: 503},
		{name: "empty", body: func() io.Reader { return onlyReader{strings.NewReader("")} }, wantExec: 3, wantCode: 201},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n < 3 {
					w.WriteHeader(503)
					return
				}
				w.WriteHeader(201)
			})
			tr := &Transport{Base: newBase(t), Policy: testPolicy(newFakeClock()), MaxBufferedBody: tc.maxBuffer}
			req, err := http.NewRequest(http.MethodPut, srv.URL, tc.body())
			if err != nil {
				t.Fatal(err)
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.wantCode || srv.Executions() != tc.wantExec {
				t.Errorf("got %d after %d executions, want %d after %d", resp.StatusCode, srv.Executions(), tc.wantCode, tc.wantExec)
			}
			want := payload
			if tc.name == "empty" {
				want = ""
			}
			for i, b := range srv.Bodies() {
				if b != want {
					t.Errorf("execution %d got a body of %d bytes, want %d intact", i+1, len(b), len(want))
				}
			}
		})
	}
}

// The budget is shared by all the requests of a Transport and stops their retries.
func TestTransportBudget(t *testing.T) {
	t.Parallel()
	unavailable := func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) }
	run := func(t *testing.T, tr *Transport, url string) int {
		base := tr.Base.(*counting)
		before := base.Attempts()
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), http.MethodGet, url, ""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Errorf("status %d, want the last 503", resp.StatusCode)
		}
		return base.Attempts() - before
	}
	p := testPolicy(newFakeClock())
	p.MaxAttempts = 100

	t.Run("shared", func(t *testing.T) {
		t.Parallel()
		srv := newScript(t, unavailable)
		b := NewBudget(4, 0.1)
		// 4 tokens: the first failure leaves 3 (> 2: retry), the second 2 (no more).
		tr := &Transport{Base: newBase(t), Policy: p, Budget: b}
		if got := run(t, tr, srv.URL); got != 2 {
			t.Errorf("first call: %d attempts, want 2", got)
		}
		other := &Transport{Base: newBase(t), Policy: p, Budget: b}
		if got := run(t, other, srv.URL); got != 1 {
			t.Errorf("another Transport sharing the budget: %d attempts, want 1", got)
		}
	})
	t.Run("default per Transport and host", func(t *testing.T) {
		t.Parallel()
		srv := newScript(t, unavailable)
		tr := &Transport{Base: newBase(t), Policy: p}
		if got := run(t, tr, srv.URL); got != 5 {
			t.Errorf("first call: %d attempts, want 5 (10 tokens, retries while > 5)", got)
		}
		if got := run(t, tr, srv.URL); got != 1 {
			t.Errorf("second call: %d attempts, want 1", got)
		}
		fresh := &Transport{Base: newBase(t), Policy: p}
		if got := run(t, fresh, srv.URL); got != 5 {
			t.Errorf("another Transport: %d attempts, want 5 (its own budget)", got)
		}
	})
	t.Run("policy budget", func(t *testing.T) {
		t.Parallel()
		srv := newScript(t, unavailable)
		pb := p
		pb.Budget = NewBudget(2, 0.1)
		tr := &Transport{Base: newBase(t), Policy: pb}
		if got := run(t, tr, srv.URL); got != 1 {
			t.Errorf("%d attempts, want 1 (Policy.Budget of 2 tokens)", got)
		}
	})
	t.Run("none", func(t *testing.T) {
		t.Parallel()
		srv := newScript(t, unavailable)
		p8 := p
		p8.MaxAttempts = 8
		tr := &Transport{Base: newBase(t), Policy: p8, NoBudget: true}
		for range 2 {
			if got := run(t, tr, srv.URL); got != 8 {
				t.Errorf("%d attempts, want 8", got)
			}
		}
	})
}

// The request context bounds the whole call: a wait that would outlive its deadline is
// not started.
func TestTransportDeadline(t *testing.T) {
	t.Parallel()
	t.Run("Retry-After beyond the deadline", func(t *testing.T) {
		t.Parallel()
		srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(503)
		})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		retried := false
		tr := &Transport{Base: newBase(t), Policy: Policy{MaxAttempts: 3},
			OnRetry: func(*http.Request, Attempt) { retried = true }}
		start := time.Now()
		resp, err := tr.RoundTrip(newRequest(t, ctx, http.MethodGet, srv.URL, ""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 || retried || srv.Executions() != 1 {
			t.Errorf("got %d, retried %v, %d executions; want the 503 at once", resp.StatusCode, retried, srv.Executions())
		}
		if el := time.Since(start); el > 10*time.Second { // waiting would take 20s (the deadline)
			t.Errorf("took %v", el)
		}
	})
	t.Run("backoff beyond the deadline", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		tr := &Transport{Base: newBase(t), Policy: Policy{MaxAttempts: 3, Base: time.Minute, Jitter: JitterNone}}
		start := time.Now()
		_, err := tr.RoundTrip(newRequest(t, ctx, http.MethodGet, "http://"+closedAddr(t), ""))
		var ex *ExhaustedError
		if !errors.As(err, &ex) || ex.Attempts != 1 || !errors.Is(err, ErrDeadline) {
			t.Fatalf("err = %v, want ErrDeadline after 1 attempt", err)
		}
		if el := time.Since(start); el > 10*time.Second { // waiting would take 20s (the deadline)
			t.Errorf("took %v", el)
		}
	})
	t.Run("canceled during the wait", func(t *testing.T) {
		t.Parallel()
		srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) })
		ctx, cancel := context.WithCancel(context.Background())
		tr := &Transport{Base: newBase(t), Policy: Policy{MaxAttempts: 3, Base: 10 * time.Second, Jitter: JitterNone},
			OnRetry: func(*http.Request, Attempt) { time.AfterFunc(20*time.Millisecond, cancel) }}
		resp, err := tr.RoundTrip(newRequest(t, ctx, http.MethodGet, srv.URL, ""))
		if resp != nil || !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, %v; want context.Canceled", resp, err)
		}
		var ex *ExhaustedError
		if !errors.As(err, &ex) || !errors.Is(ex.Last, ErrPlatform) {
			t.Errorf("err = %v, want an *ExhaustedError whose Last is the 503", err)
		}
	})
	t.Run("canceled before", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		base := newBase(t)
		tr := &Transport{Base: base, Policy: testPolicy(newFakeClock())}
		_, err := tr.RoundTrip(newRequest(t, ctx, http.MethodGet, "http://"+closedAddr(t), ""))
		if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrCanceled) || base.Attempts() != 1 {
			t.Errorf("err = %v after %d attempts, want ErrCanceled after 1", err, base.Attempts())
		}
	})
}

// A POST without a key whose response was lost: the status check decides.
func TestTransportStatusCheck(t *testing.T) {
	t.Parallel()
	errCheck := errors.New("status service down")
	tests := []struct {
		name     string
		check    func(ctx context.Context) (*http.Response, error)
		wantExec int
		wantCode int
		wantErr  []error
	}{
		{name: "did not happen", check: func(context.Context) (*http.Response, error) { return nil, nil },
			wantExec: 2, wantCode: 201},
		{name: "it happened", check: func(context.Context) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("found")), Header: http.Header{}}, nil
		}, wantExec: 1, wantCode: 200},
		{name: "unknown", check: func(context.Context) (*http.Response, error) { return nil, errCheck },
			wantExec: 1, wantErr: []error{ErrUnknownOutcome, errCheck, ErrPlatform}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					hijack(t, w, "", false)
					return
				}
				w.WriteHeader(201)
			})
			var checks atomic.Int64
			ctx := WithStatusCheck(context.Background(), func(ctx context.Context) (*http.Response, error) {
				checks.Add(1)
				return tc.check(ctx)
			})
			tr := &Transport{Base: newBase(t), Policy: testPolicy(newFakeClock())}
			resp, err := tr.RoundTrip(newRequest(t, ctx, http.MethodPost, srv.URL, "pay"))
			if srv.Executions() != tc.wantExec || checks.Load() != 1 {
				t.Errorf("%d executions, %d checks; want %d, 1", srv.Executions(), checks.Load(), tc.wantExec)
			}
			if tc.wantErr != nil {
				for _, target := range tc.wantErr {
					if !errors.Is(err, target) {
						t.Errorf("err = %v, does not match %v", err, target)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.wantCode {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.wantCode)
			}
		})
	}
}

// AttemptTimeout bounds the wait for the headers, not the reading of the returned body:
// the attempt's context lives until the body is closed. Server and client talk over an
// in-memory connection in a synctest bubble, so the AttemptTimeout's timer and the
// server's pause run on the bubble's virtual clock: the body ends a virtual second after
// the timeout, whatever the machine's load, and the test does not wait for it.
func TestTransportAttemptTimeoutKeepsBody(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var executions atomic.Int64
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			executions.Add(1)
			io.WriteString(w, "first half, ")
			http.NewResponseController(w).Flush()
			time.Sleep(2 * time.Second) // virtual: the body ends after the AttemptTimeout
			io.WriteString(w, "second half")
		})}
		l := memnet.New()
		go func() { _ = srv.Serve(l) }()
		defer srv.Shutdown(context.Background()) // waits for the handlers, also when the test fails
		base := &http.Transport{DialContext: l.DialContext}
		defer base.CloseIdleConnections()
		tr := &Transport{Base: base, Policy: testPolicy(newFakeClock()), AttemptTimeout: time.Second}
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), http.MethodGet, "http://mem/", ""))
		if err != nil {
			t.Fatal(err)
		}
		if body := readBody(t, resp); body != "first half, second half" {
			t.Errorf("body %q", body)
		}
		if n := executions.Load(); n != 1 {
			t.Errorf("%d executions", n)
		}
	})
}

// Hooks and logs: Policy.OnRetry and Transport.OnRetry both see each retry; the logger
// gets a record per retry and per auth failure.
func TestTransportHooksAndLogs(t *testing.T) {
	t.Parallel()
	srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch n {
		case 1:
			w.WriteHeader(503)
		default:
			w.WriteHeader(401)
		}
	})
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, nil))
	var policyRetries, transportRetries []Attempt
	p := testPolicy(newFakeClock())
	p.OnRetry = func(a Attempt) { policyRetries = append(policyRetries, a) }
	tr := &Transport{Base: newBase(t), Policy: p, Logger: logger,
		OnRetry: func(r *http.Request, a Attempt) {
			if r.URL.Path != "/secret-free" {
				t.Errorf("OnRetry got %s", r.URL.Path)
			}
			transportRetries = append(transportRetries, a)
		}}
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), http.MethodGet, srv.URL+"/secret-free?token=s3cr3t", ""))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(policyRetries) != 1 || len(transportRetries) != 1 || transportRetries[0].N != 1 || !errors.Is(transportRetries[0].Err, ErrPlatform) {
		t.Errorf("retries: policy %v, transport %v", policyRetries, transportRetries)
	}
	mu.Lock()
	logs := buf.String()
	mu.Unlock()
	for _, want := range []string{"level=INFO msg=\"retry: retrying request\" attempt=1", "level=WARN msg=\"retry: auth failure\" status=401"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "s3cr3t") {
		t.Errorf("logs show the query:\n%s", logs)
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Failures no retry can fix are returned at once.
func TestTransportNotRetried(t *testing.T) {
	t.Parallel()
	base := newBase(t)
	tr := &Transport{Base: base, Policy: testPolicy(newFakeClock())}
	_, err := tr.RoundTrip(newRequest(t, context.Background(), http.MethodGet, "ftp://example.invalid/x", ""))
	var se *StatusError
	if !errors.As(err, &se) || !errors.Is(err, ErrInvalid) || base.Attempts() != 1 {
		t.Errorf("err = %v after %d attempts, want ErrInvalid after 1", err, base.Attempts())
	}
}

// A base RoundTripper that breaks its contract (nil body, both response and error) does
// not make Transport panic.
func TestTransportOddBase(t *testing.T) {
	t.Parallel()
	odd := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodPost {
			return &http.Response{StatusCode: 503, Body: io.NopCloser(strings.NewReader(""))}, errors.New("both")
		}
		return &http.Response{StatusCode: 503, Request: nil}, nil
	})
	tr := &Transport{Base: odd, Policy: testPolicy(newFakeClock()), AttemptTimeout: time.Second}
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), http.MethodGet, "http://x", ""))
	if err != nil || resp.StatusCode != 503 {
		t.Errorf("got %v, %v", resp, err)
	}
	resp.Body.Close()
	if _, err := tr.RoundTrip(newRequest(t, context.Background(), http.MethodPost, "http://x", "b")); err == nil {
		t.Error("want an error")
	}
	// A request without a header map.
	req := &http.Request{Method: http.MethodPost, URL: mustURL(t, "http://x")}
	tr2 := &Transport{Base: odd, Policy: testPolicy(newFakeClock()), AutoKey: true}
	if _, err := tr2.RoundTrip(req); err == nil {
		t.Error("want an error")
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// Through http.Client: the error is wrapped in a *url.Error and still matches.
func TestTransportWithClient(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hijack(t, w, "", false) }))
	defer srv.Close()
	client := &http.Client{Transport: &Transport{Base: newBase(t), Policy: testPolicy(newFakeClock())}}
	_, err := client.Post(srv.URL, "text/plain", strings.NewReader("x"))
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Errorf("err = %v, want ErrUnknownOutcome", err)
	}
}

// Discarded responses are drained (up to a limit) and closed, so their connection is
// reused; a body past the limit is closed undrained, and its connection with it.
func TestTransportDrainsDiscardedBodies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		size int
		want []bool // GotConn's Reused, by attempt
	}{
		{"small body drained", 1000, []bool{false, true, true}},
		{"large body closed", 4 * drainLimit, []bool{false, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n < 3 {
					w.WriteHeader(503)
					io.WriteString(w, strings.Repeat("x", tc.size))
					return
				}
				io.WriteString(w, "ok")
			})
			var mu sync.Mutex
			var reused []bool
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
				mu.Lock()
				reused = append(reused, i.Reused)
				mu.Unlock()
			}})
			tr := &Transport{Base: newBase(t), Policy: Policy{MaxAttempts: 3, Base: 20 * time.Millisecond, Jitter: JitterNone}}
			resp, err := tr.RoundTrip(newRequest(t, ctx, http.MethodGet, srv.URL, ""))
			if err != nil {
				t.Fatal(err)
			}
			if body := readBody(t, resp); body != "ok" {
				t.Errorf("body %q", body)
			}
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(reused) != fmt.Sprint(tc.want) {
				t.Errorf("connections reused = %v, want %v", reused, tc.want)
			}
		})
	}
}

// Whatever HTTP answer Transport stops at, it returns it with its body and a nil error,
// through http.Client too; StopReason says why it stopped there.
func TestStopReason(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		method   string
		header   map[string]string
		status   int
		budget   *Budget
		ctx      func(context.Context) context.Context
		wantExec int
		wantNil  bool  // StopReason is nil: a success
		class    error // the class StopReason matches
		reason   error // an *ExhaustedError with this Reason; nil: a *StatusError or other
		also     error // another error StopReason matches
	}{
		{name: "200", status: 200, wantExec: 1, wantNil: true},
		{name: "404 counted a success", status: 404, wantExec: 1, wantNil: true,
			ctx: func(ctx context.Context) context.Context { return WithStatusClass(ctx, 404, nil) }},
		{name: "409 without Retry-After", status: 409, wantExec: 1, class: ErrInvalid},
		{name: "401", status: 401, wantExec: 1, class: ErrAuth},
		{name: "503 to the last attempt", status: 503, wantExec: 3, class: ErrPlatform, reason: ErrMaxAttempts},
		{name: "503 until the budget is spent", status: 503, budget: NewBudget(2, 1), wantExec: 1, class: ErrPlatform, reason: ErrBudget},
		{name: "429 asking too long a wait", status: 429, header: map[string]string{"Retry-After": "3600"}, wantExec: 1,
			class: ErrRateLimited, reason: ErrServerDelay},
		{name: "504 saying the budget is spent", status: 504, header: map[string]string{BudgetExhaustedHeader: "?1"}, wantExec: 1,
			class: ErrCanceled},
		{name: "503 to a POST without a key", method: http.MethodPost, status: 503, wantExec: 1, class: ErrPlatform,
			also: ErrUnknownOutcome},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) {
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				io.WriteString(w, "answer "+strconv.Itoa(n))
			})
			client := &http.Client{Transport: &Transport{Base: newBase(t), Policy: testPolicy(newFakeClock()), Budget: tc.budget}}
			ctx := context.Background()
			if tc.ctx != nil {
				ctx = tc.ctx(ctx)
			}
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			resp, err := client.Do(newRequest(t, ctx, method, srv.URL, "body"))
			if err != nil {
				t.Fatalf("err = %v, want the answer and no error", err)
			}
			if body := readBody(t, resp); resp.StatusCode != tc.status || body != "answer "+strconv.Itoa(tc.wantExec) {
				t.Errorf("got %d %q, want %d from attempt %d", resp.StatusCode, body, tc.status, tc.wantExec)
			}
			if srv.Executions() != tc.wantExec {
				t.Errorf("%d executions, want %d", srv.Executions(), tc.wantExec)
			}
			stop := StopReason(resp)
			if tc.wantNil {
				if stop != nil {
					t.Errorf("StopReason = %v, want nil", stop)
				}
				return
			}
			if !matchesOnly(stop, tc.class) {
				t.Errorf("StopReason = %v, want only the class %v", stop, tc.class)
			}
			var se *StatusError
			if !errors.As(stop, &se) || se.StatusCode != tc.status {
				t.Errorf("StopReason = %v, want a *StatusError of status %d", stop, tc.status)
			}
			var ex *ExhaustedError
			switch {
			case tc.reason == nil && errors.As(stop, &ex):
				t.Errorf("StopReason = %v, an *ExhaustedError; want none", stop)
			case tc.reason != nil && (!errors.As(stop, &ex) || !errors.Is(ex.Reason, tc.reason) || ex.Attempts != tc.wantExec):
				t.Errorf("StopReason = %v, want an *ExhaustedError of reason %v after %d attempts", stop, tc.reason, tc.wantExec)
			}
			if tc.also != nil && !errors.Is(stop, tc.also) {
				t.Errorf("StopReason = %v, want it to match %v", stop, tc.also)
			}
			if msg := stop.Error(); strings.Count(msg, tc.class.Error()) != 1 || strings.Contains(msg, "\n") {
				t.Errorf("StopReason's message %q, want one line naming its class once", msg)
			}
			if again := Classify(nil, stop); again != stop {
				t.Errorf("Classify(nil, StopReason) = %v, want StopReason itself", again)
			}
		})
	}
	t.Run("not from Transport", func(t *testing.T) {
		t.Parallel()
		if StopReason(nil) != nil {
			t.Error("StopReason(nil) is not nil")
		}
		resp := &http.Response{StatusCode: 503, Header: http.Header{}}
		if err := StopReason(resp); !matchesOnly(err, ErrPlatform) {
			t.Errorf("StopReason of a 503 Transport did not return = %v, want Classify's", err)
		}
	})
}
