package rabbitmq

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/pgbox"
	"github.com/retrysafe/retrysafe/retry"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		os.Exit(m.Run()) // the crash child dies by SIGKILL; no leak check there
	}
	goleak.VerifyTestMain(m)
}

func quiet() *slog.Logger {
	if os.Getenv("RETRYSAFE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testDelays are short delay buckets for tests.
var testDelays = []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}

// testPolicy doubles from 50ms without jitter, so the delays are 50, 100, 200, 400ms.
func testPolicy(maxAttempts int) redeliver.Policy {
	return redeliver.Policy{MaxAttempts: maxAttempts, Timeout: 10 * time.Second,
		Backoff: retry.Policy{Base: 50 * time.Millisecond, Cap: 400 * time.Millisecond, Jitter: retry.JitterNone}}
}

// rmq is one test's RabbitMQ: a unique work queue and an admin connection.
type rmq struct {
	url   string
	urls  []string // the other nodes of a cluster, if any
	queue string
	topo  Topology
	admin *amqp.Connection
}

func newRMQ(t testing.TB, quorum bool) *rmq {
	t.Helper()
	return newRMQAt(t, []string{testenv.AMQPURL(t)}, quorum)
}

// newRMQAt is newRMQ on the broker whose nodes are urls; the admin connection goes to
// the first.
func newRMQAt(t testing.TB, urls []string, quorum bool) *rmq {
	t.Helper()
	url := urls[0]
	queue := testenv.Name("rd")
	topo, err := newTopology(queue, testDelays, quorum)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	r := &rmq{url: url, urls: urls[1:], queue: queue, topo: topo, admin: admin}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := DeleteTopology(ctx, admin, topo); err != nil {
			t.Errorf("deleting topology: %v", err)
		}
		_ = admin.Close()
	})
	return r
}

func (r *rmq) config() Config {
	return Config{URL: r.url, URLs: r.urls, Queue: r.queue, Delays: testDelays, Quorum: r.topo.Quorum, Classic: !r.topo.Quorum, Logger: quiet(), Prefetch: 50}
}

// count returns the ready messages of queue q.
func (r *rmq) count(t testing.TB, q string) int {
	t.Helper()
	ch, err := r.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspecting %s: %v", q, err)
	}
	return info.Messages
}

// empty checks that the work and delay queues hold nothing and the DLQ holds dlq.
func (r *rmq) expectQueues(t testing.TB, dlq int) {
	t.Helper()
	for _, q := range r.topo.Queues() {
		want := 0
		if q == r.topo.DLQ {
			want = dlq
		}
		if n := r.count(t, q); n != want {
			t.Errorf("queue %s holds %d messages, want %d", q, n, want)
		}
	}
}

// publish publishes messages with the given ids (body = id) to the work queue, with
// confirms, in batches.
func (r *rmq) publish(t testing.TB, ids ...string) {
	t.Helper()
	ch, err := r.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for len(ids) > 0 {
		n := min(len(ids), 500)
		var dcs []*amqp.DeferredConfirmation
		for _, id := range ids[:n] {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", r.queue, true, false, amqp.Publishing{
				MessageId: id, Body: []byte(id), ContentType: "text/plain", DeliveryMode: amqp.Persistent,
				Headers: amqp.Table{"app": "yes"},
			})
			if err != nil {
				t.Fatal(err)
			}
			dcs = append(dcs, dc)
		}
		for _, dc := range dcs {
			if !dc.Wait() {
				t.Fatal("publish nacked")
			}
		}
		ids = ids[n:]
	}
}

// markers are the marker messages quiesce publishes, by id. The Consumers that consume
// starts acknowledge them without calling the test's handler.
var markers sync.Map // id → *marker

type marker struct {
	once sync.Once
	seen chan struct{} // closed when a handler got the marker
}

// quiesce returns once no delivery of r's queue can still reach the handler of the
// Consumer that stop stops, so that the test may count what it got: the delay queues and
// the work queue hold nothing ready and the DLQ holds dlq (the delay queues are counted
// first: their messages move to the work queue); a marker published then has reached
// the handler, so every message delivered before it was received (a queue delivers in
// order, and a message requeued keeps its place); and the Consumer is stopped, which
// waits for the handlers still running.
func (r *rmq) quiesce(t testing.TB, stop func(), dlq int) {
	t.Helper()
	var queues []string
	for _, d := range r.topo.Delays {
		queues = append(queues, d.Name)
	}
	queues = append(queues, r.topo.DLQ, r.topo.Work)
	eventually(t, 10*time.Second, fmt.Sprintf("empty work and delay queues and %d dead letters", dlq), func() bool {
		for _, q := range queues {
			want := 0
			if q == r.topo.DLQ {
				want = dlq
			}
			if r.count(t, q) != want {
				return false
			}
		}
		return true
	})
	id := testenv.Name("marker")
	mk := &marker{seen: make(chan struct{})}
	markers.Store(id, mk)
	defer markers.Delete(id)
	r.publish(t, id)
	select {
	case <-mk.seen:
	case <-time.After(10 * time.Second):
		t.Fatal("the marker message did not reach the handler")
	}
	stop()
}

// consume runs a Consumer on a new Source until the test ends (or stop is called).
func consume(t testing.TB, cfg Config, rc redeliver.Config) (src *Source, stop func()) {
	t.Helper()
	src, err := NewSource(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if h := rc.Handler; h != nil {
		rc.Handler = func(ctx context.Context, m *redeliver.Message) error {
			if v, ok := markers.Load(m.ID); ok {
				mk := v.(*marker)
				mk.once.Do(func() { close(mk.seen) })
				return nil
			}
			return h(ctx, m)
		}
	}
	rc.Source = src
	if rc.Logger == nil {
		rc.Logger = quiet()
	}
	if rc.ShutdownGrace == 0 {
		rc.ShutdownGrace = 5 * time.Second
	}
	c, err := redeliver.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return src, stop
}

// eventually polls cond until it holds, or fails t when the timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, timeout, cond, "%s", what)
}

// db is one test's PostgreSQL schema with an inbox and a business table.
type db struct {
	pool   *pgxpool.Pool
	schema string
	inbox  *pgbox.Inbox
}

// newDB returns a db in a fresh schema, dropped when t ends, with the inbox migrated
// and the business table created.
func newDB(t testing.TB) *db {
	t.Helper()
	schema := testenv.Schema(t, "rdtest") // named before the pool, which is closed before it is dropped
	d := openDB(t, schema)
	ctx := context.Background()
	if err := d.inbox.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s.business (id text PRIMARY KEY, attempt int NOT NULL)`, schema)); err != nil {
		t.Fatal(err)
	}
	return d
}

// openDB returns the db of an existing schema (another process's).
func openDB(t testing.TB, schema string) *db {
	t.Helper()
	pool := testenv.PostgresPool(t, 16)
	inbox, err := pgbox.NewInbox(pgbox.InboxConfig{Pool: pool, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return &db{pool: pool, schema: schema, inbox: inbox}
}

// write is the business write: one row per message id (a second insert would fail on
// the primary key).
func (d *db) write(ctx context.Context, tx pgx.Tx, m *redeliver.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+d.schema+`.business (id, attempt) VALUES ($1, $2)`, m.ID, m.Attempt)
	return err
}

func (d *db) rows(t testing.TB) (total, distinct int) {
	t.Helper()
	if err := d.pool.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT id) FROM `+d.schema+`.business`).Scan(&total, &distinct); err != nil {
		t.Fatal(err)
	}
	return total, distinct
}

// proxy is a TCP proxy to the broker that a test can cut, to make the consumer lose its
// connection as it does when the broker restarts.
type proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	refuse  bool
	refused int // connections refused
	wg      sync.WaitGroup
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.refuse {
			p.refused++
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// cut closes every proxied connection and refuses new ones until resume.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// refusals returns how many connections the proxy refused.
func (p *proxy) refusals() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

func (p *proxy) resume() {
	p.mu.Lock()
	p.refuse = false
	p.mu.Unlock()
}

func (p *proxy) close() {
	_ = p.ln.Close()
	p.cut()
	p.wg.Wait()
}
