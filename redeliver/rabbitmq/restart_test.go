//go:build linux

package rabbitmq

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/harness/rabbitnode"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

// TestBrokerRestart restarts a disposable RabbitMQ node while a consumer runs and a
// producer publishes: the consumer reconnects and no message is lost. Booting a node
// takes 5–20 s here, twice, so it runs only with RETRYSAFE_LONG=1.
func TestBrokerRestart(t *testing.T) {
	if os.Getenv("RETRYSAFE_LONG") != "1" {
		t.Skip("boots a disposable RabbitMQ node twice; set RETRYSAFE_LONG=1")
	}
	n := rabbitnode.Start(t)
	t.Logf("node booted in %v", n.StartTimes()[0])
	d := newDB(t)
	queue := testenv.Name("restart")
	cfg := Config{URL: n.URL(), Queue: queue, Delays: testDelays, Logger: quiet(),
		Reconnect: retry.Policy{Base: 100 * time.Millisecond, Cap: time.Second}}
	// After the first messages (some of them retried through the delay queues), the
	// handlers wait in their transactions until the node is stopping: a backlog is
	// still there, and in flight, when the broker stops.
	const flowing = 30
	stopping := make(chan struct{})
	var writes, started atomic.Int32
	src, stopConsumer := consume(t, cfg, redeliver.Config{Policy: testPolicy(5), Concurrency: 2,
		Handler: d.inbox.Handler(func(ctx context.Context, tx pgx.Tx, m *redeliver.Message) error {
			writes.Add(1)
			if started.Add(1) > flowing {
				select {
				case <-stopping:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if m.Attempt == 1 && m.ID[len(m.ID)-1] == '3' {
				return errors.New("blip") // some go through the delay queues across the restart
			}
			return d.write(ctx, tx, m)
		})})
	pub, err := NewPublisher(t.Context(), PublisherConfig{URL: n.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	const total = 200
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			m := &redeliver.Message{ID: "m" + strconv.Itoa(i), Body: []byte("x")}
			// At least once: retry until confirmed, while the publisher reconnects.
			eventually(t, 30*time.Second, "a confirmed publish of "+m.ID, func() bool { return pub.Publish(t.Context(), queue, m) == nil })
		}
	}
	// Half before the restart, stopped while they are being processed and retried, …
	publish(0, total/2)
	eventually(t, 30*time.Second, "both handlers held", func() bool { return started.Load() >= flowing+2 })
	n.Stop()
	close(stopping)
	t.Logf("node stopped; %d rows so far", func() int { r, _ := d.rows(t); return r }())
	n.Restart()
	t.Logf("node restarted in %v", n.StartTimes()[1])
	// … half after it.
	publish(total/2, total)
	eventually(t, 60*time.Second, "every message", func() bool { rows, _ := d.rows(t); return rows == total })
	stopConsumer()
	if rows, distinct := d.rows(t); rows != total || distinct != total {
		t.Errorf("business rows %d (%d ids), want %d", rows, distinct, total)
	}
	if c := src.Connects(); c < 2 {
		t.Errorf("%d connects, want a reconnect", c)
	}
	t.Logf("%d handler runs, %d connects", writes.Load(), src.Connects())
}
