package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/retrysafe/retrysafe/harness/natsserver"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/jetstream"
	"github.com/retrysafe/retrysafe/retry"
)

// A consumer on an embedded NATS server: the grant fails once, is redelivered after the
// backoff (NakWithDelay) and succeeds on the second attempt. The handler reads the
// attempt and the first failure from the message, as on RabbitMQ: JetStream redelivers
// the message unchanged, and the Source fills both from the server's delivery count and
// its failure bucket.
func Example() {
	ctx := context.Background()
	url, shutdown, err := natsserver.Start(ctx, "") // or your server's URL
	if err != nil {
		fmt.Println(err)
		return
	}
	defer shutdown()

	policy := redeliver.Policy{
		MaxAttempts: 5,
		Backoff:     retry.Policy{Base: 50 * time.Millisecond, Cap: time.Second},
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	src, err := jetstream.NewSource(ctx, jetstream.Config{
		Queue: "emitter.access", URL: url, Policy: policy, Logger: quiet,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	done := make(chan struct{})
	consumer, err := redeliver.New(redeliver.Config{
		Source: src,
		Policy: policy,
		Logger: quiet,
		Handler: func(ctx context.Context, m *redeliver.Message) error {
			fmt.Printf("attempt %d of %s: %s (failing before: %t)\n", m.Attempt, m.ID, m.Body, !m.FirstFailure.IsZero())
			if m.Attempt == 1 {
				return errors.New("github: 502 bad gateway")
			}
			close(done)
			return nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	stopped := make(chan error, 1)
	go func() { stopped <- consumer.Run(runCtx) }()

	pub, err := jetstream.NewPublisher(src.Conn())
	if err != nil {
		fmt.Println(err)
		return
	}
	err = pub.Publish(ctx, "emitter.access", &redeliver.Message{ID: "grant-1", Body: []byte(`{"user":42}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	<-done
	stop()
	fmt.Println("stopped:", <-stopped)
	// Output:
	// attempt 1 of grant-1: {"user":42} (failing before: false)
	// attempt 2 of grant-1: {"user":42} (failing before: true)
	// stopped: <nil>
}

// Inspecting and replaying dead letters, as the retrysafe dlq command does.
func ExampleDeadLetters() {
	ctx := context.Background()
	url, shutdown, err := natsserver.Start(ctx, "")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer shutdown()
	cfg := jetstream.Config{Queue: "emitter.access", URL: url}
	if err := jetstream.Declare(ctx, cfg); err != nil {
		fmt.Println(err)
		return
	}
	dlq, err := jetstream.NewDeadLetters(ctx, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dlq.Close()
	list, err := dlq.List(ctx, 10)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range list {
		fmt.Println(d.ID, d.Info.Reason, d.Info.Attempts, d.Info.Err)
	}
	n, err := dlq.Replay(ctx) // all of them, attempt count reset
	fmt.Println("replayed", n, err)
	// Output:
	// replayed 0 <nil>
}
