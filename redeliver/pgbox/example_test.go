package pgbox_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/pgbox"
	"github.com/retrysafe/retrysafe/redeliver/rabbitmq"
)

// The producer writes its state and the message in one transaction; a relay publishes
// the message with confirms; the consumer records the message id with its own write.
// (Not run: it needs PostgreSQL and RabbitMQ.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	outbox, _ := pgbox.NewOutbox(pgbox.OutboxConfig{Pool: pool})
	inbox, _ := pgbox.NewInbox(pgbox.InboxConfig{Pool: pool})
	_ = outbox.Migrate(ctx)
	_ = inbox.Migrate(ctx)

	// Producer: the grant's state and its message commit together.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "UPDATE access SET state = 'granting' WHERE id = $1", 42); err != nil {
			return err
		}
		return outbox.Add(ctx, tx, "emitter.access", &redeliver.Message{Body: []byte(`{"access":42}`)})
	})
	if err != nil {
		log.Fatal(err)
	}

	// Relay: publishes what committed, confirmed by the broker.
	pub, err := rabbitmq.NewPublisher(ctx, rabbitmq.PublisherConfig{URL: "amqp://guest:guest@localhost:5672/"})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = outbox.Relay(ctx, pub) }()

	// Consumer: exactly one grant per message id, however often it is delivered.
	src, err := rabbitmq.NewSource(ctx, rabbitmq.Config{URL: "amqp://guest:guest@localhost:5672/", Queue: "emitter.access"})
	if err != nil {
		log.Fatal(err)
	}
	c, err := redeliver.New(redeliver.Config{
		Source: src,
		Inbox:  inbox, // effectively once: a redelivered duplicate is acked without running again
		Handler: func(ctx context.Context, m *redeliver.Message) error {
			_, err := pgbox.Tx(ctx).Exec(ctx, "UPDATE access SET state = 'granted' WHERE id = 42")
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(c.Run(ctx))
}
