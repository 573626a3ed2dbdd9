package bench

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// cannedUpstream answers every request 201 with a small JSON body, in process: the
// gateway's own work is all that BenchmarkGatewayInProcess measures.
type cannedUpstream struct{}

var cannedBody = []byte(`{"id":1,"user":"bench","amount":1250,"currency":"EUR"}` + "\n")

func (cannedUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	h := make(http.Header, 2)
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(cannedBody)))
	return &http.Response{StatusCode: http.StatusCreated, Header: h, Body: io.NopCloser(bytes.NewReader(cannedBody)),
		ContentLength: int64(len(cannedBody)), Request: r, ProtoMajor: 1, ProtoMinor: 1}, nil
}

// reusedWriter is a ResponseWriter that keeps the status and drops the body, reused
// from one request to the next, so that the client's side costs the benchmark next to
// nothing.
type reusedWriter struct {
	h      http.Header
	status int
}

func (w *reusedWriter) Header() http.Header { return w.h }

func (w *reusedWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *reusedWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(p), nil
}

func (w *reusedWriter) reset() {
	clear(w.h)
	w.status = 0
}

// BenchmarkGatewayInProcess measures the gateway's own CPU and allocations per request,
// with no network on either side (the upstream is a RoundTripper, the client a reused
// ResponseWriter) and the memory store: new-key (claim, forward, complete) and replay.
// cpu-ns/op is the process's CPU time (user and system, the garbage collector's
// included) per request: on a machine shared with other work it moves less than ns/op,
// which is wall time.
// bare is an httputil.ReverseProxy alone over the same upstream, with the gateway's
// Rewrite and a copy-buffer pool: the floor of a proxied request.
//
//	cd bench && go test -run '^$' -bench BenchmarkGatewayInProcess -benchmem
func BenchmarkGatewayInProcess(b *testing.B) {
	u, _ := url.Parse("http://upstream.invalid")
	bare := &httputil.ReverseProxy{
		Rewrite:    func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.SetXForwarded() },
		Transport:  cannedUpstream{},
		BufferPool: &copyBuffers{},
	}
	for _, c := range []struct {
		name string
		key  func(i int) string
		bare bool
		off  bool // the route's idempotency off: the gateway's own layers around the proxy
	}{
		{"new-key", func(i int) string { return "k-" + strconv.Itoa(i) }, false, false},
		{"replay", func(int) string { return "same" }, false, false},
		{"off", func(i int) string { return "k-" + strconv.Itoa(i) }, false, true},
		{"bare", func(i int) string { return "k-" + strconv.Itoa(i) }, true, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			var h http.Handler = bare
			if !c.bare {
				cfg := gateway.Config{Upstream: u, Logger: slog.New(slog.DiscardHandler), Transport: cannedUpstream{},
					Idempotency: idempotency.Config{Store: memstore.New()}}
				if c.off {
					cfg.Routes = []gateway.Route{{Pattern: "/", Off: true}}
				}
				gw, err := gateway.New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
				h = gw
			}
			serveKeyed(b, h, c.key, nil)
		})
	}
}

// serveKeyed runs b's loop: keyed POSTs of paymentBody to h, the key of the i-th from
// key, with a load generator's headers and the extra ones set, each answered 201 into
// one reused writer. It reports allocations and the process's CPU per request
// (cpu-ns/op).
func serveKeyed(b *testing.B, h http.Handler, key func(int) string, extra map[string]string) {
	w := &reusedWriter{h: make(http.Header)}
	serve := func(i int) int {
		// A context of its own per request, canceled when it is over, as net/http's
		// server gives each: what the layers link into is what they link into there.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gateway.invalid/payments", strings.NewReader(paymentBody))
		if err != nil {
			b.Fatal(err)
		}
		r.RemoteAddr = "192.0.2.1:1234"
		// The headers of run.sh's requests as a server reads them: a Go client's, the
		// load generator's user and the payment's.
		r.Header.Set("User-Agent", "Go-http-client/1.1")
		r.Header.Set("Content-Length", strconv.Itoa(len(paymentBody)))
		r.Header.Set("Authorization", "Bearer 1")
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", key(i))
		for k, v := range extra {
			r.Header.Set(k, v)
		}
		w.reset()
		h.ServeHTTP(w, r)
		return w.status
	}
	serve(0)
	b.ReportAllocs()
	cpu0 := processCPU(b)
	i := 0
	for b.Loop() {
		i++
		if code := serve(i); code != http.StatusCreated {
			b.Fatalf("status %d", code)
		}
	}
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// copyBuffers is a ReverseProxy's pool of 32 KiB copy buffers, as the gateway has.
type copyBuffers struct{ p sync.Pool }

func (c *copyBuffers) Get() []byte {
	if v, ok := c.p.Get().(*[32 << 10]byte); ok {
		return v[:]
	}
	return make([]byte, 32<<10)
}

// Put keeps buf as a pointer to its array, which needs no allocation.
func (c *copyBuffers) Put(buf []byte) {
	if cap(buf) == 32<<10 {
		c.p.Put((*[32 << 10]byte)(buf[:32<<10]))
	}
}

// processCPU returns the CPU time the process has used, user and system, in ns.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
