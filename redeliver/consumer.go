package redeliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Consumer. Source and Handler are required; the zero value of every
// other field means the default documented on it.
type Config struct {
	// Source is the backend's queue (rabbitmq.Source, jetstream.Source …). Required. The
	// Consumer closes it when Run returns.
	Source Source
	// Handler processes each message. Required.
	Handler Handler
	// Inbox makes the Consumer effectively once: each message runs its Handler inside
	// Inbox.Once, in a database transaction that first records the message id and
	// commits together with the handler's writes (the handler finds the transaction in
	// its context: pgbox.Tx, sqlitebox.Tx). A message whose id is already recorded is
	// acknowledged without running the Handler, logged and counted as a duplicate
	// (retrysafe_redeliver_duplicates_total). Set it: redeliver/pgbox and
	// redeliver/sqlitebox provide one.
	//
	// Default nil: at-least-once. A broker redelivers what it did not see acknowledged,
	// and in a failover that is always some completed work: the acks in flight, the
	// messages pulled ahead, on a RabbitMQ classic queue killed hard every ack since the
	// start. Without an inbox each of those runs the Handler again, so its side effects
	// must be idempotent some other way.
	Inbox Inbox
	// Policy governs retries and dead-lettering. Default: the zero Policy's defaults.
	Policy Policy
	// Concurrency is the most handlers running at once. Default 10.
	Concurrency int
	// ShutdownGrace is how long Run, once its context ends, lets running handlers
	// finish. When it is over, their contexts are canceled, and a message whose handler
	// then fails is released back to the broker (Delivery.Release) without counting an
	// attempt. Default 30s; negative cancels them at once.
	ShutdownGrace time.Duration
	// Heartbeat is how often Delivery.InProgress is called while a handler runs.
	// Default: the Source's Heartbeater interval, or never when it has none; negative:
	// never.
	Heartbeat time.Duration
	// SettleTimeout bounds each Ack, Retry, DeadLetter or Release. Default 30s. A
	// settlement runs after its handler has given back its concurrency slot, so one
	// sent to a broker node that died (whose answer never comes) delays no other
	// message: it only holds one of MaxSettling.
	SettleTimeout time.Duration
	// MaxSettling is the most messages received and not yet settled: handled or being
	// handled, and waiting for their settlement's answer. When that many are, Run
	// receives no more until one is settled (or its settlement fails), which bounds the
	// work a broker that stopped answering can leave pending. Default 4 × Concurrency;
	// at least Concurrency.
	MaxSettling int
	// Logger receives the consumer's logs. Default slog.Default().
	Logger *slog.Logger
	// Registerer, when set, receives the Prometheus collectors (retrysafe_redeliver_*).
	// Several Consumers may share one: the collectors are registered once and labelled
	// by queue. Default nil: no metrics.
	Registerer prometheus.Registerer
	// Clock is the time source of received and failure times and of handler durations.
	// Nil means time.Now.
	Clock func() time.Time
}

// An Inbox records the ids of the messages whose handlers committed, in the same
// transaction as the handlers' writes, so that a redelivered duplicate is recognised
// and not run again (Config.Inbox). redeliver/pgbox (PostgreSQL) and
// redeliver/sqlitebox (SQLite) implement it.
type Inbox interface {
	// Once runs h in a transaction that first records m.ID, scoped by m.Queue, and
	// commits both together; h finds the transaction in its context. When the id is
	// already recorded it returns ran == false and a nil error without calling h. When
	// h fails nothing is recorded and h's error is returned as it is, so a retry runs
	// h again. A message without an id fails with a permanent error.
	Once(ctx context.Context, m *Message, h Handler) (ran bool, err error)
	// Seen reports whether the message id of queue is recorded.
	Seen(ctx context.Context, queue, id string) (bool, error)
}

// Defaults of Config.
const (
	DefaultConcurrency   = 10
	DefaultShutdownGrace = 30 * time.Second
	DefaultSettleTimeout = 30 * time.Second
)

// Consumer runs a Handler over a Source, retrying failed messages and dead-lettering
// those that fail for good. Make one with New.
type Consumer struct {
	cfg    Config
	policy Policy
	log    *slog.Logger
	m      *metrics
	beat   time.Duration
	// header: the Source counts attempts in the header (HeaderCounter).
	header bool
	// keeper: the Source records failed attempts itself (AttemptKeeper).
	keeper bool
	// failed remembers the failed attempts whose Retry or DeadLetter did not reach
	// the broker, and for a while those whose Retry did (its ack may not have), by
	// queue and message id, so that the redelivery still counts them.
	failedMu sync.Mutex
	failed   map[failedKey]failedAttempt
	seq      uint64
	mu       sync.Mutex
	running  bool
}

// New checks cfg and returns a Consumer.
func New(cfg Config) (*Consumer, error) {
	if cfg.Source == nil {
		return nil, errors.New("redeliver: Config.Source is required")
	}
	if cfg.Handler == nil {
		return nil, errors.New("redeliver: Config.Handler is required")
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	if cfg.MaxSettling <= 0 {
		cfg.MaxSettling = 4 * cfg.Concurrency
	}
	cfg.MaxSettling = max(cfg.MaxSettling, cfg.Concurrency)
	if cfg.SettleTimeout <= 0 {
		cfg.SettleTimeout = DefaultSettleTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	beat := cfg.Heartbeat
	if beat == 0 {
		if h, ok := cfg.Source.(Heartbeater); ok {
			beat = h.Heartbeat()
		}
	}
	c := &Consumer{cfg: cfg, policy: cfg.Policy.WithDefaults(), log: cfg.Logger, beat: beat}
	if h, ok := cfg.Source.(HeaderCounter); ok {
		c.header = h.CountsInHeader()
	}
	if k, ok := cfg.Source.(AttemptKeeper); ok {
		c.keeper = k.KeepsAttempts()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	c.m = m
	return c, nil
}

// Run receives and handles messages until ctx ends, then shuts down gracefully: it stops
// receiving, lets running handlers finish for up to Config.ShutdownGrace, releases what
// is left, closes the Source and returns nil. It returns an error when the Source fails
// for good. Run may be called once.
func (c *Consumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return errors.New("redeliver: Run called twice")
	}
	c.running = true
	c.mu.Unlock()
	if c.cfg.Inbox == nil {
		c.log.Info("redeliver: no inbox configured: a message the broker redelivers after its handler completed runs again (at-least-once); set Config.Inbox for effectively-once handling")
	}

	// Handlers run under work, which outlives ctx by the shutdown grace.
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()

	// A message takes a slot of sem while its handler runs, and a slot of unsettled
	// from its receipt until its settlement is over: a settlement waiting for a broker
	// that stopped answering holds no handler slot.
	sem := make(chan struct{}, c.cfg.Concurrency)
	unsettled := make(chan struct{}, c.cfg.MaxSettling)
	var wg sync.WaitGroup
	var runErr error
	for {
		select {
		case unsettled <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			<-unsettled
			break
		}
		d, err := c.cfg.Source.Receive(ctx)
		if err != nil {
			<-sem
			<-unsettled
			if ctx.Err() == nil {
				runErr = fmt.Errorf("redeliver: receive: %w", err)
			}
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-unsettled }()
			settle := c.handle(work, d)
			<-sem
			settle()
		}()
	}

	// Shutdown: wait for the handlers, up to the grace.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if c.cfg.ShutdownGrace > 0 {
		t := time.NewTimer(c.cfg.ShutdownGrace)
		select {
		case <-done:
		case <-t.C:
			c.log.Warn("redeliver: shutdown grace over, canceling handlers",
				slog.Duration("grace", c.cfg.ShutdownGrace))
		}
		t.Stop()
	}
	stopWork()
	<-done

	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.SettleTimeout)
	defer cancel()
	if err := c.cfg.Source.Close(closeCtx); err != nil && runErr == nil && !errors.Is(err, ErrClosed) {
		runErr = fmt.Errorf("redeliver: closing source: %w", err)
	}
	return runErr
}

// maxRemembered bounds Consumer.failed: past it, the oldest half is forgotten.
const maxRemembered = 10000

type failedKey struct{ queue, id string }

type failedAttempt struct {
	attempt int
	first   time.Time
	seq     uint64    // order of remembering, to forget the oldest first
	until   time.Time // when set, forgotten after it
}

// retriedGrace is how long after its retry's delay a Consumer keeps counting an
// attempt whose Retry succeeded: a successful Retry means the copy is stored, not that
// the broker got the original's ack (an ack has no answer: RabbitMQ redelivers the
// original, header unchanged, when its node stopped before reading the ack). The copy
// coming back ends it sooner; the bound keeps a much later delivery of the same id (a
// replay from the dead-letter queue) from counting it.
const retriedGrace = 5 * time.Minute

// remember records that attempt of m failed, first failing at first, and that the
// broker did not learn it (its Retry or DeadLetter failed).
func (c *Consumer) remember(m *Message, attempt int, first time.Time) {
	if m.ID == "" {
		return
	}
	c.failedMu.Lock()
	defer c.failedMu.Unlock()
	if c.failed == nil {
		c.failed = map[failedKey]failedAttempt{}
	}
	if len(c.failed) >= maxRemembered {
		var seqs []uint64
		for _, f := range c.failed {
			seqs = append(seqs, f.seq)
		}
		slices.Sort(seqs)
		cut := seqs[len(seqs)/2]
		for k, f := range c.failed {
			if f.seq < cut {
				delete(c.failed, k)
			}
		}
	}
	c.seq++
	c.failed[failedKey{m.Queue, m.ID}] = failedAttempt{attempt: attempt, first: first, seq: c.seq}
}

// recall returns what remember recorded for m, and forgets it.
func (c *Consumer) recall(m *Message) (failedAttempt, bool) {
	if m.ID == "" {
		return failedAttempt{}, false
	}
	c.failedMu.Lock()
	defer c.failedMu.Unlock()
	k := failedKey{m.Queue, m.ID}
	f, ok := c.failed[k]
	delete(c.failed, k)
	if ok && !f.until.IsZero() && c.cfg.Clock().After(f.until) {
		return failedAttempt{}, false
	}
	return f, ok
}

// retried marks the remembered attempt of m as settled by a Retry: kept until the
// message comes back, or until the retry's delay and retriedGrace have passed.
func (c *Consumer) retried(m *Message, delay time.Duration) {
	if m.ID == "" {
		return
	}
	c.failedMu.Lock()
	defer c.failedMu.Unlock()
	k := failedKey{m.Queue, m.ID}
	if f, ok := c.failed[k]; ok {
		f.until = c.cfg.Clock().Add(delay + retriedGrace)
		c.failed[k] = f
	}
}

// handle runs the handler on one delivery and returns its settlement, which the caller
// runs once it has given back the handler's concurrency slot.
func (c *Consumer) handle(work context.Context, d Delivery) (settle func()) {
	m := d.Message()
	if m.Header == nil {
		m.Header = map[string]string{}
	}
	if m.Received.IsZero() {
		m.Received = c.cfg.Clock()
	}
	switch {
	case c.header:
		// Only a handler's reported failure advances the header; a redelivery after
		// a restart or a lost connection does not spend an attempt.
		m.Attempt = AttemptOf(m.Header, c.policy.Header, 0)
	case c.keeper:
		// Likewise only a reported failure advances the Source's record.
		m.Attempt = max(AttemptOf(m.Header, c.policy.Header, 0), m.FailedAttempts+1)
	default:
		m.Attempt = AttemptOf(m.Header, c.policy.Header, m.DeliveryCount)
	}
	if m.FirstFailure.IsZero() {
		m.FirstFailure = parseTime(m.Header[HeaderFirstFailure])
	}
	if f, ok := c.recall(m); ok {
		// This process saw an attempt fail whose Retry or DeadLetter the broker never
		// got (it went away): that attempt counts, and its failure time is the first
		// failure when the message carries none.
		m.Attempt = max(m.Attempt, f.attempt+1)
		if m.FirstFailure.IsZero() {
			m.FirstFailure = f.first
		}
	}
	q := m.Queue
	c.m.received(q)

	if (c.header || c.keeper) && m.DeliveryCount > c.policy.MaxDeliveries {
		// Delivered this often with no outcome: its handler crashes the process or
		// never returns (restarts alone do not come near the bound) — unless a run of it
		// committed, which the inbox knows.
		if c.seen(work, m) {
			return func() { c.duplicate(work, d, m) }
		}
		now := c.cfg.Clock()
		info := c.deadInfo(m, ReasonMaxDeliver, ClassUnknown,
			"delivered "+strconv.Itoa(m.DeliveryCount)+" times (the broker's count) without any handler settling it, more than max deliveries "+
				strconv.Itoa(c.policy.MaxDeliveries)+": a handler that crashed the process or never returned?", m.Attempt-1, now)
		c.logMsg(slog.LevelWarn, "redeliver: dead-lettering a message delivered more often than max deliveries", m,
			slog.Int("delivery_count", m.DeliveryCount), slog.Int("max_deliveries", c.policy.MaxDeliveries))
		return func() { c.deadLetter(work, d, m, info) }
	}
	if m.Attempt > c.policy.MaxAttempts {
		// The handler already had its attempts: the count header or the Source's
		// record says so (a consumer with a higher MaxAttempts retried it), or, on a
		// Source that counts attempts in its deliveries, the broker delivered it more
		// often than the policy allows (crashes before a settlement).
		// One of them may have committed, which the inbox knows: then this is a
		// duplicate, not a failure.
		if c.seen(work, m) {
			return func() { c.duplicate(work, d, m) }
		}
		now := c.cfg.Clock()
		info := c.deadInfo(m, ReasonMaxAttempts, ClassTransient,
			"delivered "+strconv.Itoa(m.Attempt)+" times, more than max attempts", m.Attempt-1, now)
		c.logMsg(slog.LevelWarn, "redeliver: dead-lettering a message delivered more often than max attempts", m,
			slog.Int("delivery_count", m.DeliveryCount))
		return func() { c.deadLetter(work, d, m, info) }
	}

	err, class, canceled, dup := c.call(work, d, m)
	if dup {
		return func() { c.duplicate(work, d, m) }
	}
	if err == nil {
		return func() {
			c.settle(work, "ack", m, d.Ack)
			c.m.succeeded(q)
		}
	}
	if canceled {
		// Shutdown ended the handler: not the message's fault.
		c.logMsg(slog.LevelInfo, "redeliver: releasing message at shutdown", m, slog.Any("error", err))
		return func() {
			c.settle(work, "release", m, d.Release)
			c.m.released(q)
		}
	}
	now := c.cfg.Clock()
	if !class.Retryable() || m.Attempt >= c.policy.MaxAttempts {
		reason := ReasonMaxAttempts
		switch class {
		case ClassPermanent:
			reason = ReasonPermanent
		case ClassDecode:
			reason = ReasonDecode
		}
		info := c.deadInfo(m, reason, class, err.Error(), m.Attempt, now)
		c.logMsg(slog.LevelWarn, "redeliver: dead-lettering message", m, slog.String("reason", string(reason)),
			slog.String("error_class", string(class)), slog.Any("error", err))
		// Remembered before the settlement and forgotten once it is acknowledged, so
		// that a redelivery of a settlement the broker never got finds it, however soon.
		c.remember(m, m.Attempt, info.FirstFailure)
		return func() {
			if c.deadLetter(work, d, m, info) {
				c.recall(m)
			}
		}
	}
	delay := c.policy.Delay(m.Attempt, err)
	first := m.FirstFailure
	if first.IsZero() {
		first = now
	}
	r := RetryInfo{
		Delay:        delay,
		Attempt:      m.Attempt,
		FirstFailure: first,
		CountHeader:  c.policy.Header,
		Header: map[string]string{
			c.policy.Header:    strconv.Itoa(m.Attempt),
			HeaderFirstFailure: formatTime(first),
		},
		Err:   err,
		Class: class,
	}
	c.logMsg(slog.LevelInfo, "redeliver: retrying message", m, slog.Duration("delay", delay),
		slog.String("error_class", string(class)), slog.Any("error", err))
	c.remember(m, m.Attempt, first) // kept after the Retry, in case its ack is lost (retriedGrace)
	return func() {
		if c.settle(work, "retry", m, func(ctx context.Context) error { return d.Retry(ctx, r) }) {
			c.retried(m, delay)
			c.m.retried(q, class)
		}
	}
}

// seen reports whether the inbox has m's id recorded; false without an inbox, an id,
// or an answer.
func (c *Consumer) seen(work context.Context, m *Message) bool {
	if c.cfg.Inbox == nil || m.ID == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(work), c.cfg.SettleTimeout)
	defer cancel()
	ok, err := c.cfg.Inbox.Seen(ctx, m.Queue, m.ID)
	if err != nil {
		c.logMsg(slog.LevelWarn, "redeliver: reading the inbox failed", m, slog.Any("error", err))
		return false
	}
	return ok
}

// duplicate acknowledges a message the inbox has already recorded, without running the
// handler.
func (c *Consumer) duplicate(work context.Context, d Delivery, m *Message) {
	c.logMsg(slog.LevelInfo, "redeliver: duplicate of a processed message, acknowledged without running the handler", m,
		slog.Int("delivery_count", m.DeliveryCount))
	if c.settle(work, "ack", m, d.Ack) {
		c.m.duplicated(m.Queue)
	}
}

// call runs the handler (through the inbox, when there is one) under the per-message
// timeout and the heartbeat. canceled reports that the shutdown (not the timeout) ended
// it; dup that the inbox found the message already processed and did not run it.
func (c *Consumer) call(work context.Context, d Delivery, m *Message) (err error, class Class, canceled, dup bool) {
	ctx, cancel := work, context.CancelFunc(func() {})
	if c.policy.Timeout > 0 {
		ctx, cancel = context.WithTimeoutCause(work, c.policy.Timeout, errHandlerTimeout)
	}
	defer cancel()
	if c.beat > 0 {
		stop := c.heartbeat(ctx, d, m)
		defer stop()
	}
	start := c.cfg.Clock()
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("redeliver: handler panicked: %v", p)
				class = ClassPanic
				c.logMsg(slog.LevelError, "redeliver: handler panicked", m,
					slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			}
		}()
		if c.cfg.Inbox == nil {
			err = c.cfg.Handler(ctx, m)
			return
		}
		var ran bool
		ran, err = c.cfg.Inbox.Once(ctx, m, c.cfg.Handler)
		dup = err == nil && !ran
	}()
	c.m.observe(m.Queue, c.cfg.Clock().Sub(start))
	if err == nil {
		return nil, "", false, dup
	}
	if class == "" {
		switch {
		case work.Err() != nil:
			return err, "", true, false
		case errors.Is(context.Cause(ctx), errHandlerTimeout):
			class = ClassTimeout
		default:
			class = c.policy.Classify(err)
			if class == "" {
				class = ClassTransient
			}
		}
	}
	return err, class, false, false
}

var errHandlerTimeout = errors.New("redeliver: handler timeout")

// heartbeat calls d.InProgress every c.beat until stop is called. stop cancels a call
// under way rather than waiting for it: the handler's slot is not held by a signal to a
// broker that stopped answering.
func (c *Consumer) heartbeat(ctx context.Context, d Delivery, m *Message) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(c.beat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if err := d.InProgress(ctx); err != nil && ctx.Err() == nil {
					c.logMsg(slog.LevelWarn, "redeliver: in-progress signal failed", m, slog.Any("error", err))
				}
			}
		}
	}()
	return func() { close(done); cancel(); wg.Wait() }
}

func (c *Consumer) deadInfo(m *Message, reason Reason, class Class, errText string, attempts int, now time.Time) DeadInfo {
	first := m.FirstFailure
	if first.IsZero() {
		first = now
		if (m.Attempt > 1 || reason == ReasonMaxDeliver) && !m.Published.IsZero() {
			// Earlier attempts recorded no failure (they died with their process): the
			// publish is the latest time known to precede them.
			first = m.Published
		}
	}
	return DeadInfo{
		Reason: reason, Class: class, Err: errText, Attempts: attempts,
		FirstFailure: first, LastFailure: now, Queue: m.Queue, CountHeader: c.policy.Header,
	}
}

// deadLetter dead-letters m and reports success.
func (c *Consumer) deadLetter(work context.Context, d Delivery, m *Message, info DeadInfo) bool {
	if c.settle(work, "dead_letter", m, func(ctx context.Context) error { return d.DeadLetter(ctx, info) }) {
		c.m.deadLettered(m.Queue, info.Class)
		return true
	}
	return false
}

// settle runs one settlement under SettleTimeout, detached from the shutdown, and logs
// and counts a failure. It reports success.
func (c *Consumer) settle(work context.Context, op string, m *Message, f func(context.Context) error) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(work), c.cfg.SettleTimeout)
	defer cancel()
	if err := f(ctx); err != nil {
		c.logMsg(slog.LevelWarn, "redeliver: settling message failed; the broker will redeliver it", m,
			slog.String("op", op), slog.Any("error", err))
		c.m.settleFailed(m.Queue, op)
		return false
	}
	return true
}

// logMsg logs about message m: its queue, id and attempt, then attrs.
func (c *Consumer) logMsg(level slog.Level, msg string, m *Message, attrs ...slog.Attr) {
	ctx := context.Background()
	if !c.log.Enabled(ctx, level) {
		return
	}
	all := append([]slog.Attr{slog.String("queue", m.Queue), slog.String("message_id", m.ID),
		slog.Int("attempt", m.Attempt)}, attrs...)
	c.log.LogAttrs(ctx, level, msg, all...)
}
