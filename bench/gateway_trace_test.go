package bench

import (
	"context"
	"log/slog"
	"net/url"
	"strconv"
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
			serveKeyed(b, gw, c.key, map[string]string{"Traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
		})
	}
}
