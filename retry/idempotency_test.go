package retry

import (
	"bufio"
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
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// flakyProxy is a TCP proxy in front of a backend. On each of its first drop connections
// it forwards the request, reads the backend's whole response (the work is done), waits
// for settled, then resets the client's connection without a byte of the response: the
// response is lost on the way back. Later connections are forwarded both ways.
type flakyProxy struct {
	ln      net.Listener
	backend string
	drop    int64
	settled func()
	conns   atomic.Int64
	wg      sync.WaitGroup
}

func newFlakyProxy(t *testing.T, backend string, drop int64, settled func()) *flakyProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &flakyProxy{ln: ln, backend: backend, drop: drop, settled: settled}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.wg.Wait()
	})
	return p
}

func (p *flakyProxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *flakyProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c, p.conns.Add(1))
		}()
	}
}

func (p *flakyProxy) handle(c net.Conn, n int64) {
	defer c.Close()
	b, err := net.Dial("tcp", p.backend)
	if err != nil {
		return
	}
	defer b.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(b, c)
		b.Close()
	}()
	defer func() { c.Close(); <-done }()
	if n > p.drop {
		_, _ = io.Copy(c, b)
		return
	}
	resp, err := http.ReadResponse(bufio.NewReader(b), nil)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	p.settled()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // an RST: the client learns nothing of the response
	}
}

// paymentsServer is a /payments endpoint behind the idempotency middleware: each
// execution counts one payment and answers 201 with its number and the request body.
func paymentsServer(t *testing.T, keyOptional bool) (srv *httptest.Server, payments *atomic.Int64, outcomes chan idempotency.Outcome) {
	payments = new(atomic.Int64)
	outcomes = make(chan idempotency.Outcome, 100)
	mw, err := idempotency.New(idempotency.Config{
		Store:       memstore.New(),
		KeyOptional: keyOptional,
		OnOutcome:   func(_ *http.Request, o idempotency.Outcome) { outcomes <- o },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mw.Shutdown(context.Background()) })
	srv = httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n := payments.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d,"request":%s}`, n, body)
	})))
	t.Cleanup(srv.Close)
	return srv, payments, outcomes
}

// THE test: a POST sent through a network that loses the response of the first two
// attempts after the server did the work. With a key (here AutoKey's) the payment is
// made once and the client finally gets the stored response; without one it is never
// repeated once written.
func TestTransportPaymentThroughFlakyNetwork(t *testing.T) {
	t.Parallel()
	settle := func(outcomes chan idempotency.Outcome) func() {
		return func() {
			select {
			case <-outcomes: // the middleware has stored (or released) the outcome
			case <-time.After(5 * time.Second):
			}
		}
	}

	t.Run("with a key: executed once, stored response returned", func(t *testing.T) {
		t.Parallel()
		srv, payments, outcomes := paymentsServer(t, false)
		var seen []idempotency.Outcome
		var mu sync.Mutex
		proxy := newFlakyProxy(t, srv.Listener.Addr().String(), 2, func() {
			select {
			case o := <-outcomes:
				mu.Lock()
				seen = append(seen, o)
				mu.Unlock()
			case <-time.After(5 * time.Second):
			}
		})
		base := newBase(t)
		p := testPolicy(newFakeClock())
		p.MaxAttempts = 5
		client := &http.Client{Transport: &Transport{Base: base, Policy: p, AutoKey: true}}

		resp, err := client.Post(proxy.URL()+"/payments", "application/json", strings.NewReader(`{"amount":100}`))
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(t, resp)
		if resp.StatusCode != http.StatusCreated || body != `{"payment":1,"request":{"amount":100}}` {
			t.Errorf("got %d %s", resp.StatusCode, body)
		}
		if resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the final response is not the stored one: %v", resp.Header)
		}
		if n := payments.Load(); n != 1 {
			t.Errorf("payments made = %d, want 1", n)
		}
		if n := base.Attempts(); n != 3 {
			t.Errorf("attempts = %d, want 3", n)
		}
		keys := base.Keys()
		if len(keys) != 3 || keys[0] == "" || keys[0] != keys[1] || keys[1] != keys[2] {
			t.Errorf("keys = %q", keys)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != 2 || seen[0] != idempotency.OutcomeExecuted || seen[1] != idempotency.OutcomeReplayed {
			t.Errorf("middleware outcomes behind the lost responses = %v, want executed, replayed", seen)
		}
	})

	t.Run("without a key: never repeated once written", func(t *testing.T) {
		t.Parallel()
		srv, payments, outcomes := paymentsServer(t, true)
		proxy := newFlakyProxy(t, srv.Listener.Addr().String(), 2, settle(outcomes))
		base := newBase(t)
		p := testPolicy(newFakeClock())
		p.MaxAttempts = 5
		client := &http.Client{Transport: &Transport{Base: base, Policy: p}}

		resp, err := client.Post(proxy.URL()+"/payments", "application/json", strings.NewReader(`{"amount":100}`))
		if resp != nil {
			resp.Body.Close()
		}
		if !errors.Is(err, ErrUnknownOutcome) {
			t.Errorf("err = %v, want ErrUnknownOutcome", err)
		}
		if n := payments.Load(); n != 1 {
			t.Errorf("payments made = %d, want 1", n)
		}
		if n := base.Attempts(); n != 1 {
			t.Errorf("attempts = %d, want 1", n)
		}
	})

	t.Run("without a key, with a status check: resent only when it did not happen", func(t *testing.T) {
		t.Parallel()
		srv, payments, outcomes := paymentsServer(t, true)
		proxy := newFlakyProxy(t, srv.Listener.Addr().String(), 1, settle(outcomes))
		base := newBase(t)
		client := &http.Client{Transport: &Transport{Base: base, Policy: testPolicy(newFakeClock())}}
		ctx := WithStatusCheck(context.Background(), func(ctx context.Context) (*http.Response, error) {
			if payments.Load() > 0 { // the server's ledger says it happened
				return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("found"))}, nil
			}
			return nil, nil
		})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, proxy.URL()+"/payments", strings.NewReader(`{"amount":100}`))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if body := readBody(t, resp); resp.StatusCode != http.StatusOK || body != "found" {
			t.Errorf("got %d %q, want the status check's answer", resp.StatusCode, body)
		}
		if payments.Load() != 1 || base.Attempts() != 1 {
			t.Errorf("%d payments after %d attempts, want 1 and 1", payments.Load(), base.Attempts())
		}
	})
}
