package rabbitmq_test

import (
	"context"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/pgbox"
	"github.com/retrysafe/retrysafe/redeliver/rabbitmq"
	"github.com/retrysafe/retrysafe/retry"
)

// A consumer with an inbox (effectively once: its grant commits with the message id, and
// the copy the broker delivers again after a failover is acked without running), five
// attempts, jittered exponential backoff through the delay queues, then
// emitter.access.dlq. The handler reads the attempt and the first failure from the
// message, as on every backend. (Not run: it needs a broker and PostgreSQL.)
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	inbox, err := pgbox.NewInbox(pgbox.InboxConfig{Pool: pool})
	if err != nil {
		log.Fatal(err)
	}
	if err := inbox.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	src, err := rabbitmq.NewSource(ctx, rabbitmq.Config{
		URL:      "amqp://guest:guest@localhost:5672/",
		Queue:    "emitter.access",
		Prefetch: 20,
		// Quorum queues by default: replicated, and the broker counts deliveries, so a
		// message that crashes the consumer still ends in the DLQ.
	})
	if err != nil {
		log.Fatal(err)
	}
	c, err := redeliver.New(redeliver.Config{
		Source: src,
		Inbox:  inbox,
		Policy: redeliver.Policy{
			MaxAttempts: 5,
			Backoff:     retry.Policy{Base: 2 * time.Second, Cap: 5 * time.Minute}, // full jitter
			Timeout:     5 * time.Minute,
		},
		Concurrency: 10,
		Logger:      slog.Default(),
		Handler: func(ctx context.Context, m *redeliver.Message) error {
			var grant struct{ User, Repo string }
			if err := redeliver.DecodeJSON(m, &grant); err != nil {
				return err // straight to the DLQ
			}
			if m.Attempt > 1 && !m.FirstFailure.IsZero() {
				slog.InfoContext(ctx, "retrying a grant", slog.Int("attempt", m.Attempt),
					slog.Duration("failing_for", time.Since(m.FirstFailure)))
			}
			_, err := pgbox.Tx(ctx).Exec(ctx, "INSERT INTO grants (grant_id, repo, login) VALUES ($1, $2, $3)",
				m.ID, grant.Repo, grant.User) // commits with the message id
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // returns after a graceful shutdown on Ctrl-C
		log.Fatal(err)
	}
}

// Inspect and replay dead letters (what "retrysafe dlq" does).
func ExampleDeadLetters() {
	ctx := context.Background()
	dl, err := rabbitmq.OpenDeadLetters(ctx, rabbitmq.DeadLettersConfig{
		URL: "amqp://guest:guest@localhost:5672/", Queue: "emitter.access"})
	if err != nil {
		log.Fatal(err)
	}
	defer dl.Close()
	list, err := dl.List(ctx, 20)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range list {
		log.Printf("%s: %s after %d attempts: %s", d.ID, d.Info.Reason, d.Info.Attempts, d.Info.Err)
	}
	n, err := dl.Replay(ctx) // all of them, attempt count reset, ids kept
	log.Println(n, err)
}
