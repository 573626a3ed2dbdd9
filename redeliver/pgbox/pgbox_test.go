package pgbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/pgbox"
	"github.com/retrysafe/retrysafe/redeliver/rabbitmq"
	"github.com/retrysafe/retrysafe/retry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newSchema returns a pool and a fresh schema (dropped at cleanup) with a business table.
// The schema is named before the pool is made, so the pool is closed before it is dropped.
func newSchema(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	schema := testenv.Schema(t, "pgbox")
	pool := testenv.PostgresPool(t, 12)
	if _, err := pool.Exec(t.Context(), "CREATE SCHEMA "+schema+"; CREATE TABLE "+schema+".business (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	return pool, schema
}

func newInbox(t *testing.T, cfg pgbox.InboxConfig) *pgbox.Inbox {
	t.Helper()
	in, err := pgbox.NewInbox(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := in.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	return in
}

func rows(t *testing.T, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+schema+".business").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func insert(schema string) func(ctx context.Context, tx pgx.Tx, m *redeliver.Message) error {
	return func(ctx context.Context, tx pgx.Tx, m *redeliver.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+schema+".business (id) VALUES ($1)", m.ID)
		return err
	}
}

func TestInbox(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	in := newInbox(t, pgbox.InboxConfig{Pool: pool, Schema: schema})
	m := &redeliver.Message{ID: "m1", Queue: "q"}
	write := func(ctx context.Context, tx pgx.Tx) error { return insert(schema)(ctx, tx, m) }

	// A failing handler records nothing.
	errBoom := errors.New("boom")
	ran, err := in.Do(t.Context(), m, func(ctx context.Context, tx pgx.Tx) error {
		if err := write(ctx, tx); err != nil {
			return err
		}
		return errBoom
	})
	if !ran || !errors.Is(err, errBoom) {
		t.Fatalf("Do = %v, %v", ran, err)
	}
	if seen, _ := in.Seen(t.Context(), "q", "m1"); seen || rows(t, pool, schema) != 0 {
		t.Fatal("a failed handler left a trace")
	}
	// The first success runs, the duplicate does not.
	for i, want := range []bool{true, false, false} {
		ran, err := in.Do(t.Context(), m, write)
		if err != nil || ran != want {
			t.Fatalf("Do #%d = %v, %v; want %v", i, ran, err, want)
		}
	}
	if seen, _ := in.Seen(t.Context(), "q", "m1"); !seen || rows(t, pool, schema) != 1 {
		t.Fatal("not recorded once")
	}
	// Another queue is another scope.
	if ran, err := in.Do(t.Context(), &redeliver.Message{ID: "m1", Queue: "other"}, func(context.Context, pgx.Tx) error { return nil }); !ran || err != nil {
		t.Errorf("other queue: %v, %v", ran, err)
	}
	// No id: permanent.
	_, err = in.Do(t.Context(), &redeliver.Message{Queue: "q"}, write)
	if !errors.Is(err, pgbox.ErrNoID) || retry.Retryable(err) || redeliver.DefaultClassify(err) != redeliver.ClassPermanent {
		t.Errorf("no id: %v", err)
	}
}

func TestInboxConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	in := newInbox(t, pgbox.InboxConfig{Pool: pool, Schema: schema})
	// The first delivery holds the row until the others wait for it.
	hold := make(chan struct{})
	var letGo sync.Once
	free := func() { letGo.Do(func() { close(hold) }) }
	h := in.Handler(func(ctx context.Context, tx pgx.Tx, m *redeliver.Message) error {
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
		return insert(schema)(ctx, tx, m)
	})
	var wg sync.WaitGroup
	defer func() { free(); wg.Wait() }() // also when the test fails
	var failed atomic.Int32
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h(t.Context(), &redeliver.Message{ID: "dup", Queue: "q"}); err != nil {
				failed.Add(1)
				t.Error(err)
			}
		}()
	}
	// The primary key serializes them: the other 7 inserts wait for the first
	// transaction, and PostgreSQL says so.
	testenv.Eventually(t, 10*time.Second, func() bool {
		var waiting int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, schema).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting == 7
	}, "7 duplicates waiting for the first delivery's row")
	free()
	wg.Wait()
	if n := rows(t, pool, schema); n != 1 {
		t.Errorf("%d business rows, want 1", n)
	}
}

func TestInboxExpiry(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	in := newInbox(t, pgbox.InboxConfig{Pool: pool, Schema: schema, Table: "inbox", TTL: time.Hour, Clock: clock})
	noop := func(context.Context, pgx.Tx) error { return nil }
	for i := range 5 {
		if _, err := in.Do(t.Context(), &redeliver.Message{ID: strconv.Itoa(i), Queue: "q"}, noop); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := in.DeleteExpired(t.Context(), 0); err != nil || n != 0 {
		t.Fatalf("DeleteExpired before expiry = %d, %v", n, err)
	}
	mu.Lock()
	now = now.Add(2 * time.Hour)
	mu.Unlock()
	if n, err := in.DeleteExpired(t.Context(), 3); err != nil || n != 3 {
		t.Fatalf("DeleteExpired(3) = %d, %v", n, err)
	}
	if n, err := in.DeleteExpired(t.Context(), 0); err != nil || n != 2 {
		t.Fatalf("DeleteExpired = %d, %v", n, err)
	}
	if ran, err := in.Do(t.Context(), &redeliver.Message{ID: "0", Queue: "q"}, noop); !ran || err != nil {
		t.Errorf("after expiry: %v, %v", ran, err)
	}
}

func TestNames(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{} // never used: New does no I/O
	for _, tt := range []struct {
		schema, table string
		ok            bool
	}{
		{"", "", true},
		{"s1", "t_1", true},
		{"S", "", false},
		{"", `x"; DROP TABLE y; --`, false},
		{"", "1abc", false},
	} {
		_, err1 := pgbox.NewInbox(pgbox.InboxConfig{Pool: pool, Schema: tt.schema, Table: tt.table})
		_, err2 := pgbox.NewOutbox(pgbox.OutboxConfig{Pool: pool, Schema: tt.schema, Table: tt.table})
		if (err1 == nil) != tt.ok || (err2 == nil) != tt.ok {
			t.Errorf("%q.%q: %v, %v", tt.schema, tt.table, err1, err2)
		}
	}
	if _, err := pgbox.NewInbox(pgbox.InboxConfig{}); err == nil {
		t.Error("nil pool accepted")
	}
	if _, err := pgbox.NewOutbox(pgbox.OutboxConfig{}); err == nil {
		t.Error("nil pool accepted")
	}
}

// fakePublisher records publishes; fail decides which fail, dup which the broker
// already holds (ErrDuplicate, as JetStream reports them). With meet set, the first
// publishes wait until meet of them are under way at once.
type fakePublisher struct {
	mu      sync.Mutex
	got     []string
	meet    int
	arrived int
	met     chan struct{}
	fail    func(id string) bool
	dup     func(id string) bool
}

func (p *fakePublisher) Publish(ctx context.Context, queue string, m *redeliver.Message) error {
	if p.meet > 0 {
		p.mu.Lock()
		if p.met == nil {
			p.met = make(chan struct{})
		}
		if p.arrived++; p.arrived == p.meet {
			close(p.met)
		}
		met := p.met
		p.mu.Unlock()
		select {
		case <-met:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if p.fail != nil && p.fail(m.ID) {
		return errors.New("broker unavailable")
	}
	if p.dup != nil && p.dup(m.ID) {
		return fmt.Errorf("fake: publishing %s: %w", m.ID, redeliver.ErrDuplicate)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, queue+"/"+m.ID+"/"+string(m.Body)+"/"+m.Header["k"])
	return nil
}

func (p *fakePublisher) published() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.got...)
}

func newOutbox(t *testing.T, cfg pgbox.OutboxConfig) *pgbox.Outbox {
	t.Helper()
	cfg.Logger = quiet()
	o, err := pgbox.NewOutbox(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := o.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	return o
}

func TestOutbox(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	o := newOutbox(t, pgbox.OutboxConfig{Pool: pool, Schema: schema, Clock: clock,
		Backoff: retry.Policy{Base: time.Minute, Cap: time.Minute, Jitter: retry.JitterNone}})

	// Committed: relayed. Rolled back: never.
	add := func(id string, commit bool) *redeliver.Message {
		m := &redeliver.Message{ID: id, Body: []byte("b" + id), Header: map[string]string{"k": "v"}}
		tx, err := pool.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		if err := o.Add(t.Context(), tx, "work", m); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		return m
	}
	add("1", true)
	add("2", false)
	add("3", true)
	gen := add("", true)
	if len(gen.ID) != 32 {
		t.Errorf("generated id %q", gen.ID)
	}
	if n, _ := o.Pending(t.Context()); n != 3 {
		t.Errorf("pending %d, want 3", n)
	}
	pub := &fakePublisher{fail: func(id string) bool { return id == "3" }}
	n, err := o.RelayOnce(t.Context(), pub)
	if err != nil || n != 2 {
		t.Fatalf("RelayOnce = %d, %v", n, err)
	}
	want := []string{"work/1/b1/v", "work/" + gen.ID + "/b/v"}
	if got := pub.published(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("published %v, want %v", got, want)
	}
	// "3" failed: rescheduled a minute later, with its error kept.
	var attempts int
	var lastErr string
	if err := pool.QueryRow(t.Context(), "SELECT attempts, last_error FROM "+schema+".retrysafe_outbox WHERE message_id = '3'").Scan(&attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 || lastErr != "broker unavailable" {
		t.Errorf("attempts %d, last error %q", attempts, lastErr)
	}
	pub.fail = nil
	if n, _ := o.RelayOnce(t.Context(), pub); n != 0 {
		t.Errorf("relayed %d before the backoff ended", n)
	}
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	if n, _ := o.RelayOnce(t.Context(), pub); n != 1 {
		t.Errorf("relayed %d after the backoff, want 1", n)
	}
	if n, _ := o.Pending(t.Context()); n != 0 {
		t.Errorf("pending %d, want 0", n)
	}
	if err := o.Add(t.Context(), nil, "", &redeliver.Message{}); err == nil {
		t.Error("empty queue accepted")
	}
}

// A message the broker already holds (its first relay's confirm was lost, and the
// broker deduplicated the resend) is published: its row goes, it is not resent.
func TestOutboxDuplicateIsPublished(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	o := newOutbox(t, pgbox.OutboxConfig{Pool: pool, Schema: schema})
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"held", "new"} {
		if err := o.Add(t.Context(), tx, "q", &redeliver.Message{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	pub := &fakePublisher{dup: func(id string) bool { return id == "held" }}
	if n, err := o.RelayOnce(t.Context(), pub); err != nil || n != 2 {
		t.Errorf("RelayOnce = %d, %v; want 2 (the duplicate counts as published)", n, err)
	}
	if n, _ := o.Pending(t.Context()); n != 0 {
		t.Errorf("%d messages still pending, want 0", n)
	}
}

// TestOutboxConcurrentRelays: relays on several connections take disjoint batches (SKIP
// LOCKED): every message is published once. The first publishes wait until the four
// relays each publish from a batch of their own at once.
func TestOutboxConcurrentRelays(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	o := newOutbox(t, pgbox.OutboxConfig{Pool: pool, Schema: schema, Batch: 10, PollInterval: 10 * time.Millisecond})
	const n = 300
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := o.Add(t.Context(), tx, "q", &redeliver.Message{ID: strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	const relays = 4
	pub := &fakePublisher{meet: relays}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }() // also when the test fails
	for range relays {
		wg.Add(1)
		go func() { defer wg.Done(); _ = o.Relay(ctx, pub) }()
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return len(pub.published()) >= n }, "%d publishes", n)
	cancel()
	wg.Wait()
	got := pub.published()
	seen := map[string]bool{}
	for _, g := range got {
		if seen[g] {
			t.Errorf("published twice: %s", g)
		}
		seen[g] = true
	}
	if len(seen) != n {
		t.Errorf("published %d distinct, want %d", len(seen), n)
	}
}

// TestOutboxToInbox is the whole chain on the real services: business writes with
// outbox rows, the relay publishing to RabbitMQ with confirms, a redeliver consumer
// with an inbox writing the consumer-side rows exactly once.
func TestOutboxToInbox(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	pool, schema := newSchema(t)
	queue := testenv.Name("outbox")
	cfg := rabbitmq.Config{URL: url, Queue: queue, Delays: []time.Duration{50 * time.Millisecond}, Logger: quiet()}
	src, err := rabbitmq.NewSource(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		_ = rabbitmq.DeleteTopology(context.Background(), conn, src.Topology())
	})
	o := newOutbox(t, pgbox.OutboxConfig{Pool: pool, Schema: schema, PollInterval: 20 * time.Millisecond})
	in := newInbox(t, pgbox.InboxConfig{Pool: pool, Schema: schema})
	if _, err := pool.Exec(t.Context(), "CREATE TABLE "+schema+".grants (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	const n = 100
	for i := range n {
		err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
			id := "g" + strconv.Itoa(i)
			if _, err := tx.Exec(t.Context(), "INSERT INTO "+schema+".business (id) VALUES ($1)", id); err != nil {
				return err
			}
			return o.Add(t.Context(), tx, queue, &redeliver.Message{ID: id, Body: []byte(id)})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	pub, err := rabbitmq.NewPublisher(t.Context(), rabbitmq.PublisherConfig{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ctx, cancel := context.WithCancel(t.Context())
	relayDone := make(chan error, 1)
	go func() { relayDone <- o.Relay(ctx, pub) }()
	var attempts sync.Map
	c, err := redeliver.New(redeliver.Config{Source: src, Logger: quiet(),
		Policy: redeliver.Policy{Backoff: retry.Policy{Base: 50 * time.Millisecond, Jitter: retry.JitterNone}},
		Handler: in.Handler(func(ctx context.Context, tx pgx.Tx, m *redeliver.Message) error {
			if _, loaded := attempts.LoadOrStore(m.ID, true); !loaded && m.ID[len(m.ID)-1] == '7' {
				return errors.New("first try fails")
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+schema+".grants (id) VALUES ($1)", m.ID)
			return err
		})})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(ctx) }()
	var stopOnce sync.Once
	var relayErr, runErr error
	stop := func() { stopOnce.Do(func() { cancel(); relayErr, runErr = <-relayDone, <-runDone }) }
	defer stop() // also when the test fails
	var grants int
	testenv.Eventually(t, 20*time.Second, func() bool {
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+schema+".grants").Scan(&grants); err != nil {
			t.Fatal(err)
		}
		return grants == n
	}, "%d grants", n)
	stop()
	if relayErr != nil {
		t.Error(relayErr)
	}
	if runErr != nil {
		t.Error(runErr)
	}
	if grants != n {
		t.Errorf("%d grants, want %d", grants, n)
	}
	if p, _ := o.Pending(t.Context()); p != 0 {
		t.Errorf("%d messages still in the outbox", p)
	}
}

// Once, the redeliver.Inbox a Consumer calls, hands the handler its transaction in the
// context; a recorded id does not run it; Inbox.Handler inside Once joins that
// transaction instead of recording the id a second time (which would find it recorded
// and skip the write); Tx is nil outside an inbox.
func TestInboxOnce(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	in := newInbox(t, pgbox.InboxConfig{Pool: pool, Schema: schema})
	if pgbox.Tx(t.Context()) != nil {
		t.Fatal("Tx outside an inbox is not nil")
	}
	runs := 0
	h := func(ctx context.Context, m *redeliver.Message) error {
		runs++
		tx := pgbox.Tx(ctx)
		if tx == nil {
			return errors.New("no transaction in the handler's context")
		}
		return insert(schema)(ctx, tx, m)
	}
	m := &redeliver.Message{ID: "once-1", Queue: "q"}
	for i, want := range []bool{true, false} {
		ran, err := in.Once(t.Context(), m, h)
		if err != nil || ran != want {
			t.Fatalf("Once #%d: ran %t, %v; want %t, nil", i+1, ran, err, want)
		}
	}
	// The Handler of a second Inbox made from the same configuration joins too.
	nested := newInbox(t, pgbox.InboxConfig{Pool: pool, Schema: schema}).Handler(insert(schema))
	// A second transaction for the same id would wait for the first's row lock for
	// ever: the context bounds that failure.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ran, err := in.Once(ctx, &redeliver.Message{ID: "once-2", Queue: "q"},
		func(ctx context.Context, m *redeliver.Message) error { runs++; return nested(ctx, m) })
	if err != nil || !ran {
		t.Fatalf("Once with a nested Handler: ran %t, %v", ran, err)
	}
	if got := rows(t, pool, schema); runs != 2 || got != 2 {
		t.Errorf("handler ran %d times, %d rows; want 2 and 2", runs, got)
	}
	for _, id := range []string{"once-1", "once-2"} {
		if ok, err := in.Seen(t.Context(), "q", id); err != nil || !ok {
			t.Errorf("Seen(%s) = %t, %v", id, ok, err)
		}
	}
}
