// Package retryotel traces the retries of package retry with OpenTelemetry: one span per
// logical call, with a child span per attempt that carries its number and the wait
// before it, and an event per retry on the call's span with the wait and the class of
// the failure. It lives apart from package retry so that retry stays free of
// dependencies outside the standard library.
//
// An HTTP call through an instrumented retry.Transport is a span "retry METHOD" (kind
// internal) whose children are the attempts, "METHOD" (kind client, as OpenTelemetry's
// HTTP conventions have one span per resend), each injecting its own traceparent into
// the request it sends. A call of Do is a span of the caller's name with children
// "attempt".
//
// An attempt's span ends when its response headers arrive (or it fails), and the call's
// when Transport returns: reading the body is the caller's, in neither.
//
// The spans record the method, the server's host and port, status codes, attempt
// numbers, waits and failure classes: never the URL's path or query, a header's value,
// a body or an error's text.
package retryotel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/retrysafe/retry"
)

// TracerName is the instrumentation scope of the spans.
const TracerName = "github.com/retrysafe/retrysafe/retry/retryotel"

// Attributes and the event of the spans, beyond OpenTelemetry's conventions
// (http.request.method, http.request.resend_count, http.response.status_code,
// server.address, server.port, error.type).
const (
	AttrAttempt  = attribute.Key("retrysafe.retry.attempt")  // attempt span, event: its number, 1 for the first
	AttrWait     = attribute.Key("retrysafe.retry.wait")     // attempt span: seconds waited before it; event: before the next
	AttrClass    = attribute.Key("retrysafe.retry.class")    // event, call span: the failure's class (platform, rate_limited, …)
	AttrAttempts = attribute.Key("retrysafe.retry.attempts") // call span: attempts made
	EventRetry   = "retry"                                   // on the call span, before each wait
)

// Config configures the instrumentation.
type Config struct {
	// TracerProvider makes the spans. Required: nil leaves the transport or call
	// untraced.
	TracerProvider trace.TracerProvider
	// Propagator writes each attempt's context into its request. Default
	// propagation.TraceContext (traceparent, tracestate).
	Propagator propagation.TextMapPropagator
}

type instr struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

func (cfg Config) instr() *instr {
	in := &instr{tracer: cfg.TracerProvider.Tracer(TracerName), prop: cfg.Propagator}
	if in.prop == nil {
		in.prop = propagation.TraceContext{}
	}
	return in
}

// call is the state of one logical call, in the context of its requests.
type call struct {
	span trace.Span
	mu   sync.Mutex
	n    int           // attempts started
	wait time.Duration // before the next attempt
}

type callKey struct{}

func callFrom(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// next counts an attempt and returns its number and the wait before it.
func (c *call) next() (int, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	w := c.wait
	c.wait = 0
	return c.n, w
}

func (c *call) attempts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// retrying records the retry a announces: an event on the call's span, and the wait
// for the next attempt's span.
func (c *call) retrying(a retry.Attempt) {
	c.mu.Lock()
	c.wait = a.Wait
	c.mu.Unlock()
	attrs := []attribute.KeyValue{AttrAttempt.Int(a.N), AttrWait.Float64(a.Wait.Seconds()), AttrClass.String(Class(a.Err))}
	var se *retry.StatusError
	if errors.As(a.Err, &se) && se.StatusCode != 0 {
		attrs = append(attrs, attribute.Int("http.response.status_code", se.StatusCode))
	}
	c.span.AddEvent(EventRetry, trace.WithAttributes(attrs...))
}

// Class names the class of a failure that package retry classified (a
// *retry.StatusError, or an error matching one of retry's classes): auth,
// rate_limited, not_found, invalid, platform, conflict, canceled, unknown_outcome,
// attempt_timeout; "other" for anything else.
func Class(err error) string {
	for _, c := range []struct {
		err  error
		name string
	}{
		{retry.ErrUnknownOutcome, "unknown_outcome"}, {retry.ErrAttemptTimeout, "attempt_timeout"},
		{retry.ErrAuth, "auth"}, {retry.ErrRateLimited, "rate_limited"}, {retry.ErrNotFound, "not_found"},
		{retry.ErrInvalid, "invalid"}, {retry.ErrPlatform, "platform"}, {retry.ErrConflict, "conflict"},
		{retry.ErrCanceled, "canceled"},
	} {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return "other"
}

// Instrument traces the calls of t and returns the RoundTripper to use in its place: it
// sets t.Base to one that makes a span per attempt (wrapping t's Base) and chains t's
// OnRetry (t's own still runs), so call it once, before t's first request. With a nil
// TracerProvider it returns t unchanged.
func Instrument(t *retry.Transport, cfg Config) http.RoundTripper {
	if cfg.TracerProvider == nil {
		return t
	}
	in := cfg.instr()
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	t.Base = &attempts{in: in, base: base}
	user := t.OnRetry
	t.OnRetry = func(r *http.Request, a retry.Attempt) {
		if c := callFrom(r.Context()); c != nil {
			c.retrying(a)
		}
		if user != nil {
			user(r, a)
		}
	}
	return &calls{in: in, next: t}
}

// calls makes the span of each logical call.
type calls struct {
	in   *instr
	next *retry.Transport
}

func (t *calls) RoundTrip(req *http.Request) (*http.Response, error) {
	attrs := append(serverAttrs(req), attribute.String("http.request.method", req.Method))
	ctx, span := t.in.tracer.Start(req.Context(), "retry "+req.Method, trace.WithAttributes(attrs...))
	c := &call{span: span}
	ctx = context.WithValue(ctx, callKey{}, c)
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	span.SetAttributes(AttrAttempts.Int(c.attempts()))
	switch {
	case err != nil:
		span.SetAttributes(AttrClass.String(Class(err)), attribute.String("error.type", Class(err)))
		span.SetStatus(codes.Error, "retry: "+Class(err))
	default:
		span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
		if stop := retry.StopReason(resp); stop != nil {
			span.SetAttributes(AttrClass.String(Class(stop)))
		}
		if resp.StatusCode >= 400 {
			span.SetAttributes(attribute.String("error.type", strconv.Itoa(resp.StatusCode)))
			span.SetStatus(codes.Error, "")
		}
	}
	span.End()
	return resp, err
}

// CloseIdleConnections closes the idle connections of the retry.Transport.
func (t *calls) CloseIdleConnections() { t.next.CloseIdleConnections() }

// attempts makes the span of each attempt, under its call's.
type attempts struct {
	in   *instr
	base http.RoundTripper
}

func (t *attempts) RoundTrip(r *http.Request) (*http.Response, error) {
	attrs := append(serverAttrs(r), attribute.String("http.request.method", r.Method))
	if c := callFrom(r.Context()); c != nil {
		n, wait := c.next()
		attrs = append(attrs, AttrAttempt.Int(n))
		if n > 1 {
			attrs = append(attrs, attribute.Int("http.request.resend_count", n-1), AttrWait.Float64(wait.Seconds()))
		}
	}
	ctx, span := t.in.tracer.Start(r.Context(), r.Method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	out := r.WithContext(ctx)
	out.Header = r.Header.Clone() // the caller's request is not modified
	if out.Header == nil {
		out.Header = http.Header{}
	}
	t.in.prop.Inject(ctx, propagation.HeaderCarrier(out.Header))
	resp, err := t.base.RoundTrip(out)
	switch {
	case err != nil:
		span.SetAttributes(attribute.String("error.type", errorType(err)))
		span.SetStatus(codes.Error, "")
	default:
		span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
		if resp.StatusCode >= 400 {
			span.SetAttributes(attribute.String("error.type", strconv.Itoa(resp.StatusCode)))
			span.SetStatus(codes.Error, "")
		}
	}
	span.End()
	return resp, err
}

func serverAttrs(r *http.Request) []attribute.KeyValue {
	if r.URL == nil {
		return nil
	}
	attrs := []attribute.KeyValue{attribute.String("server.address", r.URL.Hostname())}
	port := r.URL.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[r.URL.Scheme]
	}
	if p, err := strconv.Atoi(port); err == nil {
		attrs = append(attrs, attribute.Int("server.port", p))
	}
	return attrs
}

// errorType is a transport error's class, not its text.
func errorType(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case ne != nil:
		return "network"
	}
	return fmt.Sprintf("%T", err)
}

// Do is retry.Do traced: a span name for the call, with a child span "attempt" per
// call of fn (its number, and the wait before it) and an event per retry; p's own
// OnRetry still runs. With a nil TracerProvider it is retry.Do.
func Do(ctx context.Context, cfg Config, name string, p retry.Policy, fn func(context.Context) error) error {
	if cfg.TracerProvider == nil {
		return retry.Do(ctx, p, fn)
	}
	in := cfg.instr()
	ctx, span := in.tracer.Start(ctx, name)
	c := &call{span: span}
	user := p.OnRetry
	p.OnRetry = func(a retry.Attempt) {
		c.retrying(a)
		if user != nil {
			user(a)
		}
	}
	err := retry.Do(ctx, p, func(ctx context.Context) error {
		n, wait := c.next()
		attrs := []attribute.KeyValue{AttrAttempt.Int(n)}
		if n > 1 {
			attrs = append(attrs, AttrWait.Float64(wait.Seconds()))
		}
		ctx, as := in.tracer.Start(ctx, "attempt", trace.WithAttributes(attrs...))
		err := fn(ctx)
		if err != nil {
			as.SetAttributes(AttrClass.String(Class(err)))
			as.SetStatus(codes.Error, "")
		}
		as.End()
		return err
	})
	span.SetAttributes(AttrAttempts.Int(c.attempts()))
	if err != nil {
		span.SetAttributes(AttrClass.String(Class(err)))
		span.SetStatus(codes.Error, "")
	}
	span.End()
	return err
}
