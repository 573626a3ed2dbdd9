package bench

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
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

// BenchmarkGatewayInProcess measures the gateway's own CPU and allocations per request,
// with no network on either side (the upstream is a RoundTripper, the client a
// recorder) and the memory store: new-key (claim, forward, complete) and replay.
//
//	cd bench && go test -run '^$' -bench BenchmarkGatewayInProcess -benchmem
func BenchmarkGatewayInProcess(b *testing.B) {
	for _, c := range []struct {
		name string
		key  func(i int) string
		want int
	}{
		{"new-key", func(i int) string { return "k-" + strconv.Itoa(i) }, http.StatusCreated},
		{"replay", func(int) string { return "same" }, http.StatusCreated},
	} {
		b.Run(c.name, func(b *testing.B) {
			u, _ := url.Parse("http://upstream.invalid")
			gw, err := gateway.New(gateway.Config{Upstream: u, Logger: slog.New(slog.DiscardHandler), Transport: cannedUpstream{},
				Idempotency: idempotency.Config{Store: memstore.New()}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
			serve := func(i int) int {
				r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(paymentBody))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Idempotency-Key", c.key(i))
				w := httptest.NewRecorder()
				gw.ServeHTTP(w, r)
				return w.Code
			}
			serve(0)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				if code := serve(i); code != c.want {
					b.Fatalf("status %d", code)
				}
			}
		})
	}
}
