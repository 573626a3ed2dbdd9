// Package redeliverotel traces message consumers of package redeliver with
// OpenTelemetry: a span per delivery, with its attempt number, under the trace of the
// message's producer when the message carries a traceparent header, and failed with the
// class of the handler's error. It lives apart from package redeliver so that a
// consumer that does not trace never compiles OpenTelemetry.
//
// A delivery is a span "process QUEUE" (kind consumer) with the OpenTelemetry messaging
// attributes messaging.operation.type (process), messaging.destination.name (the queue),
// messaging.message.id and messaging.message.body.size, and retrysafe.delivery.attempt
// (Message.Attempt, 1 for the first delivery). A failed delivery has error.type and
// retrysafe.error.class set to its Class (transient, timeout, panic, permanent, decode,
// or the caller's own) and an error status. The spans never hold the body, a header's
// value or the error's text.
//
// Every delivery of a message that kept its headers (the retries RabbitMQ republishes
// copy them; JetStream redelivers the stored message) is a child of the producer's
// span, so the attempts of one message are siblings in the producer's trace.
package redeliverotel

import (
	"context"
	"errors"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/retrysafe/redeliver"
)

// TracerName is the instrumentation scope of the spans.
const TracerName = "github.com/retrysafe/retrysafe/redeliver/redeliverotel"

// Attributes of the delivery spans beyond OpenTelemetry's messaging conventions.
const (
	AttrAttempt    = attribute.Key("retrysafe.delivery.attempt") // Message.Attempt
	AttrErrorClass = attribute.Key("retrysafe.error.class")      // the failure's redeliver.Class
)

// Config configures the instrumentation.
type Config struct {
	// TracerProvider makes the spans. Required: nil leaves the handler untraced.
	TracerProvider trace.TracerProvider
	// Propagator reads the producer's context from the message's headers, and Inject
	// writes it. Default propagation.TraceContext (traceparent, tracestate).
	Propagator propagation.TextMapPropagator
	// Classify names the class of a handler's error: give it the Consumer's
	// Policy.Classify, so that the spans say what the Consumer decided. Default
	// redeliver.DefaultClassify. A panic is always ClassPanic and an error returned when
	// the handler's deadline passed always ClassTimeout, as the Consumer has them.
	Classify func(error) redeliver.Class
}

func (cfg Config) propagator() propagation.TextMapPropagator {
	if cfg.Propagator != nil {
		return cfg.Propagator
	}
	return propagation.TraceContext{}
}

// Handler returns h with a span per delivery. With a nil TracerProvider it returns h.
func Handler(h redeliver.Handler, cfg Config) redeliver.Handler {
	if cfg.TracerProvider == nil {
		return h
	}
	tracer := cfg.TracerProvider.Tracer(TracerName)
	prop := cfg.propagator()
	classify := cfg.Classify
	if classify == nil {
		classify = redeliver.DefaultClassify
	}
	return func(ctx context.Context, m *redeliver.Message) (err error) {
		parent := ctx
		if pc := prop.Extract(ctx, headerCarrier(m.Header)); trace.SpanContextFromContext(pc).IsValid() {
			parent = pc
		}
		attrs := []attribute.KeyValue{
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", m.Queue),
			attribute.Int("messaging.message.body.size", len(m.Body)),
			AttrAttempt.Int(m.Attempt),
		}
		if m.ID != "" {
			attrs = append(attrs, attribute.String("messaging.message.id", m.ID))
		}
		ctx, span := tracer.Start(parent, "process "+m.Queue, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
		defer func() {
			if p := recover(); p != nil {
				fail(span, redeliver.ClassPanic)
				span.End()
				panic(p) // the Consumer recovers it and retries the message
			}
			switch {
			case err == nil:
			case errors.Is(ctx.Err(), context.DeadlineExceeded):
				fail(span, redeliver.ClassTimeout)
			case errors.Is(ctx.Err(), context.Canceled):
				// Shutdown ended the handler: the message is released, not failed.
				span.SetAttributes(attribute.String("error.type", "canceled"))
			default:
				c := classify(err)
				if c == "" {
					c = redeliver.ClassTransient
				}
				fail(span, c)
			}
			span.End()
		}()
		return h(ctx, m)
	}
}

func fail(span trace.Span, c redeliver.Class) {
	span.SetAttributes(attribute.String("error.type", string(c)), AttrErrorClass.String(string(c)))
	span.SetStatus(codes.Error, "delivery failed: "+string(c))
}

// Inject writes the context of ctx's span into header (traceparent, tracestate), for a
// producer: the deliveries of the message are then children of that span. header must
// not be nil.
func Inject(ctx context.Context, cfg Config, header map[string]string) {
	cfg.propagator().Inject(ctx, propagation.MapCarrier(header))
}

// headerCarrier reads a message's headers for the propagator, their names in any case
// (traceparent, Traceparent): a producer that bridges HTTP headers may have written
// them canonicalized, and header names are case-insensitive in W3C Trace Context.
type headerCarrier map[string]string

func (h headerCarrier) Get(key string) string {
	if v, ok := h[key]; ok {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return ""
}

func (h headerCarrier) Set(key, value string) { h[key] = value }

func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}
