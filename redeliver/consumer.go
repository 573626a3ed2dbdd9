package redeliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
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

// Defaults of Config.
const (
	DefaultConcurrency   = 10
	DefaultShutdownGrace = 30 * time.Second
	DefaultSettleTimeout = 30 * time.Second
)

// Consumer runs a Handler over a Source, retrying failed messages and dead-lettering
// those that fail for good. Make one with New.
type Consumer struct {
	cfg     Config
	policy  Policy
	log     *slog.Logger
	m       *metrics
	beat    time.Duration
	mu      sync.Mutex
	running bool
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
	m.Attempt = AttemptOf(m.Header, c.policy.Header, m.DeliveryCount)
	if m.FirstFailure.IsZero() {
		m.FirstFailure = parseTime(m.Header[HeaderFirstFailure])
	}
	q := m.Queue
	c.m.received(q)

	if m.Attempt > c.policy.MaxAttempts {
		// The broker delivered it more often than the policy allows (crashes before a
		// republish): the handler already had its attempts.
		now := c.cfg.Clock()
		info := c.deadInfo(m, ReasonMaxAttempts, ClassTransient,
			"delivered "+strconv.Itoa(m.Attempt)+" times, more than max attempts", m.Attempt-1, now)
		c.logMsg(slog.LevelWarn, "redeliver: dead-lettering a message delivered more often than max attempts", m,
			slog.Int("delivery_count", m.DeliveryCount))
		return func() { c.deadLetter(work, d, m, info) }
	}

	err, class, canceled := c.call(work, d, m)
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
		return func() { c.deadLetter(work, d, m, info) }
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
	return func() {
		if c.settle(work, "retry", m, func(ctx context.Context) error { return d.Retry(ctx, r) }) {
			c.m.retried(q, class)
		}
	}
}

// call runs the handler under the per-message timeout and the heartbeat. canceled
// reports that the shutdown (not the timeout) ended it.
func (c *Consumer) call(work context.Context, d Delivery, m *Message) (err error, class Class, canceled bool) {
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
		err = c.cfg.Handler(ctx, m)
	}()
	c.m.observe(m.Queue, c.cfg.Clock().Sub(start))
	if err == nil {
		return nil, "", false
	}
	if class == "" {
		switch {
		case work.Err() != nil:
			return err, "", true
		case errors.Is(context.Cause(ctx), errHandlerTimeout):
			class = ClassTimeout
		default:
			class = c.policy.Classify(err)
			if class == "" {
				class = ClassTransient
			}
		}
	}
	return err, class, false
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
		if m.Attempt > 1 && !m.Published.IsZero() {
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

func (c *Consumer) deadLetter(work context.Context, d Delivery, m *Message, info DeadInfo) {
	if c.settle(work, "dead_letter", m, func(ctx context.Context) error { return d.DeadLetter(ctx, info) }) {
		c.m.deadLettered(m.Queue, info.Class)
	}
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
