package retryotel_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/retrysafe/retry"
	"github.com/retrysafe/retrysafe/retry/retryotel"
)

func newProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

func attr(attrs []attribute.KeyValue, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range attrs {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// fast is a policy whose waits are short and distinct.
func fast() retry.Policy {
	return retry.Policy{MaxAttempts: 5, Base: 2 * time.Millisecond, Cap: 20 * time.Millisecond, Jitter: retry.JitterNone}
}

// TestTransportAttempts: a server that fails twice and then answers is one call span
// with three attempt spans, numbered, each with the wait before it, each the parent of
// the request the server received; the call span has two retry events with the waits
// and the class.
func TestTransportAttempts(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var parents []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		parents = append(parents, r.Header.Get("Traceparent"))
		n := len(parents)
		mu.Unlock()
		if n <= 2 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	tp, exp := newProvider(t)
	var waits []time.Duration
	rt := &retry.Transport{Policy: fast(), NoBudget: true, OnRetry: func(_ *http.Request, a retry.Attempt) { waits = append(waits, a.Wait) }}
	client := &http.Client{Transport: retryotel.Instrument(rt, retryotel.Config{TracerProvider: tp})}

	ctx, parent := tp.Tracer("test").Start(context.Background(), "caller")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments?card=SECRET", strings.NewReader(`{"a":1}`))
	req.Header.Set("Idempotency-Key", "k-SECRET")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	parent.End()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("status %d", res.StatusCode)
	}
	if len(waits) != 2 {
		t.Fatalf("the transport's own OnRetry saw %d retries, want 2", len(waits))
	}

	spans := exp.GetSpans()
	var callSpan tracetest.SpanStub
	var tries []tracetest.SpanStub
	for _, s := range spans {
		switch s.Name {
		case "retry POST":
			callSpan = s
		case "POST":
			tries = append(tries, s)
		}
	}
	if callSpan.Parent.SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("call span %q not under the caller's span", callSpan.Name)
	}
	if v, _ := attr(callSpan.Attributes, retryotel.AttrAttempts); v.AsInt64() != 3 {
		t.Errorf("call span attempts %v, want 3", v.Emit())
	}
	if len(tries) != 3 {
		t.Fatalf("%d attempt spans, want 3", len(tries))
	}
	slices.SortFunc(tries, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	for i, s := range tries {
		if s.Parent.SpanID() != callSpan.SpanContext.SpanID() || s.SpanKind != trace.SpanKindClient {
			t.Errorf("attempt %d: not a client span under the call span", i+1)
		}
		if v, _ := attr(s.Attributes, retryotel.AttrAttempt); v.AsInt64() != int64(i+1) {
			t.Errorf("attempt %d: number %v", i+1, v.Emit())
		}
		wait, ok := attr(s.Attributes, retryotel.AttrWait)
		switch {
		case i == 0 && ok:
			t.Errorf("the first attempt records a wait")
		case i > 0 && wait.AsFloat64() != waits[i-1].Seconds():
			t.Errorf("attempt %d: wait %v, the transport waited %v", i+1, wait.Emit(), waits[i-1])
		}
		want := "00-" + s.SpanContext.TraceID().String() + "-" + s.SpanContext.SpanID().String() + "-01"
		if parents[i] != want {
			t.Errorf("attempt %d: the server received traceparent %q, want the attempt's %q", i+1, parents[i], want)
		}
		status, _ := attr(s.Attributes, "http.response.status_code")
		if wantSt := map[bool]int64{true: 503, false: 201}[i < 2]; status.AsInt64() != wantSt {
			t.Errorf("attempt %d: status %v, want %d", i+1, status.Emit(), wantSt)
		}
	}
	if len(callSpan.Events) != 2 {
		t.Fatalf("%d retry events, want 2", len(callSpan.Events))
	}
	for i, e := range callSpan.Events {
		n, _ := attr(e.Attributes, retryotel.AttrAttempt)
		w, _ := attr(e.Attributes, retryotel.AttrWait)
		c, _ := attr(e.Attributes, retryotel.AttrClass)
		if e.Name != retryotel.EventRetry || n.AsInt64() != int64(i+1) || w.AsFloat64() != waits[i].Seconds() || c.AsString() != "platform" {
			t.Errorf("event %d: %s attempt %v wait %v class %v, want retry %d %v platform", i, e.Name, n.Emit(), w.Emit(), c.Emit(), i+1, waits[i])
		}
	}
	if req.Header.Get("Traceparent") != "" {
		t.Error("the caller's request was given a traceparent")
	}
	for _, s := range spans {
		for _, kv := range s.Attributes {
			if strings.Contains(kv.Value.Emit(), "SECRET") {
				t.Errorf("span %q: %s = %q holds the query or the key", s.Name, kv.Key, kv.Value.Emit())
			}
		}
	}
}

// TestTransportGivesUp: a call that exhausts its attempts is a failed call span.
func TestTransportGivesUp(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	tp, exp := newProvider(t)
	p := fast()
	p.MaxAttempts = 2
	client := &http.Client{Transport: retryotel.Instrument(&retry.Transport{Policy: p, NoBudget: true}, retryotel.Config{TracerProvider: tp})}
	res, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	for _, s := range exp.GetSpans() {
		if s.Name == "retry GET" {
			if s.Status.Code != codes.Error {
				t.Errorf("call span status %v, want error", s.Status)
			}
			if v, _ := attr(s.Attributes, retryotel.AttrAttempts); v.AsInt64() != 2 {
				t.Errorf("attempts %v, want 2", v.Emit())
			}
			return
		}
	}
	t.Fatal("no call span")
}

// TestDo: retry.Do traced, failing twice: three attempt spans with their waits.
func TestDo(t *testing.T) {
	t.Parallel()
	tp, exp := newProvider(t)
	var waits []time.Duration
	p := fast()
	p.OnRetry = func(a retry.Attempt) { waits = append(waits, a.Wait) }
	n := 0
	err := retryotel.Do(context.Background(), retryotel.Config{TracerProvider: tp}, "charge", p, func(ctx context.Context) error {
		if !trace.SpanFromContext(ctx).IsRecording() {
			t.Error("fn's context has no attempt span")
		}
		if n++; n < 3 {
			return retry.After(0, errors.New("flaky"))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var tries []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "attempt" {
			tries = append(tries, s)
		}
	}
	if len(tries) != 3 || len(waits) != 2 {
		t.Fatalf("%d attempt spans and %d waits, want 3 and 2", len(tries), len(waits))
	}
	slices.SortFunc(tries, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	for i, s := range tries[1:] {
		if w, _ := attr(s.Attributes, retryotel.AttrWait); w.AsFloat64() != waits[i].Seconds() {
			t.Errorf("attempt %d: wait %v, want %v", i+2, w.Emit(), waits[i])
		}
	}
}

// Without a TracerProvider the transport is returned as it is.
func TestNilProvider(t *testing.T) {
	t.Parallel()
	rt := &retry.Transport{}
	if got := retryotel.Instrument(rt, retryotel.Config{}); got != http.RoundTripper(rt) {
		t.Errorf("Instrument with no provider returned %T, want the transport itself", got)
	}
}
