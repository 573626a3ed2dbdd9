package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const bigSize = 256 << 10

// server is the upstream of the tests: it counts the requests it executed.
type server struct {
	*httptest.Server
	executed atomic.Int64
	conns    atomic.Int64
}

func newServer(t *testing.T) *server {
	t.Helper()
	s := &server{}
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		s.executed.Add(1)
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Method", r.Method)
		_, _ = w.Write(b)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		s.executed.Add(1)
		w.Header().Set("Content-Length", fmt.Sprint(bigSize))
		_, _ = w.Write(bytes.Repeat([]byte("x"), bigSize))
	})
	mux.HandleFunc("/chunked", func(w http.ResponseWriter, r *http.Request) {
		s.executed.Add(1)
		for i := range 3 {
			fmt.Fprintf(w, "part %d\n", i)
			w.(http.Flusher).Flush()
		}
	})
	s.Server = httptest.NewUnstartedServer(mux)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func start(t *testing.T, s *server, cfg Config) *Proxy {
	t.Helper()
	cfg.Target = s.Listener.Addr().String()
	p, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// onFirstFault returns an OnFault that closes the returned channel at the first fault
// injected. The proxy counts a fault before it reports it, so once the channel is
// closed the count is in, with no poll of counters the proxy updates on its own
// goroutines (which a client that timed out has no happens-before edge with).
func onFirstFault() (func(Fault), <-chan struct{}) {
	ch := make(chan struct{})
	var once sync.Once
	return func(Fault) { once.Do(func() { close(ch) }) }, ch
}

// awaitFault waits up to 10s for the channel of onFirstFault.
func awaitFault(t *testing.T, faulted <-chan struct{}) {
	t.Helper()
	select {
	case <-faulted:
	case <-time.After(10 * time.Second):
		t.Fatal("no fault injected in 10s")
	}
}

func client(t *testing.T, timeout time.Duration, keepAlive bool) *http.Client {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: 4}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: timeout}
}

func TestPassThrough(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := start(t, s, Config{})
	c := client(t, 5*time.Second, true)

	for i := range 5 {
		body := strings.Repeat("payload ", i+1)
		resp, err := c.Post(p.URL()+"/echo", "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(got) != body || resp.Header.Get("X-Method") != "POST" {
			t.Fatalf("echo %d: %q, %v, method %q", i, got, err, resp.Header.Get("X-Method"))
		}
	}
	// A body of unknown length goes chunked, and comes back whole.
	pr, pw := io.Pipe()
	go func() {
		for range 4 {
			_, _ = pw.Write([]byte("chunk;"))
		}
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPut, p.URL()+"/echo", pr)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != strings.Repeat("chunk;", 4) {
		t.Fatalf("chunked echo: %q", got)
	}
	// A streamed (chunked) response, a large one, a HEAD and an Expect: 100-continue.
	resp, err = c.Get(p.URL() + "/chunked")
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != "part 0\npart 1\npart 2\n" {
		t.Fatalf("chunked response: %q", got)
	}
	resp, err = c.Get(p.URL() + "/big")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if n != bigSize {
		t.Fatalf("big: %d bytes", n)
	}
	resp, err = c.Head(p.URL() + "/big")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ContentLength != bigSize {
		t.Fatalf("HEAD: Content-Length %d", resp.ContentLength)
	}
	req, _ = http.NewRequest(http.MethodPost, p.URL()+"/echo", strings.NewReader("continue"))
	req.Header.Set("Expect", "100-continue")
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != "continue" {
		t.Fatalf("expect-continue echo: %q", got)
	}

	// Keep-alive is preserved: all of that went over one client connection, hence one
	// server connection.
	st := p.Stats()
	if st.Connections != 1 || s.conns.Load() != 1 {
		t.Errorf("connections: proxy %d, server %d; want 1 and 1", st.Connections, s.conns.Load())
	}
	if st.Requests != 10 || st.Forwarded != 10 || st.Faults != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestRefuse(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := start(t, s, Config{Refuse: 1})
	c := client(t, 5*time.Second, false)
	for range 3 {
		resp, err := c.Post(p.URL()+"/echo", "text/plain", strings.NewReader("x"))
		if err == nil {
			resp.Body.Close()
			t.Fatal("refused connection answered")
		}
	}
	if n := s.executed.Load(); n != 0 {
		t.Errorf("server executed %d requests through refused connections", n)
	}
	if st := p.Stats(); st.Refused != 3 || st.Faults != 3 || st.Requests != 0 || s.conns.Load() != 0 {
		t.Errorf("stats %+v, server connections %d", st, s.conns.Load())
	}
}

func TestBlackHole(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	onFault, faulted := onFirstFault()
	p := start(t, s, Config{BlackHole: 1, OnFault: onFault})
	c := client(t, 200*time.Millisecond, false)
	begin := time.Now()
	resp, err := c.Post(p.URL()+"/echo", "text/plain", strings.NewReader("x"))
	if err == nil {
		resp.Body.Close()
		t.Fatal("black hole answered")
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("want a client timeout, got %v", err)
	}
	if time.Since(begin) < 150*time.Millisecond {
		t.Errorf("failed after %v, before the client's timeout", time.Since(begin))
	}
	if n := s.executed.Load(); n != 0 {
		t.Errorf("server executed %d requests through a black hole", n)
	}
	awaitFault(t, faulted) // a loaded machine may accept the connection after the client gave up
	if st := p.Stats(); st.BlackHoled != 1 || st.Requests != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestReadTimeout(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	onFault, faulted := onFirstFault()
	p := start(t, s, Config{ReadTimeout: 1, OnFault: onFault})
	c := client(t, 2*time.Second, false) // long enough for the request to be forwarded
	begin := time.Now()
	resp, err := c.Post(p.URL()+"/echo", "text/plain", strings.NewReader("x"))
	if err == nil {
		resp.Body.Close()
		t.Fatal("withheld response arrived")
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("want a client timeout, got %v", err)
	}
	if time.Since(begin) < 1500*time.Millisecond {
		t.Errorf("failed after %v, before the client's timeout", time.Since(begin))
	}
	// The request was forwarded: the server executed it, the client saw a timeout. The
	// proxy withholds the response only once it has read it, after the server ran.
	awaitFault(t, faulted)
	if n := s.executed.Load(); n != 1 {
		t.Errorf("server executed %d requests, want 1", n)
	}
	if st := p.Stats(); st.ReadTimeouts != 1 || st.Forwarded != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestResponseLost(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := start(t, s, Config{ResponseLost: 1})
	c := client(t, 5*time.Second, false)
	resp, err := c.Post(p.URL()+"/echo", "text/plain", strings.NewReader("x"))
	if err == nil {
		resp.Body.Close()
		t.Fatal("lost response arrived")
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Logf("error (not EOF, acceptable): %v", err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("want a connection error at once, got a timeout: %v", err)
	}
	if n := s.executed.Load(); n != 1 {
		t.Errorf("server executed %d requests, want 1: the response was lost after execution", n)
	}
	if st := p.Stats(); st.ResponsesLost != 1 || st.Faults != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestResponseReset(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := start(t, s, Config{ResponseReset: 1})
	c := client(t, 5*time.Second, false)
	resp, err := c.Post(p.URL()+"/echo", "text/plain", strings.NewReader("x"))
	if err == nil {
		resp.Body.Close()
		t.Fatal("reset response arrived")
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("error %v, want ECONNRESET", err)
	}
	if n := s.executed.Load(); n != 1 {
		t.Errorf("server executed %d requests, want 1: the response was reset after execution", n)
	}
	if st := p.Stats(); st.ResponseResets != 1 || st.Faults != 1 {
		t.Errorf("stats %+v", st)
	}
}

// seedFor returns a seed whose first request decisions are none, then kind, then none
// (for the rate given to kind alone), so a test can aim a fault at the second request.
func seedFor(t *testing.T, cfg Config) uint64 {
	t.Helper()
	for seed := uint64(1); seed < 10000; seed++ {
		cfg.Seed = seed
		d := newDecider(cfg, streamRequest)
		a, b, c := d.next(), d.next(), d.next()
		if a.kind == 0 && b.kind != 0 && c.kind == 0 {
			return seed
		}
	}
	t.Fatal("no seed found")
	return 0
}

// TestTransportResendsKeyedRequest shows what the proxy's faults on a reused keep-alive
// connection provoke in Go's http.Transport: a keyed POST whose response was lost or
// reset without a byte is sent again on a new connection by the transport itself, and
// the server executes it twice while the caller sees one success. A fault that sends
// part of the response (Reset), or a request without a key, is not resent.
func TestTransportResendsKeyedRequest(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		cfg       Config
		key       bool
		resent    bool
		wantFault Kind
	}{
		{"response lost, keyed", Config{ResponseLost: 0.5}, true, true, ResponseLost},
		{"response reset, keyed", Config{ResponseReset: 0.5}, true, true, ResponseReset},
		{"response lost, no key", Config{ResponseLost: 0.5}, false, false, ResponseLost},
		{"reset mid-answer, keyed", Config{Reset: 0.5}, true, false, Reset},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			cfg := tc.cfg
			cfg.Seed = seedFor(t, cfg)
			var faults []Fault
			var mu sync.Mutex
			cfg.OnFault = func(f Fault) {
				mu.Lock()
				faults = append(faults, f)
				mu.Unlock()
			}
			p := start(t, s, cfg)
			c := client(t, 5*time.Second, true)
			post := func(key string) error {
				req, _ := http.NewRequest(http.MethodPost, p.URL()+"/big", strings.NewReader("x"))
				req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("x")), nil }
				if tc.key {
					req.Header.Set("Idempotency-Key", key)
				}
				resp, err := c.Transport.RoundTrip(req)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				_, err = io.Copy(io.Discard, resp.Body)
				return err
			}
			if err := post("k1"); err != nil {
				t.Fatal(err)
			}
			err := post("k2") // on the reused connection: the fault
			executed := s.executed.Load()
			if tc.resent {
				if err != nil || executed != 3 {
					t.Errorf("error %v, server executed %d; want the transport's silent resend: nil and 3", err, executed)
				}
			} else if err == nil || executed != 2 {
				t.Errorf("error %v, server executed %d; want an error and 2 (no resend)", err, executed)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(faults) != 1 {
				t.Fatalf("OnFault saw %d faults, want 1", len(faults))
			}
			f := faults[0]
			wantKey := ""
			if tc.key {
				wantKey = "k2"
			}
			if f.Kind != tc.wantFault || f.Conn != 1 || f.Request != 2 || f.Method != http.MethodPost || f.Path != "/big" ||
				f.Key != wantKey || f.Status != http.StatusOK || f.ResponseHeader.Get("Content-Length") != fmt.Sprint(bigSize) || f.At.IsZero() {
				t.Errorf("fault %+v", f)
			}
			if st := p.Stats(); st.OnReused != 1 {
				t.Errorf("stats %+v: want 1 fault on a reused connection", st)
			}
		})
	}
}

func TestReset(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := start(t, s, Config{Reset: 1, Seed: 7})
	c := client(t, 5*time.Second, false)
	midBody := 0
	for range 5 {
		resp, err := c.Get(p.URL() + "/big")
		if err != nil {
			continue // cut inside the headers: also a reset, just earlier
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Fatalf("reset response read whole (%d bytes)", n)
		}
		if n >= bigSize {
			t.Fatalf("read %d bytes of %d before the error", n, bigSize)
		}
		midBody++
	}
	// With a 256 KiB body nearly every cut falls in the body.
	if midBody == 0 {
		t.Error("no reset hit the body")
	}
	if n := s.executed.Load(); n != 5 {
		t.Errorf("server executed %d requests, want 5", n)
	}
	if st := p.Stats(); st.Resets != 5 {
		t.Errorf("stats %+v", st)
	}
}

func TestLatency(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := start(t, s, Config{Latency: 60 * time.Millisecond, Jitter: 20 * time.Millisecond})
	c := client(t, 5*time.Second, true)
	begin := time.Now()
	resp, err := c.Get(p.URL() + "/echo")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if d := time.Since(begin); d < 60*time.Millisecond {
		t.Errorf("answered in %v, before the added latency", d)
	}
	if st := p.Stats(); st.Delayed != 1 || st.Faults != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestPerRequestFaults: faults hit requests on a keep-alive connection, and a request
// that is not faulted is served on the connection the earlier ones used.
func TestPerRequestFaults(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := start(t, s, Config{ResponseLost: 0.3, Seed: 3})
	c := client(t, 5*time.Second, true)
	ok, failed := 0, 0
	for range 50 {
		req, _ := http.NewRequest(http.MethodPost, p.URL()+"/echo", strings.NewReader("x"))
		resp, err := c.Transport.RoundTrip(req) // no http.Client redirects; POST: no hidden retry
		if err != nil {
			failed++
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ok++
	}
	st := p.Stats()
	if int64(failed) != st.ResponsesLost || st.Requests != 50 || int64(ok+failed) != s.executed.Load() {
		t.Errorf("ok %d, failed %d, executed %d, stats %+v", ok, failed, s.executed.Load(), st)
	}
	// Each lost response ends its connection; every other request reused one.
	if st.Connections > st.ResponsesLost+1 {
		t.Errorf("%d connections for %d faults: keep-alive connections were not reused", st.Connections, st.ResponsesLost)
	}
}

// TestRates: over 1000 requests (or connections), a rate of 0.3 injects about 300.
func TestRates(t *testing.T) {
	t.Parallel()
	const n, rate = 1000, 0.3
	// 4.5 standard deviations of Binomial(1000, 0.3) either side: sane, never flaky.
	lo, hi := int64(235), int64(365)
	t.Run("request", func(t *testing.T) {
		t.Parallel()
		s := newServer(t)
		p := start(t, s, Config{ResponseLost: rate, Seed: 11})
		c := client(t, 5*time.Second, true)
		failed := int64(0)
		for range n {
			req, _ := http.NewRequest(http.MethodPost, p.URL()+"/echo", strings.NewReader("x"))
			resp, err := c.Transport.RoundTrip(req)
			if err != nil {
				failed++
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		st := p.Stats()
		if st.ResponsesLost < lo || st.ResponsesLost > hi {
			t.Errorf("%d responses lost of %d, want %d..%d", st.ResponsesLost, n, lo, hi)
		}
		if failed != st.ResponsesLost || st.Requests != n || st.Faults != st.ResponsesLost {
			t.Errorf("client saw %d failures; stats %+v", failed, st)
		}
	})
	t.Run("connection", func(t *testing.T) {
		t.Parallel()
		s := newServer(t)
		p := start(t, s, Config{Refuse: rate, Seed: 12})
		c := client(t, 5*time.Second, false)
		failed := int64(0)
		for range n {
			req, _ := http.NewRequest(http.MethodPost, p.URL()+"/echo", strings.NewReader("x"))
			resp, err := c.Transport.RoundTrip(req)
			if err != nil {
				failed++
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		st := p.Stats()
		if st.Refused < lo || st.Refused > hi {
			t.Errorf("%d connections refused of %d, want %d..%d", st.Refused, n, lo, hi)
		}
		if failed != st.Refused || st.Connections != n || s.executed.Load() != n-st.Refused {
			t.Errorf("client saw %d failures, server executed %d; stats %+v", failed, s.executed.Load(), st)
		}
	})
}

// TestDeciderDeterministic: the same seed gives the same decisions, another seed other
// ones, and the rates are honoured.
func TestDeciderDeterministic(t *testing.T) {
	t.Parallel()
	cfg := Config{Seed: 42, Refuse: 0.1, BlackHole: 0.1, ReadTimeout: 0.1, Reset: 0.1, ResponseLost: 0.1,
		Latency: time.Millisecond, Jitter: 5 * time.Millisecond}
	draw := func(cfg Config, s stream) []decision {
		d := newDecider(cfg, s)
		out := make([]decision, 2000)
		for i := range out {
			out[i] = d.next()
		}
		return out
	}
	for _, s := range []stream{streamConn, streamRequest} {
		a, b := draw(cfg, s), draw(cfg, s)
		other := cfg
		other.Seed = 43
		c := draw(other, s)
		same, counts := 0, map[Kind]int{}
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("stream %x, decision %d: %+v then %+v with the same seed", s, i, a[i], b[i])
			}
			if a[i] == c[i] {
				same++
			}
			counts[a[i].kind]++
			if s == streamRequest && (a[i].delay < time.Millisecond || a[i].delay >= 6*time.Millisecond) {
				t.Fatalf("delay %v outside [1ms, 6ms)", a[i].delay)
			}
		}
		if same == len(a) {
			t.Errorf("stream %x: seeds 42 and 43 gave the same decisions", s)
		}
		for k, n := range counts {
			if k != 0 && (n < 120 || n > 290) { // 0.1 of 2000 = 200
				t.Errorf("stream %x: %v drawn %d times of 2000", s, k, n)
			}
		}
	}
}

// TestSeedReproducible: one client sending requests one after the other sees the same
// sequence of outcomes for the same seed, end to end.
func TestSeedReproducible(t *testing.T) {
	t.Parallel()
	run := func(seed uint64) string {
		s := newServer(t)
		p := start(t, s, Config{Seed: seed, Refuse: 0.2, ResponseLost: 0.2, Reset: 0.2})
		c := client(t, 5*time.Second, true)
		var b strings.Builder
		for range 60 {
			req, _ := http.NewRequest(http.MethodPost, p.URL()+"/big", nil)
			resp, err := c.Transport.RoundTrip(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if err != nil {
				b.WriteByte('x')
			} else {
				b.WriteByte('.')
			}
		}
		st := p.Stats()
		fmt.Fprintf(&b, " %d/%d/%d", st.Refused, st.Resets, st.ResponsesLost)
		return b.String()
	}
	a, b, c := run(5), run(5), run(6)
	if a != b {
		t.Errorf("seed 5 twice:\n%s\n%s", a, b)
	}
	if a == c {
		t.Errorf("seeds 5 and 6 gave the same run: %s", a)
	}
	t.Logf("seed 5: %s", a)
}

func TestCloseReleasesHeldConnections(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	onFault, faulted := onFirstFault()
	cfg := Config{Target: s.Listener.Addr().String(), ReadTimeout: 1, OnFault: onFault}
	p, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := client(t, 0, false) // no timeout: only Close can end the wait
	errc := make(chan error, 1)
	go func() {
		resp, err := c.Get(p.URL() + "/echo")
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	awaitFault(t, faulted) // the request is held: only Close can end it
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	if err := <-errc; err == nil {
		t.Error("held request answered")
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// A closed proxy refuses connections.
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Error("closed proxy still accepts")
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{
		{},
		{Target: "x:1", Refuse: -0.1},
		{Target: "x:1", Reset: 1.5},
		{Target: "x:1", ReadTimeout: 0.5, Reset: 0.3, ResponseLost: 0.3},
		{Target: "x:1", ReadTimeout: 0.5, ResponseReset: 0.6},
		{Target: "x:1", Refuse: 0.6, BlackHole: 0.6},
		{Target: "x:1", Reset: nan()},
		{Target: "x:1", Latency: -time.Second},
		{Target: "x:1", Listen: "not an address"},
	} {
		if p, err := Start(context.Background(), cfg); err == nil {
			p.Close()
			t.Errorf("Start(%+v) succeeded", cfg)
		}
	}
}

func nan() float64 {
	zero := 0.0
	return zero / zero
}

func TestKindString(t *testing.T) {
	t.Parallel()
	want := []string{"refuse", "black-hole", "read-timeout", "reset", "response-lost", "response-reset"}
	for i, k := range Kinds() {
		if k.String() != want[i] {
			t.Errorf("%d: %q", i, k.String())
		}
	}
	if Kind(0).String() != "Kind(0)" {
		t.Error(Kind(0).String())
	}
	st := Stats{Refused: 1, BlackHoled: 2, ReadTimeouts: 3, Resets: 4, ResponsesLost: 5, ResponseResets: 6}
	for i, k := range Kinds() {
		if st.Count(k) != int64(i+1) {
			t.Errorf("Count(%v) = %d", k, st.Count(k))
		}
	}
}
