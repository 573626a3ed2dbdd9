package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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
	// Accepts, reads the request's headers, never answers.
	silent := listen(t, func(c net.Conn, stop <-chan struct{}) {
		_, _ = http.ReadRequest(bufio.NewReader(c))
		<-stop
		_ = c.Close()
	})
	// Only the silent server needs the context's timeout to end the round trip; the
	// others fail by themselves, and a loaded machine must not turn them into timeouts.
	cases := []struct {
		name    string
		addr    string
		timeout time.Duration
		want    failure
	}{
		{"nothing listening", testenv.DeadAddr(t), 30 * time.Second, failUnreachable},
		{"hang-up after the request", hangup, 30 * time.Second, failBroken},
		{"no answer in time", silent, 300 * time.Millisecond, failTimeout},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			var sent atomic.Bool
			ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
			defer cancel()
			req, _ := http.NewRequestWithContext(sentTrace(ctx, &sent), http.MethodPost, "http://"+c.addr+"/x", nil)
			req.Header.Set("Idempotency-Key", "k") // makes the transport retry what it may
			res, err := tr.RoundTrip(req)
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

type plainStore struct{ idempotency.Store }
type pingStore struct {
	idempotency.Store
	err error
}

func (p pingStore) Ping(context.Context) error { return p.err }

type listJanitorStore struct {
	idempotency.Store
	idempotency.Lister
	idempotency.Janitor
}

func TestInstrumentKeepsOptionalInterfaces(t *testing.T) {
	t.Parallel()
	mem := memstore.New()
	cases := []struct {
		name    string
		s       idempotency.Store
		j, l, p bool
	}{
		{"memstore (all)", mem, true, true, true},
		{"store only", plainStore{mem}, false, false, false},
		{"pinger", pingStore{Store: mem}, false, false, true},
		{"lister and janitor", listJanitorStore{mem, mem, mem}, true, true, false},
	}
	for _, c := range cases {
		m, err := newMetrics(newRegistry())
		if err != nil {
			t.Fatal(err)
		}
		s := instrument(c.s, m)
		_, j := s.(idempotency.Janitor)
		_, l := s.(idempotency.Lister)
		_, p := s.(idempotency.Pinger)
		if j != c.j || l != c.l || p != c.p {
			t.Errorf("%s: instrumented is Janitor %v Lister %v Pinger %v, want %v %v %v", c.name, j, l, p, c.j, c.l, c.p)
		}
	}
	// Errors pass through unchanged, matchable with errors.Is.
	m, _ := newMetrics(newRegistry())
	s := instrument(pingStore{Store: mem, err: idempotency.ErrClosed}, m)
	if err := s.(idempotency.Pinger).Ping(context.Background()); !errors.Is(err, idempotency.ErrClosed) {
		t.Fatalf("Ping = %v", err)
	}
	if _, err := s.Get(context.Background(), "", "nope"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get = %v", err)
	}
}
