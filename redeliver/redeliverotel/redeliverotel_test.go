package redeliverotel_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/jetstream"
	"github.com/retrysafe/retrysafe/redeliver/rabbitmq"
	"github.com/retrysafe/retrysafe/redeliver/redeliverotel"
	"github.com/retrysafe/retrysafe/retry"
)

func attr(s tracetest.SpanStub, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// broker is a queue of a real broker: its Source, a Publisher, and the queue's name.
type broker struct {
	src   redeliver.Source
	pub   redeliver.Publisher
	queue string
}

func rabbitMQ(t *testing.T) broker {
	url := testenv.AMQPURL(t)
	cfg := rabbitmq.Config{URL: url, Queue: testenv.Name("otel"), Delays: []time.Duration{50 * time.Millisecond}, Logger: quiet()}
	ctx := context.Background()
	src, err := rabbitmq.NewSource(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Errorf("deleting the topology: %v", err)
			return
		}
		defer conn.Close()
		if err := rabbitmq.DeleteTopology(context.Background(), conn, src.Topology()); err != nil {
			t.Errorf("deleting the topology: %v", err)
		}
	})
	pub, err := rabbitmq.NewPublisher(ctx, rabbitmq.PublisherConfig{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return broker{src, pub, cfg.Queue}
}

func natsJetStream(t *testing.T) broker {
	url := testenv.NATSURL(t)
	cfg := jetstream.Config{URL: url, Queue: testenv.Name("otel"), MemoryStorage: true, Logger: quiet(), Policy: policy()}
	ctx := context.Background()
	src, err := jetstream.NewSource(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := jetstream.DeleteTopology(context.Background(), cfg); err != nil {
			t.Errorf("deleting the topology: %v", err)
		}
	})
	nc, err := jetstream.Dial(ctx, url, "redeliverotel-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pub, err := jetstream.NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	return broker{src, pub, cfg.Queue}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// policy: three attempts, 50ms apart.
func policy() redeliver.Policy {
	return redeliver.Policy{MaxAttempts: 3, Timeout: 10 * time.Second,
		Backoff: retry.Policy{Base: 50 * time.Millisecond, Cap: 50 * time.Millisecond, Jitter: retry.JitterNone}}
}

// TestFailOnceThenSucceed: on RabbitMQ and on NATS JetStream, a message published under
// a producer's span fails once and succeeds on its retry: two delivery spans, attempts
// 1 and 2, both children of the producer's span, the first failed with its class.
func TestFailOnceThenSucceed(t *testing.T) {
	t.Parallel()
	for _, b := range []struct {
		name string
		open func(*testing.T) broker
	}{{"rabbitmq", rabbitMQ}, {"jetstream", natsJetStream}} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			failOnceThenSucceed(t, b.open(t))
		})
	}
}

func failOnceThenSucceed(t *testing.T, b broker) {
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	otelCfg := redeliverotel.Config{TracerProvider: tp}

	var calls atomic.Int32
	done := make(chan struct{})
	handler := func(ctx context.Context, m *redeliver.Message) error {
		if !trace.SpanFromContext(ctx).IsRecording() {
			t.Error("the handler's context has no delivery span")
		}
		if calls.Add(1) == 1 {
			return errors.New("flaky downstream")
		}
		close(done)
		return nil
	}
	c, err := redeliver.New(redeliver.Config{
		Source:        b.src,
		Handler:       redeliverotel.Handler(handler, otelCfg),
		Policy:        policy(),
		Logger:        quiet(),
		ShutdownGrace: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	pctx, producer := tp.Tracer("test").Start(ctx, "publish", trace.WithSpanKind(trace.SpanKindProducer))
	m := &redeliver.Message{ID: "msg-1", Body: []byte(`{"secret":"BODY"}`), Header: map[string]string{}}
	redeliverotel.Inject(pctx, otelCfg, m.Header)
	if err := b.pub.Publish(pctx, b.queue, m); err != nil {
		t.Fatal(err)
	}
	producer.End()

	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the retry did not succeed")
	}
	var deliveries []tracetest.SpanStub
	testenv.Eventually(t, 5*time.Second, func() bool {
		deliveries = deliveries[:0]
		for _, s := range exp.GetSpans() {
			if s.SpanKind == trace.SpanKindConsumer {
				deliveries = append(deliveries, s)
			}
		}
		return len(deliveries) == 2
	}, "two delivery spans")
	slices.SortFunc(deliveries, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	for i, s := range deliveries {
		// JetStream names the stream and its consumer, RabbitMQ the queue.
		if q := deliveryQueue(s); s.Name != "process "+q || !strings.Contains(q, b.queue) {
			t.Errorf("delivery %d: span %q, destination %q, want process and the queue %s", i+1, s.Name, q, b.queue)
		}
		if s.Parent.SpanID() != producer.SpanContext().SpanID() || s.SpanContext.TraceID() != producer.SpanContext().TraceID() {
			t.Errorf("delivery %d: not a child of the producer's span", i+1)
		}
		if got := attr(s, redeliverotel.AttrAttempt).AsInt64(); got != int64(i+1) {
			t.Errorf("delivery %d: attempt %d", i+1, got)
		}
		if got := attr(s, "messaging.message.id").AsString(); got != "msg-1" {
			t.Errorf("delivery %d: message id %q", i+1, got)
		}
		for _, kv := range s.Attributes {
			if v := kv.Value.Emit(); v == string(m.Body) || v == "flaky downstream" {
				t.Errorf("delivery %d: %s holds %q", i+1, kv.Key, v)
			}
		}
	}
	first, second := deliveries[0], deliveries[1]
	if first.Status.Code != codes.Error || attr(first, redeliverotel.AttrErrorClass).AsString() != string(redeliver.ClassTransient) {
		t.Errorf("first delivery: status %v class %q, want error transient", first.Status, attr(first, redeliverotel.AttrErrorClass).Emit())
	}
	if second.Status.Code == codes.Error {
		t.Errorf("second delivery failed: %v", second.Status)
	}
}

// deliveryQueue is the queue a delivery span names (messaging.destination.name).
func deliveryQueue(s tracetest.SpanStub) string {
	return attr(s, "messaging.destination.name").AsString()
}

// TestClasses: a panic, a timeout and a permanent error are marked with their class;
// the panic goes on to the Consumer.
func TestClasses(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg := redeliverotel.Config{TracerProvider: tp}
	m := &redeliver.Message{Queue: "q", Attempt: 3, Header: map[string]string{}}

	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic did not go on")
			}
		}()
		_ = redeliverotel.Handler(func(context.Context, *redeliver.Message) error { panic("boom") }, cfg)(context.Background(), m)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_ = redeliverotel.Handler(func(ctx context.Context, _ *redeliver.Message) error { <-ctx.Done(); return ctx.Err() }, cfg)(ctx, m)
	_ = redeliverotel.Handler(func(context.Context, *redeliver.Message) error { return retry.Permanent(errors.New("no")) }, cfg)(context.Background(), m)

	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	for i, want := range []redeliver.Class{redeliver.ClassPanic, redeliver.ClassTimeout, redeliver.ClassPermanent} {
		s := spans[i]
		if got := attr(s, redeliverotel.AttrErrorClass).AsString(); got != string(want) || s.Status.Code != codes.Error {
			t.Errorf("span %d: class %q status %v, want %q and error", i, got, s.Status, want)
		}
		if got := attr(s, redeliverotel.AttrAttempt).AsInt64(); got != 3 {
			t.Errorf("span %d: attempt %d, want 3", i, got)
		}
		if s.Parent.IsValid() {
			t.Errorf("span %d: a parent without a traceparent header", i)
		}
	}
}

// TestCanonicalHeaderName: a producer that wrote Traceparent (as an HTTP bridge would)
// is still the delivery's parent.
func TestCanonicalHeaderName(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	m := &redeliver.Message{Queue: "q", Attempt: 1, Header: map[string]string{"Traceparent": parent}}
	h := redeliverotel.Handler(func(context.Context, *redeliver.Message) error { return nil }, redeliverotel.Config{TracerProvider: tp})
	if err := h(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	s := exp.GetSpans()[0]
	if s.Parent.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || s.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("delivery's parent %v, want the Traceparent header's", s.Parent)
	}
}
