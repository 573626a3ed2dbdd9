package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/deadline"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassifyTable(t *testing.T) {
	t.Parallel()
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	cases := []struct {
		name string
		err  error
		sent bool
		want failure
	}{
		{"no error", nil, true, failNone},
		{"dial refused", dial, false, failUnreachable},
		{"dns", &net.DNSError{Err: "no such host", Name: "nope.invalid", IsNotFound: true}, false, failUnreachable},
		{"dial timeout", &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}, false, failUnreachable},
		{"deadline before sending", context.DeadlineExceeded, false, failUnreachable},
		{"budget spent before sending", fmt.Errorf("wrapped: %w", deadline.ErrExhausted), false, failUnreachable},
		{"deadline after sending", fmt.Errorf("net/http: request canceled: %w", context.DeadlineExceeded), true, failTimeout},
		{"header timeout after sending", timeoutErr{}, true, failTimeout},
		{"reset after sending", reset, true, failBroken},
		{"eof after sending", io.ErrUnexpectedEOF, true, failBroken},
		{"dial error on a retry after a first attempt was sent", dial, true, failBroken},
	}
	for _, c := range cases {
		if got := classify(c.err, c.sent); got != c.want {
			t.Errorf("%s: classify(%v, %v) = %v, want %v", c.name, c.err, c.sent, got, c.want)
		}
	}
}

// TestClassifyRealRoundTrips drives an http.Transport against sockets that fail at each
// stage, with the trace the gateway uses, and checks the verdicts.
func TestClassifyRealRoundTrips(t *testing.T) {
	t.Parallel()
	// Accepts, reads the request's headers, then closes without an answer.
	hangup := listen(t, func(c net.Conn, _ <-chan struct{}) {
		_, _ = http.ReadRequest(bufio.NewReader(c))
		_ = c.Close()
	})
	// Accepts, reads the request's headers, says so, never answers.
	heard := make(chan struct{}, 1)
	silent := listen(t, func(c net.Conn, stop <-chan struct{}) {
		_, _ = http.ReadRequest(bufio.NewReader(c))
		select {
		case heard <- struct{}{}:
		default: // said already
		}
		<-stop
		_ = c.Close()
	})
	// The others fail by themselves, within a timeout of 30s that only stops a test that
	// hangs. The silent server's round trip ends as the gateway's upstream timeout ends
	// one, with errUpstreamTimeout as its context's cause, but only once the server has
	// read the request: a timer could cut a round trip that a busy machine had not sent
	// yet, which would be no timeout but an unreachable upstream.
	cases := []struct {
		name string
		addr string
		cut  <-chan struct{} // when set, its signal ends the round trip as a timeout
		want failure
	}{
		{"nothing listening", testenv.DeadAddr(t), nil, failUnreachable},
		{"hang-up after the request", hangup, nil, failBroken},
		{"no answer in time", silent, heard, failTimeout},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			var ex exchange
			sent := &ex.sent
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if c.cut != nil {
				var cut context.CancelCauseFunc
				ctx, cut = context.WithCancelCause(ctx)
				defer cut(nil)
				go func() {
					select {
					case <-c.cut:
						cut(errUpstreamTimeout)
					case <-ctx.Done():
					}
				}()
			}
			// As the gateway's proxy sends it: with the ReverseProxy's own trace, on
			// which the exchange's hooks are set.
			proxyTrace := &httptrace.ClientTrace{Got1xxResponse: func(int, textproto.MIMEHeader) error { return nil }}
			req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, proxyTrace), http.MethodPost, "http://"+c.addr+"/x", nil)
			req.Header.Set("Idempotency-Key", "k") // makes the transport retry what it may
			res, err := tr.RoundTrip(ex.hook(req))
			if err == nil {
				_ = res.Body.Close()
				t.Fatal("round trip succeeded")
			}
			if got := classify(err, sent.Load()); got != c.want {
				t.Fatalf("classify(%v, sent=%v) = %v, want %v", err, sent.Load(), got, c.want)
			}
		})
	}
}

// hook sets the exchange's hooks on the proxy's own trace when it has none of their
// kinds, and otherwise adds a trace of the exchange's: either way a round trip's
// WroteHeaders reaches ex.sent, and another trace's hooks still run.
func TestHookSetsSent(t *testing.T) {
	t.Parallel()
	var otherSaw bool
	for _, c := range []struct {
		name  string
		trace *httptrace.ClientTrace // in the request's context; nil: none
		same  bool                   // the hooks go on that trace, in place
	}{
		{"the proxy's trace", &httptrace.ClientTrace{Got1xxResponse: func(int, textproto.MIMEHeader) error { return nil }}, true},
		{"no trace", nil, false},
		{"a trace with a WroteHeaders of its own", &httptrace.ClientTrace{WroteHeaders: func() { otherSaw = true }}, false},
	} {
		var ex exchange
		ctx := context.Background()
		if c.trace != nil {
			ctx = httptrace.WithClientTrace(ctx, c.trace)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://upstream.invalid/x", nil)
		out := ex.hook(req)
		if (out == req) != c.same {
			t.Errorf("%s: hooked in place %v, want %v", c.name, out == req, c.same)
		}
		tr := httptrace.ContextClientTrace(out.Context())
		if tr == nil || tr.WroteHeaders == nil {
			t.Fatalf("%s: no WroteHeaders hook on the outbound request", c.name)
		}
		tr.WroteHeaders()
		if !ex.sent.Load() {
			t.Errorf("%s: WroteHeaders did not set sent", c.name)
		}
		if c.trace != nil && c.trace.Got1xxResponse != nil && tr.Got1xxResponse == nil {
			t.Errorf("%s: the proxy's Got1xxResponse hook is lost", c.name)
		}
	}
	if !otherSaw {
		t.Error("the other trace's WroteHeaders did not run")
	}
}

func listen(t *testing.T, handle func(c net.Conn, stop <-chan struct{})) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(stop)
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { handle(c, stop) })
		}
	})
	return ln.Addr().String()
}

type pingStore struct {
	idempotency.Store
	err error
}

func (p pingStore) Ping(context.Context) error { return p.err }

// Every store call is timed under its operation, the middleware's (through
// OnStoreCall) and the gateway's own (the readiness ping), and a failed one is counted
// as an error: a store that cannot be pinged shows on the metrics.
func TestStoreCallsAreTimed(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	reg := prometheus.NewRegistry()
	down := errors.New("store down")
	gw, err := New(Config{Upstream: u, Idempotency: idempotency.Config{Store: pingStore{Store: memstore.New(), err: down}},
		Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
	req := httptest.NewRequest("POST", "/pay", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "k1")
	gw.ServeHTTP(httptest.NewRecorder(), req)
	rec := httptest.NewRecorder()
	gw.Admin().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz = %d, want 503 from the failing ping", rec.Code)
	}
	counts := map[string]float64{}
	errs := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			op := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "operation" {
					op = l.GetValue()
				}
			}
			switch mf.GetName() {
			case "retrysafe_gateway_store_duration_seconds":
				counts[op] = float64(m.GetHistogram().GetSampleCount())
			case "retrysafe_gateway_store_errors_total":
				errs[op] = m.GetCounter().GetValue()
			}
		}
	}
	if counts["claim"] != 1 || counts["complete"] != 1 || counts["ping"] < 1 {
		t.Errorf("store calls timed = %v, want claim 1, complete 1, ping ≥ 1", counts)
	}
	if errs["ping"] < 1 || errs["claim"] != 0 {
		t.Errorf("store errors = %v, want the failed pings only", errs)
	}
}

// requests_waiting shows the duplicates waiting, under the wait conflict policy, for a
// key in progress.
func TestWaitingGauge(t *testing.T) {
	t.Parallel()
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(arrived) })
		<-release
		w.WriteHeader(201)
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	reg := prometheus.NewRegistry()
	gw, err := New(Config{Upstream: u, Registerer: reg, Logger: slog.New(slog.DiscardHandler),
		Idempotency: idempotency.Config{Store: memstore.New(), Conflict: idempotency.ConflictWait}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
	gauge := func() float64 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "retrysafe_gateway_requests_waiting" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	post := func() int {
		req := httptest.NewRequest("POST", "/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		gw.ServeHTTP(w, req)
		return w.Code
	}
	codes := make(chan int, 2)
	go func() { codes <- post() }()
	<-arrived
	go func() { codes <- post() }()
	deadline := time.Now().Add(10 * time.Second)
	for gauge() != 1 && time.Now().Before(deadline) {
		runtime.Gosched() // the duplicate joins the waiters in this process
	}
	if g := gauge(); g != 1 {
		t.Fatalf("requests_waiting = %v with one duplicate waiting, want 1", g)
	}
	close(release)
	for range 2 {
		if c := <-codes; c != 201 {
			t.Errorf("status %d, want 201", c)
		}
	}
	if g := gauge(); g != 0 {
		t.Errorf("requests_waiting = %v after both answered, want 0", g)
	}
}

// TestUpstreamContentLength: the upstream is told each body's length, keyed (the body
// read into memory) or not (streamed), though the outbound header map no longer carries
// the client's Content-Length.
func TestUpstreamContentLength(t *testing.T) {
	t.Parallel()
	type seen struct {
		length   int64
		header   string
		encoding []string
		body     string
	}
	got := make(chan seen, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.ContentLength, r.Header.Get("Content-Length"), r.TransferEncoding, string(b)}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	g, err := New(Config{Upstream: u, Logger: slog.New(slog.DiscardHandler), Idempotency: idempotency.Config{Store: memstore.New(), KeyOptional: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Shutdown(context.Background()) })
	front := httptest.NewServer(g)
	t.Cleanup(front.Close)
	const body = `{"amount":1250}`
	for _, key := range []string{"k1", ""} {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/pay", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := front.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			t.Fatalf("key %q: status %d", key, res.StatusCode)
		}
		s := <-got
		want := strconv.Itoa(len(body))
		if s.length != int64(len(body)) || s.header != want || len(s.encoding) != 0 || s.body != body {
			t.Errorf("key %q: the upstream saw length %d, Content-Length %q, Transfer-Encoding %q, body %q; want %s, %q, none, %q",
				key, s.length, s.header, s.encoding, s.body, want, want, body)
		}
	}
}

// TestSettledAnswerWaitIsBounded: once an unkeyed answer's headers have come, the
// upstream timeout bounds each wait for its body, so a body that stalls is cut at the
// timeout, towards the client (its connection is cut: its answer is not whole) and
// towards the upstream. The upstream holds the rest of its body until the test ends it,
// long after the timeout: a gateway that did not bound the wait would leave the client
// reading until then. (A body that keeps coming: TestUnkeyedAnswerAtTheClientsPace.)
func TestSettledAnswerWaitIsBounded(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	upstreamGone := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("first part"))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done(): // the gateway cut the call
			upstreamGone <- struct{}{}
		case <-release:
		}
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	g, err := New(Config{Upstream: u, Logger: slog.New(slog.DiscardHandler), UpstreamTimeout: 200 * time.Millisecond,
		Idempotency: idempotency.Config{Store: memstore.New()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Shutdown(context.Background()) })
	front := httptest.NewServer(g)
	t.Cleanup(front.Close)

	got := make(chan error, 1)
	go func() {
		res, err := front.Client().Get(front.URL + "/stalls")
		if err == nil {
			_, err = io.ReadAll(res.Body)
			_ = res.Body.Close()
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err == nil {
			t.Fatal("the client got a whole answer from a body that stalled")
		}
	case <-time.After(30 * time.Second): // a failure's bound, 150 times the timeout
		close(release)
		t.Fatalf("the body's stall was not cut at the upstream timeout: the client read until the upstream went on (%v)", <-got)
	}
	<-upstreamGone // the call was cut upstream too, not only towards the client
	close(release)
}

// unkeyedGateway is a gateway in front of handler, with the memory store and the
// timeouts given, and a server in front of it.
func unkeyedGateway(t *testing.T, handler http.HandlerFunc, upstreamTimeout, bodyTimeout time.Duration) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(handler)
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	g, err := New(Config{Upstream: u, Logger: slog.New(slog.DiscardHandler), UpstreamTimeout: upstreamTimeout,
		Idempotency: idempotency.Config{Store: memstore.New(), BodyTimeout: bodyTimeout}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Shutdown(context.Background()) })
	front := httptest.NewServer(g)
	t.Cleanup(front.Close)
	return front
}

// TestUnkeyedCallEndsWithItsClientAndBudget: an unkeyed upstream call (nothing will be
// stored for a retry) ends when its client leaves, and when the caller's budget runs
// out before the upstream timeout would, whatever context the gateway gives the call.
// The upstream holds each request until its context ends: a call that outlived its
// client or its budget would hold it until the test's bound.
func TestUnkeyedCallEndsWithItsClientAndBudget(t *testing.T) {
	t.Parallel()
	arrived, ended := make(chan struct{}, 1), make(chan struct{}, 1)
	front := unkeyedGateway(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
			ended <- struct{}{}
		case <-time.After(60 * time.Second): // the upstream timeout; a failure below first
		}
	}, time.Minute, 0)
	endedBy := func(what string) {
		t.Helper()
		select {
		case <-ended:
		case <-time.After(30 * time.Second): // a failure's bound
			t.Fatalf("the upstream call outlived %s", what)
		}
	}

	ctx, leave := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+"/held", nil)
	go func() {
		if res, err := front.Client().Do(req); err == nil {
			_ = res.Body.Close()
		}
	}()
	<-arrived
	leave()
	endedBy("its client")

	req, _ = http.NewRequest(http.MethodGet, front.URL+"/held", nil)
	req.Header.Set(deadline.DefaultHeader, "300") // far before the upstream timeout
	res, err := front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	<-arrived
	endedBy("the caller's budget")
	if res.StatusCode != http.StatusGatewayTimeout {
		t.Errorf("status %d once the caller's budget ran out, want 504", res.StatusCode)
	}
}

// TestUnkeyedAnswerAtTheClientsPace: an unkeyed answer whose body keeps coming is copied
// whole, however long past the request's budget (the time to receive its body and to
// call the upstream) it takes, as through any proxy: once its headers have come, only
// each wait for its body is bounded, by the upstream timeout. The upstream writes a
// chunk every 50 ms, for three times the budget; each wait is 40 times shorter than the
// timeout.
func TestUnkeyedAnswerAtTheClientsPace(t *testing.T) {
	t.Parallel()
	const (
		upstreamTimeout = 2 * time.Second
		bodyTimeout     = 100 * time.Millisecond
		budget          = upstreamTimeout + bodyTimeout
	)
	front := unkeyedGateway(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		for start := time.Now(); time.Since(start) < 3*budget; {
			if _, err := w.Write([]byte("chunk\n")); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
		}
		_, _ = w.Write([]byte("end\n"))
	}, upstreamTimeout, bodyTimeout)
	res, err := front.Client().Get(front.URL + "/download")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil || !strings.HasSuffix(string(body), "end\n") {
		t.Fatalf("the answer was cut: %v after %d bytes", err, len(body))
	}
}
