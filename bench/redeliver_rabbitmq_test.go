package bench

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/rabbitmq"
	"github.com/retrysafe/retrysafe/retry"
)

// BenchmarkRedeliverRabbitMQ measures messages per second from publish to settled
// handling on the real broker, for three consumers measured in the same run:
//
//	raw        amqp091 alone: a consumer that acks each delivery, prefetch 64
//	fail=0%    redeliver.Consumer on a rabbitmq.Source (prefetch 64, concurrency 16),
//	           empty handler
//	fail=10%   the same, one message in ten failing its first attempt: it is
//	           republished to a 1ms delay queue (confirmed), acked, and comes back
//
// Each variant has its own queue and a consumer that runs throughout; the same
// publisher (persistent messages, confirms, 256 in flight) feeds them in rounds of 1000
// messages, the variants taking turns in rotating order, so that the load of a shared
// machine falls on all three alike. b.N is the number of messages per variant; the
// metrics are each variant's rate over its rounds and the ratios to raw.
func BenchmarkRedeliverRabbitMQ(b *testing.B) {
	url := testenv.AMQPURL(b)
	variants := []*benchVariant{
		newRawVariant(b, url),
		newRedeliverVariant(b, url, 0),
		newRedeliverVariant(b, url, 10),
	}
	const round = 1000
	b.ResetTimer()
	for r := 0; r*round < b.N; r++ {
		n := min(round, b.N-r*round)
		for i := range variants {
			v := variants[(r+i)%len(variants)]
			v.run(b, n)
		}
	}
	b.StopTimer()
	raw := variants[0].rate()
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(raw, "raw_msgs/s")
	b.ReportMetric(variants[1].rate(), "rd0_msgs/s")
	b.ReportMetric(variants[2].rate(), "rd10_msgs/s")
	b.ReportMetric(variants[1].rate()/raw, "rd0/raw")
	b.ReportMetric(variants[2].rate()/raw, "rd10/raw")
}

// benchVariant is one consumer on its own queue; handled is bumped once per message
// handled successfully.
type benchVariant struct {
	admin   *amqp.Connection
	queue   string
	handled atomic.Int64
	target  atomic.Int64
	reached chan struct{}
	msgs    int
	elapsed time.Duration
}

func (v *benchVariant) done() {
	if n := v.handled.Add(1); n == v.target.Load() {
		v.reached <- struct{}{}
	}
}

// run publishes n messages and waits until they are all handled.
func (v *benchVariant) run(b *testing.B, n int) {
	start := time.Now()
	v.target.Store(v.handled.Load() + int64(n))
	go benchPublish(b, v.admin, v.queue, n)
	select {
	case <-v.reached:
	case <-time.After(5 * time.Minute):
		b.Fatal("timed out")
	}
	v.elapsed += time.Since(start)
	v.msgs += n
}

func (v *benchVariant) rate() float64 { return float64(v.msgs) / v.elapsed.Seconds() }

func newRawVariant(b *testing.B, url string) *benchVariant {
	cfg, admin := benchQueue(b, url)
	v := &benchVariant{admin: admin, queue: cfg.Queue, reached: make(chan struct{}, 1)}
	conn, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Qos(64, 0, false); err != nil {
		b.Fatal(err)
	}
	deliveries, err := ch.Consume(cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		for d := range deliveries {
			if d.Ack(false) == nil {
				v.done()
			}
		}
	}()
	return v
}

func newRedeliverVariant(b *testing.B, url string, failPct int) *benchVariant {
	cfg, admin := benchQueue(b, url)
	v := &benchVariant{admin: admin, queue: cfg.Queue, reached: make(chan struct{}, 1)}
	src, err := rabbitmq.NewSource(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	errBlip := errors.New("blip")
	c, err := redeliver.New(redeliver.Config{
		Source: src, Concurrency: 16, Logger: cfg.Logger,
		Policy: redeliver.Policy{Backoff: retry.Policy{Base: time.Millisecond, Cap: time.Millisecond}},
		Handler: func(ctx context.Context, m *redeliver.Message) error {
			if failPct > 0 && m.Attempt == 1 {
				if i, _ := strconv.Atoi(m.ID); i%100 < failPct {
					return errBlip
				}
			}
			v.done()
			return nil
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-runDone; err != nil {
			b.Error(err)
		}
	})
	return v
}

// benchQueue declares a fresh redeliver topology (work queue, DLQ, one 1ms delay queue)
// and deletes it when the benchmark ends.
func benchQueue(b *testing.B, url string) (rabbitmq.Config, *amqp.Connection) {
	b.Helper()
	cfg := rabbitmq.Config{URL: url, Queue: testenv.Name("bench_rd"), Prefetch: 64,
		Delays: []time.Duration{time.Millisecond}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	src, err := rabbitmq.NewSource(context.Background(), cfg) // declares the topology
	if err != nil {
		b.Fatal(err)
	}
	topo := src.Topology()
	_ = src.Close(context.Background())
	admin, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = rabbitmq.DeleteTopology(context.Background(), admin, topo)
		_ = admin.Close()
	})
	return cfg, admin
}

// benchPublish publishes n persistent messages to queue with confirms, 256 in flight.
func benchPublish(b *testing.B, conn *amqp.Connection, queue string, n int) {
	ch, err := conn.Channel()
	if err != nil {
		b.Error(err)
		return
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		b.Error(err)
		return
	}
	window := make([]*amqp.DeferredConfirmation, 0, 256)
	flush := func() bool {
		for _, dc := range window {
			if !dc.Wait() {
				b.Error("publish nacked")
				return false
			}
		}
		window = window[:0]
		return true
	}
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, false, false, amqp.Publishing{
			MessageId: strconv.Itoa(i), Body: []byte(`{"grant":"repo:read"}`), DeliveryMode: amqp.Persistent,
		})
		if err != nil {
			b.Error(err)
			return
		}
		if window = append(window, dc); len(window) == cap(window) && !flush() {
			return
		}
	}
	flush()
}
