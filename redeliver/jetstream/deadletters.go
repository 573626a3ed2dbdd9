package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/retrysafe/retrysafe/redeliver"
)

// Publisher is a redeliver.Publisher on JetStream: it publishes to a subject and waits
// for the stream's PubAck. A message's ID becomes its Nats-Msg-Id, which the Source
// reads back as Message.ID, and on which the stream deduplicates: a second publish of
// an id the stream stored within its duplicate window (Config.Duplicates for the
// streams this package declares, default DefaultDuplicates, 2m; StreamConfig.Duplicates
// for others) is dropped, and Publish returns an error matching redeliver.ErrDuplicate.
type Publisher struct {
	js js.JetStream
}

var _ redeliver.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher on nc, which it leaves open.
func NewPublisher(nc *nats.Conn) (*Publisher, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrConfig)
	}
	j, err := js.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Publisher{js: j}, nil
}

// Publish sends m's ID, Body, ContentType and Header to the subject queue and returns
// nil once a stream stored it. When the stream had stored m.ID already, within its
// duplicate window, it stores nothing and Publish returns an error matching
// redeliver.ErrDuplicate: the earlier message stands (an outbox relay resending after
// a lost PubAck counts it as delivered), and a second message reusing the id is not
// stored. A subject no stream listens on is an error (nats.ErrNoStreamResponse,
// wrapped).
func (p *Publisher) Publish(ctx context.Context, queue string, m *redeliver.Message) error {
	if m == nil {
		return fmt.Errorf("%w: nil message", ErrConfig)
	}
	if err := checkSubject(queue); err != nil {
		return fmt.Errorf("%w: subject: %w", ErrConfig, err)
	}
	out := &nats.Msg{Subject: queue, Header: make(nats.Header, len(m.Header)+2), Data: m.Body}
	for k, v := range m.Header {
		out.Header.Set(k, v)
	}
	if m.ContentType != "" {
		out.Header.Set(HeaderContentType, m.ContentType)
	}
	var opts []js.PublishOpt
	if m.ID != "" {
		opts = append(opts, js.WithMsgID(m.ID))
	}
	ack, err := p.js.PublishMsg(ctx, out, opts...)
	if err != nil {
		return fmt.Errorf("jetstream: publishing %s to %s: %w", m.ID, queue, err)
	}
	if ack.Duplicate {
		return fmt.Errorf("jetstream: publishing %s to %s: stream %s stored it before: %w", m.ID, queue, ack.Stream, redeliver.ErrDuplicate)
	}
	return nil
}

// DeadLetters is redeliver.DeadLetters on a queue's DLQ stream: the operations of the
// retrysafe dlq command. It reads the stream by sequence (it creates no consumer), so
// listing never removes or redelivers anything. Make one with NewDeadLetters.
type DeadLetters struct {
	cfg    Config
	nc     *nats.Conn
	own    bool
	js     js.JetStream
	dlq    js.Stream
	header string
	closed atomic.Bool
}

var _ redeliver.DeadLetters = (*DeadLetters)(nil)

// NewDeadLetters opens the DLQ of cfg's queue (Queue, URL or Conn, and the names; only
// Policy.Header among the rest, the count header a replay removes). The DLQ stream must
// exist (NewSource or Declare creates it): otherwise the error matches
// redeliver.ErrNotFound.
func NewDeadLetters(ctx context.Context, cfg Config) (*DeadLetters, error) {
	s, err := cfg.open(ctx)
	if err != nil {
		return nil, err
	}
	c := s.cfg
	dlq, err := s.js.Stream(ctx, c.DLQStream)
	if err != nil {
		s.close()
		if errors.Is(err, js.ErrStreamNotFound) {
			return nil, fmt.Errorf("jetstream: no DLQ stream %s for queue %s: %w (%w)", c.DLQStream, c.Queue, redeliver.ErrNotFound, err)
		}
		return nil, fmt.Errorf("jetstream: DLQ stream %s: %w", c.DLQStream, err)
	}
	return &DeadLetters{cfg: c, nc: s.nc, own: s.own, js: s.js, dlq: dlq, header: c.Policy.Header}, nil
}

// each calls fn on every dead letter, oldest first, until fn returns false.
func (d *DeadLetters) each(ctx context.Context, fn func(*js.RawStreamMsg) (bool, error)) error {
	if d.closed.Load() || d.nc.IsClosed() {
		return redeliver.ErrClosed
	}
	info, err := d.dlq.Info(ctx)
	if err != nil {
		return fmt.Errorf("jetstream: DLQ stream info: %w", err)
	}
	last := info.State.LastSeq
	for seq := max(info.State.FirstSeq, 1); seq <= last; {
		raw, err := nextMsg(ctx, d.dlq, seq, last, d.cfg.DLQSubject)
		if errors.Is(err, js.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("jetstream: reading dead letters from %d: %w", seq, err)
		}
		more, err := fn(raw)
		if err != nil || !more {
			return err
		}
		seq = raw.Sequence + 1
	}
	return nil
}

// List returns up to limit dead letters (limit <= 0: all), oldest first.
func (d *DeadLetters) List(ctx context.Context, limit int) ([]redeliver.DeadLetter, error) {
	var out []redeliver.DeadLetter
	err := d.each(ctx, func(raw *js.RawStreamMsg) (bool, error) {
		out = append(out, toDeadLetter(raw, d.cfg.Stream, d.cfg.Queue))
		return limit <= 0 || len(out) < limit, nil
	})
	return out, err
}

// Get returns the oldest dead letter with the message id, or an error matching
// redeliver.ErrNotFound.
func (d *DeadLetters) Get(ctx context.Context, id string) (*redeliver.DeadLetter, error) {
	var found *redeliver.DeadLetter
	err := d.each(ctx, func(raw *js.RawStreamMsg) (bool, error) {
		if messageID(raw.Header, d.cfg.Stream, raw.Sequence) != id {
			return true, nil
		}
		dl := toDeadLetter(raw, d.cfg.Stream, d.cfg.Queue)
		found = &dl
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, fmt.Errorf("jetstream: dead letter %q in %s: %w", id, d.cfg.DLQStream, redeliver.ErrNotFound)
	}
	return found, nil
}

// matcher returns whether a stored dead letter is selected by ids (none: all).
func (d *DeadLetters) matcher(ids []string) func(*js.RawStreamMsg) bool {
	return func(raw *js.RawStreamMsg) bool {
		return len(ids) == 0 || slices.Contains(ids, messageID(raw.Header, d.cfg.Stream, raw.Sequence))
	}
}

// Replay publishes the dead letters with the given ids (none: all) to the work queue, in
// order: id kept (HeaderID), first publish kept (HeaderPublished), the count header,
// HeaderSwept, HeaderFailed and the dead-letter headers removed (the message starts again at attempt
// 1, with no first failure: the copy has a new sequence, so no failure record), the
// other headers and the body as they were. Each is removed from the DLQ once the work
// stream acknowledged its copy. Each copy's Nats-Msg-Id names the dead letter, so
// replaying the same one twice (a crash between the publish and the removal) stores one
// copy within the work stream's window.
func (d *DeadLetters) Replay(ctx context.Context, ids ...string) (int, error) {
	match := d.matcher(ids)
	n := 0
	err := d.each(ctx, func(raw *js.RawStreamMsg) (bool, error) {
		if !match(raw) {
			return true, nil
		}
		id := messageID(raw.Header, d.cfg.Stream, raw.Sequence)
		h := copyHeader(raw.Header, func(k string) bool {
			return redeliver.IsRedeliverHeader(k) || k == d.header || k == HeaderSwept || k == HeaderFailed
		})
		h.Set(HeaderID, id)
		out := &nats.Msg{Subject: d.cfg.Queue, Header: h, Data: raw.Data}
		if _, err := d.js.PublishMsg(ctx, out, js.WithMsgID(replayKey(id, d.cfg.DLQStream, raw.Sequence)),
			js.WithExpectStream(d.cfg.Stream)); err != nil {
			return false, fmt.Errorf("jetstream: replaying %s to %s: %w", id, d.cfg.Queue, err)
		}
		if err := d.dlq.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, js.ErrMsgNotFound) {
			return false, fmt.Errorf("jetstream: removing replayed dead letter %s: %w", id, err)
		}
		n++
		return true, nil
	})
	return n, err
}

// Purge removes the dead letters with the given ids (none: all of them present when it
// starts) and returns how many it removed.
func (d *DeadLetters) Purge(ctx context.Context, ids ...string) (int, error) {
	if d.closed.Load() || d.nc.IsClosed() {
		return 0, redeliver.ErrClosed
	}
	if len(ids) == 0 {
		info, err := d.dlq.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("jetstream: DLQ stream info: %w", err)
		}
		if info.State.Msgs == 0 {
			return 0, nil
		}
		// Everything below LastSeq+1: a dead letter arriving meanwhile stays.
		if err := d.dlq.Purge(ctx, js.WithPurgeSequence(info.State.LastSeq+1)); err != nil {
			return 0, fmt.Errorf("jetstream: purging %s: %w", d.cfg.DLQStream, err)
		}
		return int(min(info.State.Msgs, 1<<31-1)), nil
	}
	match := d.matcher(ids)
	n := 0
	err := d.each(ctx, func(raw *js.RawStreamMsg) (bool, error) {
		if !match(raw) {
			return true, nil
		}
		if err := d.dlq.DeleteMsg(ctx, raw.Sequence); err != nil {
			if errors.Is(err, js.ErrMsgNotFound) {
				return true, nil
			}
			return false, fmt.Errorf("jetstream: removing dead letter %d: %w", raw.Sequence, err)
		}
		n++
		return true, nil
	})
	return n, err
}

// Close closes the connection when NewDeadLetters dialled it; every operation then
// returns redeliver.ErrClosed. A second Close returns nil.
func (d *DeadLetters) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	if d.own {
		d.nc.Close()
	}
	return nil
}

// nextMsg returns the first message of the stream on subject with a sequence in
// [seq, last], or js.ErrMsgNotFound. It reads by sequence: no consumer is created.
func nextMsg(ctx context.Context, s js.Stream, seq, last uint64, subject string) (*js.RawStreamMsg, error) {
	for seq <= last {
		raw, err := s.GetMsg(ctx, seq, js.WithGetMsgSubject(subject))
		if err == nil {
			if raw.Sequence > last {
				return nil, js.ErrMsgNotFound
			}
			return raw, nil
		}
		if !errors.Is(err, js.ErrMsgNotFound) {
			return nil, err
		}
		// nats-server 2.9 can miss the next message after deletes at both ends of the
		// stream: trust "none" only when the stream's state agrees.
		info, err := s.Info(ctx)
		if err != nil {
			return nil, err
		}
		if info.State.Msgs == 0 || info.State.FirstSeq > last || info.State.LastSeq < seq {
			return nil, js.ErrMsgNotFound
		}
		seq = max(seq, info.State.FirstSeq)
		raw, err = s.GetMsg(ctx, seq)
		switch {
		case err == nil && raw.Subject == subject:
			return raw, nil
		case err != nil && !errors.Is(err, js.ErrMsgNotFound):
			return nil, err
		}
		seq++
	}
	return nil, js.ErrMsgNotFound
}
