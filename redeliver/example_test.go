package redeliver_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/sqlitebox"
	"github.com/retrysafe/retrysafe/retry"
)

// memQueue is a minimal in-memory backend: a Source whose Retry re-enqueues a copy with
// the new headers after the delay (a timer, never a sleep holding the delivery), and
// whose DeadLetter appends to a slice.
type memQueue struct {
	name  string
	ch    chan *redeliver.Message
	mu    sync.Mutex
	dead  []redeliver.DeadLetter
	wg    sync.WaitGroup
	onDLQ func()
	onAck func()
}

func newMemQueue(name string) *memQueue {
	return &memQueue{name: name, ch: make(chan *redeliver.Message, 16)}
}

func (q *memQueue) Publish(_ context.Context, _ string, m *redeliver.Message) error {
	c := *m
	c.Queue, c.Header = q.name, maps.Clone(m.Header)
	if c.Header == nil {
		c.Header = map[string]string{}
	}
	q.ch <- &c
	return nil
}

func (q *memQueue) Receive(ctx context.Context) (redeliver.Delivery, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case m := <-q.ch:
		return &memDelivery{q: q, m: m}, nil
	}
}

func (q *memQueue) Close(context.Context) error { q.wg.Wait(); return nil }

type memDelivery struct {
	q *memQueue
	m *redeliver.Message
}

func (d *memDelivery) Message() *redeliver.Message { return d.m }
func (d *memDelivery) Ack(context.Context) error {
	if d.q.onAck != nil {
		d.q.onAck()
	}
	return nil
}
func (d *memDelivery) Release(context.Context) error    { d.q.ch <- d.m; return nil }
func (d *memDelivery) InProgress(context.Context) error { return nil }
func (d *memDelivery) DeadLetter(_ context.Context, info redeliver.DeadInfo) error {
	m := *d.m
	m.Header = maps.Clone(d.m.Header)
	maps.Copy(m.Header, info.Header())
	d.q.mu.Lock()
	d.q.dead = append(d.q.dead, redeliver.DeadLetter{Message: m, Info: info})
	d.q.mu.Unlock()
	if d.q.onDLQ != nil {
		d.q.onDLQ()
	}
	return nil
}
func (d *memDelivery) Retry(_ context.Context, r redeliver.RetryInfo) error {
	c := *d.m
	c.Header = maps.Clone(d.m.Header)
	maps.Copy(c.Header, r.Header)
	d.q.wg.Add(1)
	time.AfterFunc(r.Delay, func() { defer d.q.wg.Done(); d.q.ch <- &c })
	return nil
}

// Effectively once: with Config.Inbox the handler writes through the inbox's
// transaction, and the copy a broker delivers again after a failover (its ack was lost)
// is acknowledged without running the handler, logged and counted as a duplicate.
// Without an inbox the handler would run twice and write two rows. The inbox here is
// sqlitebox on SQLite; pgbox is the same on PostgreSQL (pgbox.Tx).
func Example() {
	dir, err := os.MkdirTemp("", "redeliver-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := db.ExecContext(ctx, "CREATE TABLE grants (grant_id TEXT NOT NULL)"); err != nil {
		panic(err)
	}
	inbox, err := sqlitebox.NewInbox(sqlitebox.InboxConfig{DB: db})
	if err != nil {
		panic(err)
	}
	if err := inbox.Migrate(ctx); err != nil {
		panic(err)
	}

	q := newMemQueue("emitter.access")
	var acks atomic.Int32 // settlements run on goroutines of their own
	q.onAck = func() {
		if acks.Add(1) == 2 {
			cancel() // both deliveries settled
		}
	}
	c, err := redeliver.New(redeliver.Config{
		Source: q,
		Inbox:  inbox,
		Handler: func(ctx context.Context, m *redeliver.Message) error {
			fmt.Println("granting", m.ID)
			_, err := sqlitebox.Tx(ctx).ExecContext(ctx, "INSERT INTO grants (grant_id) VALUES (?)", m.ID)
			return err
		},
		Concurrency: 1,
		Logger: slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
			ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			},
		})),
	})
	if err != nil {
		panic(err)
	}
	m := &redeliver.Message{ID: "grant-42", Body: []byte(`{"repo":"acme/api"}`)}
	_ = q.Publish(ctx, q.name, m) // the delivery whose ack is lost
	_ = q.Publish(ctx, q.name, m) // the broker's redelivery
	if err := c.Run(ctx); err != nil {
		panic(err)
	}
	var n int
	_ = db.QueryRow("SELECT count(*) FROM grants").Scan(&n)
	fmt.Println(n, "grant")
	// Output:
	// granting grant-42
	// level=INFO msg="redeliver: duplicate of a processed message, acknowledged without running the handler" queue=emitter.access message_id=grant-42 attempt=1 delivery_count=0
	// 1 grant
}

// A consumer whose handler fails twice and then succeeds, and one that rejects a
// message for good: the first is retried with a growing delay, the second goes straight
// to the dead-letter queue with its reason. The handler reads the attempt and the first
// failure from the message, which every backend fills the same way (the count header
// does not advance on JetStream).
func Example_retries() {
	q := newMemQueue("emitter.access")
	ctx, cancel := context.WithCancel(context.Background())
	q.onDLQ = cancel // stop once the bad message is dead-lettered

	c, err := redeliver.New(redeliver.Config{
		Source: q,
		Policy: redeliver.Policy{
			MaxAttempts: 5,
			Backoff:     retry.Policy{Base: 10 * time.Millisecond, Jitter: retry.JitterNone},
		},
		Concurrency: 1,
		Logger:      slog.New(slog.DiscardHandler),
		Handler: func(ctx context.Context, m *redeliver.Message) error {
			if m.ID == "bad" {
				return retry.Permanent(errors.New("unknown account"))
			}
			if m.Attempt < 3 {
				fmt.Printf("%s: attempt %d fails (failing before: %t)\n", m.ID, m.Attempt, !m.FirstFailure.IsZero())
				return errors.New("github: 502")
			}
			// A handler may give up on a message that has been failing for too long
			// (FirstFailure is zero when no failure was recorded: a crash).
			if !m.FirstFailure.IsZero() && time.Since(m.FirstFailure) > time.Hour {
				return retry.Permanent(errors.New("stale grant"))
			}
			fmt.Printf("%s: attempt %d succeeds (failing before: %t)\n", m.ID, m.Attempt, !m.FirstFailure.IsZero())
			// Only now hand over the bad message, so the output's order is fixed.
			return q.Publish(ctx, q.name, &redeliver.Message{ID: "bad"})
		},
	})
	if err != nil {
		panic(err)
	}
	_ = q.Publish(ctx, q.name, &redeliver.Message{ID: "grant-1"})
	if err := c.Run(ctx); err != nil {
		panic(err)
	}
	for _, d := range q.dead {
		fmt.Printf("dead letter %s: reason %s, attempts %d, error %q\n", d.ID, d.Info.Reason, d.Info.Attempts, d.Info.Err)
	}
	// Output:
	// grant-1: attempt 1 fails (failing before: false)
	// grant-1: attempt 2 fails (failing before: true)
	// grant-1: attempt 3 succeeds (failing before: true)
	// dead letter bad: reason permanent, attempts 1, error "unknown account"
}

// DecodeJSON marks a body that does not decode as a decode failure, which is
// dead-lettered at once: no retry can fix it.
func ExampleDecodeJSON() {
	var grant struct{ Repo string }
	err := redeliver.DecodeJSON(&redeliver.Message{Body: []byte("{not json")}, &grant)
	fmt.Println(errors.Is(err, redeliver.ErrDecode), redeliver.DefaultClassify(err))
	// Output: true decode
}
