package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/retrysafe/retrysafe/redeliver"
)

// PublisherConfig configures a Publisher. URL (or URLs) is required; the zero value of
// every other field means the default documented on it.
type PublisherConfig struct {
	// URL is the broker's AMQP URL: the node the Publisher connects to first. Required
	// unless URLs is set.
	URL string
	// URLs are the AMQP URLs of the other nodes of the broker's cluster, as in
	// Config.URLs: NewPublisher tries URL, then URLs in order; after the connection was
	// lost, the next Publish tries each node once, starting with the one after the node
	// it lost. Default none: URL alone.
	URLs []string
	// AMQP configures the connection. Its Properties get a "connection_name" of
	// "retrysafe-publisher" unless they have one. Default: amqp091's defaults.
	AMQP amqp.Config
	// Clock is the time source of the messages' timestamp. Nil means time.Now.
	Clock func() time.Time
}

// Publisher is a redeliver.Publisher on RabbitMQ: it publishes persistent messages to a
// queue through the default exchange, mandatory, and waits for each confirm. After the
// connection was lost, the next Publish reconnects (once to each node; the caller
// retries). It is
// safe for concurrent use; concurrent publishes share one channel and are confirmed
// independently.
type Publisher struct {
	cfg   PublisherConfig
	nodes nodes

	mu     sync.Mutex
	conn   *amqp.Connection
	pub    *confirmChannel
	closed bool
	node   int  // index in nodes of the node connected to (or tried) last
	dialed bool // a connection was tried before
}

var _ redeliver.Publisher = (*Publisher)(nil)

// NewPublisher connects to cfg.URL, or when it fails to each of cfg.URLs in turn.
func NewPublisher(ctx context.Context, cfg PublisherConfig) (*Publisher, error) {
	ns, err := newNodes("PublisherConfig", cfg.URL, cfg.URLs)
	if err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	cfg.AMQP = withConnectionName(cfg.AMQP, "retrysafe-publisher")
	p := &Publisher{cfg: cfg, nodes: ns}
	if _, err := p.channel(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// channel returns the live publish channel, connecting when there is none.
func (p *Publisher) channel(ctx context.Context) (*confirmChannel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, redeliver.ErrClosed
	}
	if p.pub != nil && !p.pub.ch.IsClosed() {
		return p.pub, nil
	}
	if p.conn != nil {
		_ = p.conn.Close()
		p.conn, p.pub = nil, nil
	}
	start := 0
	if p.dialed {
		start = p.nodes.after(p.node)
	}
	p.dialed = true
	var errs []error
	for n := range p.nodes {
		p.node = (start + n) % len(p.nodes)
		conn, err := dial(ctx, p.nodes[p.node], p.cfg.AMQP)
		if err == nil {
			var pub *confirmChannel
			if pub, err = newConfirmChannel(conn); err == nil {
				p.conn, p.pub = conn, pub
				return pub, nil
			}
			_ = conn.Close()
		}
		if ctx.Err() != nil || len(p.nodes) == 1 {
			return nil, err
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// Publish sends m (ID, Body, ContentType and Header, all headers as strings, with the
// timestamp property set to now) to queue and waits for the broker's confirm.
// ErrUnroutable means no such queue exists. RabbitMQ stores every confirmed publish,
// whatever its id: Publish never returns redeliver.ErrDuplicate.
func (p *Publisher) Publish(ctx context.Context, queue string, m *redeliver.Message) error {
	ch, err := p.channel(ctx)
	if err != nil {
		return err
	}
	return ch.publish(ctx, queue, publishingOf(m, p.cfg.Clock()))
}

// Close closes the connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.conn != nil {
		if err := p.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			return fmt.Errorf("rabbitmq: closing connection: %w", err)
		}
	}
	return nil
}
