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

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/retrysafe/retrysafe/harness/natsserver"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/jetstream"
	"github.com/retrysafe/retrysafe/retry"
)

// BenchmarkRedeliverJetStream measures messages per second from publish to settled
// handling through JetStream, on the machine's NATS server (nats) and on an embedded one
// in the benchmark's process (embedded), for three consumers measured in the same run:
//
//	raw        nats.go's jetstream package alone: a durable pull consumer on a
//	           work-queue stream, Messages() with its defaults (500 prefetched), each
//	           message acked with a plain (unconfirmed) Ack
//	fail=0%    redeliver.Consumer on a jetstream.Source (defaults: prefetch 16,
//	           concurrency 16, every settlement confirmed by the server), empty handler
//	fail=10%   the same, one message in ten failing its first attempt: NakWithDelay
//	           of 1ms, redelivered, succeeds
//
// Each variant has its own streams (file storage, the default) and a consumer that runs
// throughout; one publisher (async publishes, 256 awaiting their PubAck) feeds them in
// rounds of 1000 messages, the variants taking turns in rotating order, so that the load
// of a shared machine falls on all three alike. b.N is the number of messages per
// variant; the metrics are each variant's rate over its rounds and the ratios to raw.
func BenchmarkRedeliverJetStream(b *testing.B) {
	b.Run("nats", func(b *testing.B) { benchJetStream(b, testenv.NATSURL(b)) })
	b.Run("embedded", func(b *testing.B) {
		url, shutdown, err := natsserver.Start(context.Background(), "")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(shutdown)
		benchJetStream(b, url)
	})
}

func benchJetStream(b *testing.B, url string) {
	pub, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pub.Close)
	variants := []*jsVariant{
		newJSRawVariant(b, url, pub),
		newJSRedeliverVariant(b, url, pub, 0),
		newJSRedeliverVariant(b, url, pub, 10),
	}
	const round = 1000
	b.ResetTimer()
	for r := 0; r*round < b.N; r++ {
		n := min(round, b.N-r*round)
		for i := range variants {
			variants[(r+i)%len(variants)].run(b, n)
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

// jsVariant is one consumer on its own queue; handled is bumped once per message handled
// successfully.
type jsVariant struct {
	js      js.JetStream // the publisher's
	queue   string
	next    int // the next message id: ids never repeat (the stream deduplicates them)
	handled atomic.Int64
	target  atomic.Int64
	reached chan struct{}
	msgs    int
	elapsed time.Duration
}

func (v *jsVariant) done() {
	if n := v.handled.Add(1); n == v.target.Load() {
		v.reached <- struct{}{}
	}
}

// run publishes n messages and waits until they are all handled.
func (v *jsVariant) run(b *testing.B, n int) {
	start := time.Now()
	v.target.Store(v.handled.Load() + int64(n))
	first := v.next
	v.next += n
	go jsPublish(b, v.js, v.queue, first, n)
	select {
	case <-v.reached:
	case <-time.After(5 * time.Minute):
		b.Fatal("timed out")
	}
	v.elapsed += time.Since(start)
	v.msgs += n
}

func (v *jsVariant) rate() float64 { return float64(v.msgs) / v.elapsed.Seconds() }

func newJSRawVariant(b *testing.B, url string, pub *nats.Conn) *jsVariant {
	cfg := jsBenchQueue(b, url)
	j, _ := js.New(pub)
	v := &jsVariant{js: j, queue: cfg.Queue, reached: make(chan struct{}, 1)}
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	cj, _ := js.New(nc)
	// The same durable consumer the Source declared (Declare in jsBenchQueue).
	cons, err := cj.Consumer(context.Background(), jsStream(cfg), jetstream.DefaultConsumer)
	if err != nil {
		b.Fatal(err)
	}
	cc, err := cons.Consume(func(m js.Msg) {
		if m.Ack() == nil {
			v.done()
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cc.Stop)
	return v
}

func newJSRedeliverVariant(b *testing.B, url string, pub *nats.Conn, failPct int) *jsVariant {
	cfg := jsBenchQueue(b, url)
	j, _ := js.New(pub)
	v := &jsVariant{js: j, queue: cfg.Queue, reached: make(chan struct{}, 1)}
	src, err := jetstream.NewSource(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	errBlip := errors.New("blip")
	c, err := redeliver.New(redeliver.Config{
		Source: src, Concurrency: 16, Logger: cfg.Logger, Policy: cfg.Policy,
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

// jsBenchQueue declares a fresh queue (work stream, DLQ stream, durable consumer) and
// deletes its streams when the benchmark ends.
func jsBenchQueue(b *testing.B, url string) jetstream.Config {
	b.Helper()
	cfg := jetstream.Config{
		URL: url, Queue: testenv.Name("bench_js"),
		Policy: redeliver.Policy{Backoff: retry.Policy{Base: time.Millisecond, Cap: time.Millisecond}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if err := jetstream.Declare(context.Background(), cfg); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = jetstream.DeleteTopology(ctx, cfg) // the work and DLQ streams, and the failures bucket
	})
	return cfg
}

// jsStream is the work stream's default name: the queue (testenv.Name has no dots).
func jsStream(cfg jetstream.Config) string { return cfg.Queue }

// jsPublish publishes n messages with ids first… to queue, 256 awaiting their PubAck.
func jsPublish(b *testing.B, j js.JetStream, queue string, first, n int) {
	window := make([]js.PubAckFuture, 0, 256)
	flush := func() bool {
		for _, f := range window {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Error(err)
				return false
			}
		}
		window = window[:0]
		return true
	}
	for i := first; i < first+n; i++ {
		f, err := j.PublishMsgAsync(&nats.Msg{Subject: queue, Data: []byte(`{"grant":"repo:read"}`)},
			js.WithMsgID(strconv.Itoa(i)))
		if err != nil {
			b.Error(err)
			return
		}
		if window = append(window, f); len(window) == cap(window) && !flush() {
			return
		}
	}
	flush()
}
