package jetstream

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/redelivertest"
)

// TestConformance runs the backends' shared suite on the machine's NATS server and on
// the embedded one.
func TestConformance(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		redelivertest.Run(t, redelivertest.Harness{
			Deduplicates: true,
			New: func(t *testing.T, p redeliver.Policy) *redelivertest.Queue {
				cfg := newConfig(t, url)
				cfg.Policy = p
				ctx := context.Background()
				if err := Declare(ctx, cfg); err != nil {
					t.Fatal(err)
				}
				return conformanceQueue(t, connect(t, url), cfg)
			},
		})
	})
}

// conformanceQueue is the suite's view of cfg's declared queue, reached through nc.
func conformanceQueue(t *testing.T, nc *nats.Conn, cfg Config) *redelivertest.Queue {
	pub, err := NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &redelivertest.Queue{
		Name:        cfg.Queue,
		Publisher:   pub,
		DeadLetters: deadLetters(t, cfg),
		NewSource: func(t *testing.T) redeliver.Source {
			s, err := NewSource(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Stored: func(t *testing.T) int { return int(queueState(t, nc, cfg).work) },
	}
}
