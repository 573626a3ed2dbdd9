package deadline

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestBudgetMillis(t *testing.T) {
	t.Parallel()
	tests := []struct {
		left, reserve time.Duration
		ms            int64
		ok            bool
	}{
		{time.Second, 0, 1000, true},
		{time.Second, 100 * time.Millisecond, 900, true},
		{time.Second + 999*time.Microsecond, 0, 1000, true}, // rounded down
		{1500 * time.Microsecond, 0, 1, true},
		{999 * time.Microsecond, 0, 0, false}, // the header would say 0: spent
		{100 * time.Millisecond, 100 * time.Millisecond, 0, false},
		{100 * time.Millisecond, 200 * time.Millisecond, 0, false},
		{100*time.Millisecond + 500*time.Microsecond, 100 * time.Millisecond, 0, false},
		{time.Second, -time.Hour, 1000, true}, // negative reserve is none
		{-time.Hour, 1<<63 - 1, 0, false},     // no overflow
		{0, 0, 0, false},
		{-time.Second, 0, 0, false},
	}
	for _, tt := range tests {
		ms, ok := budgetMillis(tt.left, tt.reserve)
		if ms != tt.ms || ok != tt.ok {
			t.Errorf("budgetMillis(%v, %v) = %d, %v; want %d, %v", tt.left, tt.reserve, ms, ok, tt.ms, tt.ok)
		}
	}
}

// echoServer answers each request with the value of header (or "absent"), and counts
// the requests that reached it.
func echoServer(t *testing.T, header string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		v, ok := r.Header[http.CanonicalHeaderKey(header)]
		if !ok {
			_, _ = io.WriteString(w, "absent")
			return
		}
		_, _ = io.WriteString(w, strings.Join(v, ";"))
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func get(ctx context.Context, t *testing.T, rt http.RoundTripper, url string, h http.Header) (string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if len(req.Header) != len(h) {
		t.Errorf("the caller's request was modified: %v", req.Header)
	}
	return string(b), nil
}

func TestTransportWritesRemainingMinusReserve(t *testing.T) {
	t.Parallel()
	srv, _ := echoServer(t, DefaultHeader)
	// Seconds of slack below the expected value for a loaded machine; without the
	// reserve the header would be about 20000.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	got, err := get(ctx, t, Transport{Base: srv.Client().Transport, Reserve: 10 * time.Second}, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := strconv.ParseInt(got, 10, 64)
	if err != nil {
		t.Fatalf("header = %q: %v", got, err)
	}
	if ms > 10000 || ms < 5000 {
		t.Errorf("header = %d ms, want about 20000 − 10000 (in [5000, 10000])", ms)
	}
}

func TestTransportCustomHeaderReplacesCallerValue(t *testing.T) {
	t.Parallel()
	srv, _ := echoServer(t, "X-Budget")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	got, err := get(ctx, t, Transport{Base: srv.Client().Transport, Header: "X-Budget"}, srv.URL,
		http.Header{"X-Budget": {"999999"}})
	if err != nil {
		t.Fatal(err)
	}
	if ms, err := strconv.ParseInt(got, 10, 64); err != nil || ms > 10000 || ms < 5000 {
		t.Errorf("header = %q, want one value in [5000, 10000]", got)
	}
}

func TestTransportNoDeadlineNoHeader(t *testing.T) {
	t.Parallel()
	srv, n := echoServer(t, DefaultHeader)
	rt := Transport{Base: srv.Client().Transport, Reserve: time.Second}
	got, err := get(context.Background(), t, rt, srv.URL, nil)
	if err != nil || got != "absent" {
		t.Errorf("got %q, %v; want no header", got, err)
	}
	// A value the caller set itself is left alone.
	got, err = get(context.Background(), t, rt, srv.URL, http.Header{DefaultHeader: {"1234"}})
	if err != nil || got != "1234" {
		t.Errorf("got %q, %v; want the caller's 1234", got, err)
	}
	if n.Load() != 2 {
		t.Errorf("server saw %d requests, want 2", n.Load())
	}
}

type closeCounter struct {
	io.Reader
	closed atomic.Int64
}

func (c *closeCounter) Close() error { c.closed.Add(1); return nil }

func TestTransportFailsFastBelowReserve(t *testing.T) {
	t.Parallel()
	srv, n := echoServer(t, DefaultHeader)
	rt := Transport{Base: srv.Client().Transport, Reserve: 200 * time.Millisecond}
	for _, budget := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 0, -time.Second} {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		body := &closeCounter{Reader: strings.NewReader("payload")}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, body)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := (&http.Client{Transport: rt}).Do(req)
		cancel()
		if resp != nil {
			resp.Body.Close()
		}
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrExhausted) {
			t.Errorf("budget %v: err = %v, want one matching context.DeadlineExceeded and ErrExhausted", budget, err)
		}
		if body.closed.Load() == 0 {
			t.Errorf("budget %v: request body not closed", budget)
		}
	}
	if n.Load() != 0 {
		t.Errorf("%d requests reached the server, want 0", n.Load())
	}
}

func TestTransportDefaultBase(t *testing.T) {
	t.Parallel()
	srv, _ := echoServer(t, DefaultHeader)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	// The zero Transport uses http.DefaultTransport.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Connection", "close") // leave no idle connection behind
	resp, err := Transport{}.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if ms, err := strconv.Atoi(string(b)); err != nil || ms > 10000 || ms < 5000 {
		t.Errorf("header = %q, want in [5000, 10000]", b)
	}
}

// A request without a header map still gets the header.
func TestTransportNilHeader(t *testing.T) {
	t.Parallel()
	var got string
	rt := Transport{Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		got = r.Header.Get(DefaultHeader)
		return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Request: r}, nil
	})}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://example.invalid/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = nil
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got == "" || req.Header != nil {
		t.Errorf("sent header %q, caller's header map %v; want a value sent and the caller's left nil", got, req.Header)
	}
}

// With InPlace the budget is written on the request given, which Base receives itself:
// no copy of it or of its header map; a nil header map gets one.
func TestTransportInPlace(t *testing.T) {
	t.Parallel()
	for _, nilHeader := range []bool{false, true} {
		var sent *http.Request
		rt := Transport{InPlace: true, Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			sent = r
			return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Request: r}, nil
		})}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://example.invalid/", nil)
		if err != nil {
			t.Fatal(err)
		}
		if nilHeader {
			req.Header = nil
		}
		resp, err := rt.RoundTrip(req)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if sent != req {
			t.Errorf("nil header %v: Base got a copy of the request, want the request itself", nilHeader)
		}
		if ms, err := strconv.ParseInt(req.Header.Get(DefaultHeader), 10, 64); err != nil || ms > 10000 || ms < 5000 {
			t.Errorf("nil header %v: the request's %s is %q, want one value in [5000, 10000]", nilHeader, DefaultHeader, req.Header.Get(DefaultHeader))
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Across two hops: a client with 10 s calls A; A (Middleware, then Transport with a
// 50 ms reserve) calls B; B must see at most 9950 ms. The lower bound (half the budget)
// leaves seconds for the two local round trips on a loaded machine.
func TestEndToEndTwoHops(t *testing.T) {
	t.Parallel()
	type observed struct {
		header string
		left   time.Duration
	}
	seenB := make(chan observed, 1)
	b := httptest.NewServer(Middleware(Config{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		left, _ := Remaining(r.Context())
		seenB <- observed{r.Header.Get(DefaultHeader), left}
		w.WriteHeader(http.StatusNoContent)
	})))
	t.Cleanup(b.Close)
	toB := &http.Client{Transport: Transport{Base: b.Client().Transport, Reserve: 50 * time.Millisecond}}
	a := httptest.NewServer(Middleware(Config{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, b.URL, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		resp, err := toB.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
	})))
	t.Cleanup(a.Close)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: Transport{Base: a.Client().Transport}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d, want 204", resp.StatusCode)
	}
	got := <-seenB
	ms, err := strconv.Atoi(got.header)
	if err != nil || ms > 9950 || ms < 5000 {
		t.Errorf("B's header = %q, want ≤ 9950 (and ≥ 5000)", got.header)
	}
	if got.left > 9950*time.Millisecond || got.left < 5*time.Second {
		t.Errorf("B's remaining time = %v, want ≤ 9950ms (and ≥ 5s)", got.left)
	}
}
