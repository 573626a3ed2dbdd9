package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/retrysafe/retrysafe/redeliver"
)

// DeadLettersConfig configures DeadLetters. URL and Queue are required; the zero value of
// every other field means the default documented on it.
type DeadLettersConfig struct {
	// URL is the broker's AMQP URL. Required.
	URL string
	// Queue is the work queue; its dead letters are in Queue+".dlq", and Replay
	// publishes to Queue. Required.
	Queue string
	// Header is the attempt count header that Replay removes (Policy.Header of the
	// consumers). Default "x-retry-count".
	Header string
	// Quorum says the DLQ is a quorum queue, for Message.DeliveryCount. Default false.
	Quorum bool
	// AMQP configures the connection. Default: amqp091's defaults.
	AMQP amqp.Config
	// Clock is the time source of the replayed messages' times. Nil means time.Now.
	Clock func() time.Time
}

// DeadLetters implements redeliver.DeadLetters on a RabbitMQ dead-letter queue.
//
// RabbitMQ has no way to read a queue without taking messages from it, so List and Get
// peek: they take messages with basic.get (manual ack) and, when done, return them all
// with one basic.nack (requeue). The caveats:
//
//   - While a peek runs, the messages it holds are invisible to other consumers of the
//     DLQ (there normally are none).
//   - A classic queue puts requeued messages back in their original positions; a quorum
//     queue may not (RabbitMQ 4 puts them at the back), and counts each peek in the
//     messages' x-delivery-count. A quorum queue also takes a moment to make requeued
//     messages ready again, so a scan right after another may not see the messages the
//     other held; it sees them when run again.
//   - Messages are marked redelivered.
//   - A scan reads at most the number of messages the queue had when it began, so
//     messages dead-lettered meanwhile may be missed, and Get costs a round trip per
//     message before the one it finds.
//
// Replay and Purge with ids scan the same way, acknowledging the chosen messages and
// requeueing the others; Purge without ids is queue.purge.
type DeadLetters struct {
	cfg    DeadLettersConfig
	dlq    string
	header string
	conn   *amqp.Connection
}

var _ redeliver.DeadLetters = (*DeadLetters)(nil)

// OpenDeadLetters connects to cfg.URL and checks that the DLQ exists (an error matching
// redeliver.ErrNotFound when it does not).
func OpenDeadLetters(ctx context.Context, cfg DeadLettersConfig) (*DeadLetters, error) {
	if cfg.URL == "" {
		return nil, fmt.Errorf("%w: DeadLettersConfig.URL is required", ErrConfig)
	}
	if cfg.Queue == "" {
		return nil, fmt.Errorf("%w: DeadLettersConfig.Queue is required", ErrConfig)
	}
	if cfg.Header == "" {
		cfg.Header = redeliver.DefaultHeader
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	conn, err := dial(ctx, cfg.URL, withConnectionName(cfg.AMQP, "retrysafe-dlq "+cfg.Queue))
	if err != nil {
		return nil, err
	}
	d := &DeadLetters{cfg: cfg, dlq: cfg.Queue + ".dlq", header: cfg.Header, conn: conn}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("rabbitmq: opening channel: %w", err)
	}
	defer ch.Close()
	if _, err := d.count(ch); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return d, nil
}

// count returns the number of ready messages in the DLQ.
func (d *DeadLetters) count(ch *amqp.Channel) (int, error) {
	q, err := ch.QueueDeclarePassive(d.dlq, true, false, false, false, nil)
	if err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return 0, fmt.Errorf("rabbitmq: dead-letter queue %q: %w", d.dlq, redeliver.ErrNotFound)
		}
		return 0, fmt.Errorf("rabbitmq: inspecting %q: %w", d.dlq, err)
	}
	return q.Messages, nil
}

// returnWait bounds how long a scan waits for the messages it requeued to be counted in
// the queue again.
const returnWait = 5 * time.Second

// awaitReturned waits until the DLQ counts at least n ready messages, for at most
// returnWait. A requeue is not answered, and a quorum queue applies it after the
// channel's later methods (its Raft log commits it): a count, a list or a purge that
// follows a scan at once would miss the messages still on their way back. Another
// reader of the DLQ can keep the count below n; the wait then ends at the bound.
func (d *DeadLetters) awaitReturned(ch *amqp.Channel, n int) {
	deadline := time.Now().Add(returnWait)
	for {
		c, err := d.count(ch)
		if err != nil || c >= n || time.Now().After(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// action is what a scan does with a message.
type action int

const (
	keep   action = iota // requeue it at the end of the scan
	remove               // ack it now
	stop                 // requeue it and end the scan
)

// scan takes up to max messages (max <= 0: as many as the queue had when it began) from
// the DLQ and calls visit on each; the messages not removed are requeued when it ends,
// and scan returns once the queue holds them again (see awaitReturned).
func (d *DeadLetters) scan(ctx context.Context, max int, visit func(*amqp.Delivery) (action, error)) error {
	ch, err := d.conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: opening channel: %w", err)
	}
	defer ch.Close() // requeues anything still unacknowledged
	n, err := d.count(ch)
	if err != nil {
		return err
	}
	if max > 0 {
		n = min(n, max)
	}
	var lastKept uint64
	kept := 0
	defer func() {
		if lastKept > 0 && ch.Nack(lastKept, true, true) == nil {
			d.awaitReturned(ch, kept)
		}
	}()
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, ok, err := ch.Get(d.dlq, false)
		if err != nil {
			return fmt.Errorf("rabbitmq: reading %q: %w", d.dlq, err)
		}
		if !ok {
			return nil
		}
		a, err := visit(&m)
		if err != nil || a != remove {
			kept++
		}
		switch {
		case err != nil:
			lastKept = m.DeliveryTag
			return err
		case a == remove:
			if err := m.Ack(false); err != nil {
				return fmt.Errorf("rabbitmq: ack in %q: %w", d.dlq, err)
			}
		case a == stop:
			lastKept = m.DeliveryTag
			return nil
		default:
			lastKept = m.DeliveryTag
		}
	}
	return nil
}

func (d *DeadLetters) deadLetter(m *amqp.Delivery) redeliver.DeadLetter {
	msg := toMessage(m, d.dlq, d.cfg.Quorum, d.cfg.Clock())
	dead, _ := time.Parse(time.RFC3339Nano, msg.Header[HeaderDeadLettered])
	return redeliver.DeadLetter{Message: *msg, Info: redeliver.ParseDeadInfo(msg.Header), DeadLettered: dead}
}

// List returns up to limit dead letters (limit <= 0: all), in queue order, and leaves
// them in the queue (see the caveats on DeadLetters).
func (d *DeadLetters) List(ctx context.Context, limit int) ([]redeliver.DeadLetter, error) {
	var out []redeliver.DeadLetter
	err := d.scan(ctx, limit, func(m *amqp.Delivery) (action, error) {
		out = append(out, d.deadLetter(m))
		return keep, nil
	})
	return out, err
}

// Get returns the first dead letter whose message id is id, leaving it in the queue, or
// an error matching redeliver.ErrNotFound.
func (d *DeadLetters) Get(ctx context.Context, id string) (*redeliver.DeadLetter, error) {
	var found *redeliver.DeadLetter
	err := d.scan(ctx, 0, func(m *amqp.Delivery) (action, error) {
		if m.MessageId != id {
			return keep, nil
		}
		dl := d.deadLetter(m)
		found = &dl
		return stop, nil
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, fmt.Errorf("rabbitmq: dead letter %q in %q: %w", id, d.dlq, redeliver.ErrNotFound)
	}
	return found, nil
}

// Replay republishes the dead letters with the given message ids (none: all of them)
// to the work queue — body, properties (the timestamp of the first publish included)
// and message id kept; the attempt count header, the redeliver-* headers and RabbitMQ's
// x-death, x-first-death-* and x-last-death-* removed, so the message starts clean —
// and acks each DLQ copy once the broker confirmed its replay. It returns how many it
// replayed. A failure stops it; the messages replayed so far stay replayed.
func (d *DeadLetters) Replay(ctx context.Context, ids ...string) (int, error) {
	pub, err := newConfirmChannel(d.conn)
	if err != nil {
		return 0, err
	}
	defer pub.close()
	n := 0
	err = d.scan(ctx, 0, func(m *amqp.Delivery) (action, error) {
		if len(ids) > 0 && !slices.Contains(ids, m.MessageId) {
			return keep, nil
		}
		p := copyOf(m, nil, "")
		for k := range p.Headers {
			if replayDrops(k, d.header) {
				delete(p.Headers, k)
			}
		}
		if err := pub.publish(ctx, d.cfg.Queue, p); err != nil {
			return keep, fmt.Errorf("rabbitmq: replaying %q: %w", m.MessageId, err)
		}
		n++
		return remove, nil
	})
	return n, err
}

// Purge removes the dead letters with the given message ids (none: all of them, with
// queue.purge) and returns how many it removed.
func (d *DeadLetters) Purge(ctx context.Context, ids ...string) (int, error) {
	if len(ids) == 0 {
		ch, err := d.conn.Channel()
		if err != nil {
			return 0, fmt.Errorf("rabbitmq: opening channel: %w", err)
		}
		defer ch.Close()
		n, err := ch.QueuePurge(d.dlq, false)
		if err != nil {
			return 0, fmt.Errorf("rabbitmq: purging %q: %w", d.dlq, err)
		}
		return n, nil
	}
	n := 0
	err := d.scan(ctx, 0, func(m *amqp.Delivery) (action, error) {
		if !slices.Contains(ids, m.MessageId) {
			return keep, nil
		}
		n++
		return remove, nil
	})
	return n, err
}

// Close closes the connection.
func (d *DeadLetters) Close() error {
	if err := d.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("rabbitmq: closing connection: %w", err)
	}
	return nil
}
