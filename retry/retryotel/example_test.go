package retryotel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/retrysafe/retrysafe/retry"
	"github.com/retrysafe/retrysafe/retry/retryotel"
)

// A keyed POST to a server that is busy once: one call span, two attempt spans.
func ExampleInstrument() {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())

	rt := &retry.Transport{Policy: retry.Policy{Base: time.Millisecond}}
	client := &http.Client{Transport: retryotel.Instrument(rt, retryotel.Config{TracerProvider: tp})}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
	req.Header.Set("Idempotency-Key", "pay-7c0e")
	res, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	res.Body.Close()

	spans := exp.GetSpans()
	slices.SortFunc(spans, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	for _, s := range spans {
		fmt.Println(s.Name, len(s.Events), "events")
	}
	// Output:
	// retry POST 1 events
	// POST 0 events
	// POST 0 events
}
