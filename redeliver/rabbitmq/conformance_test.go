package rabbitmq

import (
	"context"
	"testing"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/redelivertest"
)

// TestConformance runs the backends' shared suite on classic and on quorum queues.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, quorum := range []bool{false, true} {
		name := "classic"
		if quorum {
			name = "quorum"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			redelivertest.Run(t, redelivertest.Harness{New: func(t *testing.T, p redeliver.Policy) *redelivertest.Queue {
				return conformanceQueue(t, quorum, p)
			}})
		})
	}
}

func conformanceQueue(t *testing.T, quorum bool, p redeliver.Policy) *redelivertest.Queue {
	return conformanceQueueOf(t, newRMQ(t, quorum), quorum, p)
}

func conformanceQueueOf(t *testing.T, r *rmq, quorum bool, p redeliver.Policy) *redelivertest.Queue {
	ctx := context.Background()
	pre, err := NewSource(ctx, r.config()) // declares the topology
	if err != nil {
		t.Fatal(err)
	}
	_ = pre.Close(ctx)
	pub, err := NewPublisher(ctx, PublisherConfig{URL: r.url, URLs: r.urls})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	dl, err := OpenDeadLetters(ctx, DeadLettersConfig{URL: r.url, Queue: r.queue, Header: p.Header, Quorum: quorum})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dl.Close() })
	return &redelivertest.Queue{
		Name:        r.queue,
		Publisher:   pub,
		DeadLetters: dl,
		NewSource: func(t *testing.T) redeliver.Source {
			s, err := NewSource(ctx, r.config())
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Stored: func(t *testing.T) int { return r.count(t, r.queue) },
	}
}
