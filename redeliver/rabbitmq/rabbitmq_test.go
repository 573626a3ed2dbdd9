package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

func TestBucket(t *testing.T) {
	t.Parallel()
	topo, err := newTopology("q", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ d, want time.Duration }{
		{0, time.Second},
		{10 * time.Millisecond, time.Second},
		{time.Second, time.Second},
		{1400 * time.Millisecond, time.Second},
		{1500 * time.Millisecond, 2 * time.Second},
		{3 * time.Second, 2 * time.Second},
		{3200 * time.Millisecond, 5 * time.Second},
		{4 * time.Minute, 5 * time.Minute},
		{24 * time.Hour, time.Hour},
	} {
		if got := topo.Bucket(tt.d).Delay; got != tt.want {
			t.Errorf("bucket(%v) = %v, want %v", tt.d, got, tt.want)
		}
	}
	if n := len(topo.Delays); n != 11 {
		t.Errorf("%d delay queues, want 11", n)
	}
	if got := topo.Bucket(5 * time.Second).Name; got != "q.delay.5000ms" {
		t.Errorf("name = %q", got)
	}
	for _, bad := range [][]time.Duration{{time.Microsecond}, {1000 * time.Hour}} {
		if _, err := newTopology("q", bad, false); err == nil {
			t.Errorf("delays %v accepted", bad)
		}
	}
	if _, err := newTopology("", nil, false); err == nil {
		t.Error("empty queue accepted")
	}
}

// deliveryLog records the deliveries a handler saw.
type deliveryLog struct {
	mu    sync.Mutex
	seen  []seen
	total atomic.Int64
}

type seen struct {
	id      string
	attempt int
	at      time.Time
	header  map[string]string
}

func (l *deliveryLog) add(m *redeliver.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, seen{m.ID, m.Attempt, time.Now(), m.Header})
	l.total.Add(1)
}

func (l *deliveryLog) of(id string) []seen {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []seen
	for _, s := range l.seen {
		if s.id == id {
			out = append(out, s)
		}
	}
	return out
}

func TestFailTwiceThenSucceed(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, false)
	var log deliveryLog
	var ok atomic.Int32
	// Delays of 200ms then 400ms (two of the buckets): the second gap exceeds the first
	// by 200ms, more than a loaded machine adds to either.
	policy := testPolicy(5)
	policy.Backoff.Base = 200 * time.Millisecond
	_, stop := consume(t, r.config(), redeliver.Config{Policy: policy, Handler: func(ctx context.Context, m *redeliver.Message) error {
		log.add(m)
		if m.Attempt < 3 {
			return errors.New("not yet")
		}
		ok.Add(1)
		return nil
	}})
	r.publish(t, "m1")
	eventually(t, 10*time.Second, "success", func() bool { return ok.Load() == 1 })
	r.quiesce(t, stop, 0) // nothing more arrives
	got := log.of("m1")
	if len(got) != 3 || ok.Load() != 1 {
		t.Fatalf("%d deliveries, %d successes, want 3 and 1", len(got), ok.Load())
	}
	for i, s := range got {
		if s.attempt != i+1 {
			t.Errorf("delivery %d has attempt %d", i, s.attempt)
		}
		if s.header["app"] != "yes" {
			t.Errorf("delivery %d lost the app header: %v", i, s.header)
		}
	}
	if got[1].header["x-retry-count"] != "1" || got[2].header["x-retry-count"] != "2" {
		t.Errorf("x-retry-count = %q, %q", got[1].header["x-retry-count"], got[2].header["x-retry-count"])
	}
	if got[1].header[redeliver.HeaderFirstFailure] == "" || got[1].header[redeliver.HeaderFirstFailure] != got[2].header[redeliver.HeaderFirstFailure] {
		t.Errorf("first failure header not kept: %v", got[2].header)
	}
	gap1, gap2 := got[1].at.Sub(got[0].at), got[2].at.Sub(got[1].at)
	t.Logf("delays: %v, %v", gap1, gap2)
	if gap1 < 200*time.Millisecond || gap2 < 400*time.Millisecond || gap2 <= gap1 {
		t.Errorf("delays %v then %v: want ≥200ms, then ≥400ms and growing", gap1, gap2)
	}
	r.expectQueues(t, 0)
}

func TestAlwaysFailing(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, false)
	var log deliveryLog
	_, stop := consume(t, r.config(), redeliver.Config{Policy: testPolicy(5), Handler: func(ctx context.Context, m *redeliver.Message) error {
		log.add(m)
		return fmt.Errorf("upstream down (attempt %d)", m.Attempt)
	}})
	r.publish(t, "m1")
	eventually(t, 15*time.Second, "dead letter", func() bool { return r.count(t, r.topo.DLQ) == 1 })
	r.quiesce(t, stop, 1)
	if n := len(log.of("m1")); n != 5 {
		t.Errorf("%d deliveries, want 5", n)
	}
	r.expectQueues(t, 1)

	dl, err := OpenDeadLetters(t.Context(), DeadLettersConfig{URL: r.url, Queue: r.queue})
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	d, err := dl.Get(t.Context(), "m1")
	if err != nil {
		t.Fatal(err)
	}
	h := d.Header
	if string(d.Body) != "m1" || d.ID != "m1" || d.ContentType != "text/plain" || h["app"] != "yes" {
		t.Errorf("body/properties/headers not kept: %+v", d.Message)
	}
	for k, want := range map[string]string{
		"x-retry-count":              "5",
		redeliver.HeaderReason:       "max-attempts",
		redeliver.HeaderError:        "upstream down (attempt 5)",
		redeliver.HeaderErrorClass:   "transient",
		redeliver.HeaderAttempts:     "5",
		redeliver.HeaderQueue:        r.queue,
		redeliver.HeaderFirstFailure: log.of("m1")[0].at.UTC().Format(time.RFC3339)[:10], // prefix: the date
	} {
		if got := h[k]; len(got) < len(want) || got[:len(want)] != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	info := d.Info
	if info.Attempts != 5 || info.Reason != redeliver.ReasonMaxAttempts || info.FirstFailure.IsZero() ||
		!info.LastFailure.After(info.FirstFailure) || info.Queue != r.queue {
		t.Errorf("info = %+v", info)
	}
	if first := log.of("m1")[0].at; info.FirstFailure.Before(first.Add(-time.Second)) || info.FirstFailure.After(first.Add(time.Second)) {
		t.Errorf("first failure %v, first delivery %v", info.FirstFailure, first)
	}
	// Peeking left it in place.
	if n := r.count(t, r.topo.DLQ); n != 1 {
		t.Errorf("DLQ holds %d after Get", n)
	}
}

func TestPermanentAndDecode(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, false)
	var log deliveryLog
	_, stop := consume(t, r.config(), redeliver.Config{Policy: testPolicy(5), Handler: func(ctx context.Context, m *redeliver.Message) error {
		log.add(m)
		if m.ID == "perm" {
			return retry.Permanent(errors.New("invalid account"))
		}
		var v struct{}
		return redeliver.DecodeJSON(m, &v) // "bad" is not JSON
	}})
	r.publish(t, "perm", "bad")
	eventually(t, 10*time.Second, "dead letters", func() bool { return r.count(t, r.topo.DLQ) == 2 })
	r.quiesce(t, stop, 2)
	if a, b := len(log.of("perm")), len(log.of("bad")); a != 1 || b != 1 {
		t.Errorf("deliveries %d and %d, want 1 each", a, b)
	}
	dl, err := OpenDeadLetters(t.Context(), DeadLettersConfig{URL: r.url, Queue: r.queue})
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	all, err := dl.List(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]redeliver.Reason{}
	for _, d := range all {
		reasons[d.ID] = d.Info.Reason
		if d.Info.Attempts != 1 {
			t.Errorf("%s: attempts %d", d.ID, d.Info.Attempts)
		}
	}
	if reasons["perm"] != redeliver.ReasonPermanent || reasons["bad"] != redeliver.ReasonDecode {
		t.Errorf("reasons = %v", reasons)
	}
	r.expectQueues(t, 2)
}

// TestQuorumDeliveryCount: a message the broker already delivered MaxDeliveries times
// without any settlement (the consumer crashed each time, before it could republish)
// goes to the DLQ without running the handler again, as max-deliver: no attempt
// recorded a failure, so it counts none.
func TestQuorumDeliveryCount(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, true)
	// Declare the quorum topology, then return the message three times.
	pre, err := NewSource(t.Context(), r.config())
	if err != nil {
		t.Fatal(err)
	}
	_ = pre.Close(t.Context())
	r.publish(t, "poison")
	ch, err := r.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		var d amqp.Delivery
		eventually(t, 5*time.Second, "the message", func() bool {
			var ok bool
			d, ok, err = ch.Get(r.queue, false)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		})
		if n, _ := intValue(d.Headers["x-delivery-count"]); int(n) != i {
			t.Logf("delivery %d: x-delivery-count %v", i, d.Headers["x-delivery-count"])
		}
		if err := d.Nack(false, true); err != nil {
			t.Fatal(err)
		}
	}
	_ = ch.Close()

	var log deliveryLog
	policy := testPolicy(3)
	policy.MaxDeliveries = 3
	consume(t, r.config(), redeliver.Config{Policy: policy, Handler: func(ctx context.Context, m *redeliver.Message) error {
		log.add(m)
		return nil
	}})
	eventually(t, 10*time.Second, "dead letter", func() bool { return r.count(t, r.topo.DLQ) == 1 })
	if n := log.total.Load(); n != 0 {
		t.Errorf("handler ran %d times, want 0", n)
	}
	dl, err := OpenDeadLetters(t.Context(), DeadLettersConfig{URL: r.url, Queue: r.queue, Quorum: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	d, err := dl.Get(t.Context(), "poison")
	if err != nil {
		t.Fatal(err)
	}
	if d.Info.Reason != redeliver.ReasonMaxDeliver || d.Info.Attempts != 0 || d.Info.Class != redeliver.ClassUnknown ||
		!strings.Contains(d.Info.Err, "delivered 4 times") {
		t.Errorf("info = %+v", d.Info)
	}
}

const crashChildEnv = "RETRYSAFE_REDELIVER_CRASH_CHILD"

// TestCrashChild is the consumer process TestCrashAfterRepublish kills: its handler fails
// the first attempt, and the process SIGKILLs itself after the retry copy was confirmed
// and before the original's ack.
func TestCrashChild(t *testing.T) {
	spec := os.Getenv(crashChildEnv)
	if spec == "" {
		t.Skip("run by TestCrashAfterRepublish")
	}
	q, _ := url.ParseQuery(spec)
	d := openDB(t, q.Get("schema"))
	cfg := Config{URL: q.Get("amqp"), Queue: q.Get("queue"), Delays: testDelays, Logger: quiet()}
	cfg.hook = func(point string, _ *Source) {
		if point == "retry-confirmed" {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // not reached: a SIGKILL a process sends itself is delivered before kill(2) returns
		}
	}
	consume(t, cfg, redeliver.Config{Policy: testPolicy(5), Handler: d.inbox.Handler(
		func(ctx context.Context, tx pgx.Tx, m *redeliver.Message) error {
			if err := d.write(ctx, tx, m); err != nil {
				return err
			}
			return errors.New("transient: rolled back") // the inbox row and the write roll back
		})})
	// The child runs until the hook kills it. If it never does, the test timeout the
	// parent gives it ends it, by an exit the parent reports.
	select {}
}

// TestCrashAfterRepublish kills a consumer process between the confirm of a retry copy
// and the ack of the original: the broker then holds two copies, both are processed,
// and the inbox lets exactly one of them write.
func TestCrashAfterRepublish(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, false)
	d := newDB(t)
	// Declare the topology before the child consumes.
	pre, err := NewSource(t.Context(), r.config())
	if err != nil {
		t.Fatal(err)
	}
	_ = pre.Close(t.Context())
	r.publish(t, "m1")

	// The child finds PostgreSQL as this process does, from the environment it inherits.
	spec := url.Values{"amqp": {r.url}, "queue": {r.queue}, "schema": {d.schema}}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1", "-test.timeout=60s")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+spec.Encode())
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die by SIGKILL: %v\n%s", err, out)
	}

	var calls, writes atomic.Int32
	var mu sync.Mutex
	var seen []string          // every delivery, for the failure message
	copies := map[string]int{} // deliveries by their attempt count header: "" the original, "1" the copy
	src, stop := consume(t, r.config(), redeliver.Config{Policy: testPolicy(5), Handler: func(ctx context.Context, m *redeliver.Message) error {
		calls.Add(1)
		err := d.inbox.Handler(func(ctx context.Context, tx pgx.Tx, m *redeliver.Message) error {
			writes.Add(1)
			return d.write(ctx, tx, m)
		})(ctx, m)
		mu.Lock()
		copies[m.Header[redeliver.DefaultHeader]]++
		seen = append(seen, fmt.Sprintf("attempt %d (header %q): %v", m.Attempt, m.Header[redeliver.DefaultHeader], err))
		mu.Unlock()
		return err
	}})
	// The original (redelivered at once) and the copy (after 50ms) both arrive.
	eventually(t, 10*time.Second, "both copies", func() bool { return calls.Load() >= 2 })
	r.quiesce(t, stop, 0)
	mu.Lock()
	defer mu.Unlock()
	// Both copies are processed, and exactly one writes. The broker delivers at least
	// once: a delivery beyond the two (an ack lost on a loaded broker) is allowed, and
	// the inbox must absorb it as well.
	if c, w := calls.Load(), writes.Load(); copies[""] == 0 || copies["1"] == 0 || w != 1 {
		t.Errorf("%d deliveries and %d business writes, want the original and the copy, and 1 write; %d connects; deliveries: %q",
			c, w, src.Connects(), seen)
	} else if c > 2 {
		t.Logf("%d deliveries, more than the two copies (%d connects): %q", c, src.Connects(), seen)
	}
	if total, distinct := d.rows(t); total != 1 || distinct != 1 {
		t.Errorf("business table has %d rows (%d ids), want 1", total, distinct)
	}
	r.expectQueues(t, 0)
}

// TestCrashBeforeAck: the connection dies after the business transaction committed and
// before the ack; the redelivery is absorbed by the inbox.
func TestCrashBeforeAck(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, false)
	d := newDB(t)
	cfg := r.config()
	var crashed atomic.Bool
	cfg.hook = func(point string, s *Source) {
		if point == "ack" && crashed.CompareAndSwap(false, true) {
			s.mu.Lock()
			sess := s.cur
			s.mu.Unlock()
			sess.close()
		}
	}
	var calls, writes atomic.Int32
	src, stop := consume(t, cfg, redeliver.Config{Policy: testPolicy(5), Handler: func(ctx context.Context, m *redeliver.Message) error {
		calls.Add(1)
		return d.inbox.Handler(func(ctx context.Context, tx pgx.Tx, m *redeliver.Message) error {
			writes.Add(1)
			return d.write(ctx, tx, m)
		})(ctx, m)
	}})
	r.publish(t, "m1")
	eventually(t, 10*time.Second, "the redelivery", func() bool { return calls.Load() >= 2 })
	r.quiesce(t, stop, 0)
	if c, w := calls.Load(), writes.Load(); c != 2 || w != 1 {
		t.Errorf("%d deliveries and %d business writes, want 2 and 1", c, w)
	}
	if total, _ := d.rows(t); total != 1 {
		t.Errorf("business table has %d rows, want 1", total)
	}
	if n := src.Connects(); n < 2 {
		t.Errorf("%d connects, want a reconnect", n)
	}
}

// TestReconnect cuts every connection of the consumer (as a broker restart does) while
// its handlers are in their transactions, and refuses new ones until it has tried to
// reconnect twice, while messages keep arriving: none is lost.
func TestReconnect(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, false)
	d := newDB(t)
	u, err := url.Parse(r.url)
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, u.Host)
	cfg := r.config()
	pu := *u
	pu.Host = p.addr()
	cfg.URL = pu.String()
	cfg.Reconnect = retry.Policy{Base: 50 * time.Millisecond, Cap: 200 * time.Millisecond}
	// The first deliveries (one per handler) wait in their transaction until the
	// connections are cut: their acks are lost, and the inbox absorbs the redeliveries.
	const concurrency = 8
	cut := make(chan struct{})
	var writes, held atomic.Int32
	src, _ := consume(t, cfg, redeliver.Config{Policy: testPolicy(5), Concurrency: concurrency,
		Handler: d.inbox.Handler(func(ctx context.Context, tx pgx.Tx, m *redeliver.Message) error {
			writes.Add(1)
			if held.Add(1) <= concurrency {
				select {
				case <-cut:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return d.write(ctx, tx, m)
		})})
	const n = 300
	var ids []string
	for i := range n {
		ids = append(ids, "m"+strconv.Itoa(i))
	}
	// A third of the messages before the cut, a third while the consumer is cut off and
	// tries to reconnect (refused twice), a third after.
	r.publish(t, ids[:n/3]...)
	eventually(t, 10*time.Second, "every handler in a transaction", func() bool { return held.Load() >= concurrency })
	p.cut()
	close(cut)
	r.publish(t, ids[n/3:2*n/3]...)
	eventually(t, 10*time.Second, "two refused reconnections", func() bool { return p.refusals() >= 2 })
	p.resume()
	r.publish(t, ids[2*n/3:]...)
	eventually(t, 20*time.Second, "every message", func() bool { total, _ := d.rows(t); return total == n })
	eventually(t, 5*time.Second, "empty queues", func() bool { return r.count(t, r.queue) == 0 })
	if total, distinct := d.rows(t); total != n || distinct != n {
		t.Errorf("business rows %d (%d ids), want %d", total, distinct, n)
	}
	if c := src.Connects(); c < 2 {
		t.Errorf("%d connects, want a reconnect", c)
	}
	t.Logf("%d business writes for %d messages, %d connects", writes.Load(), n, src.Connects())
	r.expectQueues(t, 0)
}

// TestBulk: many messages, 10% failing transiently (once or twice), 1% failing
// transiently every time and 1% permanently: every other message is processed exactly
// once, and the always-failing ones are all in the DLQ. 2,000 messages; 10,000 with
// RETRYSAFE_LONG=1.
func TestBulk(t *testing.T) {
	t.Parallel()
	n := 2000
	if os.Getenv("RETRYSAFE_LONG") == "1" {
		n = 10000
	}
	r := newRMQ(t, false)
	d := newDB(t)
	kind := func(i int) string {
		switch {
		case i%100 == 7:
			return "permanent"
		case i%100 == 13:
			return "always"
		case i%10 == 3:
			return "transient"
		}
		return "ok"
	}
	var ids []string
	want := map[string]int{}
	for i := range n {
		ids = append(ids, strconv.Itoa(i))
		want[kind(i)]++
	}
	cfg := r.config()
	cfg.Prefetch = 64
	var deliveries atomic.Int32
	start := time.Now()
	_, stop := consume(t, cfg, redeliver.Config{Policy: testPolicy(3), Concurrency: 32,
		Handler: d.inbox.Handler(func(ctx context.Context, tx pgx.Tx, m *redeliver.Message) error {
			deliveries.Add(1)
			i, err := strconv.Atoi(m.ID)
			if err != nil {
				return redeliver.Decode(err)
			}
			switch kind(i) {
			case "permanent":
				return retry.Permanent(errors.New("rejected"))
			case "always":
				return errors.New("still failing")
			case "transient":
				if m.Attempt < 1+i%2+1 { // fails once or twice
					return errors.New("blip")
				}
			}
			return d.write(ctx, tx, m)
		})})
	r.publish(t, ids...)
	dead := want["permanent"] + want["always"]
	eventually(t, 60*time.Second, "all processed", func() bool {
		total, _ := d.rows(t)
		return total == n-dead && r.count(t, r.topo.DLQ) == dead
	})
	el := time.Since(start)
	r.quiesce(t, stop, dead)
	total, distinct := d.rows(t)
	if total != n-dead || distinct != n-dead {
		t.Errorf("business rows %d (%d ids), want %d", total, distinct, n-dead)
	}
	r.expectQueues(t, dead)
	t.Logf("%d messages (%v) in %v: %.0f msg/s, %d deliveries; business rows %d, DLQ %d",
		n, want, el.Round(time.Millisecond), float64(n)/el.Seconds(), deliveries.Load(), total, r.count(t, r.topo.DLQ))
}

func TestDeadLettersReplayAndPurge(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, false)
	var healthy atomic.Bool
	var log deliveryLog
	var ok sync.Map
	consume(t, r.config(), redeliver.Config{Policy: testPolicy(2), Handler: func(ctx context.Context, m *redeliver.Message) error {
		log.add(m)
		if !healthy.Load() {
			return errors.New("dependency down")
		}
		ok.Store(m.ID, m.Attempt)
		return nil
	}})
	r.publish(t, "a", "b", "c", "d")
	eventually(t, 10*time.Second, "dead letters", func() bool { return r.count(t, r.topo.DLQ) == 4 })

	dl, err := OpenDeadLetters(t.Context(), DeadLettersConfig{URL: r.url, Queue: r.queue})
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	var _ redeliver.DeadLetters = dl
	list, err := dl.List(t.Context(), 2)
	if err != nil || len(list) != 2 {
		t.Fatalf("List(2) = %d, %v", len(list), err)
	}
	if all, err := dl.List(t.Context(), 0); err != nil || len(all) != 4 {
		t.Fatalf("List = %d, %v", len(all), err)
	}
	if _, err := dl.Get(t.Context(), "nope"); !errors.Is(err, redeliver.ErrNotFound) {
		t.Errorf("Get(nope) = %v, want ErrNotFound", err)
	}
	if n, err := dl.Purge(t.Context(), "d"); err != nil || n != 1 {
		t.Errorf("Purge(d) = %d, %v", n, err)
	}

	healthy.Store(true)
	if n, err := dl.Replay(t.Context(), "a"); err != nil || n != 1 {
		t.Fatalf("Replay(a) = %d, %v", n, err)
	}
	eventually(t, 5*time.Second, "a processed", func() bool { _, done := ok.Load("a"); return done })
	if n, err := dl.Replay(t.Context()); err != nil || n != 2 {
		t.Fatalf("Replay() = %d, %v", n, err)
	}
	eventually(t, 5*time.Second, "b and c processed", func() bool {
		_, b := ok.Load("b")
		_, c := ok.Load("c")
		return b && c
	})
	for _, id := range []string{"a", "b", "c"} {
		if at, _ := ok.Load(id); at != 1 {
			t.Errorf("%s replayed at attempt %v, want 1 (count reset)", id, at)
		}
		last := log.of(id)
		if h := last[len(last)-1].header; h["x-retry-count"] != "" || h[redeliver.HeaderReason] != "" || h["app"] != "yes" {
			t.Errorf("%s replayed with headers %v", id, h)
		}
	}
	if _, done := ok.Load("d"); done {
		t.Error("purged message processed")
	}
	r.expectQueues(t, 0)

	// Purge all.
	healthy.Store(false)
	r.publish(t, "e", "f")
	eventually(t, 10*time.Second, "dead letters", func() bool { return r.count(t, r.topo.DLQ) == 2 })
	if n, err := dl.Purge(t.Context()); err != nil || n != 2 {
		t.Errorf("Purge() = %d, %v", n, err)
	}
	r.expectQueues(t, 0)
}

// A read of the DLQ (List, Get) takes the messages and requeues them; a quorum queue
// applies the requeue after the channel is done. Each read returns only once the
// messages are back: a count, a list or a purge right after it sees every one of them.
func TestDeadLettersReadLeavesThemCounted(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, true)
	consume(t, r.config(), redeliver.Config{Policy: testPolicy(2), Handler: func(ctx context.Context, m *redeliver.Message) error {
		return retry.Permanent(errors.New("refused"))
	}})
	const n = 60
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "rd-" + strconv.Itoa(i)
	}
	r.publish(t, ids...)
	eventually(t, 20*time.Second, "the dead letters", func() bool { return r.count(t, r.topo.DLQ) == n })
	dl, err := OpenDeadLetters(t.Context(), DeadLettersConfig{URL: r.url, Queue: r.queue, Quorum: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	short := 0
	for range 10 {
		all, err := dl.List(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		counted := r.count(t, r.topo.DLQ)
		if len(all) != n || counted != n {
			short++
			t.Logf("List returned %d, then the DLQ counted %d; want %d and %d", len(all), counted, n, n)
		}
	}
	if short > 0 {
		t.Errorf("%d of 10 reads of the DLQ were short or left it short", short)
	}
}

func TestOpenDeadLettersMissing(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	_, err := OpenDeadLetters(t.Context(), DeadLettersConfig{URL: url, Queue: testenv.Name("missing")})
	if !errors.Is(err, redeliver.ErrNotFound) {
		t.Errorf("err = %v, want ErrNotFound", err)
	}
}

func TestPublisher(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, false)
	pre, err := NewSource(t.Context(), r.config())
	if err != nil {
		t.Fatal(err)
	}
	_ = pre.Close(t.Context())
	p, err := NewPublisher(t.Context(), PublisherConfig{URL: r.url})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	m := &redeliver.Message{ID: "x", Body: []byte("hi"), ContentType: "text/plain", Header: map[string]string{"k": "v"}}
	if err := p.Publish(t.Context(), r.queue, m); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(t.Context(), testenv.Name("nowhere"), m); !errors.Is(err, ErrUnroutable) {
		t.Errorf("publish to a missing queue: %v, want ErrUnroutable", err)
	}
	// Concurrent publishes, one of them unroutable, are confirmed independently.
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := r.queue
			if i == 7 {
				q = testenv.Name("nowhere")
			}
			errs[i] = p.Publish(t.Context(), q, &redeliver.Message{ID: "c" + strconv.Itoa(i), Body: []byte("x")})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if (i == 7) != errors.Is(err, ErrUnroutable) || (i != 7 && err != nil) {
			t.Errorf("publish %d: %v", i, err)
		}
	}
	if n := r.count(t, r.queue); n != 20 {
		t.Errorf("queue holds %d, want 20", n)
	}
	_ = p.Close()
	if err := p.Publish(t.Context(), r.queue, m); !errors.Is(err, redeliver.ErrClosed) {
		t.Errorf("publish after close: %v", err)
	}
}

func TestNewSourceErrors(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, false)
	if _, err := NewSource(t.Context(), Config{Queue: "q"}); err == nil {
		t.Error("no URL accepted")
	}
	if _, err := NewSource(t.Context(), Config{URL: r.url}); err == nil {
		t.Error("no queue accepted")
	}
	if _, err := NewSource(t.Context(), Config{URL: "amqp://guest:guest@" + testenv.DeadAddr(t) + "/", Queue: "q"}); err == nil {
		t.Error("dead broker accepted")
	}
	// Declaring twice is idempotent; declaring with another type fails.
	for range 2 {
		s, err := NewSource(t.Context(), r.config())
		if err != nil {
			t.Fatal(err)
		}
		_ = s.Close(t.Context())
	}
	cfg := r.config()
	cfg.Quorum = true
	if s, err := NewSource(t.Context(), cfg); err == nil {
		_ = s.Close(t.Context())
		t.Error("redeclaring a classic queue as quorum succeeded")
	}
}

// TestCopyDropsCC: a retry copy must not be routed to the original's CC queues again.
func TestCopyDropsCC(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, false)
	var log deliveryLog
	_, stop := consume(t, r.config(), redeliver.Config{Policy: testPolicy(5), Handler: func(ctx context.Context, m *redeliver.Message) error {
		log.add(m)
		if m.Attempt < 3 {
			return errors.New("again")
		}
		return nil
	}})
	ch, err := r.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	cc := testenv.Name("cc")
	if _, err := ch.QueueDeclare(cc, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := r.admin.Channel(); err == nil {
			_, _ = c.QueueDelete(cc, false, false, false)
			_ = c.Close()
		}
	})
	if err := ch.PublishWithContext(t.Context(), "", r.queue, false, false, amqp.Publishing{
		MessageId: "cc1", Body: []byte("x"), Headers: amqp.Table{"CC": []any{cc}},
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "three deliveries", func() bool { return len(log.of("cc1")) == 3 })
	r.quiesce(t, stop, 0)
	if n := r.count(t, cc); n != 1 {
		t.Errorf("CC queue holds %d, want the original's 1", n)
	}
	r.expectQueues(t, 0)
}
