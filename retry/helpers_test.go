package retry

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/memnet"
)

// fakeClock advances by each wait at once, and records the waits.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	waits []time.Duration
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now().Truncate(time.Second)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waits = append(c.waits, d)
	c.now = c.now.Add(d)
	ch := make(chan time.Time, 1)
	ch <- c.now
	return ch, func() bool { return false }
}

func (c *fakeClock) Waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

func zeroRand() float64 { return 0 }

// testPolicy retries 3 times in all, without real waits.
func testPolicy(clock Clock) Policy {
	return Policy{MaxAttempts: 3, Base: time.Millisecond, Cap: 4 * time.Millisecond, Rand: zeroRand, Clock: clock}
}

// counting is a RoundTripper that counts attempts and records their keys and bodies.
type counting struct {
	base http.RoundTripper
	mu   sync.Mutex
	n    int
	keys []string
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.n++
	c.keys = append(c.keys, anyCase(r.Header, IdempotencyKeyHeader))
	c.mu.Unlock()
	return c.base.RoundTrip(r)
}

func (c *counting) Attempts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (c *counting) Keys() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.keys...)
}

// anyCase returns the first value of the header map entry named name in any case (below
// SendOnce, the key is under its lower-case map key).
func anyCase(h http.Header, name string) string {
	for k, vv := range h {
		if strings.EqualFold(k, name) && len(vv) > 0 {
			return vv[0]
		}
	}
	return ""
}

// newBase returns a private http.Transport whose idle connections close with the test.
func newBase(t testing.TB) *counting {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &counting{base: tr}
}

// newMemBase is newBase dialing l, an in-memory listener (see newMemScript).
func newMemBase(t testing.TB, l *memnet.Listener) *counting {
	tr := &http.Transport{DialContext: l.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &counting{base: tr}
}

// script is a test server whose handler for execution n (1 is the first) is chosen by fn.
type script struct {
	*httptest.Server
	n      atomic.Int64
	mu     sync.Mutex
	bodies []string
}

func newScript(t testing.TB, fn func(n int, w http.ResponseWriter, r *http.Request)) *script {
	s := &script{}
	s.Server = httptest.NewServer(s.handler(fn))
	t.Cleanup(s.Close)
	return s
}

// newMemScript is newScript served on l, an in-memory listener, for a test in a synctest
// bubble (make l in the bubble). Its URL is http://mem; reach it through newMemBase(t, l).
func newMemScript(t testing.TB, l *memnet.Listener, fn func(n int, w http.ResponseWriter, r *http.Request)) *script {
	s := &script{}
	s.Server = httptest.NewUnstartedServer(s.handler(fn))
	s.Listener.Close() // the loopback listener it made, replaced before it serves
	s.Listener = l
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func (s *script) handler(fn func(n int, w http.ResponseWriter, r *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.bodies = append(s.bodies, string(b))
		s.mu.Unlock()
		fn(int(s.n.Add(1)), w, r)
	})
}

func (s *script) Executions() int { return int(s.n.Load()) }

func (s *script) Bodies() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bodies...)
}

// hijack takes the connection over, writes partial, and closes it: with reset, by an
// RST (SetLinger(0)) instead of a FIN.
func hijack(t testing.TB, w http.ResponseWriter, partial string, reset bool) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	if partial != "" {
		_, _ = io.WriteString(conn, partial)
	}
	if tc, ok := conn.(*net.TCPConn); ok && reset {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// closedAddr returns an address nothing listens on.
func closedAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func newRequest(t testing.TB, ctx context.Context, method, url, body string) *http.Request {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func readBody(t testing.TB, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return string(b)
}
