package jetstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	js "github.com/nats-io/nats.go/jetstream"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

// Deliveries no handler saw — a message pulled ahead into a Source that a failover or
// a restart then handed back, four times — raise NumDelivered but spend no attempt: the
// message's first run is attempt 1, and the run after its one failure attempt 2, within
// max attempts 3. Counted by NumDelivered, its first run would be attempt 5, and the
// Consumer would dead-letter it unrun as past its attempts.
func TestDeliveriesNoHandlerSawSpendNoAttempts(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		ctx := context.Background()
		cfg := newConfig(t, url)
		if err := Declare(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		nc := connect(t, url)
		publish(t, nc, cfg, "ahead-1")
		c, _ := cfg.withDefaults()
		j, _ := js.New(nc)
		cons, err := j.Consumer(ctx, c.Stream, c.Consumer)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			m, err := cons.Next(js.FetchMaxWait(5 * time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if md, _ := m.Metadata(); md.NumDelivered != uint64(i+1) {
				t.Fatalf("NumDelivered %d, want %d", md.NumDelivered, i+1)
			}
			if err := m.Nak(); err != nil { // handed back unseen
				t.Fatal(err)
			}
		}

		rec := newRecorder()
		counts := make(chan int, 4)
		r := run(t, cfg, func(_ context.Context, m *redeliver.Message) error {
			rec.delivered(m)
			counts <- m.DeliveryCount
			if m.Attempt == 1 {
				return errors.New("once")
			}
			rec.succeeded(m.ID)
			return nil
		}, nil)
		eventually(t, 10*time.Second, "a success", func() bool { return rec.success("ahead-1") == 1 })
		quiesce(t, nc, cfg, r, state{})
		rec.mu.Lock()
		attempts := fmt.Sprint(rec.attempts["ahead-1"])
		rec.mu.Unlock()
		if attempts != "[1 2]" {
			t.Errorf("the runs were attempts %s, want [1 2]", attempts)
		}
		if first := <-counts; first != 5 {
			t.Errorf("the first run's DeliveryCount is %d, want 5 (four deliveries no handler saw)", first)
		}
	})
}

// A server that loses the consumer's state — here the consumer is deleted — delivers
// every message anew with NumDelivered 1. A message that had failed two attempts runs
// next as attempt 3, with its first failure's time: the failure bucket, not the
// delivery count, holds the attempts. Both when the running Source declares the
// consumer again, and when the consumer's process was stopped and starts after the
// loss.
func TestLostConsumerStateKeepsAttempts(t *testing.T) {
	t.Parallel()
	for _, restart := range []bool{false, true} {
		t.Run(map[bool]string{false: "running", true: "restarted"}[restart], func(t *testing.T) {
			t.Parallel()
			lostConsumerState(t, restart)
		})
	}
}

func lostConsumerState(t *testing.T, restart bool) {
	forEach(t, func(t *testing.T, url string) {
		ctx := context.Background()
		cfg := newConfig(t, url)
		cfg.Policy.MaxAttempts = 5
		cfg.Policy.Backoff = retry.Policy{Base: 10 * time.Millisecond, Cap: 2 * time.Hour, Jitter: retry.JitterNone}
		type handled struct {
			attempt, count int
			first          time.Time
		}
		runs := make(chan handled, 8)
		handler := func(_ context.Context, m *redeliver.Message) error {
			runs <- handled{m.Attempt, m.DeliveryCount, m.FirstFailure}
			switch m.Attempt {
			case 1:
				return errors.New("first")
			case 2:
				// The redelivery would come in an hour: it comes from the new consumer.
				return retry.After(time.Hour, errors.New("second"))
			}
			return nil
		}
		secondRetried := make(chan struct{})
		var once sync.Once
		watch := func(rc *redeliver.Config) {
			rc.Source = confirmedRetries{Source: rc.Source.(*Source), retried: func(attempt int) {
				if attempt == 2 {
					once.Do(func() { close(secondRetried) })
				}
			}}
		}
		r := run(t, cfg, handler, watch)
		nc := connect(t, url)
		publish(t, nc, cfg, "lost-state-1")
		next := func() handled {
			t.Helper()
			select {
			case got := <-runs:
				return got
			case <-time.After(30 * time.Second):
				t.Fatal("no run")
				return handled{}
			}
		}
		first, second := next(), next()
		if first.attempt != 1 || second.attempt != 2 || second.first.IsZero() {
			t.Fatalf("runs %+v then %+v, want attempts 1 and 2, the second with a first failure", first, second)
		}
		// The consumer's state is lost only once the second failure's Retry has been
		// confirmed: the failure bucket then holds attempt 2, and the message waits for
		// its delayed redelivery. The queue's state (work 1, ack pending 1) cannot tell:
		// it holds as soon as the second run is delivered, while its handler still runs,
		// and a loss then makes the server deliver the message anew next to that run,
		// rightly as attempt 2.
		select {
		case <-secondRetried:
		case <-time.After(30 * time.Second):
			t.Fatal("the second failure's Retry was not confirmed")
		}
		if st := queueState(t, nc, cfg); st != (state{work: 1, ackPending: 1}) {
			t.Fatalf("the queue's state after the second failure's Retry is %+v, want the message waiting for its redelivery: %+v",
				st, state{work: 1, ackPending: 1})
		}
		c, _ := cfg.withDefaults()
		j, _ := js.New(nc)
		if restart {
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
		}
		if err := j.DeleteConsumer(ctx, c.Stream, c.Consumer); err != nil {
			t.Fatal(err)
		}
		if restart {
			r = run(t, cfg, handler, nil)
		}
		third := next()
		if third.count != 1 {
			t.Errorf("the run after the loss has DeliveryCount %d, want 1 (the server counts anew)", third.count)
		}
		if third.attempt != 3 || !third.first.Equal(second.first) {
			t.Errorf("the run after the loss is attempt %d, first failure %v; want attempt 3, first failure %v",
				third.attempt, third.first, second.first)
		}
		eventually(t, 10*time.Second, "an empty queue", func() bool { return queueState(t, nc, cfg) == state{} })
		_ = r.stop()
	})
}

// confirmedRetries is a Source with every method of *Source (the Consumer sees that it
// keeps attempts, and its Heartbeat), whose deliveries call retried with the attempt of
// each Retry the server confirmed: a handler's return, and its run's delivery, come
// before the Retry reaches the server.
type confirmedRetries struct {
	*Source
	retried func(attempt int)
}

func (s confirmedRetries) Receive(ctx context.Context) (redeliver.Delivery, error) {
	d, err := s.Source.Receive(ctx)
	if err != nil {
		return nil, err
	}
	return confirmedRetry{Delivery: d, retried: s.retried}, nil
}

type confirmedRetry struct {
	redeliver.Delivery
	retried func(attempt int)
}

func (d confirmedRetry) Retry(ctx context.Context, r redeliver.RetryInfo) error {
	err := d.Delivery.Retry(ctx, r)
	if err == nil {
		d.retried(r.Attempt)
	}
	return err
}
