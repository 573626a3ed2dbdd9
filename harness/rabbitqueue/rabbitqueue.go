// Package rabbitqueue opens, for a test, a work queue of its own on a real RabbitMQ,
// with its retry and dead-letter queues, and deletes them when the test ends, so that
// tests sharing one broker leave nothing behind.
package rabbitqueue

import (
	"context"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/retrysafe/retrysafe/redeliver/rabbitmq"
)

// Open declares queue's topology on the broker at url and returns its Source and an
// administrative connection (for inspecting the queues). Both the topology and the
// connection go when t ends.
func Open(ctx context.Context, t testing.TB, url, queue string, logger *slog.Logger) (*rabbitmq.Source, *amqp.Connection) {
	t.Helper()
	return OpenConfig(ctx, t, rabbitmq.Config{URL: url, Queue: queue, Logger: logger})
}

// OpenConfig is Open with a Config of the test's (Config.Classic for classic queues,
// say): its URL and Queue name the broker and the queue.
func OpenConfig(ctx context.Context, t testing.TB, cfg rabbitmq.Config) (*rabbitmq.Source, *amqp.Connection) {
	t.Helper()
	admin, err := amqp.Dial(cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	src, err := rabbitmq.NewSource(ctx, cfg)
	if err != nil {
		_ = admin.Close()
		t.Fatal(err)
	}
	topo := src.Topology()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rabbitmq.DeleteTopology(ctx, admin, topo); err != nil {
			t.Errorf("deleting topology: %v", err)
		}
		_ = admin.Close()
	})
	return src, admin
}
