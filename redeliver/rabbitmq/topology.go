package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultDelays returns the delay buckets used when Config.Delays is empty: 1s, 2s, 5s,
// 10s, 30s, 1m, 2m, 5m, 10m, 30m and 1h — a bounded set on a roughly geometric scale,
// so that a work queue has 11 delay queues (13 queues with the work queue and its DLQ)
// however the backoff is configured. It returns a new slice on every call.
func DefaultDelays() []time.Duration {
	return []time.Duration{
		time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 30 * time.Minute, time.Hour,
	}
}

// Topology names the queues that serve one work queue.
type Topology struct {
	// Work is the work queue.
	Work string
	// DLQ is the dead-letter queue, Work + ".dlq".
	DLQ string
	// Delays are the delay queues, shortest first: Work + ".delay." + the TTL in
	// milliseconds + "ms" (for example "orders.delay.5000ms"). Each holds a message for
	// its TTL, then dead-letters it back to Work through the default exchange.
	Delays []DelayQueue
	// Quorum says whether the queues are quorum queues.
	Quorum bool
}

// DelayQueue is one delay bucket.
type DelayQueue struct {
	Name  string
	Delay time.Duration
}

// Queues returns every queue name of the topology: the work queue, the DLQ, then the
// delay queues.
func (t Topology) Queues() []string {
	q := []string{t.Work, t.DLQ}
	for _, d := range t.Delays {
		q = append(q, d.Name)
	}
	return q
}

// Topology returns the queues a Source with c declares (Queue, Delays and Classic are
// read), or an error matching ErrConfig when NewSource would refuse them.
// A Source may find the work queue already declared as a classic queue and use that
// type instead (Source.Topology says which it uses).
func (c Config) Topology() (Topology, error) { return newTopology(c.Queue, c.Delays, !c.Classic) }

// typeMismatch reports whether err is RabbitMQ's refusal to redeclare a queue with
// another x-queue-type than it has (PRECONDITION_FAILED, "inequivalent arg
// 'x-queue-type'").
func typeMismatch(err error) bool {
	var aerr *amqp.Error
	return errors.As(err, &aerr) && aerr.Code == amqp.PreconditionFailed && strings.Contains(aerr.Reason, "x-queue-type")
}

// newTopology returns the topology of queue with the given delay buckets (none: the
// default ones).
func newTopology(queue string, delays []time.Duration, quorum bool) (Topology, error) {
	if queue == "" {
		return Topology{}, fmt.Errorf("%w: a queue name is required", ErrConfig)
	}
	if len(queue) > 200 {
		return Topology{}, fmt.Errorf("%w: queue name %q is too long (at most 200 bytes, to leave room for the derived names)", ErrConfig, queue)
	}
	if len(delays) == 0 {
		delays = DefaultDelays()
	}
	if err := checkDelays(delays); err != nil {
		return Topology{}, err
	}
	t := Topology{Work: queue, DLQ: queue + ".dlq", Quorum: quorum}
	for _, d := range delays {
		t.Delays = append(t.Delays, DelayQueue{
			Name:  queue + ".delay." + strconv.FormatInt(d.Milliseconds(), 10) + "ms",
			Delay: d,
		})
	}
	return t, nil
}

// checkDelays accepts a list of delay buckets in strictly ascending order, each a
// positive whole number of milliseconds within RabbitMQ's TTL limit. A list that is not
// is refused rather than mended: the buckets name the delay queues, which every Source
// of the work queue must agree on, so a list sorted or merged in silence would hide a
// configuration that differs from what its author wrote.
func checkDelays(delays []time.Duration) error {
	for i, d := range delays {
		switch {
		case d <= 0:
			return fmt.Errorf("%w: delay %v is not positive", ErrConfig, d)
		case d%time.Millisecond != 0:
			return fmt.Errorf("%w: delay %v is not a whole number of milliseconds (RabbitMQ's TTLs are)", ErrConfig, d)
		case d.Milliseconds() > math.MaxInt32:
			return fmt.Errorf("%w: delay %v is longer than RabbitMQ's TTL limit (2^31-1 ms)", ErrConfig, d)
		case i > 0 && d <= delays[i-1]:
			return fmt.Errorf("%w: delays must be in strictly ascending order, without repeats: %v comes after %v", ErrConfig, d, delays[i-1])
		}
	}
	return nil
}

// Bucket returns the delay queue a retry that should wait d goes to: the nearest
// bucket on a logarithmic scale — between two buckets lo < hi, lo when d is below their
// geometric mean √(lo·hi), else hi (so with the default buckets a delay is never
// rounded to less than about 0.6 or more than about 1.6 times itself) — the shortest
// one for delays below it and the longest for delays above it.
func (t Topology) Bucket(d time.Duration) DelayQueue {
	b := t.Delays
	i, _ := slices.BinarySearchFunc(b, d, func(q DelayQueue, d time.Duration) int {
		return cmpDuration(q.Delay, d)
	})
	switch {
	case i == 0:
		return b[0]
	case i == len(b):
		return b[len(b)-1]
	}
	lo, hi := b[i-1], b[i]
	// d between lo and hi: compare d/lo with hi/d.
	if float64(d)*float64(d) < float64(lo.Delay)*float64(hi.Delay) {
		return lo
	}
	return hi
}

func cmpDuration(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// declare declares the topology on ch, idempotently: re-declaring a queue with the same
// arguments is a no-op in RabbitMQ. A queue that exists with other arguments (another
// type, another TTL) fails with PRECONDITION_FAILED, which closes ch.
func (t Topology) declare(ctx context.Context, ch *amqp.Channel) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	base := func() amqp.Table {
		if t.Quorum {
			return amqp.Table{"x-queue-type": "quorum"}
		}
		return amqp.Table{}
	}
	if _, err := ch.QueueDeclare(t.Work, true, false, false, false, base()); err != nil {
		return fmt.Errorf("rabbitmq: declaring queue %q: %w", t.Work, err)
	}
	if _, err := ch.QueueDeclare(t.DLQ, true, false, false, false, base()); err != nil {
		return fmt.Errorf("rabbitmq: declaring queue %q: %w", t.DLQ, err)
	}
	for _, d := range t.Delays {
		args := base()
		args["x-message-ttl"] = d.Delay.Milliseconds()
		args["x-dead-letter-exchange"] = ""
		args["x-dead-letter-routing-key"] = t.Work
		if t.Quorum {
			// Quorum queues dead-letter at least once (classic queues at most once), which
			// needs reject-publish overflow.
			args["x-dead-letter-strategy"] = "at-least-once"
			args["x-overflow"] = "reject-publish"
		}
		if _, err := ch.QueueDeclare(d.Name, true, false, false, false, args); err != nil {
			return fmt.Errorf("rabbitmq: declaring delay queue %q: %w", d.Name, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// DeleteTopology deletes every queue of t (messages included) through conn. Queues
// that do not exist are skipped. It is meant for tests and for decommissioning a queue.
func DeleteTopology(ctx context.Context, conn *amqp.Connection, t Topology) error {
	var errs []error
	for _, q := range t.Queues() {
		if err := ctx.Err(); err != nil {
			return err
		}
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("rabbitmq: opening channel: %w", err)
		}
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			var aerr *amqp.Error
			if !errors.As(err, &aerr) || aerr.Code != amqp.NotFound {
				errs = append(errs, fmt.Errorf("rabbitmq: deleting queue %q: %w", q, err))
			}
		}
		_ = ch.Close()
	}
	return errors.Join(errs...)
}
