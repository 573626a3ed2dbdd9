package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/retrysafe/retrysafe/redeliver"
)

// Source is a redeliver.Source on a JetStream durable pull consumer. Make one with
// NewSource; it is safe for concurrent use, and its deliveries may be settled from any
// goroutine.
type Source struct {
	cfg    Config
	nc     *nats.Conn
	own    bool
	js     js.JetStream
	stream js.Stream
	log    *slog.Logger

	mu      sync.Mutex // guards cons, kv and cur
	cons    js.Consumer
	kv      js.KeyValue     // the failure bucket
	cur     js.MessageBatch // the current pull
	closing chan struct{}   // closed by Close

	closed  atomic.Bool
	stop    context.CancelFunc // ends the orphan loop
	wg      sync.WaitGroup
	advSub  *nats.Subscription
	orphanC chan orphan
	rescued atomic.Int64

	// lastFirst is the highest stream sequence of a first delivery received; recheck is
	// the highest one received before the consumer's state went back (see regressed).
	// Both are touched only by Receive, which runs once at a time.
	lastFirst atomic.Uint64
	recheck   atomic.Uint64
	// recorded holds the stream sequences the failure bucket had a record for when the
	// Source started (see loadRecorded); set before NewSource returns, read-only after.
	recorded map[uint64]struct{}
}

var (
	_ redeliver.Source        = (*Source)(nil)
	_ redeliver.Heartbeater   = (*Source)(nil)
	_ redeliver.AttemptKeeper = (*Source)(nil)
)

// KeepsAttempts reports true: a message's failed attempts are counted in the failure
// bucket, written by Delivery.Retry, and returned as Message.FailedAttempts, because
// NumDelivered counts deliveries no handler saw (pulled ahead, then handed back by a
// failover or a restart) and goes back to 1 when a server loses the consumer's state.
func (s *Source) KeepsAttempts() bool { return true }

// NewSource connects (Config.URL, or Config.Conn), declares the work stream, the DLQ
// stream and the durable consumer (Declare), starts following the consumer's MaxDeliver
// advisories and sweeps once for orphans. Close it, or let the redeliver.Consumer that
// runs it close it.
func NewSource(ctx context.Context, cfg Config) (*Source, error) {
	ss, err := cfg.open(ctx)
	if err != nil {
		return nil, err
	}
	ss.chooseReplicas()
	c, nc, own, j := ss.cfg, ss.nc, ss.own, ss.js
	fail := func(err error) (*Source, error) {
		ss.close()
		return nil, err
	}
	cons, kv, err := c.declare(ctx, j)
	if err != nil {
		return fail(err)
	}
	var stream js.Stream
	err = c.callAPI(ctx, "reading stream "+c.Stream, func(ctx context.Context) error {
		var err error
		stream, err = j.Stream(ctx, c.Stream)
		return err
	})
	if err != nil {
		return fail(fmt.Errorf("jetstream: stream %s: %w", c.Stream, err))
	}
	s := &Source{
		cfg: c, nc: nc, own: own, js: j, stream: stream, cons: cons, kv: kv,
		log:     c.Logger.With(slog.String("queue", c.Queue), slog.String("stream", c.Stream)),
		orphanC: make(chan orphan, 256),
		closing: make(chan struct{}),
	}
	s.loadRecorded(ctx)
	// The server announces each message that reached MaxDeliver.
	subj := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + c.Stream + "." + c.Consumer
	s.advSub, err = nc.Subscribe(subj, s.onAdvisory)
	if err != nil {
		return fail(fmt.Errorf("jetstream: subscribing to %s: %w", subj, err))
	}
	fctx, cancel := withTimeout(ctx)
	err = nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		_ = s.advSub.Unsubscribe()
		return fail(fmt.Errorf("jetstream: %w", err))
	}
	loop, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stop = stop
	s.wg.Add(1)
	go s.orphans(loop)
	return s, nil
}

// withTimeout gives ctx a deadline of 10s when it has none (nats.go's flush requires one,
// and a request without one could wait forever for a reply that was lost).
func withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, 10*time.Second)
}

// Heartbeat is how often the redeliver.Consumer calls InProgress while a handler runs: a
// third of AckWait.
func (s *Source) Heartbeat() time.Duration { return s.cfg.AckWait / 3 }

// Conn returns the connection the Source uses.
func (s *Source) Conn() *nats.Conn { return s.nc }

// Rescued returns how many orphans (messages that reached MaxDeliver) this Source moved
// to the DLQ.
func (s *Source) Rescued() int64 { return s.rescued.Load() }

var errDisconnected = errors.New("not connected to the server")

// pullWait is how long one pull request waits at the server for messages: the longest
// an idle Source takes to notice a lost request, and to close.
const pullWait = time.Second

// Receive returns the next message of the durable consumer. It waits through broker
// restarts (the connection reconnects by itself) and re-declares the topology when the
// consumer disappears; it returns an error only when ctx ends, after Close
// (redeliver.ErrClosed), or when the connection is closed for good.
//
// Messages are pulled in batches of up to Prefetch (one pull request each, waiting at
// most a second at the server); a pulled message waits in the Source, its AckWait
// running, until Receive returns it.
func (s *Source) Receive(ctx context.Context) (redeliver.Delivery, error) {
	wait := 50 * time.Millisecond
	for {
		if s.closed.Load() {
			return nil, redeliver.ErrClosed
		}
		b, err := s.batch()
		if err == nil {
			select {
			case msg, ok := <-b.Messages():
				if ok {
					return s.newDelivery(ctx, msg), nil
				}
				s.mu.Lock()
				s.cur = nil
				s.mu.Unlock()
				if err = b.Error(); err == nil {
					wait = 50 * time.Millisecond
					continue // the batch is complete, or the pull expired: pull again
				}
			case <-ctx.Done():
				return nil, ctx.Err() // the batch stays for the next Receive
			case <-s.closing:
				return nil, redeliver.ErrClosed
			}
		}
		if s.closed.Load() {
			return nil, redeliver.ErrClosed
		}
		if s.nc.IsClosed() {
			return nil, fmt.Errorf("jetstream: receive: %w", nats.ErrConnectionClosed)
		}
		if errors.Is(err, js.ErrServerShutdown) || !s.nc.IsConnected() {
			// The server is going away, or gone: the connection reconnects by itself;
			// wait for it, then pull anew.
			s.log.Info("jetstream: waiting for the server", slog.Any("error", err))
			if errors.Is(err, js.ErrServerShutdown) {
				if err := s.sleep(ctx, time.Second); err != nil {
					return nil, err
				}
			}
			if err := s.awaitConnected(ctx); err != nil {
				return nil, err
			}
			continue
		}
		// The consumer was deleted, or the server lost it: declare the topology again
		// and pull anew.
		s.log.Warn("jetstream: pulling failed; declaring the consumer again", slog.Any("error", err))
		if err := s.sleep(ctx, wait); err != nil {
			return nil, err
		}
		wait = min(2*wait, 5*time.Second)
		if !s.nc.IsConnected() {
			continue
		}
		dctx, cancel := withTimeout(ctx)
		cons, kv, derr := s.cfg.declare(dctx, s.js)
		cancel()
		if derr == nil {
			s.mu.Lock()
			s.cons, s.kv = cons, kv
			s.mu.Unlock()
		} else {
			s.log.Warn("jetstream: declaring the topology failed", slog.Any("error", derr))
		}
	}
}

// sleep waits for d, or until ctx ends (its error) or the Source closes
// (redeliver.ErrClosed).
func (s *Source) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	return s.wait(ctx, t.C)
}

// wait waits for c, or until ctx ends (its error) or the Source closes
// (redeliver.ErrClosed).
func (s *Source) wait(ctx context.Context, c <-chan time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closing:
		return redeliver.ErrClosed
	case <-c:
		return nil
	}
}

// awaitConnected waits until the connection is up again, ctx ends (its error), or the
// Source closes (redeliver.ErrClosed).
func (s *Source) awaitConnected(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !s.nc.IsConnected() {
		if s.nc.IsClosed() {
			return fmt.Errorf("jetstream: receive: %w", nats.ErrConnectionClosed)
		}
		if err := s.wait(ctx, t.C); err != nil {
			return err
		}
	}
	return nil
}

// batch returns the current pull, starting one when there is none.
func (s *Source) batch() (js.MessageBatch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil {
		return s.cur, nil
	}
	if !s.nc.IsConnected() {
		// A pull request buffered while reconnecting would reach the server after its
		// inbox is gone, and the messages it pulled would wait out AckWait.
		return nil, fmt.Errorf("jetstream: pulling from %s: %w", s.cfg.Consumer, errDisconnected)
	}
	b, err := s.cons.Fetch(s.cfg.Prefetch, js.FetchMaxWait(pullWait))
	if err != nil {
		return nil, fmt.Errorf("jetstream: pulling from %s: %w", s.cfg.Consumer, err)
	}
	s.cur = b
	return b, nil
}

// Close stops pulling, hands the pulled messages Receive did not return back to the
// server (Nak, so they are redelivered at once; this waits for the last pull request to
// end, at most a second), stops following advisories and, when the Source dialled its
// own connection, flushes and closes it. Deliveries already returned by Receive must be
// settled before Close: the redeliver.Consumer does that. A second Close returns
// redeliver.ErrClosed.
func (s *Source) Close(ctx context.Context) error {
	if !s.closed.CompareAndSwap(false, true) {
		return redeliver.ErrClosed
	}
	close(s.closing)
	s.stop()
	s.wg.Wait()
	_ = s.advSub.Unsubscribe()

	s.mu.Lock()
	b := s.cur
	s.cur = nil
	s.mu.Unlock()
	var errs []error
	if b != nil {
	drain:
		for {
			select {
			case msg, ok := <-b.Messages():
				if !ok {
					break drain
				}
				if err := ackSync(ctx, s.nc, msg, ackNak); err != nil {
					errs = append(errs, err)
				}
			case <-ctx.Done():
				errs = append(errs, ctx.Err())
				break drain
			}
		}
	}
	if s.own {
		fctx, cancel := withTimeout(ctx)
		err := s.nc.FlushWithContext(fctx)
		cancel()
		if err != nil && !s.nc.IsClosed() {
			errs = append(errs, fmt.Errorf("jetstream: flush: %w", err))
		}
		s.nc.Close()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("jetstream: returning pulled messages: %w", err)
	}
	return nil
}

// The acknowledgement bodies JetStream understands.
var (
	ackAck      = []byte("+ACK")
	ackNak      = []byte("-NAK")
	ackProgress = []byte("+WPI")
	ackTerm     = []byte("+TERM")
)

// ackAttempt bounds one try of an acknowledgement, or of a failure record's write. A
// request whose answer does not come within it (the consumer or stream leader died with
// it, or the connection is being re-established) is sent again, so it reaches the
// leader the cluster elects next: the consumer answers every acknowledgement, applying
// one twice changes nothing, and a record written twice holds the same value.
const ackAttempt = 2 * time.Second

// ackRetryWait is the pause before sending again a request that found no leader to
// answer it (one is being elected).
const ackRetryWait = 100 * time.Millisecond

// ackSync sends an acknowledgement of msg and waits for the server to confirm it (what
// nats.go's DoubleAck does for +ACK), so a settle returns only once the server has the
// outcome. It tries again (see ackAttempt) until ctx ends; without a deadline, for 10s.
func ackSync(ctx context.Context, nc *nats.Conn, msg js.Msg, body []byte) error {
	reply := msg.Reply()
	if reply == "" {
		return fmt.Errorf("jetstream: %w", js.ErrMsgNoReply)
	}
	err := untilAnswered(ctx, func(ctx context.Context) error {
		_, err := nc.RequestWithContext(ctx, reply, body)
		return err
	})
	if err != nil {
		return fmt.Errorf("jetstream: %s: %w", body, err)
	}
	return nil
}

// untilAnswered runs try, each time bounded by ackAttempt, until it succeeds, fails
// otherwise than for a lost or missing answer, or ctx ends (without a deadline, after
// 10s); it returns try's last error.
func untilAnswered(ctx context.Context, try func(context.Context) error) error {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, ackAttempt)
		err := try(actx)
		acancel()
		if err == nil {
			return nil
		}
		noLeader := errors.Is(err, nats.ErrNoResponders) || errors.Is(err, js.ErrNoStreamResponse)
		again := noLeader || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
		if !again || ctx.Err() != nil {
			return err
		}
		if noLeader {
			t := time.NewTimer(ackRetryWait)
			select {
			case <-ctx.Done():
				t.Stop()
				return err
			case <-t.C:
			}
		}
	}
}

// delivery is one received message.
type delivery struct {
	s     *Source
	msg   js.Msg
	m     *redeliver.Message
	seq   uint64 // stream sequence
	found bool   // the failure bucket held a record of the message when it was received
}

// newDelivery converts a pulled message. A redelivered one (NumDelivered > 1), and any
// delivered while the consumer's state is behind what this Source saw (regressed), gets
// its FailedAttempts and FirstFailure from the failure bucket; a first delivery costs
// no lookup. A copy the sweep published again starts from the record it carries
// (HeaderFailed).
func (s *Source) newDelivery(ctx context.Context, msg js.Msg) *delivery {
	d := &delivery{s: s, msg: msg}
	h := msg.Headers()
	m := &redeliver.Message{
		Queue:       s.cfg.Queue,
		Body:        msg.Data(),
		ContentType: h.Get(HeaderContentType),
		Header:      appHeader(h),
		Received:    s.cfg.Clock(),
	}
	lookup := false
	if md, err := msg.Metadata(); err == nil {
		d.seq = md.Sequence.Stream
		m.DeliveryCount = int(min(md.NumDelivered, 1<<30))
		m.Published = md.Timestamp
		if lookup = md.NumDelivered > 1; !lookup {
			_, known := s.recorded[md.Sequence.Stream]
			lookup = s.regressed(md.Sequence.Stream) || known
		}
	} else {
		s.log.Warn("jetstream: message without metadata", slog.Any("error", err))
	}
	if p := publishedAt(h); !p.IsZero() {
		m.Published = p // a replayed copy: its first life's publish
	}
	m.ID = messageID(h, s.cfg.Stream, d.seq)
	if v := h.Get(HeaderFailed); v != "" {
		if f, ok := parseFailure(v); ok && f.attempts >= 0 {
			m.FailedAttempts, m.FirstFailure = f.attempts, f.first
		}
	}
	if d.seq > 0 && lookup {
		var f failure
		if f, d.found = s.failure(ctx, d.seq); d.found {
			if f.attempts < 0 {
				f.attempts = max(m.DeliveryCount-1, 1) // an older record: its deliveries were its attempts
			}
			m.FailedAttempts = max(m.FailedAttempts, f.attempts)
			m.FirstFailure = f.first
		}
	}
	d.m = m
	return d
}

// maxRecorded bounds the failure records a starting Source keeps the sequences of.
const maxRecorded = 100_000

// loadRecorded reads which messages the failure bucket holds a record for, so that a
// first delivery of one of them reads its record: a server that lost the consumer's
// state before this Source started (a crash of a one-replica stream's server while the
// consumer's process restarted too) delivers such a message as new, with nothing else
// to tell. The bucket holds a record only for a message between a failed attempt and
// its settlement, so the list is short. When it cannot be read, or holds more than
// maxRecorded, every first delivery of a message stored before the start reads the
// bucket instead (logged).
func (s *Source) loadRecorded(ctx context.Context) {
	fallback := func(why string, err error) {
		s.recorded = nil
		ictx, cancel := withTimeout(ctx)
		defer cancel()
		if si, ierr := s.stream.Info(ictx); ierr == nil {
			s.recheck.Store(si.State.LastSeq)
		}
		s.log.Warn("jetstream: "+why+"; the first delivery of each message stored before the start reads the failure bucket",
			slog.Any("error", err))
	}
	lctx, cancel := withTimeout(ctx)
	defer cancel()
	lister, err := s.bucket().ListKeys(lctx)
	if err != nil {
		fallback("listing the failure records failed", err)
		return
	}
	recorded := map[uint64]struct{}{}
	for k := range lister.Keys() {
		if seq, err := strconv.ParseUint(k, 10, 64); err == nil {
			recorded[seq] = struct{}{}
		}
		if len(recorded) > maxRecorded {
			cancel() // ends the lister's goroutine, which the drain lets reach its end
			for range lister.Keys() {
			}
			fallback("more than "+strconv.Itoa(maxRecorded)+" failure records", nil)
			return
		}
	}
	if err := lctx.Err(); err != nil {
		fallback("listing the failure records did not finish", err)
		return
	}
	s.recorded = recorded
}

// regressed reports whether a first delivery (NumDelivered 1) of the message at stream
// sequence seq must have its failure record read all the same. The consumer delivers
// new messages in stream order, so each first delivery a Source receives has a higher
// stream sequence than the one before; one at or below a sequence received before is a
// message delivered before that the server counts anew: it lost the consumer's recent
// state (a crash of a one-replica stream's server; the consumer deleted and declared
// again), and with it the delivery counts. Every first delivery up to the highest
// sequence received before may then be a message that failed. A Source started after
// the loss finds those messages in the failure bucket instead (loadRecorded).
func (s *Source) regressed(seq uint64) bool {
	last := s.lastFirst.Load()
	if seq > last {
		s.lastFirst.Store(seq)
		return seq <= s.recheck.Load()
	}
	if s.recheck.Load() < last {
		s.recheck.Store(last)
		s.log.Warn("jetstream: the consumer delivers as new a message it delivered before: the server lost its recent state, "+
			"and its delivery counts; failed attempts are read from the failure bucket for such deliveries",
			slog.Uint64("stream_seq", seq), slog.Uint64("last_seen", last))
	}
	return true
}

// bucket returns the failure bucket.
func (s *Source) bucket() js.KeyValue {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kv
}

// failure reads the failure record of the message at seq; found is false when there is
// none (or it cannot be read, which it logs). Each try is bounded (untilAnswered): a read
// sent to a node that died, while the bucket's stream elects a new leader, is sent again
// to the next, instead of reading as "no record" and delivering a failed message as a
// first attempt.
func (s *Source) failure(ctx context.Context, seq uint64) (f failure, found bool) {
	var e js.KeyValueEntry
	err := untilAnswered(ctx, func(ctx context.Context) error {
		var err error
		e, err = s.bucket().Get(ctx, failureKey(seq))
		return err
	})
	if err != nil {
		if !errors.Is(err, js.ErrKeyNotFound) && ctx.Err() == nil {
			s.log.Warn("jetstream: reading a failure record failed", slog.Uint64("stream_seq", seq), slog.Any("error", err))
		}
		return failure{}, false
	}
	return parseFailure(string(e.Value()))
}

// recordFailure records f as the failure record of the message at seq.
// Each try is bounded (untilAnswered): a write sent to a node that died is sent again
// to the next leader, instead of holding the settlement until its timeout.
func (s *Source) recordFailure(ctx context.Context, seq uint64, f failure) error {
	err := untilAnswered(ctx, func(ctx context.Context) error {
		_, err := s.bucket().PutString(ctx, failureKey(seq), f.String())
		return err
	})
	if err != nil {
		return fmt.Errorf("jetstream: recording a failed attempt of message %d in %s: %w", seq, s.cfg.FailureBucket, err)
	}
	return nil
}

// forgetFailure deletes the first failure record of the message at seq, once the
// message is settled for good. A failure is only logged: the record expires after
// FailureTTL, and no later delivery can read it (the message is gone from the stream).
func (s *Source) forgetFailure(ctx context.Context, seq uint64) {
	if err := s.bucket().Delete(ctx, failureKey(seq)); err != nil && !errors.Is(err, js.ErrKeyNotFound) {
		s.log.Warn("jetstream: deleting a first failure record failed; it expires after FailureTTL",
			slog.Uint64("stream_seq", seq), slog.Any("error", err))
	}
}

func (d *delivery) Message() *redeliver.Message { return d.m }

// Ack acknowledges the message (+ACK), then deletes its first failure record if it had
// one.
func (d *delivery) Ack(ctx context.Context) error {
	if err := ackSync(ctx, d.s.nc, d.msg, ackAck); err != nil {
		return err
	}
	if d.found {
		d.s.forgetFailure(ctx, d.seq)
	}
	return nil
}

// Retry asks the server to redeliver the message after r.Delay (NakWithDelay). The
// message comes back as it is: r.Header is not written. The failure bucket first
// records the failed attempts (r.Attempt) and r.FirstFailure, for the next deliveries'
// Message.FailedAttempts and FirstFailure; if it cannot, Retry fails and the server
// redelivers the message after AckWait (the Consumer remembers the attempt).
func (d *delivery) Retry(ctx context.Context, r redeliver.RetryInfo) error {
	if d.seq > 0 {
		first := r.FirstFailure
		if first.IsZero() {
			first = d.s.cfg.Clock()
		}
		if err := d.s.recordFailure(ctx, d.seq, failure{attempts: r.Attempt, first: first}); err != nil {
			return err
		}
	}
	body := ackNak
	if r.Delay > 0 {
		body = fmt.Appendf(nil, `%s {"delay": %d}`, ackNak, r.Delay.Nanoseconds())
	}
	return ackSync(ctx, d.s.nc, d.msg, body)
}

// DeadLetter publishes the message with info's headers to the DLQ stream, deduplicated
// by deadKey, waits for the server's PubAck, then terminates the delivery (+TERM), which
// removes it from the work stream, and deletes its first failure record.
func (d *delivery) DeadLetter(ctx context.Context, info redeliver.DeadInfo) error {
	if err := d.s.publishDead(ctx, d.m.ID, d.m.Published, d.msg.Headers(), d.msg.Data(), info, d.seq); err != nil {
		return err
	}
	if err := ackSync(ctx, d.s.nc, d.msg, ackTerm); err != nil {
		return err
	}
	if d.found {
		d.s.forgetFailure(ctx, d.seq)
	}
	return nil
}

// Release hands the message back for immediate redelivery (Nak). JetStream counts the
// delivery all the same: a released message has one attempt fewer left.
func (d *delivery) Release(ctx context.Context) error {
	return ackSync(ctx, d.s.nc, d.msg, ackNak)
}

// InProgress resets the server's AckWait timer of the message (+WPI).
func (d *delivery) InProgress(ctx context.Context) error {
	return ackSync(ctx, d.s.nc, d.msg, ackProgress)
}

// publishDead publishes a dead letter and waits for the PubAck. A duplicate (the same
// stored message dead-lettered before) counts as success.
func (s *Source) publishDead(ctx context.Context, id string, published time.Time, h nats.Header, body []byte, info redeliver.DeadInfo, seq uint64) error {
	out := deadMsg(s.cfg.DLQSubject, id, published, h, body, info)
	_, err := s.js.PublishMsg(ctx, out,
		js.WithMsgID(deadKey(id, s.cfg.Stream, seq)), js.WithExpectStream(s.cfg.DLQStream))
	if err != nil {
		return fmt.Errorf("jetstream: publishing dead letter %s to %s: %w", id, s.cfg.DLQSubject, err)
	}
	return nil
}

// orphan is a message that reached MaxDeliver.
type orphan struct {
	seq        uint64
	deliveries uint64
}

// onAdvisory receives the server's MaxDeliver advisories.
func (s *Source) onAdvisory(m *nats.Msg) {
	var a struct {
		Stream     string `json:"stream"`
		Consumer   string `json:"consumer"`
		StreamSeq  uint64 `json:"stream_seq"`
		Deliveries uint64 `json:"deliveries"`
	}
	if err := json.Unmarshal(m.Data, &a); err != nil || a.StreamSeq == 0 ||
		a.Stream != s.cfg.Stream || a.Consumer != s.cfg.Consumer {
		return
	}
	select {
	case s.orphanC <- orphan{seq: a.StreamSeq, deliveries: a.Deliveries}:
	default:
		// The loop is behind: the next sweep finds the message.
		s.log.Warn("jetstream: MaxDeliver advisory dropped; the next sweep handles it",
			slog.Uint64("stream_seq", a.StreamSeq))
	}
}

// orphans moves orphans to the DLQ: those the advisories name, and those a sweep finds
// at the start and every SweepInterval.
func (s *Source) orphans(ctx context.Context) {
	defer s.wg.Done()
	var tick <-chan time.Time
	if s.cfg.SweepInterval > 0 {
		t := time.NewTicker(s.cfg.SweepInterval)
		defer t.Stop()
		tick = t.C
	}
	sweep := func() {
		if n, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("jetstream: sweeping for orphans failed", slog.Any("error", err))
		} else if n > 0 {
			s.log.Warn("jetstream: sweep handled orphans (published again, or moved to the DLQ)", slog.Int("count", n))
		}
	}
	sweep()
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-s.orphanC:
			if _, err := s.rescue(ctx, o.seq, o.deliveries); err != nil && ctx.Err() == nil {
				s.log.Warn("jetstream: moving an orphan to the DLQ failed; the next sweep retries",
					slog.Uint64("stream_seq", o.seq), slog.Any("error", err))
			}
		case <-tick:
			sweep()
		}
	}
}

// Sweep hands back every orphan of the work stream the server no longer delivers: a
// message the consumer has delivered (its sequence is at most the consumer's last
// delivered one) that is neither removed nor pending. It does so only while nothing is
// pending, since an orphan cannot be told from a pending message otherwise; it returns
// how many it handled. The Source calls it at start and every SweepInterval.
//
// Such a message is not proof that a handler failed: after a crash of the stream's
// server, the stream can hold messages whose acknowledgement it had confirmed (their
// removal was lost) below a consumer state that counts them delivered. So a first
// orphan is published again under its id (HeaderID, a new sequence; HeaderSwept
// counts it) and removed, with a WARN naming it: its handler may run once more, a
// duplicate effect an inbox (Config.Inbox) absorbs, where dead-lettering completed work
// would never be right. A copy that becomes an orphan in turn (HeaderSwept set) was
// given up by the server twice without any Source settling it — a handler that crashes
// the process or never returns — and is moved to the DLQ (ReasonMaxDeliver), with
// attempts 0: how many handler runs it had is not known.
func (s *Source) Sweep(ctx context.Context) (int, error) {
	s.mu.Lock()
	cons := s.cons
	s.mu.Unlock()
	ci, err := cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("jetstream: consumer info: %w", err)
	}
	if ci.NumAckPending > 0 || ci.Delivered.Stream == 0 {
		return 0, nil
	}
	last := ci.Delivered.Stream
	si, err := s.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("jetstream: stream info: %w", err)
	}
	n := 0
	for seq := max(si.State.FirstSeq, 1); seq <= last; {
		raw, err := nextMsg(ctx, s.stream, seq, last, s.cfg.Queue)
		if errors.Is(err, js.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return n, fmt.Errorf("jetstream: reading messages from %d: %w", seq, err)
		}
		if raw.Header.Get(HeaderSwept) == "" {
			err = s.requeue(ctx, raw)
		} else {
			err = s.rescueMsg(ctx, raw, 0)
		}
		if err != nil {
			return n, err
		}
		n++
		seq = raw.Sequence + 1
	}
	return n, nil
}

// requeue publishes a copy of the orphan raw to the work queue (its id in HeaderID, its
// first publish in HeaderPublished, HeaderSwept incremented; deduplicated by sweepKey,
// so a second requeue of the same stored message after a crash stores one copy) and
// deletes the orphan and its failure record.
func (s *Source) requeue(ctx context.Context, raw *js.RawStreamMsg) error {
	id := messageID(raw.Header, s.cfg.Stream, raw.Sequence)
	published := publishedAt(raw.Header)
	if published.IsZero() {
		published = raw.Time
	}
	swept, _ := strconv.Atoi(raw.Header.Get(HeaderSwept))
	h := copyHeader(raw.Header, nil)
	h.Set(HeaderID, id)
	h.Set(HeaderPublished, published.UTC().Format(time.RFC3339Nano))
	h.Set(HeaderSwept, strconv.Itoa(swept+1))
	if f, ok := s.orphanFailure(ctx, raw); ok {
		h.Set(HeaderFailed, f.String()) // the copy's attempts go on from the orphan's
	}
	out := &nats.Msg{Subject: s.cfg.Queue, Header: h, Data: raw.Data}
	if _, err := s.js.PublishMsg(ctx, out, js.WithMsgID(sweepKey(id, s.cfg.Stream, raw.Sequence)),
		js.WithExpectStream(s.cfg.Stream)); err != nil {
		return fmt.Errorf("jetstream: publishing orphan %s again to %s: %w", id, s.cfg.Queue, err)
	}
	if err := s.stream.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, js.ErrMsgNotFound) {
		return fmt.Errorf("jetstream: deleting orphan %d from %s: %w", raw.Sequence, s.cfg.Stream, err)
	}
	s.forgetFailure(ctx, raw.Sequence)
	s.log.Warn("jetstream: an unsettled message the server no longer delivers was published again: "+
		"it may have completed (a crash of the stream's server loses removals), so its handler may run again",
		slog.String("message_id", id), slog.Uint64("stream_seq", raw.Sequence))
	return nil
}

// orphanFailure returns what is known of an orphan's failed attempts: its failure
// record, else the record its copy carries (HeaderFailed); ok is false when neither
// exists (attempts 0).
func (s *Source) orphanFailure(ctx context.Context, raw *js.RawStreamMsg) (failure, bool) {
	var carried failure
	if v := raw.Header.Get(HeaderFailed); v != "" {
		if f, ok := parseFailure(v); ok && f.attempts >= 0 {
			carried = f
		}
	}
	f, found := s.failure(ctx, raw.Sequence)
	switch {
	case found && f.attempts >= carried.attempts:
		return f, true
	case !carried.first.IsZero():
		return carried, true
	case found: // an older record without a count
		return failure{first: f.first}, true
	}
	return failure{}, false
}

// rescue moves the orphan at seq to the DLQ; it reports whether it found it.
func (s *Source) rescue(ctx context.Context, seq, deliveries uint64) (bool, error) {
	raw, err := s.stream.GetMsg(ctx, seq)
	if errors.Is(err, js.ErrMsgNotFound) {
		return false, nil // settled or rescued meanwhile
	}
	if err != nil {
		return false, fmt.Errorf("jetstream: reading message %d: %w", seq, err)
	}
	return true, s.rescueMsg(ctx, raw, deliveries)
}

func (s *Source) rescueMsg(ctx context.Context, raw *js.RawStreamMsg, deliveries uint64) error {
	id := messageID(raw.Header, s.cfg.Stream, raw.Sequence)
	now := s.cfg.Clock()
	published := publishedAt(raw.Header)
	if published.IsZero() {
		published = raw.Time
	}
	f, known := s.orphanFailure(ctx, raw)
	first := f.first
	if !known {
		first = published // a lower bound: no attempt recorded its failure
		if t, err := time.Parse(time.RFC3339Nano, raw.Header.Get(redeliver.HeaderFirstFailure)); err == nil {
			first = t
		}
	}
	attempts := max(f.attempts, 0)
	why := "the server stopped redelivering it after " + strconv.FormatUint(deliveries, 10) +
		" deliveries (MaxDeliver) without any consumer settling it, " + strconv.Itoa(attempts) +
		" of them failed attempts: a handler that crashed the process or never returned?"
	if deliveries == 0 {
		why = "the server stopped redelivering it, and a copy published again, without any consumer settling " +
			"either (" + strconv.Itoa(attempts) + " failed attempts recorded; runs that ended with their process are not): " +
			"a handler that crashes the process or never returns?"
	}
	info := redeliver.DeadInfo{
		Reason:       ReasonMaxDeliver,
		Class:        ClassUnknown,
		Err:          why,
		Attempts:     attempts,
		FirstFailure: first,
		LastFailure:  now,
		Queue:        s.cfg.Queue,
		CountHeader:  s.cfg.Policy.Header,
	}
	if err := s.publishDead(ctx, id, published, raw.Header, raw.Data, info, raw.Sequence); err != nil {
		return err
	}
	if err := s.stream.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, js.ErrMsgNotFound) {
		return fmt.Errorf("jetstream: deleting orphan %d from %s: %w", raw.Sequence, s.cfg.Stream, err)
	}
	s.forgetFailure(ctx, raw.Sequence)
	s.rescued.Add(1)
	s.log.Warn("jetstream: orphan moved to the DLQ", slog.String("message_id", id),
		slog.Uint64("stream_seq", raw.Sequence), slog.Uint64("deliveries", deliveries))
	return nil
}
