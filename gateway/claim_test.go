package gateway_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// claimSeer is an upstream transport that records the claim in each outbound request's
// context. While refuse is set, its calls fail before anything is sent, as to an
// upstream that cannot be reached.
type claimSeer struct {
	mu     sync.Mutex
	refuse bool
	claims []*idempotency.Claim
}

var errNoUpstream = errors.New("connect: connection refused")

func (s *claimSeer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	c, _ := idempotency.ClaimFromContext(r.Context())
	s.mu.Lock()
	s.claims = append(s.claims, c)
	refuse := s.refuse
	s.mu.Unlock()
	if refuse {
		return nil, errNoUpstream
	}
	return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("done")),
		ContentLength: 4, Request: r, ProtoMajor: 1, ProtoMinor: 1}, nil
}

// The transports under the gateway's proxy find a keyed request's claim in the
// outbound request's context, and no claim for a request without a key; the gateway's
// own answer to a failed round trip finds it there too: an upstream that could not be
// reached releases the key, and the retry runs.
func TestUpstreamCallCarriesTheClaim(t *testing.T) {
	t.Parallel()
	seer := &claimSeer{}
	u, _ := url.Parse("http://upstream.invalid")
	gw, err := gateway.New(gateway.Config{Upstream: u, Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler),
		Transport: seer, Idempotency: idempotency.Config{Store: memstore.New()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
	send := func(method, key string) int {
		req := httptest.NewRequest(method, "/pay", strings.NewReader(`{"amount":1}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		gw.ServeHTTP(w, req)
		return w.Code
	}

	if code := send(http.MethodPost, "k-seen"); code != http.StatusCreated {
		t.Fatalf("keyed: status %d", code)
	}
	if code := send(http.MethodGet, ""); code != http.StatusCreated {
		t.Fatalf("unkeyed: status %d", code)
	}
	seer.mu.Lock()
	seer.refuse = true
	seer.mu.Unlock()
	if code := send(http.MethodPost, "k-refused"); code != http.StatusBadGateway {
		t.Fatalf("unreachable upstream: status %d, want 502", code)
	}
	seer.mu.Lock()
	seer.refuse = false
	refused := len(seer.claims) - 2 // the gateway sends a request nothing of which was sent again
	seer.mu.Unlock()
	if code := send(http.MethodPost, "k-refused"); code != http.StatusCreated {
		t.Fatalf("the retry after an unreachable upstream: status %d, want 201 (the key released)", code)
	}

	seer.mu.Lock()
	defer seer.mu.Unlock()
	want := []string{"k-seen", ""}
	for range refused + 1 {
		want = append(want, "k-refused")
	}
	if len(seer.claims) != len(want) {
		t.Fatalf("%d upstream calls, want %d", len(seer.claims), len(want))
	}
	for i, want := range want {
		c := seer.claims[i]
		switch {
		case want == "" && c != nil:
			t.Errorf("call %d, unkeyed: a claim in the outbound context (%q)", i, c.Key)
		case want != "" && (c == nil || c.Key != want || c.Token <= 0):
			t.Errorf("call %d: claim %+v in the outbound context, want key %q with a token", i, c, want)
		}
	}
	if first, last := seer.claims[2], seer.claims[len(seer.claims)-1]; first != nil && last != nil && first.Token == last.Token {
		t.Errorf("the retry ran under the released claim's token")
	}
}

// writeCounter counts the writes on the connections it dials.
type writeCounter struct {
	d      net.Dialer
	writes atomic.Int64
}

func (wc *writeCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := wc.d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return countedConn{c, &wc.writes}, nil
}

type countedConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countedConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A keyed request's body, which the middleware holds in memory, goes to the upstream in
// the same write as its headers: http.Transport flushes the headers by themselves first
// for a body it does not know to be in memory, one write and one TCP segment more per
// request.
func TestKeyedBodyGoesUpstreamInOneWrite(t *testing.T) {
	t.Parallel()
	var got atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b, _ := io.ReadAll(r.Body); string(b) == `{"amount":1}` {
			got.Add(1)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(up.Close)
	wc := &writeCounter{}
	u, _ := url.Parse(up.URL)
	gw, err := gateway.New(gateway.Config{Upstream: u, Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler),
		Transport: &http.Transport{DialContext: wc.dial}, Idempotency: idempotency.Config{Store: memstore.New()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
	const n = 3
	for i := range n {
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Idempotency-Key", "one-write-"+strconv.Itoa(i))
		w := httptest.NewRecorder()
		gw.ServeHTTP(w, req)
		if w.Code != http.StatusCreated {
			t.Fatalf("request %d: status %d", i, w.Code)
		}
	}
	if got.Load() != n {
		t.Fatalf("the upstream got %d whole bodies, want %d", got.Load(), n)
	}
	if w := wc.writes.Load(); w != n {
		t.Errorf("%d writes to the upstream for %d keyed requests with bodies, want one each", w, n)
	}
}
