package idempotencytest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/idempotency/endpointcheck"
)

// TestEndpoint runs endpointcheck.Check against cfg.URL from a test. Every required case that
// fails is a t.Errorf, because such a failure means retries against the endpoint are
// not safe. An advisory case that fails, and a required case that could not be checked
// (not applicable), is a t.Log: neither makes retries unsafe, but both say what the test
// did not prove. When a case fails, the text report is logged too, since its table says
// what each case expected and observed. A configuration the battery cannot use, or an
// endpoint that does not answer the first request, is a t.Errorf as well.
//
// It returns the report, for checks of the caller's own (how many times its handler
// executed, an advisory case it wants to require), or nil after such an error.
//
// The requests are real and the valid ones may execute: point it at a test deployment,
// or use TestHandler for an http.Handler.
func TestEndpoint(t *testing.T, cfg endpointcheck.Config) *endpointcheck.Report {
	t.Helper()
	return testEndpoint(t.Context(), t, cfg)
}

// TestHandler serves h on a loopback httptest.Server for the length of the call and runs
// TestEndpoint against it. cfg.URL and cfg.OtherRoute are paths on that server (cfg.URL
// default "/"); an absolute URL in either is a t.Errorf, since its requests would not
// reach h.
//
// For every case to count, the test must provide:
//
//   - cfg.URL: a route of h that executes cfg.Method (default POST) with cfg.Body, and
//     cfg.Header with whatever h needs to answer it 2xx (a Content-Type, an API
//     version). The verdicts compare successful executions; a valid request answered
//     4xx makes them compare errors, and the report notes it.
//   - Executions that can be told apart, such as a new id or a counter in each body, or
//     replays marked Idempotent-Replayed: true. Otherwise a replay looks like a second
//     execution, and the replay, concurrent and two-credentials cases are not
//     applicable rather than passed.
//   - cfg.Auth: two Authorization values that h accepts as two callers, for the
//     two-credentials case, which checks that one caller's key never replays another
//     caller's response (idempotency.Config's default Scope keys records by the
//     Authorization header). With fewer than two that case is not applicable.
//   - cfg.OtherRoute, when the default sibling route (cfg.URL with endpointcheck.SiblingSuffix) does
//     not pass through the same idempotency layer as cfg.URL: the other-route case
//     checks that a key used on one route does not replay on another. A middleware
//     wrapping the whole mux sees the default route; a 404 from a mux passes as well,
//     since it is not a replay.
//
// h should keep its effects in memory or in a test store, since the valid requests
// execute. In a test of the caller's:
//
//	func TestPaymentsIdempotent(t *testing.T) {
//		idempotencytest.TestHandler(t, newPaymentsServer(t), endpointcheck.Config{
//			URL:  "/payments",
//			Body: []byte(`{"amount":100,"currency":"EUR"}`),
//			Auth: []string{"Bearer test-alice", "Bearer test-bob"},
//		})
//	}
func TestHandler(t *testing.T, h http.Handler, cfg endpointcheck.Config) *endpointcheck.Report {
	t.Helper()
	return testHandler(t.Context(), t, h, cfg)
}

// reporter is the part of testing.TB the test entry points use. Taking it instead of a
// *testing.T lets their own tests record a failure rather than fail.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
}

func testEndpoint(ctx context.Context, t reporter, cfg endpointcheck.Config) *endpointcheck.Report {
	t.Helper()
	rep, err := endpointcheck.Check(ctx, cfg)
	if err != nil {
		t.Errorf("endpointcheck.Check: %v", err)
		return nil
	}
	failed := false
	for _, res := range rep.Results {
		switch {
		case res.Verdict == endpointcheck.Fail && res.Level == endpointcheck.Required:
			failed = true
			t.Errorf("%s [%s]: %s; want %s (%s)", res.Name, res.ID, res.Observed, res.Expect, res.Source)
		case res.Verdict == endpointcheck.Fail:
			failed = true
			t.Logf("advisory: %s [%s]: %s; want %s (%s)", res.Name, res.ID, res.Observed, res.Expect, res.Source)
		case res.Verdict == endpointcheck.NotApplicable && res.Level == endpointcheck.Required:
			t.Logf("not checked: %s [%s]: %s", res.Name, res.ID, res.Observed)
		}
	}
	if failed {
		var b strings.Builder
		_ = rep.WriteText(&b)
		t.Logf("endpoint report:\n%s", b.String())
	}
	return rep
}

func testHandler(ctx context.Context, t reporter, h http.Handler, cfg endpointcheck.Config) *endpointcheck.Report {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = "/"
	}
	target, err := serverPath("URL", cfg.URL)
	if err != nil {
		t.Errorf("TestHandler: %v", err)
		return nil
	}
	if cfg.OtherRoute != "" {
		if _, err := serverPath("OtherRoute", cfg.OtherRoute); err != nil {
			t.Errorf("TestHandler: %v", err)
			return nil
		}
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	base, err := url.Parse(srv.URL)
	if err != nil {
		t.Errorf("TestHandler: the test server's URL: %v", err)
		return nil
	}
	cfg.URL = base.ResolveReference(target).String()
	return testEndpoint(ctx, t, cfg)
}

// serverPath parses a path (with an optional query) on TestHandler's server; anything
// with a scheme or a host is refused, as it would send the requests elsewhere.
func serverPath(field, s string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("endpointcheck.Config.%s %q: %w", field, s, err)
	}
	if u.Scheme != "" || u.Host != "" {
		return nil, fmt.Errorf("endpointcheck.Config.%s %q must be a path on the test server, not a URL", field, s)
	}
	return u, nil
}
