package deadline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/internal/problem"
)

func TestParseBudget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		values []string
		ms     int64
		found  bool
		bad    string
	}{
		{"absent", nil, 0, false, ""},
		{"empty", []string{""}, 0, false, ""},
		{"plain", []string{"450"}, 450, true, ""},
		{"zero", []string{"0"}, 0, true, ""},
		{"leading zeros", []string{"007"}, 7, true, ""},
		{"negative is spent", []string{"-5"}, 0, true, ""},
		{"huge negative is spent", []string{"-99999999999999999999999"}, 0, true, ""},
		{"too large saturates", []string{"99999999999999999999999"}, math.MaxInt64, true, ""},
		{"plus sign", []string{"+5"}, 0, false, "+5"},
		{"fraction", []string{"1.5"}, 0, false, "1.5"},
		{"unit", []string{"5ms"}, 0, false, "5ms"},
		{"bare minus", []string{"-"}, 0, false, "-"},
		{"letters", []string{"abc"}, 0, false, "abc"},
		{"inner space", []string{"4 5"}, 0, false, "4 5"},
		{"list takes the smallest", []string{"300, 200 ,400"}, 200, true, ""},
		{"lines take the smallest", []string{"300", "100"}, 100, true, ""},
		{"malformed element skipped", []string{"abc, 250"}, 250, true, "abc"},
		{"empty elements skipped", []string{", 250,,"}, 250, true, ""},
		{"long malformed truncated", []string{strings.Repeat("x", 200)}, 0, false, strings.Repeat("x", maxLogged) + "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ms, found, bad := parseBudget(tt.values)
			if ms != tt.ms || found != tt.found || bad != tt.bad {
				t.Errorf("parseBudget(%q) = %d, %v, %q; want %d, %v, %q", tt.values, ms, found, bad, tt.ms, tt.found, tt.bad)
			}
		})
	}
}

// seen is what a test handler observed.
type seen struct {
	ran         bool
	left        time.Duration
	hasDeadline bool
}

func serve(t *testing.T, cfg Config, setup func(*http.Request)) (*httptest.ResponseRecorder, seen) {
	t.Helper()
	var s seen
	h := Middleware(cfg)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.ran = true
		s.left, s.hasDeadline = Remaining(r.Context())
		w.WriteHeader(http.StatusNoContent)
	}))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if setup != nil {
		setup(r)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w, s
}

func TestMiddlewareDeadline(t *testing.T) {
	t.Parallel()
	// Budgets of seconds, and lower bounds seconds below them: the handler reads its
	// remaining time microseconds after the middleware sets it, but a loaded machine
	// may stall the test goroutine in between.
	const server = 20 * time.Second
	const slack = 5 * time.Second
	tests := []struct {
		name     string
		header   []string
		cfg      Config
		min, max time.Duration // the handler's remaining time
		logged   bool
	}{
		{"smaller header wins", []string{"10000"}, Config{Budget: server}, 10*time.Second - slack, 10 * time.Second, false},
		{"larger header loses", []string{"3600000"}, Config{Budget: server}, server - slack, server, false},
		{"huge header loses", []string{"99999999999999999999999"}, Config{Budget: server}, server - slack, server, false},
		{"absent", nil, Config{Budget: server}, server - slack, server, false},
		{"malformed", []string{"1.5s"}, Config{Budget: server}, server - slack, server, true},
		{"negative server budget means default", nil, Config{Budget: -time.Second}, DefaultBudget - slack, DefaultBudget, false},
		{"zero config", []string{"10000"}, Config{}, 10*time.Second - slack, 10 * time.Second, false},
		{"custom header", []string{"10000"}, Config{Header: "X-Budget", Budget: server}, 10*time.Second - slack, 10 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			tt.cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			header := tt.cfg.Header
			if header == "" {
				header = DefaultHeader
			}
			w, s := serve(t, tt.cfg, func(r *http.Request) {
				for _, v := range tt.header {
					r.Header.Add(header, v)
				}
			})
			if !s.ran || w.Code != http.StatusNoContent {
				t.Fatalf("handler ran = %v, status %d; want it run, 204", s.ran, w.Code)
			}
			if !s.hasDeadline || s.left <= tt.min || s.left > tt.max {
				t.Errorf("handler's remaining time = %v (deadline %v), want in (%v, %v]", s.left, s.hasDeadline, tt.min, tt.max)
			}
			if got := strings.Contains(logs.String(), "malformed budget header"); got != tt.logged {
				t.Errorf("malformed header logged = %v, want %v; logs: %s", got, tt.logged, logs.String())
			}
			if tt.logged && !strings.Contains(logs.String(), "level=DEBUG") {
				t.Errorf("malformed header not logged at debug: %s", logs.String())
			}
		})
	}
}

func TestMiddlewareSpent(t *testing.T) {
	t.Parallel()
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	t.Cleanup(cancel)
	tests := []struct {
		name  string
		setup func(*http.Request)
		typ   string // the problem type; ProblemBudgetExhausted also carries ExhaustedHeader
	}{
		{"zero", func(r *http.Request) { r.Header.Set(DefaultHeader, "0") }, ProblemBudgetExhausted},
		{"negative", func(r *http.Request) { r.Header.Set(DefaultHeader, "-20") }, ProblemBudgetExhausted},
		{"zero among others", func(r *http.Request) { r.Header.Set(DefaultHeader, "500, 0") }, ProblemBudgetExhausted},
		{"context deadline passed", func(r *http.Request) { *r = *r.WithContext(past) }, ProblemServerBudgetExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w, s := serve(t, Config{Budget: time.Second, Logger: slog.New(slog.DiscardHandler)}, tt.setup)
			if s.ran {
				t.Error("handler ran with a spent budget")
			}
			if w.Code != http.StatusGatewayTimeout {
				t.Errorf("status = %d, want 504", w.Code)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type = %q, want application/problem+json", ct)
			}
			var p problem.Details
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
				t.Fatalf("body %q: %v", w.Body.String(), err)
			}
			if p.Type != tt.typ || p.Status != http.StatusGatewayTimeout || p.Title == "" {
				t.Errorf("problem = %+v, want type %s", p, tt.typ)
			}
			if got, want := w.Header().Get(ExhaustedHeader), finalIf(tt.typ == ProblemBudgetExhausted); got != want {
				t.Errorf("%s = %q, want %q", ExhaustedHeader, got, want)
			}
		})
	}
}

// finalIf is the value ExhaustedHeader must have: "?1" when the caller's budget is spent.
func finalIf(spent bool) string {
	if spent {
		return "?1"
	}
	return ""
}

// reply is what a client got from a server.
type reply struct {
	status int
	header http.Header
	body   string
}

// budgetServer runs h behind Middleware(cfg) on a real server.
func budgetServer(t *testing.T, cfg Config, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	srv := httptest.NewServer(Middleware(cfg)(h))
	t.Cleanup(srv.Close)
	return srv
}

// call sends a GET to url with the budget header set to budget (none when empty).
func call(t *testing.T, url, budget string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if budget != "" {
		req.Header.Set(DefaultHeader, budget)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// checkProblem checks that a is a 504 problem of type typ, with ExhaustedHeader when typ
// is ProblemBudgetExhausted.
func checkProblem(t *testing.T, a reply, typ string) {
	t.Helper()
	if a.status != http.StatusGatewayTimeout || a.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("got %d %q %q, want a 504 application/problem+json", a.status, a.header.Get("Content-Type"), a.body)
	}
	var p problem.Details
	if err := json.Unmarshal([]byte(a.body), &p); err != nil {
		t.Fatalf("body %q: %v", a.body, err)
	}
	if p.Type != typ || p.Status != http.StatusGatewayTimeout || p.Title == "" || p.Detail == "" {
		t.Errorf("problem = %+v, want type %s", p, typ)
	}
	if got, want := a.header.Get(ExhaustedHeader), finalIf(typ == ProblemBudgetExhausted); got != want {
		t.Errorf("%s = %q, want %q", ExhaustedHeader, got, want)
	}
}

// A handler that gives up when its deadline passes, returning without a word, must not
// leave its caller an empty 200 to take for a success: the middleware answers 504.
func TestMiddlewareHandlerGivesUp(t *testing.T) {
	t.Parallel()
	giveUp := func(causes chan<- error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
			causes <- context.Cause(r.Context())
		}
	}
	tests := []struct {
		name   string
		cfg    Config
		budget string
		typ    string
	}{
		{"the caller's budget runs out", Config{}, "100", ProblemBudgetExhausted},
		{"the server's budget runs out", Config{Budget: 100 * time.Millisecond}, "", ProblemServerBudgetExhausted},
		{"the server's budget is shorter than the caller's", Config{Budget: 100 * time.Millisecond}, "60000", ProblemServerBudgetExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			causes := make(chan error, 1)
			srv := budgetServer(t, tt.cfg, giveUp(causes))
			checkProblem(t, call(t, srv.URL, tt.budget), tt.typ)
			if cause := <-causes; !errors.Is(cause, ErrExhausted) || !errors.Is(cause, context.DeadlineExceeded) {
				t.Errorf("the handler's context.Cause = %v, want one matching ErrExhausted", cause)
			}
		})
	}
	// Before its deadline, a handler that answers nothing keeps net/http's 200: that is
	// its own choice, not a budget running out.
	srv := budgetServer(t, Config{}, func(http.ResponseWriter, *http.Request) {})
	if a := call(t, srv.URL, "60000"); a.status != http.StatusOK || a.header.Get(ExhaustedHeader) != "" {
		t.Errorf("a handler that wrote nothing in time: %d %v, want a plain 200", a.status, a.header)
	}
}

// A handler that never waits on its context, and only runs past its deadline, finds it
// ended all the same: its Err and context.Cause say so, a failure it then answers is
// marked, and nothing answered is a 504. (The context makes no timer of its own until
// something waits on it.)
func TestMiddlewareDeadlineWithoutDone(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		budget string // the caller's, in ms; "": none, the server's 100 ms sets the deadline
		write  bool   // the handler answers 503
		typ    string // the 504's problem type when it does not
	}{
		{"a failure after the caller's budget", "50", true, ""},
		{"nothing after the caller's budget", "50", false, ProblemBudgetExhausted},
		{"nothing after the server's budget", "", false, ProblemServerBudgetExhausted},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := Middleware(Config{Budget: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})(
					http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						if err := r.Context().Err(); err != nil {
							t.Errorf("Err before the deadline: %v", err)
						}
						time.Sleep(time.Second)
						if err := r.Context().Err(); !errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("Err after the deadline: %v", err)
						}
						if cause := context.Cause(r.Context()); !errors.Is(cause, ErrExhausted) {
							t.Errorf("Cause after the deadline: %v", cause)
						}
						if tt.write {
							w.WriteHeader(http.StatusServiceUnavailable)
						}
					}))
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				if tt.budget != "" {
					r.Header.Set(DefaultHeader, tt.budget)
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if tt.write {
					if w.Code != http.StatusServiceUnavailable || w.Header().Get(ExhaustedHeader) != "?1" {
						t.Errorf("answer %d %v, want the handler's 503 with %s", w.Code, w.Header(), ExhaustedHeader)
					}
					return
				}
				checkProblem(t, reply{status: w.Code, header: w.Header(), body: w.Body.String()}, tt.typ)
			})
		})
	}
}

// Every failure a handler answers once the caller's budget is spent says so, and no other
// answer does: the middleware sets ExhaustedHeader, or removes it.
func TestMiddlewareMarksFailuresOnceTheBudgetIsSpent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		budget string
		late   bool // the handler answers after its deadline
		status int
		write  bool // a body without WriteHeader (an implicit 200)
		relay  bool // the handler sets ExhaustedHeader itself, relaying an upstream's
		final  bool
	}{
		{name: "503 after the caller's budget", budget: "50", late: true, status: 503, final: true},
		{name: "404 after the caller's budget", budget: "50", late: true, status: 404, final: true},
		{name: "200 after the caller's budget", budget: "50", late: true, status: 200},
		{name: "implicit 200 after the caller's budget", budget: "50", late: true, write: true},
		{name: "503 in time", budget: "60000", status: 503},
		{name: "503 in time, relaying the header", budget: "60000", status: 503, relay: true},
		{name: "200 after the caller's budget, relaying the header", budget: "50", late: true, status: 200, relay: true},
		{name: "503 after the server's budget", late: true, status: 503},
		{name: "503 after the server's budget, relaying the header", late: true, status: 503, relay: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			budget := 5 * time.Second // the caller's 50 ms set the deadline
			if tt.budget == "" {
				budget = 100 * time.Millisecond // no header: the server's budget does
			}
			srv := budgetServer(t, Config{Budget: budget}, func(w http.ResponseWriter, r *http.Request) {
				if tt.late {
					<-r.Context().Done()
				}
				if tt.relay {
					w.Header().Set(ExhaustedHeader, "?1")
				}
				if tt.write {
					_, _ = io.WriteString(w, "late")
					return
				}
				w.WriteHeader(tt.status)
			})
			a := call(t, srv.URL, tt.budget)
			want := tt.status
			if tt.write {
				want = http.StatusOK
			}
			if a.status != want {
				t.Fatalf("status %d, want the handler's %d", a.status, want)
			}
			if got := a.header.Get(ExhaustedHeader); got != finalIf(tt.final) {
				t.Errorf("%s = %q, want %q", ExhaustedHeader, got, finalIf(tt.final))
			}
		})
	}
}

// A call the handler makes through Transport under the request's deadline that finds
// the caller's budget spent (refused for lack of time, or answered with ExhaustedHeader)
// spends the request's budget too; a call under a shorter deadline of the handler's own
// does not.
func TestMiddlewareLearnsFromItsCalls(t *testing.T) {
	t.Parallel()
	spent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(ExhaustedHeader, "?1") // as a next hop whose budget ran out answers
		w.WriteHeader(http.StatusGatewayTimeout)
	}))
	t.Cleanup(spent.Close)
	fine := budgetServer(t, Config{}, func(w http.ResponseWriter, r *http.Request) {})
	tests := []struct {
		name    string
		next    string
		reserve time.Duration
		shorter bool // the call's context ends before the request's
		write   bool // the handler answers 502 instead of returning without a word
		final   bool
	}{
		{name: "refused for lack of time, nothing written", next: fine.URL, reserve: time.Hour, final: true},
		{name: "refused for lack of time, 502", next: fine.URL, reserve: time.Hour, write: true, final: true},
		{name: "answered budget exhausted, 502", next: spent.URL, write: true, final: true},
		{name: "refused for lack of a shorter deadline's time, 502", next: fine.URL, reserve: time.Hour, shorter: true, write: true},
		{name: "answered, 502", next: fine.URL, write: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := budgetServer(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
				ctx := r.Context()
				if tt.shorter {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
					defer cancel()
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, tt.next, nil)
				if err != nil {
					t.Error(err)
					return
				}
				resp, err := (&http.Client{Transport: Transport{Reserve: tt.reserve}}).Do(req)
				if err == nil {
					resp.Body.Close()
				}
				if tt.write {
					w.WriteHeader(http.StatusBadGateway)
				}
			})
			a := call(t, srv.URL, "20000") // below the server's budget: the caller's sets the deadline
			switch {
			case !tt.write:
				checkProblem(t, a, ProblemBudgetExhausted)
			case a.status != http.StatusBadGateway:
				t.Fatalf("status %d, want the handler's 502", a.status)
			case a.header.Get(ExhaustedHeader) != finalIf(tt.final):
				t.Errorf("%s = %q, want %q", ExhaustedHeader, a.header.Get(ExhaustedHeader), finalIf(tt.final))
			}
		})
	}
}

// The handler's ResponseWriter still flushes (http.Flusher and http.ResponseController),
// unwraps for the rest of http.ResponseController, and hijacks; after a hijack the
// middleware writes nothing, even once the budget has run out.
func TestMiddlewareWriterKeepsItsInterfaces(t *testing.T) {
	t.Parallel()
	t.Run("flush", func(t *testing.T) {
		t.Parallel()
		next := make(chan struct{})
		srv := budgetServer(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
			rc := http.NewResponseController(w)
			if err := rc.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
				t.Errorf("SetWriteDeadline: %v", err)
			}
			if err := rc.EnableFullDuplex(); err != nil {
				t.Errorf("EnableFullDuplex: %v", err)
			}
			f, ok := w.(http.Flusher)
			if !ok {
				t.Error("the ResponseWriter is not an http.Flusher")
				return
			}
			_, _ = io.WriteString(w, "first,")
			f.Flush()
			<-next // the client has read the first part: it was flushed
			_, _ = io.WriteString(w, "second,")
			if err := rc.Flush(); err != nil {
				t.Errorf("ResponseController.Flush: %v", err)
			}
			<-next
			_, _ = io.WriteString(w, "third")
		})
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		for _, want := range []string{"first,", "second,"} {
			got, err := br.ReadString(',')
			if err != nil || got != want {
				t.Fatalf("read %q, %v; want %q flushed", got, err, want)
			}
			next <- struct{}{}
		}
		if rest, _ := io.ReadAll(br); string(rest) != "third" {
			t.Errorf("rest %q", rest)
		}
	})
	t.Run("hijack", func(t *testing.T) {
		t.Parallel()
		h := Middleware(Config{Logger: slog.New(slog.DiscardHandler)})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, ok := w.(http.Hijacker); !ok {
				t.Error("the ResponseWriter is not an http.Hijacker")
			}
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("Hijack: %v", err)
				return
			}
			defer conn.Close()
			<-r.Context().Done() // the budget runs out: the connection is the handler's still
			_, _ = brw.WriteString("HTTP/1.1 299 Hijacked\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			_ = brw.Flush()
		}))
		served := make(chan struct{})
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer close(served)
			h.ServeHTTP(w, r)
		}))
		var logs bytes.Buffer // written by the server's goroutine before served closes
		srv.Config.ErrorLog = log.New(&logs, "", 0)
		srv.Start()
		t.Cleanup(srv.Close)
		a := call(t, srv.URL, "50")
		<-served
		if a.status != 299 || a.body != "ok" {
			t.Errorf("got %d %q, want the hijacker's 299", a.status, a.body)
		}
		if logs.Len() > 0 {
			t.Errorf("the middleware wrote on a hijacked connection: %s", logs.String())
		}
	})
}
