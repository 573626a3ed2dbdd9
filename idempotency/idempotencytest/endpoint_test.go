package idempotencytest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/endpointcheck"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

var (
	alice = "Bearer alice"
	bob   = "Bearer bob"
	body  = []byte(`{"amount":100,"currency":"EUR"}`)
)

// payments is a handler that executes every request it gets: each execution answers 201
// with a new id, so two executions never look alike.
type payments struct {
	mu         sync.Mutex
	executions int
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	p.mu.Lock()
	p.executions++
	id := p.executions
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d}`+"\n", id)
}

func (p *payments) Executions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.executions
}

// withMiddleware wraps h in the idempotency middleware over a memstore, shut down and
// closed when t ends.
func withMiddleware(t *testing.T, h http.Handler) http.Handler {
	t.Helper()
	store := memstore.New()
	mw, err := idempotency.New(idempotency.Config{Store: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = mw.Shutdown(context.Background())
		_ = store.Close()
	})
	return mw.Handler(h)
}

// recorder is a reporter that keeps what the test entry points report, so that a test
// can see them fail without failing itself.
type recorder struct {
	mu     sync.Mutex
	errors []string
	logs   []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recorder) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

// A handler behind the middleware passes every required case of TestHandler, with two
// credentials, and executes once per key and credential.
func TestTestHandlerMiddleware(t *testing.T) {
	t.Parallel()
	p := &payments{}
	rep := TestHandler(t, withMiddleware(t, p), endpointcheck.Config{URL: "/payments", Body: body, Auth: []string{alice, bob}})
	if rep == nil {
		t.Fatal("no report")
	}
	if rep.Failed() {
		t.Error("Failed() = true")
	}
	for _, res := range rep.Results {
		if res.Verdict == endpointcheck.NotApplicable && res.ID != endpointcheck.CaseRetryAfter {
			// Retry-After is checked only if a concurrent duplicate arrived while the
			// first request ran, which depends on timing.
			t.Errorf("%s: not applicable (%s)", res.ID, res.Observed)
		}
	}
	// Key 1 once, the concurrent key once, key 3 under alice and under bob.
	if n := p.Executions(); n != 4 {
		t.Errorf("the handler executed %d times, want 4", n)
	}
}

// A handler without deduplication executes every request, the battery's replays and
// concurrent duplicates too: TestHandler fails on the required cases that catch it,
// logs the report, and only logs the advisory ones.
func TestTestHandlerNoDeduplication(t *testing.T) {
	t.Parallel()
	p := &payments{}
	rec := &recorder{}
	rep := testHandler(t.Context(), rec, p, endpointcheck.Config{URL: "/payments", Body: body, Auth: []string{alice, bob}})
	if rep == nil || !rep.Failed() {
		t.Fatalf("report %v: want a failed one", rep)
	}
	failing := map[string]bool{}
	for _, res := range rep.Results {
		if res.Verdict == endpointcheck.Fail && res.Level == endpointcheck.Required {
			failing[res.ID] = true
		}
	}
	for _, id := range []string{endpointcheck.CaseReplay, endpointcheck.CaseConcurrent, endpointcheck.CaseOtherBody, endpointcheck.CaseKeyEmpty, endpointcheck.CaseKeyControl} {
		if !failing[id] {
			t.Errorf("%s did not fail", id)
		}
	}
	for _, e := range rec.errors {
		t.Logf("recorded error: %s", e)
	}
	if len(rec.errors) != len(failing) {
		t.Errorf("%d errors for %d failed required cases: %q", len(rec.errors), len(failing), rec.errors)
	}
	for _, id := range []string{endpointcheck.CaseReplay, endpointcheck.CaseConcurrent} {
		if !slices.ContainsFunc(rec.errors, func(e string) bool { return strings.Contains(e, "["+id+"]") }) {
			t.Errorf("no error names %s: %q", id, rec.errors)
		}
	}
	logs := strings.Join(rec.logs, "\n")
	if !strings.Contains(logs, "advisory: malformed key: 256 characters") {
		t.Errorf("the advisory failure was not logged: %s", logs)
	}
	if !strings.Contains(logs, "endpoint report:") || !strings.Contains(logs, "NOT safe") {
		t.Errorf("the report was not logged: %s", logs)
	}
	if p.Executions() < 2+endpointcheck.DefaultConcurrency {
		t.Errorf("the handler executed %d times, want every replay and duplicate", p.Executions())
	}
}

func TestTestHandlerRefusesURLs(t *testing.T) {
	t.Parallel()
	for _, cfg := range []endpointcheck.Config{
		{URL: "http://127.0.0.1:1/payments"},
		{URL: "//example.com/payments"},
		{URL: "/payments", OtherRoute: "https://example.com/refunds"},
		{URL: "%zz"},
	} {
		rec := &recorder{}
		p := &payments{}
		if rep := testHandler(t.Context(), rec, p, cfg); rep != nil || len(rec.errors) != 1 {
			t.Errorf("testHandler(%+v) = %v, errors %q; want no report and one error", cfg, rep, rec.errors)
		}
		if p.Executions() != 0 {
			t.Errorf("testHandler(%+v) sent requests", cfg)
		}
	}
}

// TestEndpoint takes a URL: a server of the test's own passes.
func TestTestEndpoint(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(withMiddleware(t, &payments{}))
	defer srv.Close()
	if rep := TestEndpoint(t, endpointcheck.Config{URL: srv.URL + "/payments", Body: body}); rep == nil || rep.Failed() {
		t.Errorf("report %v: want one that passed", rep)
	}
}

// An endpoint that does not answer is an error of TestEndpoint, not a report.
func TestTestEndpointUnreachable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	u := srv.URL
	srv.Close()
	rec := &recorder{}
	if rep := testEndpoint(t.Context(), rec, endpointcheck.Config{URL: u, Timeout: 2 * time.Second}); rep != nil ||
		len(rec.errors) != 1 || !strings.Contains(rec.errors[0], "did not answer") {
		t.Errorf("report %v, errors %q; want no report and the unreachable error", rep, rec.errors)
	}
}
