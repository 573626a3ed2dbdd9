package gateway_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// counter returns the value of retrysafe_gateway_requests_total{route, outcome} in reg.
func counter(t *testing.T, reg *prometheus.Registry, route, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "retrysafe_gateway_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["route"] == route && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestInstruments: a server that runs the middleware itself counts its requests with
// Instruments (two on one registry share it) and, under a server span of its own, gets
// the gateway's store and answer spans under that span, with its TracerProvider; without
// one, nothing is traced.
func TestInstruments(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	mw, err := idempotency.New(idempotency.Config{Store: gateway.WrapStore(memstore.New())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mw.Shutdown(context.Background()) })
	reg := prometheus.NewRegistry()
	if _, err := gateway.NewInstruments(reg, mw); err != nil {
		t.Fatal(err)
	}
	in, err := gateway.NewInstruments(reg, mw)
	if err != nil {
		t.Fatalf("a second Instruments on the registry: %v", err)
	}
	const key = "k-instruments-secret"
	serve := func(ctx context.Context) {
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/pay", strings.NewReader(`{"a":1}`))
		r.Header.Set("Idempotency-Key", key)
		r, q := in.Route("srv0").Start(r)
		w := httptest.NewRecorder()
		o, _ := mw.Serve(w, r, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer q.Forwarding()()
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(w, "done")
		}))
		q.End(o, w.Code)
	}
	for range 2 {
		ctx, span := tp.Tracer("server").Start(context.Background(), "server", trace.WithSpanKind(trace.SpanKindServer))
		serve(ctx)
		span.End()
	}
	serve(context.Background()) // untraced: replayed, no spans

	if n := counter(t, reg, "srv0", "executed"); n != 1 {
		t.Errorf("executed = %v, want 1", n)
	}
	if n := counter(t, reg, "srv0", "replayed"); n != 2 {
		t.Errorf("replayed = %v, want 2", n)
	}
	spans := rec.Ended()
	servers := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		if s.Name() == "server" {
			servers[s.SpanContext().SpanID()] = s
		}
	}
	got := map[string]int{}
	for _, s := range spans {
		if s.Name() == "server" {
			continue
		}
		got[s.Name()]++
		if _, ok := servers[s.Parent().SpanID()]; !ok {
			t.Errorf("the %s span is not under a server span", s.Name())
		}
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.Emit(), key) {
				t.Errorf("the %s span holds the key in %s", s.Name(), a.Key)
			}
		}
	}
	if got["store.claim"] != 2 || got["store.complete"] != 1 || got["replay"] != 1 {
		t.Errorf("spans %v, want two store.claim, one store.complete and one replay (none for the untraced request)", got)
	}
	outcomes := map[string]bool{}
	for _, s := range servers {
		for _, a := range s.Attributes() {
			if a.Key == gateway.AttrOutcome {
				outcomes[a.Value.AsString()] = true
			}
		}
	}
	if !outcomes["executed"] || !outcomes["replayed"] {
		t.Errorf("the server spans' outcomes are %v, want executed and replayed", outcomes)
	}
}
