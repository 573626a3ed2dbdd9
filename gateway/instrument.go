package gateway

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/idempotency"
)

// Instruments are the gateway's metrics (the retrysafe_gateway_* collectors) for a
// server that runs idempotency middlewares itself, in front of an upstream of its own,
// as the Caddy module does: its requests are counted as the gateway counts a route's,
// by route label and outcome, with their store calls, keys in flight and the shared
// state of the root middleware. The upstream's round trips are the server's to measure:
// retrysafe_gateway_upstream_duration_seconds stays empty.
type Instruments struct {
	m      *metrics
	routes series[*RouteInstruments]
}

// State is the shared state of the middlewares the gauges report (requests_waiting,
// store_not_durable, body_memory_bytes): an idempotency.Middleware's, the root of the
// others, or the sum of several roots'.
type State interface {
	Waiting() int
	StoreNotDurable() bool
	BodyMemory() int64
}

// NewInstruments registers the gateway's collectors with reg. Collectors that another
// Instruments registered with reg already are adopted, so that the handlers of one
// configuration count into the same series; the adopted gauges report the state of the
// Instruments that registered them.
func NewInstruments(reg prometheus.Registerer, state State) (*Instruments, error) {
	m, err := newMetrics(reg, true, state.Waiting, state.StoreNotDurable, state.BodyMemory)
	if err != nil {
		return nil, err
	}
	in := &Instruments{m: m}
	in.routes.make = func(route string) *RouteInstruments {
		return &RouteInstruments{in: in, series: m.forRoute(route, "")}
	}
	return in, nil
}

// ObserveStore records one store call, as idempotency.Config.OnStoreCall: its duration,
// and its error unless it is an answer (not found, lease lost).
func (in *Instruments) ObserveStore(op idempotency.StoreOp, took time.Duration, err error) {
	in.m.observeStore(string(op), took, err)
}

// Route returns the series of the requests labelled route, made on its first use.
func (in *Instruments) Route(route string) *RouteInstruments {
	return in.routes.of(route)
}

// RouteInstruments are the series of one route label.
type RouteInstruments struct {
	in     *Instruments
	series *routeSeries
}

// Request is the instrumentation of one request, from RouteInstruments.Start to End.
type Request struct {
	rt    *RouteInstruments
	start time.Time
	tr    *reqTrace // nil: not traced
}

// Start begins the instrumentation of r. When r's context holds a recording span (the
// server's own), the request is traced: the calls of a store made by WrapStore are spans
// under it, and End adds the answer's span; otherwise nothing is traced, at the cost of
// a pointer test. It returns r with the request's state in its context: the middleware
// must serve that request.
func (rt *RouteInstruments) Start(r *http.Request) (*http.Request, *Request) {
	q := &Request{rt: rt, start: time.Now()}
	if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
		q.tr = &reqTrace{span: span}
		q.tr.ctx = context.WithValue(r.Context(), reqTraceKey{}, q.tr)
		r = r.WithContext(q.tr.ctx)
	}
	return r, q
}

// Traced reports whether the request is traced: End then wants the status it was
// answered.
func (q *Request) Traced() bool { return q.tr != nil }

// Forwarding counts the request's key in flight (retrysafe_gateway_keys_in_flight)
// until done is called: for a claimed request, while it is forwarded.
func (q *Request) Forwarding() (done func()) {
	g := q.rt.in.m.inFlight
	g.Inc()
	return g.Dec
}

// End counts the request under outcome and its duration. Traced, a request answered
// from the store gets its answer's span (replay, conflict, mismatch), and the server's
// span gets the outcome and the key hash (AttrOutcome, AttrKeyHash); the server's span
// is not ended, being the server's. status is what the client was answered.
func (q *Request) End(outcome idempotency.Outcome, status int) {
	now := time.Now()
	s := q.rt.series.outcomes.of(string(outcome))
	s.requests.Inc()
	s.dur.Observe(now.Sub(q.start).Seconds())
	if q.tr == nil {
		return
	}
	tracer := q.tr.span.TracerProvider().Tracer(TracerName)
	attrs := []attribute.KeyValue{AttrOutcome.String(string(outcome))}
	if hash := q.tr.answer(tracer, q.start, string(outcome), status, now); hash != "" {
		attrs = append(attrs, AttrKeyHash.String(hash))
	}
	q.tr.span.SetAttributes(attrs...)
}

// WrapStore returns s with the calls made for a traced request (one whose context holds
// a recording span) traced as the gateway traces them (store.claim, store.complete, …,
// with AttrKeyHash, never the key), under that span and with its TracerProvider, so
// that a server with a tracing of its own gets the spans under its own, and one without
// gets none. It keeps s's Immediate and Pinger.
func WrapStore(s idempotency.Store) idempotency.Store {
	return (&tracing{store: AttrStore.String(storeName(s))}).wrapStore(s)
}
