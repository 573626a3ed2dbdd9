package bench

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/retrysafe/retrysafe/retry"
)

// retryClients returns, by name, the clients compared. Each gets its own base from
// newBase, so no client warms another's connections.
func retryClients(newBase func() http.RoundTripper) []struct {
	name   string
	client *http.Client
} {
	rh := retryablehttp.NewClient()
	rh.Logger = nil
	rh.HTTPClient.Transport = newBase()
	rh.RetryWaitMin, rh.RetryWaitMax = time.Millisecond, 4*time.Millisecond

	fs := failsafehttp.NewRetryPolicyBuilder().WithBackoff(time.Millisecond, 4*time.Millisecond).Build()

	return []struct {
		name   string
		client *http.Client
	}{
		{"plain", &http.Client{Transport: newBase()}},
		{"retrysafe", &http.Client{Transport: &retry.Transport{Base: newBase()}}},
		{"retrysafe-autokey", &http.Client{Transport: &retry.Transport{Base: newBase(), AutoKey: true}}},
		{"retryablehttp", rh.StandardClient()},
		{"failsafehttp", &http.Client{Transport: failsafehttp.NewRoundTripper(newBase(), fs)}},
	}
}

// retryStub answers every request 200 at once, without a network: what is left is the
// clients' own cost.
type retryStub struct{}

func (retryStub) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusOK, ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{},
		Body: http.NoBody, Request: r}, nil
}

// BenchmarkRetryTransportOverhead is the cost of a successful request (a GET, and a POST
// with a small body) through each retrying client, against the plain client with the
// same base: over loopback to an httptest server ("net"), and against a stub
// RoundTripper that answers at once ("stub": the clients' own overhead, without the
// network's noise).
func BenchmarkRetryTransportOverhead(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer srv.Close()
	bases := []struct {
		name string
		new  func() http.RoundTripper
	}{
		{"net", func() http.RoundTripper {
			t := &http.Transport{MaxIdleConnsPerHost: 64}
			b.Cleanup(t.CloseIdleConnections)
			return t
		}},
		{"stub", func() http.RoundTripper { return retryStub{} }},
	}
	for _, base := range bases {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			for _, c := range retryClients(base.new) {
				b.Run(base.name+"/"+method+"/"+c.name, func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						var body io.Reader
						if method == http.MethodPost {
							body = strings.NewReader(`{"amount":100}`)
						}
						req, err := http.NewRequest(method, srv.URL+"/payments", body)
						if err != nil {
							b.Fatal(err)
						}
						resp, err := c.client.Do(req)
						if err != nil {
							b.Fatal(err)
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusOK {
							b.Fatalf("status %d", resp.StatusCode)
						}
					}
				})
			}
		}
	}
}

// TestRetryBudgetLoad counts the calls that reach a dependency that fails every request
// (503) when 50 concurrent clients each make 20 logical requests, with 5 attempts per
// request at most: without a budget the dependency sees 5× its load; with one budget
// shared by the clients' Transport it sees about 1×.
func TestRetryBudgetLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("a load run")
	}
	const clients, perClient = 50, 20
	policy := retry.Policy{MaxAttempts: 5, Base: time.Millisecond, Cap: 4 * time.Millisecond}
	run := func(newRT func() http.RoundTripper, shared bool) int64 {
		var calls atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
		}))
		defer srv.Close()
		var one http.RoundTripper
		if shared {
			one = newRT()
		}
		var wg sync.WaitGroup
		for range clients {
			rt := one
			if !shared {
				rt = newRT()
			}
			client := &http.Client{Transport: rt}
			wg.Go(func() {
				for range perClient {
					req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL, nil)
					resp, err := client.Do(req)
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			})
		}
		wg.Wait()
		return calls.Load()
	}
	base := func() *http.Transport {
		tr := &http.Transport{MaxIdleConnsPerHost: clients}
		t.Cleanup(tr.CloseIdleConnections)
		return tr
	}
	rows := []struct {
		name   string
		shared bool
		rt     func() http.RoundTripper
	}{
		{"retrysafe, no budget", true, func() http.RoundTripper {
			return &retry.Transport{Base: base(), Policy: policy, NoBudget: true}
		}},
		{"retryablehttp (no budget)", false, func() http.RoundTripper {
			c := retryablehttp.NewClient()
			c.Logger = nil
			c.HTTPClient.Transport = base()
			c.RetryMax, c.RetryWaitMin, c.RetryWaitMax = 4, time.Millisecond, 4*time.Millisecond
			return c.StandardClient().Transport
		}},
		{"retrysafe, a default budget per client", false, func() http.RoundTripper {
			return &retry.Transport{Base: base(), Policy: policy}
		}},
		{"retrysafe, one default budget shared", true, func() http.RoundTripper {
			return &retry.Transport{Base: base(), Policy: policy}
		}},
	}
	logical := int64(clients * perClient)
	got := map[string]int64{}
	t.Logf("%d clients × %d logical requests = %d, at most 5 attempts each, server fails 100%%", clients, perClient, logical)
	t.Logf("| %-40s | %12s | %13s |", "client", "server calls", "amplification")
	for _, r := range rows {
		n := run(r.rt, r.shared)
		got[r.name] = n
		t.Logf("| %-40s | %12d | %12.2f× |", r.name, n, float64(n)/float64(logical))
	}
	if n := got["retrysafe, no budget"]; n != 5*logical {
		t.Errorf("without a budget: %d calls, want %d", n, 5*logical)
	}
	if n := got["retrysafe, one default budget shared"]; float64(n) > 1.1*float64(logical) {
		t.Errorf("with a shared budget: %d calls, want at most 1.1× the %d logical requests", n, logical)
	}
	if n := got["retrysafe, a default budget per client"]; n > logical+clients*4 {
		t.Errorf("with a budget per client: %d calls, want at most %d", n, logical+clients*4)
	}
	if f := float64(got["retrysafe, no budget"]) / float64(got["retrysafe, one default budget shared"]); f < 4 {
		t.Errorf("the budget reduces calls %.1f×, want at least 4×", f)
	} else {
		t.Logf("the shared budget cuts the calls %.1f×", f)
	}
}
