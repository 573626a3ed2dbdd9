package bench

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// BenchmarkGatewayInProcessTraced is BenchmarkGatewayInProcess with tracing on: the
// SDK's TracerProvider, every request sampled, its spans batched to an exporter that
// drops them. Beside BenchmarkGatewayInProcess (tracing off) it is what tracing costs
// the gateway's process per request, the SDK's work included and the network not.
//
//	cd bench && go test -run '^$' -bench 'GatewayInProcess' -benchmem
func BenchmarkGatewayInProcessTraced(b *testing.B) {
	u, _ := url.Parse("http://upstream.invalid")
	for _, c := range []struct {
		name string
		key  func(i int) string
	}{
		{"new-key", func(i int) string { return "k-" + strconv.Itoa(i) }},
		{"replay", func(int) string { return "same" }},
	} {
		b.Run(c.name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			gw, err := gateway.New(gateway.Config{Upstream: u, Logger: slog.New(slog.DiscardHandler), Transport: cannedUpstream{},
				Idempotency: idempotency.Config{Store: memstore.New()}, TracerProvider: tp})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
			w := &reusedWriter{h: make(http.Header)}
			serve := func(i int) int {
				r, err := http.NewRequest(http.MethodPost, "http://gateway.invalid/payments", strings.NewReader(paymentBody))
				if err != nil {
					b.Fatal(err)
				}
				r.RemoteAddr = "192.0.2.1:1234"
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Idempotency-Key", c.key(i))
				r.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
				w.reset()
				gw.ServeHTTP(w, r)
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
		})
	}
}
