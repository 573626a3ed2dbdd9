package grpcidem_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/grpc/grpcidem"
	"github.com/retrysafe/retrysafe/idempotency"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
)

// TestMetricsAndSpans: with Metrics, calls are counted by method and outcome, with the
// store's calls; under otelgrpc's server span, the outcome is on the span and the
// store's calls (a store wrapped with gateway.WrapStore) are spans under it.
func TestMetricsAndSpans(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	ended := &serverEnds{SpanProcessor: rec, ch: make(chan struct{}, 16)}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(ended))
	reg := prometheus.NewRegistry()
	s := newSvc()
	addr, _ := serve(t, s, grpcidem.Config{
		Idempotency: idempotency.Config{Store: gateway.WrapStore(openStore(t, "sqlite"))},
		Metrics:     reg,
	}, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp))))
	c := dial(t, addr)
	for range 2 {
		if r := invoke(t.Context(), c, "k-obs", "obs", ""); r.err != nil {
			t.Fatal(r.err)
		}
	}
	if r := invoke(t.Context(), c, "k-obs", "obs-other", ""); r.err == nil {
		t.Fatal("a reused key was not refused")
	}

	const method = "/grpc.testing.TestService/UnaryCall"
	got := map[string]float64{}
	var storeCalls uint64
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch mf.GetName() {
			case "retrysafe_gateway_requests_total":
				if labels["route"] == method {
					got[labels["outcome"]] = m.GetCounter().GetValue()
				}
			case "retrysafe_gateway_store_duration_seconds":
				storeCalls += m.GetHistogram().GetSampleCount()
			}
		}
	}
	if got["executed"] != 1 || got["replayed"] != 1 || got["mismatch"] != 1 {
		t.Errorf("requests_total for %s: %v, want executed 1, replayed 1, mismatch 1", method, got)
	}
	if storeCalls < 3 {
		t.Errorf("store calls observed: %d, want a claim and a completion at least, and the claims of the others", storeCalls)
	}

	// gRPC ends a call's server span after it has sent the call's status, so a client
	// can have its answer before the span has ended: wait for the three.
	for i := range 3 {
		select {
		case <-ended.ch:
		case <-time.After(time.Minute): // a bound on a hang, not a margin
			t.Fatalf("%d of 3 server spans ended", i)
		}
	}
	if err := tp.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]int{}
	servers := map[string]bool{} // span IDs of the server spans
	for _, sp := range rec.Ended() {
		if sp.Name() == "grpc.testing.TestService/UnaryCall" && sp.SpanKind().String() == "server" {
			servers[sp.SpanContext().SpanID().String()] = true
			for _, a := range sp.Attributes() {
				if a.Key == gateway.AttrOutcome {
					outcomes[a.Value.AsString()]++
				}
			}
		}
	}
	storeSpans := 0
	for _, sp := range rec.Ended() {
		for _, a := range sp.Attributes() {
			if a.Key == gateway.AttrStoreOp && servers[sp.Parent().SpanID().String()] {
				storeSpans++
			}
		}
	}
	if len(servers) != 3 || outcomes["executed"] != 1 || outcomes["replayed"] != 1 || outcomes["mismatch"] != 1 {
		t.Errorf("server spans %d with outcomes %v, want 3: executed, replayed, mismatch", len(servers), outcomes)
	}
	if storeSpans < 3 {
		t.Errorf("store spans under the server spans: %d, want 3 or more", storeSpans)
	}
}

// serverEnds is the test's span processor: it records through SpanProcessor and signals
// ch as each server span ends.
type serverEnds struct {
	sdktrace.SpanProcessor
	ch chan struct{}
}

func (e *serverEnds) OnEnd(s sdktrace.ReadOnlySpan) {
	e.SpanProcessor.OnEnd(s)
	if s.SpanKind().String() == "server" {
		e.ch <- struct{}{}
	}
}
