package redeliverotel_test

import (
	"context"
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/redeliverotel"
)

// A producer's span travels in the message's headers; the delivery is its child.
func ExampleHandler() {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	cfg := redeliverotel.Config{TracerProvider: tp}

	ctx, producer := tp.Tracer("shop").Start(context.Background(), "place order")
	m := &redeliver.Message{Queue: "orders", Attempt: 1, Header: map[string]string{}}
	redeliverotel.Inject(ctx, cfg, m.Header) // before publishing m
	producer.End()

	// Give the Consumer the traced handler: redeliver.Config{Handler: h, …}.
	h := redeliverotel.Handler(func(ctx context.Context, m *redeliver.Message) error { return nil }, cfg)
	_ = h(context.Background(), m)

	delivery := exp.GetSpans()[1]
	fmt.Println(delivery.Name, delivery.Parent.SpanID() == producer.SpanContext().SpanID())
	// Output: process orders true
}
