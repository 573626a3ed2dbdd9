package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

// Config configures a Source. Queue and URL (or URLs) are required; the zero value of
// every other field means the default documented on it.
type Config struct {
	// URL is the broker's AMQP URL, e.g. "amqp://guest:guest@127.0.0.1:5672/": the node
	// the Source connects to first. Required unless URLs is set.
	URL string
	// URLs are the AMQP URLs of the other nodes of the broker's cluster. The Source
	// tries URL first, then URLs in order; when its connection is lost it reconnects
	// to the nodes in turn, starting with the one after the node it lost and ending
	// with that node, waiting the Reconnect backoff after each round in which none
	// answered. So a consumer whose node died goes on with a surviving node, which
	// serves the quorum queues (their leader moves to a surviving member), instead of
	// waiting for its node to come back. Each must be a distinct AMQP URL (same vhost
	// and credentials as a rule); an empty one or a repeated node is refused. A node
	// that does not answer costs up to AMQP.Dial's connection timeout (30 s by
	// default) per try. Default none: URL alone.
	URLs []string
	// Queue is the work queue. Required. The Source also uses Queue+".dlq" and the delay
	// queues Queue+".delay.<ms>ms" (see Topology).
	Queue string
	// Prefetch is the most unacknowledged deliveries the broker sends ahead (basic.qos).
	// About twice the Consumer's Concurrency keeps every handler busy. Default 20.
	Prefetch int
	// Classic declares the queues of a new topology as classic queues. Default false:
	// quorum queues — replicated where the cluster has the nodes, with at-least-once
	// dead-lettering from the delay queues and a broker-side delivery count
	// (x-delivery-count) that Message.DeliveryCount reports. A work queue that already
	// exists keeps its type (RabbitMQ refuses to redeclare a queue with another one):
	// by default the Source then uses the existing type for the whole topology and logs
	// a warning when it is classic. NewSource logs at start what classic queues lose on
	// a node crash (see the package documentation, "Queue type").
	Classic bool
	// Quorum insists on quorum queues: NewSource fails, saying so, when the work queue
	// exists as a classic queue, instead of using it. Quorum and Classic together are
	// refused.
	Quorum bool
	// Delays are the delay buckets: the TTLs of the delay queues, one queue each, in
	// strictly ascending order, each a positive whole number of milliseconds (RabbitMQ's
	// TTLs are) of at most 2^31-1; NewSource refuses any other list. A retry's delay is
	// rounded to the nearest bucket on a logarithmic scale (Topology.Bucket), so the
	// buckets bound how precisely the policy's backoff is followed, and how many queues
	// the work queue has: len(Delays)+2. They name the queues, so every Source of the
	// work queue must use the same list. After a change the new delay queues are
	// declared; the old ones still return what they hold to the work queue and can be
	// deleted once empty. Default DefaultDelays().
	Delays []time.Duration
	// NoDeclare skips declaring the topology (when it is managed elsewhere, with the
	// same names and arguments). Default false: the Source declares it, idempotently, on
	// every (re)connect.
	NoDeclare bool
	// Reconnect is the backoff between connection attempts after the broker went away.
	// Only Base, Cap, Jitter and Rand are used; attempts never stop (until the context
	// ends). Default: full jitter from 100ms, capped at 5s.
	Reconnect retry.Policy
	// AMQP configures the connection (TLS, heartbeat, SASL …). Its Properties get a
	// "connection_name" of "retrysafe-redeliver <queue>" unless they have one. Default:
	// amqp091's defaults.
	AMQP amqp.Config
	// Logger receives connection events. Default slog.Default().
	Logger *slog.Logger
	// Clock is the time source of received and dead-lettering times. Nil means time.Now.
	Clock func() time.Time

	// hook, when set (by this package's tests only), is called at the named points: "retry-confirmed" after
	// a retry copy's confirm and before the original's ack, "dead-confirmed" likewise
	// for a dead letter, "ack" before an ack.
	hook func(point string, s *Source)
}

// ErrConfig is returned (wrapped) for a Config that cannot work: a missing URL or queue,
// a URL that does not parse or names a node twice, delay buckets NewSource refuses.
var ErrConfig = errors.New("rabbitmq: invalid config")

// Source is a redeliver.Source on a RabbitMQ work queue. Make one with NewSource.
type Source struct {
	cfg   Config
	nodes nodes
	topo  Topology
	log   *slog.Logger

	// node is the index in nodes of the node connected to (or tried) last; only
	// NewSource and reconnect, which Receive's caller runs one at a time, change it.
	node atomic.Int32

	mu     sync.Mutex
	cur    *session
	closed bool

	connects atomic.Int64
}

var (
	_ redeliver.Source        = (*Source)(nil)
	_ redeliver.HeaderCounter = (*Source)(nil)
)

// session is one connection with its consume and publish channels.
type session struct {
	conn       *amqp.Connection
	consume    *amqp.Channel
	pub        *confirmChannel
	deliveries <-chan amqp.Delivery
}

func (s *session) close() {
	if s.conn != nil {
		_ = s.conn.Close()
	}
}

// NewSource connects to cfg.URL (or, when it fails, to each of cfg.URLs in turn),
// declares the topology (unless cfg.NoDeclare) and starts consuming the work queue. It
// fails when no node accepts the first connection; later the Source reconnects by
// itself.
func NewSource(ctx context.Context, cfg Config) (*Source, error) {
	ns, err := newNodes("Config", cfg.URL, cfg.URLs)
	if err != nil {
		return nil, err
	}
	if cfg.Classic && cfg.Quorum {
		return nil, fmt.Errorf("%w: Config.Classic and Config.Quorum are exclusive", ErrConfig)
	}
	topo, err := cfg.Topology()
	if err != nil {
		return nil, err
	}
	if cfg.Prefetch <= 0 {
		cfg.Prefetch = 20
	}
	if cfg.Reconnect.Base <= 0 {
		cfg.Reconnect.Base = 100 * time.Millisecond
	}
	if cfg.Reconnect.Cap <= 0 {
		cfg.Reconnect.Cap = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	cfg.AMQP = withConnectionName(cfg.AMQP, "retrysafe-redeliver "+cfg.Queue)
	s := &Source{cfg: cfg, nodes: ns, topo: topo, log: cfg.Logger.With(slog.String("queue", cfg.Queue))}
	// The first connect learns the work queue's type, when the configuration leaves it
	// open; the Source is not shared yet, so it may change s.topo.
	var sess *session
	var errs []error
	for i := range ns {
		s.node.Store(int32(i))
		if sess, err = s.connect(ctx, i, !cfg.Classic && !cfg.Quorum); err == nil || ctx.Err() != nil {
			break
		}
		errs = append(errs, err)
	}
	if sess == nil {
		if len(errs) == 1 || ctx.Err() != nil {
			return nil, err
		}
		return nil, errors.Join(errs...)
	}
	s.cur = sess
	if !s.topo.Quorum {
		s.log.Warn("rabbitmq: the queues are classic queues: "+classicLoss+"; declare the topology anew as quorum queues (the default) to avoid it",
			slog.Bool("existing", !cfg.Classic))
	}
	return s, nil
}

// classicLoss says what classic queues lose on a crash of their node.
const classicLoss = "a crash of their node redelivers messages already acknowledged (up to every ack since the node started), " +
	"a retry copy in a delay queue can be lost (at-most-once dead-lettering), a message that crashes every consumer is " +
	"redelivered without end (no delivery count), and they live on one node"

// Topology returns the names of the queues the Source uses.
func (s *Source) Topology() Topology { return s.topo }

// Connects reports how many connections the Source has opened, the first included.
func (s *Source) Connects() int64 { return s.connects.Load() }

func withConnectionName(c amqp.Config, name string) amqp.Config {
	props := amqp.Table{}
	for k, v := range c.Properties {
		props[k] = v
	}
	if _, ok := props["connection_name"]; !ok {
		props["connection_name"] = name
	}
	c.Properties = props
	return c
}

// connect opens a session on node i: connection, topology, publish channel, consumer.
// With learn, a work queue that exists as another type than s.topo's makes the Source
// use that type (only NewSource passes it).
func (s *Source) connect(ctx context.Context, i int, learn bool) (*session, error) {
	conn, err := dial(ctx, s.nodes[i], s.cfg.AMQP)
	if err != nil {
		return nil, err
	}
	sess := &session{conn: conn}
	fail := func(err error) (*session, error) { sess.close(); return nil, err }
	if !s.cfg.NoDeclare {
		ch, err := conn.Channel()
		if err != nil {
			return fail(fmt.Errorf("rabbitmq: opening channel: %w", err))
		}
		err = s.topo.declare(ctx, ch)
		if learn && s.topo.Quorum && typeMismatch(err) {
			// The work queue exists as a classic queue (RabbitMQ refuses a redeclare
			// with another type): keep it, and its delay queues and DLQ with it.
			s.topo.Quorum = false
			if ch, err = conn.Channel(); err != nil {
				return fail(fmt.Errorf("rabbitmq: opening channel: %w", err))
			}
			err = s.topo.declare(ctx, ch)
			if err == nil {
				s.log.Warn("rabbitmq: the work queue exists as a classic queue; using it and its classic delay queues and DLQ (a queue's type cannot change in place)")
			}
		}
		if err != nil {
			if !s.cfg.Classic && typeMismatch(err) {
				return fail(fmt.Errorf("%w (quorum queues wanted: a queue's type cannot change in place; drain and delete the classic queues, or set Config.Classic)", err))
			}
			return fail(err)
		}
		_ = ch.Close()
	}
	if sess.pub, err = newConfirmChannel(conn); err != nil {
		return fail(err)
	}
	if sess.consume, err = conn.Channel(); err != nil {
		return fail(fmt.Errorf("rabbitmq: opening consume channel: %w", err))
	}
	if err := sess.consume.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return fail(fmt.Errorf("rabbitmq: setting prefetch: %w", err))
	}
	// The consumer must outlive ctx (amqp091 cancels it when ctx ends).
	sess.deliveries, err = sess.consume.ConsumeWithContext(context.WithoutCancel(ctx), s.topo.Work, "", false, false, false, false, nil)
	if err != nil {
		return fail(fmt.Errorf("rabbitmq: consuming %q: %w", s.topo.Work, err))
	}
	s.connects.Add(1)
	return sess, nil
}

// dial connects, giving up when ctx ends.
func dial(ctx context.Context, url string, cfg amqp.Config) (*amqp.Connection, error) {
	type result struct {
		c   *amqp.Connection
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := amqp.DialConfig(url, cfg)
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("rabbitmq: connecting to %s: %w", hostOf(url), r.err)
		}
		return r.c, nil
	case <-ctx.Done():
		go func() {
			if r := <-done; r.c != nil {
				_ = r.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// reconnect replaces the broken session old with a new one, trying the nodes in turn
// from the one after the node connected to (or tried) last, with backoff after each
// round of failures, until it succeeds, ctx ends or the Source is closed.
func (s *Source) reconnect(ctx context.Context, old *session) (*session, error) {
	s.mu.Lock()
	if s.cur == old {
		s.cur = nil
	}
	s.mu.Unlock()
	lost := int(s.node.Load())
	if old != nil {
		old.close()
		s.log.Warn("rabbitmq: connection lost, reconnecting", slog.String("node", hostOf(s.nodes[lost])))
	}
	start := s.nodes.after(lost)
	for n := 0; ; n++ {
		i := (start + n) % len(s.nodes)
		s.node.Store(int32(i))
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return nil, redeliver.ErrClosed
		}
		sess, err := s.connect(ctx, i, false)
		if err == nil {
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				sess.close()
				return nil, redeliver.ErrClosed
			}
			s.cur = sess
			s.mu.Unlock()
			s.log.Info("rabbitmq: connected", slog.String("node", hostOf(s.nodes[i])), slog.Int("attempt", n+1))
			return sess, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if s.nodes.after(i) != start {
			// More nodes to try in this round: the next one at once.
			s.log.Warn("rabbitmq: connecting failed, trying the next node", slog.String("node", hostOf(s.nodes[i])), slog.Any("error", err))
			continue
		}
		wait := s.cfg.Reconnect.Backoff(min(n/len(s.nodes), 30), 0)
		s.log.Warn("rabbitmq: connecting failed", slog.String("node", hostOf(s.nodes[i])), slog.Any("error", err), slog.Duration("retry_in", wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// Receive returns the next delivery from the work queue, reconnecting (with backoff)
// when the connection was lost.
func (s *Source) Receive(ctx context.Context) (redeliver.Delivery, error) {
	for {
		s.mu.Lock()
		closed, sess := s.closed, s.cur
		s.mu.Unlock()
		if closed {
			return nil, redeliver.ErrClosed
		}
		if sess == nil {
			var err error
			if sess, err = s.reconnect(ctx, nil); err != nil {
				return nil, err
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case d, ok := <-sess.deliveries:
			if !ok {
				if _, err := s.reconnect(ctx, sess); err != nil {
					return nil, err
				}
				continue
			}
			return &delivery{s: s, sess: sess, d: d, m: toMessage(&d, s.topo.Work, s.topo.Quorum, s.cfg.Clock())}, nil
		}
	}
}

// Close closes the connection. Deliveries received but not settled (prefetched ones
// included) return to the queue.
func (s *Source) Close(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.cur != nil {
		if err := s.cur.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			s.cur = nil
			return fmt.Errorf("rabbitmq: closing connection: %w", err)
		}
		s.cur = nil
	}
	return nil
}

// delivery is one message from the work queue.
type delivery struct {
	s    *Source
	sess *session
	d    amqp.Delivery
	m    *redeliver.Message
}

var _ redeliver.Delivery = (*delivery)(nil)

func (d *delivery) Message() *redeliver.Message { return d.m }

func (d *delivery) hook(point string) {
	if d.s.cfg.hook != nil {
		d.s.cfg.hook(point, d.s)
	}
}

func (d *delivery) Ack(context.Context) error {
	d.hook("ack")
	if err := d.d.Ack(false); err != nil {
		return fmt.Errorf("rabbitmq: ack: %w", err)
	}
	return nil
}

// Retry publishes a copy to the delay queue nearest r.Delay, waits for the confirm and
// acks the original. If the publish fails the original is requeued (nack) so that it
// is not stuck unacknowledged on a live channel.
func (d *delivery) Retry(ctx context.Context, r redeliver.RetryInfo) error {
	q := d.s.topo.Bucket(r.Delay)
	if err := d.sess.pub.publish(ctx, q.Name, copyOf(&d.d, r.Header, r.CountHeader)); err != nil {
		_ = d.d.Nack(false, true)
		return err
	}
	d.hook("retry-confirmed")
	if err := d.d.Ack(false); err != nil {
		return fmt.Errorf("rabbitmq: ack after retry copy: %w", err)
	}
	return nil
}

// DeadLetter publishes a copy with the dead-letter headers and HeaderDeadLettered to
// the DLQ, waits for the confirm and acks the original.
func (d *delivery) DeadLetter(ctx context.Context, info redeliver.DeadInfo) error {
	h := info.Header()
	h[HeaderDeadLettered] = d.s.cfg.Clock().UTC().Format(time.RFC3339Nano)
	if err := d.sess.pub.publish(ctx, d.s.topo.DLQ, copyOf(&d.d, h, info.CountHeader)); err != nil {
		_ = d.d.Nack(false, true)
		return err
	}
	d.hook("dead-confirmed")
	if err := d.d.Ack(false); err != nil {
		return fmt.Errorf("rabbitmq: ack after dead-lettering: %w", err)
	}
	return nil
}

// Release requeues the message (basic.nack with requeue). A quorum queue counts it in
// x-delivery-count.
func (d *delivery) Release(context.Context) error {
	if err := d.d.Nack(false, true); err != nil {
		return fmt.Errorf("rabbitmq: nack: %w", err)
	}
	return nil
}

// InProgress does nothing: RabbitMQ has no per-message ack deadline, only the
// broker-wide consumer_timeout (30 minutes by default), which a handler's timeout
// should stay below.
func (d *delivery) InProgress(context.Context) error { return nil }

// CountsInHeader reports true: every retry republishes the message with the count
// header advanced, so the header alone counts attempts, and the broker's delivery
// count (which a broker restart advances for every unsettled delivery, prefetched
// ones included) only bounds deliveries (redeliver.Policy.MaxDeliveries).
func (s *Source) CountsInHeader() bool { return true }
