package deadline

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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
	}{
		{"zero", func(r *http.Request) { r.Header.Set(DefaultHeader, "0") }},
		{"negative", func(r *http.Request) { r.Header.Set(DefaultHeader, "-20") }},
		{"zero among others", func(r *http.Request) { r.Header.Set(DefaultHeader, "500, 0") }},
		{"context deadline passed", func(r *http.Request) { *r = *r.WithContext(past) }},
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
			var p problem
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
				t.Fatalf("body %q: %v", w.Body.String(), err)
			}
			if p.Type != ProblemBudgetExhausted || p.Status != http.StatusGatewayTimeout || p.Title == "" {
				t.Errorf("problem = %+v", p)
			}
		})
	}
}

// A canceled (not expired) request still reaches the handler: the budget is not the
// middleware's reason to refuse it.
func TestMiddlewareCanceledPassesThrough(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w, s := serve(t, Config{}, func(r *http.Request) { *r = *r.WithContext(ctx) })
	if !s.ran || w.Code != http.StatusNoContent {
		t.Errorf("handler ran = %v, status %d; want it run, 204", s.ran, w.Code)
	}
}

// An earlier deadline already on the request's context is kept.
func TestMiddlewareKeepsEarlierDeadline(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	t.Cleanup(cancel)
	_, s := serve(t, Config{Budget: time.Hour}, func(r *http.Request) {
		r.Header.Set(DefaultHeader, "60000")
		*r = *r.WithContext(ctx)
	})
	if !s.ran || s.left > time.Second {
		t.Errorf("handler ran = %v, remaining %v; want it run within 1s", s.ran, s.left)
	}
}
