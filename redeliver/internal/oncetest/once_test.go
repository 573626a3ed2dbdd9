package oncetest_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	_ "modernc.org/sqlite"

	"github.com/retrysafe/retrysafe/harness/rabbitqueue"
	"github.com/retrysafe/retrysafe/harness/tcpproxy"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/jetstream"
	"github.com/retrysafe/retrysafe/redeliver/pgbox"
	"github.com/retrysafe/retrysafe/redeliver/rabbitmq"
	"github.com/retrysafe/retrysafe/redeliver/sqlitebox"
	"github.com/retrysafe/retrysafe/redeliver/sqlitebox/sqliteboxtest"
	"github.com/retrysafe/retrysafe/retry"
)

// messages is how many messages each run publishes; every cutEvery-th one has its first
// ack lost to a partition.
const messages, cutEvery = 12, 3

// runTimeout bounds a whole run: a failure bound, not a margin anything waits for.
const runTimeout = 2 * time.Minute

func logger() *slog.Logger {
	if os.Getenv("RETRYSAFE_TEST_LOG") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// A link is a broker queue reached through a proxy that the test can partition.
type link struct {
	src     redeliver.Source
	publish func(ctx context.Context, m *redeliver.Message) error
	// lose partitions the link so that nothing the consumer sends from now on reaches
	// the broker, and returns once that holds; heal ends the partition.
	lose func(ctx context.Context) error
	heal func()
}

// A store is the database the handler applies its side effect to: one row per run of
// the handler's write.
type store struct {
	inbox redeliver.Inbox
	// inTx applies the effect in the inbox's transaction (the handler under
	// Config.Inbox); alone applies it in a transaction of its own (no inbox).
	inTx, alone redeliver.Handler
	applied     func(ctx context.Context) (map[string]int, error)
}

func rabbitLink(ctx context.Context, t *testing.T) link {
	direct := testenv.AMQPURL(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	queue := testenv.Name("rsonce")
	// The topology, and its deletion when t ends, on a connection the proxy never sees.
	decl, _ := rabbitqueue.Open(ctx, t, direct, queue, logger())
	if err := decl.Close(ctx); err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, u.Host)
	u.Host = p.Addr()
	src, err := rabbitmq.NewSource(ctx, rabbitmq.Config{URL: u.String(), Queue: queue, Prefetch: 1,
		Reconnect: retry.Policy{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond}, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := rabbitmq.NewPublisher(ctx, rabbitmq.PublisherConfig{URL: direct})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return link{
		src:     src,
		publish: func(ctx context.Context, m *redeliver.Message) error { return pub.Publish(ctx, queue, m) },
		// A Cut resets the consumer's connection on the broker's side at once: the
		// broker requeues its unacknowledged messages, and no later byte can reach it
		// on that connection.
		lose: func(context.Context) error { p.Cut(); return nil },
		heal: p.Restore,
	}
}

func jetstreamLink(ctx context.Context, t *testing.T) link {
	direct := testenv.NATSURL(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, u.Host)
	u.Host = p.Addr()
	// No reconnect buffer: what the client sends while it knows it is disconnected fails
	// instead of being replayed after the reconnect, as an ack in flight is lost when
	// a node dies.
	nc, err := nats.Connect(u.String(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pubConn, err := nats.Connect(direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pubConn.Close)
	cfg := jetstream.Config{
		Queue: testenv.Name("rsonce") + ".work", Conn: nc, MemoryStorage: true,
		AckWait: time.Second, Prefetch: 1, Logger: logger(),
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := cfg
		c.Conn = pubConn
		if err := jetstream.DeleteTopology(ctx, c); err != nil {
			t.Errorf("deleting topology: %v", err)
		}
	})
	src, err := jetstream.NewSource(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := jetstream.NewPublisher(pubConn)
	if err != nil {
		t.Fatal(err)
	}
	return link{
		src:     src,
		publish: func(ctx context.Context, m *redeliver.Message) error { return pub.Publish(ctx, cfg.Queue, m) },
		// After a Cut the ack must not be written before the client knows its
		// connection is gone (it would be lost anyway, but only by luck); once it knows,
		// the ack fails at once, and the server redelivers after AckWait.
		lose: func(ctx context.Context) error {
			p.Cut()
			for nc.IsConnected() {
				if err := sleepCtx(ctx, time.Millisecond); err != nil {
					return err
				}
			}
			return nil
		},
		heal: p.Restore,
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func newProxy(t *testing.T, target string) *tcpproxy.Proxy {
	t.Helper()
	p, err := tcpproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func pgStore(ctx context.Context, t *testing.T) store {
	schema := testenv.Schema(t, "rsonce")
	pool := testenv.PostgresPool(t, 4)
	table := pgx.Identifier{schema, "effects"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+
		"; CREATE TABLE "+table+" (message_id text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	box, err := pgbox.NewInbox(pgbox.InboxConfig{Pool: pool, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	insert := "INSERT INTO " + table + " (message_id) VALUES ($1)"
	return store{
		inbox: box,
		inTx: func(ctx context.Context, m *redeliver.Message) error {
			_, err := pgbox.Tx(ctx).Exec(ctx, insert, m.ID)
			return err
		},
		alone: func(ctx context.Context, m *redeliver.Message) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, insert, m.ID)
				return err
			})
		},
		applied: func(ctx context.Context) (map[string]int, error) {
			rows, err := pool.Query(ctx, "SELECT message_id, count(*) FROM "+table+" GROUP BY message_id")
			if err != nil {
				return nil, err
			}
			got := map[string]int{}
			var id string
			var n int
			_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { got[id] = n; return nil })
			return got, err
		},
	}
}

func sqliteStore(ctx context.Context, t *testing.T) store {
	db, box := sqliteboxtest.Open(t, "CREATE TABLE effects (message_id TEXT NOT NULL)")
	const insert = "INSERT INTO effects (message_id) VALUES (?)"
	return store{
		inbox: box,
		inTx: func(ctx context.Context, m *redeliver.Message) error {
			_, err := sqlitebox.Tx(ctx).ExecContext(ctx, insert, m.ID)
			return err
		},
		alone: func(ctx context.Context, m *redeliver.Message) (err error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, insert, m.ID); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		},
		applied: func(ctx context.Context) (map[string]int, error) {
			rows, err := db.QueryContext(ctx, "SELECT message_id, count(*) FROM effects GROUP BY message_id")
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			got := map[string]int{}
			for rows.Next() {
				var id string
				var n int
				if err := rows.Scan(&id, &n); err != nil {
					return nil, err
				}
				got[id] = n
			}
			return got, rows.Err()
		},
	}
}

// cutSource hands out its Source's deliveries; the first ack of each message in toCut
// happens across a partition (lose before, heal after), so it never reaches the broker,
// which delivers the message again. By then the handler's transaction has committed:
// the Consumer acks only after the handler (and the inbox's commit) returned.
type cutSource struct {
	redeliver.Source
	l       link
	toCut   map[string]bool
	mu      sync.Mutex
	seen    map[string]int  // deliveries per message id
	acked   map[string]bool // ids whose ack was not cut and succeeded
	cuts    int
	changed chan struct{} // signalled (without blocking) after each settlement
}

func (s *cutSource) Receive(ctx context.Context) (redeliver.Delivery, error) {
	d, err := s.Source.Receive(ctx)
	if err != nil {
		return nil, err
	}
	id := d.Message().ID
	s.mu.Lock()
	s.seen[id]++
	cut := s.seen[id] == 1 && s.toCut[id]
	s.mu.Unlock()
	return &cutDelivery{Delivery: d, s: s, cut: cut}, nil
}

func (s *cutSource) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// done reports whether every message was acknowledged through a healthy link.
func (s *cutSource) done() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.acked) == len(s.toCut)
}

type cutDelivery struct {
	redeliver.Delivery
	s   *cutSource
	cut bool
}

func (d *cutDelivery) Ack(ctx context.Context) error {
	defer d.s.notify()
	id := d.Message().ID
	if d.cut {
		if err := d.s.l.lose(ctx); err != nil {
			return err
		}
		defer d.s.l.heal()
		err := d.Delivery.Ack(ctx)
		d.s.mu.Lock()
		d.s.cuts++
		d.s.mu.Unlock()
		return err
	}
	err := d.Delivery.Ack(ctx)
	if err == nil {
		d.s.mu.Lock()
		d.s.acked[id] = true
		d.s.mu.Unlock()
	}
	return err
}

// result is what one run measured.
type result struct {
	cuts       int            // acks lost to a partition
	deliveries int            // deliveries received
	doubled    []string       // ids whose effect was applied more than once
	applied    map[string]int // effects per id
	duplicates float64        // retrysafe_redeliver_duplicates_total
}

// runOnce publishes the messages, consumes them through the link with or without the
// inbox, and counts the side effects once every message was acknowledged.
func runOnce(ctx context.Context, t *testing.T, l link, s store, withInbox bool) result {
	src := &cutSource{Source: l.src, l: l, toCut: map[string]bool{}, seen: map[string]int{},
		acked: map[string]bool{}, changed: make(chan struct{}, 1)}
	ids := make([]string, messages)
	for i := range ids {
		ids[i] = fmt.Sprintf("m-%02d", i)
		src.toCut[ids[i]] = i%cutEvery == 0
		if err := l.publish(ctx, &redeliver.Message{ID: ids[i], Body: []byte(ids[i])}); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	cfg := redeliver.Config{Source: src, Concurrency: 1, Registerer: reg, Logger: logger(),
		SettleTimeout: 10 * time.Second, ShutdownGrace: 10 * time.Second,
		Policy: redeliver.Policy{MaxAttempts: 10, Backoff: retry.Policy{Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond}}}
	if withInbox {
		cfg.Inbox, cfg.Handler = s.inbox, s.inTx
	} else {
		cfg.Handler = s.alone
	}
	c, err := redeliver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(runCtx) }()
	for !src.done() {
		select {
		case <-src.changed:
		case <-ctx.Done():
			stop()
			<-runErr
			src.mu.Lock()
			t.Fatalf("not every message acknowledged: %v; acked %d of %d, deliveries %v", ctx.Err(), len(src.acked), messages, src.seen)
		}
	}
	stop()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	applied, err := s.applied(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := result{applied: applied, cuts: src.cuts}
	for _, n := range src.seen {
		r.deliveries += n
	}
	for _, id := range ids {
		if applied[id] > 1 {
			r.doubled = append(r.doubled, id)
		}
	}
	r.duplicates = duplicates(t, reg)
	for _, id := range ids {
		if applied[id] == 0 {
			t.Errorf("message %s acknowledged but its effect never applied", id)
		}
	}
	return r
}

func duplicates(t *testing.T, reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "retrysafe_redeliver_duplicates_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// TestInboxAcrossLostAcks: on both brokers and with both inboxes, the acks of a third of
// the messages are lost after their handlers committed, and the brokers deliver them
// again. With Config.Inbox no effect is applied twice and every redelivery is counted
// as a duplicate; without it every one of those messages applies its effect twice.
func TestInboxAcrossLostAcks(t *testing.T) {
	t.Parallel()
	links := map[string]func(context.Context, *testing.T) link{"rabbitmq": rabbitLink, "jetstream": jetstreamLink}
	stores := map[string]func(context.Context, *testing.T) store{"pgbox": pgStore, "sqlitebox": sqliteStore}
	wantCuts := (messages + cutEvery - 1) / cutEvery
	for ln, newLink := range links {
		for sn, newStore := range stores {
			for _, withInbox := range []bool{true, false} {
				name := ln + "/" + sn + "/inbox"
				if !withInbox {
					name = ln + "/" + sn + "/none"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
					defer cancel()
					s := newStore(ctx, t)
					r := runOnce(ctx, t, newLink(ctx, t), s, withInbox)
					t.Logf("%d messages, %d acks lost, %d deliveries, %d applied twice or more %v, %v counted as duplicates",
						messages, r.cuts, r.deliveries, len(r.doubled), r.doubled, r.duplicates)
					if r.cuts != wantCuts {
						t.Errorf("%d acks lost, want %d", r.cuts, wantCuts)
					}
					if withInbox {
						if len(r.doubled) != 0 {
							t.Errorf("with the inbox, effects applied more than once: %v (all: %v)", r.doubled, r.applied)
						}
						if r.duplicates < float64(wantCuts) {
							t.Errorf("duplicates_total = %v, want at least the %d lost acks", r.duplicates, wantCuts)
						}
					} else if len(r.doubled) < wantCuts {
						t.Errorf("without the inbox, %d messages applied twice (%v), want at least the %d whose ack was lost",
							len(r.doubled), r.doubled, wantCuts)
					}
				})
			}
		}
	}
}
