package jetstream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/sqlitebox/sqliteboxtest"
	"github.com/retrysafe/retrysafe/retry"
)

// A handler failing twice then succeeding: exactly three deliveries, growing delays,
// one success, nothing left anywhere.
func TestFailTwiceThenSucceed(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		cfg := newConfig(t, url)
		// Waits of 250ms then 500ms: the second gap exceeds the first by 250ms, more
		// than a loaded machine adds to either.
		cfg.Policy.Backoff = retry.Policy{Base: 250 * time.Millisecond, Cap: time.Second, Jitter: retry.JitterNone}
		rec := newRecorder()
		r := run(t, cfg, func(_ context.Context, m *redeliver.Message) error {
			rec.delivered(m)
			if m.Attempt < 3 {
				return errors.New("flaky downstream")
			}
			rec.succeeded(m.ID)
			return nil
		}, nil)
		nc := connect(t, url)
		publish(t, nc, cfg, "pay-1")
		eventually(t, 10*time.Second, "a success", func() bool { return rec.success("pay-1") == 1 })
		quiesce(t, nc, cfg, r, state{}) // no extra delivery comes

		rec.mu.Lock()
		times, attempts := rec.times["pay-1"], rec.attempts["pay-1"]
		rec.mu.Unlock()
		if len(times) != 3 || rec.success("pay-1") != 1 {
			t.Fatalf("%d deliveries, %d successes; want 3 and 1", len(times), rec.success("pay-1"))
		}
		if fmt.Sprint(attempts) != "[1 2 3]" {
			t.Errorf("attempts %v, want [1 2 3]", attempts)
		}
		gap1, gap2 := times[1].Sub(times[0]), times[2].Sub(times[1])
		if gap1 < 250*time.Millisecond || gap2 < 500*time.Millisecond || gap2 <= gap1 {
			t.Errorf("delays %v then %v; want ≥250ms then ≥500ms, growing", gap1, gap2)
		}
		eventually(t, 5*time.Second, "an empty queue", func() bool {
			st := queueState(t, nc, cfg)
			return st == state{}
		})
	})
}

// A handler failing always: exactly MaxAttempts deliveries, then one message in the DLQ
// with every header; nothing left in the work stream or the consumer.
func TestAlwaysFailingIsDeadLettered(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		cfg := newConfig(t, url)
		rec := newRecorder()
		start := time.Now()
		r := run(t, cfg, func(_ context.Context, m *redeliver.Message) error {
			rec.delivered(m)
			return fmt.Errorf("attempt %d: connection refused", m.Attempt)
		}, nil)
		nc := connect(t, url)
		publish(t, nc, cfg, "grant-7")
		dl := deadLetters(t, cfg)
		var list []redeliver.DeadLetter
		eventually(t, 10*time.Second, "a dead letter", func() bool {
			var err error
			list, err = dl.List(context.Background(), 0)
			return err == nil && len(list) == 1
		})
		quiesce(t, nc, cfg, r, state{dlq: 1})
		if n := rec.deliveries("grant-7"); n != 3 {
			t.Errorf("%d deliveries, want MaxAttempts = 3", n)
		}
		d := list[0]
		if d.ID != "grant-7" || string(d.Body) != "body of grant-7" || d.ContentType != "text/plain" || d.Header["tenant"] != "acme" {
			t.Errorf("dead letter lost the message: id %q body %q type %q header %v", d.ID, d.Body, d.ContentType, d.Header)
		}
		want := map[string]string{
			redeliver.HeaderReason:     string(redeliver.ReasonMaxAttempts),
			redeliver.HeaderError:      "attempt 3: connection refused",
			redeliver.HeaderErrorClass: string(redeliver.ClassTransient),
			redeliver.HeaderAttempts:   "3",
			redeliver.HeaderQueue:      cfg.Queue,
			redeliver.DefaultHeader:    "3",
		}
		for k, v := range want {
			if d.Header[k] != v {
				t.Errorf("header %s = %q, want %q", k, d.Header[k], v)
			}
		}
		first, last := d.Info.FirstFailure, d.Info.LastFailure
		if first.Before(start.Add(-time.Second)) || last.Before(first) || last.After(time.Now().Add(time.Second)) {
			t.Errorf("failure times first %v last %v (test started %v)", first, last, start)
		}
		if d.Info.Queue != cfg.Queue || d.Info.Attempts != 3 || d.Info.Reason != redeliver.ReasonMaxAttempts {
			t.Errorf("parsed info %+v", d.Info)
		}
		eventually(t, 5*time.Second, "nothing left but the dead letter", func() bool {
			return queueState(t, nc, cfg) == state{dlq: 1}
		})
	})
}

// A permanent error (or a decode failure) goes to the DLQ after one delivery.
func TestPermanentErrorIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		cfg := newConfig(t, url)
		rec := newRecorder()
		r := run(t, cfg, func(_ context.Context, m *redeliver.Message) error {
			rec.delivered(m)
			if m.ID == "bad-json" {
				return redeliver.Decode(errors.New("unexpected end of JSON input"))
			}
			return retry.Permanent(errors.New("account closed"))
		}, nil)
		nc := connect(t, url)
		publish(t, nc, cfg, "closed-acct", "bad-json")
		dl := deadLetters(t, cfg)
		eventually(t, 10*time.Second, "two dead letters", func() bool {
			l, err := dl.List(context.Background(), 0)
			return err == nil && len(l) == 2
		})
		// A dead letter is listed once its PubAck came, before the +TERM that removes
		// its message from the work stream (DeadLetter): the queue is waited for, not
		// read once. Then no other delivery can still come.
		quiesce(t, nc, cfg, r, state{dlq: 2})
		for id, reason := range map[string]redeliver.Reason{"closed-acct": redeliver.ReasonPermanent, "bad-json": redeliver.ReasonDecode} {
			d, err := dl.Get(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if d.Info.Reason != reason || d.Info.Attempts != 1 {
				t.Errorf("%s: reason %q attempts %d, want %q after 1", id, d.Info.Reason, d.Info.Attempts, reason)
			}
			if n := rec.deliveries(id); n != 1 {
				t.Errorf("%s: %d deliveries, want 1", id, n)
			}
		}
	})
}

// A handler slower than AckWait keeps its message with InProgress: no redelivery.
func TestSlowHandlerKeptAliveByInProgress(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		cfg := newConfig(t, url)
		// InProgress every 2s keeps a 6s AckWait: a loaded machine may delay one by 4s
		// before the server redelivers. The server's AckWait runs in real time, and a
		// busy machine stalls a goroutine for more than a second.
		cfg.AckWait = 6 * time.Second
		rec := newRecorder()
		r := run(t, cfg, func(ctx context.Context, m *redeliver.Message) error {
			rec.delivered(m)
			select {
			case <-time.After(2*cfg.AckWait + 500*time.Millisecond): // more than two AckWaits
			case <-ctx.Done():
				return ctx.Err()
			}
			rec.succeeded(m.ID)
			return nil
		}, nil)
		src := r.src
		if hb := src.Heartbeat(); hb != cfg.AckWait/3 {
			t.Errorf("Heartbeat() = %v, want AckWait/3", hb)
		}
		nc := connect(t, url)
		publish(t, nc, cfg, "slow-1")
		eventually(t, time.Minute, "a success", func() bool { return rec.success("slow-1") == 1 })
		quiesce(t, nc, cfg, r, state{}) // a redelivery the server sent would come before the marker
		if n := rec.deliveries("slow-1"); n != 1 {
			t.Errorf("%d deliveries, want 1 (InProgress must keep the message)", n)
		}
		eventually(t, 5*time.Second, "an empty queue", func() bool { return queueState(t, nc, cfg) == state{} })
	})
}

// The consumer dies after its business write but before its ack (its connection closes):
// the server redelivers after AckWait to another consumer, and the inbox (sqlitebox,
// the id recorded in the business transaction) absorbs the duplicate: the business
// table has one row.
func TestKilledMidHandlingIsRedelivered(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		ctx := context.Background()
		cfg := newConfig(t, url)
		cfg.AckWait = time.Second
		db, box := sqliteboxtest.Open(t, "CREATE TABLE orders (id TEXT PRIMARY KEY)")
		write := func(ctx context.Context, tx *sql.Tx, m *redeliver.Message) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES (?)", m.ID)
			return err
		}
		var deliveries atomic.Int32

		// Process A: commits its write and the inbox row, then hangs until it is killed.
		connA := connect(t, url)
		cfgA := cfg
		cfgA.Conn = connA
		wrote := make(chan struct{})
		var once sync.Once
		a := run(t, cfgA, func(ctx context.Context, m *redeliver.Message) error {
			deliveries.Add(1)
			if _, err := box.Do(ctx, m, func(ctx context.Context, tx *sql.Tx) error { return write(ctx, tx, m) }); err != nil {
				return err
			}
			once.Do(func() { close(wrote) })
			<-ctx.Done()
			return ctx.Err()
		}, func(c *redeliver.Config) { c.ShutdownGrace = -1; c.Heartbeat = -1 })
		nc := connect(t, url)
		publish(t, nc, cfg, "order-42")
		select {
		case <-wrote:
		case <-time.After(10 * time.Second):
			t.Fatal("process A never got the message")
		}
		connA.Close() // the crash: no ack, no nak, no heartbeat
		t.Logf("process A stopped: %v", a.stop())

		// Process B gets it after AckWait; the inbox says it is done.
		var ranB, attemptB, countB atomic.Int32
		handler := box.Handler(func(ctx context.Context, tx *sql.Tx, m *redeliver.Message) error {
			ranB.Add(1)
			return write(ctx, tx, m)
		})
		run(t, cfg, func(ctx context.Context, m *redeliver.Message) error {
			deliveries.Add(1)
			attemptB.Store(int32(m.Attempt))
			countB.Store(int32(m.DeliveryCount))
			return handler(ctx, m)
		}, nil)
		eventually(t, 10*time.Second, "the redelivery", func() bool { return deliveries.Load() == 2 })
		eventually(t, 5*time.Second, "an empty queue", func() bool { return queueState(t, nc, cfg) == state{} })
		var rows int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM orders").Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if deliveries.Load() != 2 || rows != 1 || ranB.Load() != 0 {
			t.Errorf("%d deliveries, %d business rows, B ran the write %d times; want 2, 1, 0", deliveries.Load(), rows, ranB.Load())
		}
		// A run that died with its process reported no failure: it spends no attempt
		// (Policy.MaxDeliveries bounds such runs), though the server counts it.
		if attemptB.Load() != 1 || countB.Load() != 2 {
			t.Errorf("the redelivery is attempt %d, delivery %d; want attempt 1, delivery 2", attemptB.Load(), countB.Load())
		}
	})
}

// 2,000 messages (10,000 with RETRYSAFE_LONG=1), 10% failing once, 1% failing for good:
// every other message processed exactly once, every permanent failure in the DLQ. 10,000
// take 8–10 s per server under -race on the project's 2-core machine when it is quiet,
// two or three times that under the other builds' load, so they are not the default.
func TestManyMessages(t *testing.T) {
	t.Parallel()
	n := 2000
	if os.Getenv("RETRYSAFE_LONG") == "1" {
		n = 10000
	}
	forEach(t, func(t *testing.T, url string) {
		cfg := newConfig(t, url)
		cfg.Policy.Backoff = retry.Policy{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond}
		rec := newRecorder()
		var transient atomic.Int32
		permanent := map[string]bool{}
		ids := make([]string, n)
		for i := range ids {
			ids[i] = "m-" + strconv.Itoa(i)
			if i%100 == 7 {
				permanent[ids[i]] = true
			}
		}
		r := run(t, cfg, func(_ context.Context, m *redeliver.Message) error {
			i, err := strconv.Atoi(m.ID[2:])
			if err != nil {
				return redeliver.Decode(err)
			}
			switch {
			case i%100 == 7:
				return retry.Permanent(errors.New("rejected"))
			case i%10 == 0 && m.Attempt == 1:
				transient.Add(1)
				return errors.New("transient")
			}
			rec.succeeded(m.ID)
			return nil
		}, func(c *redeliver.Config) { c.Concurrency = 32 })

		start := time.Now()
		nc := connect(t, url)
		p, err := NewPublisher(nc)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < n; i += 8 {
					if err := p.Publish(context.Background(), cfg.Queue, &redeliver.Message{ID: ids[i], Body: []byte(ids[i])}); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		want := n - len(permanent)
		progress := &struct { // the last poll's, reported (through the pointer) on a timeout
			Successes int
			State     state
		}{}
		testenv.Eventually(t, 2*time.Minute, func() bool {
			progress.Successes, progress.State = rec.totalSuccesses(), queueState(t, nc, cfg)
			return progress.Successes >= want && progress.State.dlq >= uint64(len(permanent))
		}, "%d successes and %d dead letters, at the last poll %+v", want, len(permanent), progress)
		elapsed := time.Since(start)
		quiesce(t, nc, cfg, r, state{dlq: uint64(len(permanent))})
		for _, id := range ids {
			got := rec.success(id)
			if permanent[id] && got != 0 || !permanent[id] && got != 1 {
				t.Fatalf("%s processed %d times", id, got)
			}
		}
		dl, err := deadLetters(t, cfg).List(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(dl) != len(permanent) {
			t.Errorf("%d dead letters, want %d", len(dl), len(permanent))
		}
		for _, d := range dl {
			if !permanent[d.ID] {
				t.Errorf("%s dead-lettered", d.ID)
			}
		}
		if got, want := int(transient.Load()), n/10; got != want {
			t.Errorf("%d transient failures, want %d", got, want)
		}
		eventually(t, 5*time.Second, "nothing left", func() bool {
			return queueState(t, nc, cfg) == state{dlq: uint64(len(permanent))}
		})
		t.Logf("%d messages: %d processed once, %d retried once, %d dead-lettered, in %v",
			n, rec.totalSuccesses(), transient.Load(), len(dl), elapsed.Round(time.Millisecond))
	})
}

// A message the server stops redelivering at MaxDeliver (here 1, below MaxAttempts)
// does not vanish: the advisory makes the Source move it to the DLQ.
func TestMaxDeliverAdvisoryMovesOrphanToDLQ(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		cfg := newConfig(t, url)
		cfg.MaxDeliver = 1
		rec := newRecorder()
		r := run(t, cfg, func(_ context.Context, m *redeliver.Message) error {
			rec.delivered(m)
			return errors.New("try again")
		}, nil)
		nc := connect(t, url)
		publish(t, nc, cfg, "orphan-1")
		dl := deadLetters(t, cfg)
		var d *redeliver.DeadLetter
		eventually(t, 10*time.Second, "the orphan in the DLQ", func() bool {
			var err error
			d, err = dl.Get(context.Background(), "orphan-1")
			return err == nil
		})
		if d.Info.Reason != ReasonMaxDeliver || d.Info.Attempts != 1 || d.Info.Class != ClassUnknown || string(d.Body) != "body of orphan-1" {
			t.Errorf("orphan dead letter %+v body %q", d.Info, d.Body)
		}
		if n := rec.deliveries("orphan-1"); n != 1 {
			t.Errorf("%d deliveries, want 1", n)
		}
		eventually(t, 5*time.Second, "Rescued() = 1", func() bool { return r.src.Rescued() == 1 })
		eventually(t, 5*time.Second, "only the dead letter", func() bool { return queueState(t, nc, cfg) == state{dlq: 1} })
	})
}

// An orphan made while no Source listened (the advisory went unheard) is found by the
// next Source's sweep, which cannot tell it from a message whose acknowledgement a
// crash lost: it publishes it again under its id, its failure record (two failed
// attempts) with it. When the copy becomes an orphan in turn, the sweep moves it to the
// DLQ, with the two attempts and the first failure's time the record holds.
func TestSweepFindsUnheardOrphan(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		cfg := newConfig(t, url)
		cfg.MaxDeliver = 1
		cfg.AckWait = 200 * time.Millisecond
		ctx := context.Background()
		if err := Declare(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		nc := connect(t, url)
		c, _ := cfg.withDefaults()
		// The server gives the message up when its AckWait passes (MaxDeliver 1) and
		// says so in an advisory, which no Source hears: the test does.
		advisories := make(chan *nats.Msg, 1)
		sub, err := nc.ChanSubscribe("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."+c.Stream+"."+c.Consumer, advisories)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		j, _ := js.New(nc)
		cons, err := j.Consumer(ctx, c.Stream, c.Consumer)
		if err != nil {
			t.Fatal(err)
		}
		// orphan has a raw client take the next message and die without a word, and
		// returns its headers and stream sequence.
		orphan := func() (nats.Header, uint64) {
			t.Helper()
			m, err := cons.Next(js.FetchMaxWait(5 * time.Second))
			if err != nil {
				t.Fatal(err)
			}
			md, _ := m.Metadata()
			if md.NumDelivered != 1 {
				t.Fatalf("NumDelivered %d", md.NumDelivered)
			}
			// Its last pull request is still waiting: a 2.9 server acts on an expired
			// message only while a pull asks for more, newer ones by themselves.
			b, err := cons.Fetch(1, js.FetchMaxWait(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-advisories:
			case <-time.After(10 * time.Second):
				t.Fatal("no MaxDeliver advisory")
			}
			// The request ends empty-handed, before a copy could go to it.
			for m := range b.Messages() {
				t.Fatalf("pulled %q while waiting for the advisory", m.Headers().Get(HeaderID))
			}
			return m.Headers(), md.Sequence.Stream
		}
		publish(t, nc, cfg, "lost-1")
		_, seq := orphan()
		// Two attempts of it had failed, the first at failedAt.
		failedAt := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
		kv, err := j.KeyValue(ctx, c.FailureBucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.PutString(ctx, failureKey(seq), failure{attempts: 2, first: failedAt}.String()); err != nil {
			t.Fatal(err)
		}

		// A Source's start sweep publishes it again.
		src, err := NewSource(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the orphan published again", func() bool {
			st := queueState(t, nc, cfg)
			return st.work == 1 && st.unpulled == 1 && st.dlq == 0
		})
		if err := src.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if src.Rescued() != 0 {
			t.Errorf("Rescued() = %d after publishing the orphan again, want 0", src.Rescued())
		}
		h, _ := orphan()
		if got := messageID(h, c.Stream, 0); got != "lost-1" {
			t.Errorf("the copy's id is %q, want lost-1", got)
		}
		if got := h.Get(HeaderSwept); got != "1" {
			t.Errorf("the copy's %s = %q, want 1", HeaderSwept, got)
		}
		if got, want := h.Get(HeaderFailed), "2 2026-12-01T09:30:00Z"; got != want {
			t.Errorf("the copy's %s = %q, want %q", HeaderFailed, got, want)
		}

		// The copy, an orphan again, goes to the DLQ.
		r := run(t, cfg, func(context.Context, *redeliver.Message) error {
			t.Error("an orphan was delivered again")
			return nil
		}, nil)
		dl := deadLetters(t, cfg)
		var d *redeliver.DeadLetter
		eventually(t, 10*time.Second, "the orphan in the DLQ", func() bool {
			d, err = dl.Get(ctx, "lost-1")
			return err == nil
		})
		if d.Info.Reason != ReasonMaxDeliver || d.Info.Attempts != 2 || !d.Info.FirstFailure.Equal(failedAt) ||
			d.Info.Class != ClassUnknown || string(d.Body) != "body of lost-1" {
			t.Errorf("orphan dead letter %+v body %q; want max-deliver, class unknown, 2 attempts, first failure %v", d.Info, d.Body, failedAt)
		}
		if _, ok := d.Header[HeaderFailed]; ok {
			t.Errorf("the dead letter's headers hold %s: %v", HeaderFailed, d.Header)
		}
		eventually(t, 5*time.Second, "Rescued() = 1", func() bool { return r.src.Rescued() == 1 })
		eventually(t, 5*time.Second, "only the dead letter", func() bool { return queueState(t, nc, cfg) == state{dlq: 1} })
	})
}

// The failure bucket holds a record only while its message is being retried: success
// and dead-lettering delete it, so the bucket does not grow with the traffic.
func TestFailureRecordsDeleted(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		cfg := newConfig(t, url)
		rec := newRecorder()
		run(t, cfg, func(_ context.Context, m *redeliver.Message) error {
			rec.delivered(m)
			switch {
			case m.Attempt == 1:
				return errors.New("once")
			case m.ID == "fr-dead":
				return retry.Permanent(errors.New("then for good"))
			}
			rec.succeeded(m.ID)
			return nil
		}, nil)
		nc := connect(t, url)
		publish(t, nc, cfg, "fr-ok", "fr-dead")
		dl := deadLetters(t, cfg)
		eventually(t, 10*time.Second, "one success and one dead letter", func() bool {
			_, err := dl.Get(context.Background(), "fr-dead")
			return rec.success("fr-ok") == 1 && err == nil
		})
		c, _ := cfg.withDefaults()
		j, _ := js.New(nc)
		kv, err := j.KeyValue(context.Background(), c.FailureBucket)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "an empty failure bucket", func() bool {
			keys, err := kv.Keys(context.Background())
			return errors.Is(err, js.ErrNoKeysFound) || (err == nil && len(keys) == 0)
		})
	})
}
