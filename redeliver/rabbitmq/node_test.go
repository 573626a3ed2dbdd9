//go:build linux

package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/retrysafe/retrysafe/harness/rabbitnode"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

// runLog records every handler run, by message id.
type runLog struct {
	mu       sync.Mutex
	runs     map[string][]int // id → the Attempt of each run, in order
	failures map[string]int   // id → runs that returned an error
	done     map[string]bool  // id → a run returned nil
	total    atomic.Int64
}

func newRunLog() *runLog {
	return &runLog{runs: map[string][]int{}, failures: map[string]int{}, done: map[string]bool{}}
}

func (l *runLog) completed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.done)
}

// TestQuorumRestartsSpendNoAttempts restarts a disposable RabbitMQ node three times
// while slow handlers work through a quorum queue and more messages wait, delivered
// ahead, in the consumer's prefetch. Each restart hands every unsettled message back
// with a higher x-delivery-count, though for most of them no handler ran. Every
// message succeeds by its second run (every fifth fails its first), within max attempts
// 3, so: none is lost, none is dead-lettered, the first run of every message is attempt
// 1, and no run claims an attempt number above the runs the message had.
func TestQuorumRestartsSpendNoAttempts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a RabbitMQ node four times (about 40 s)")
	}
	n := rabbitnode.Start(t)
	t.Logf("node %s started in %v", n.Name, n.StartTimes()[0])
	queue := "restarts"
	cfg := Config{URL: n.URL(), Queue: queue, Quorum: true, Delays: testDelays, Logger: quiet(), Prefetch: 20,
		Reconnect: retry.Policy{Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond}}
	const total, maxAttempts, restarts = 40, 3, 3
	log := newRunLog()
	src, stop := consume(t, cfg, redeliver.Config{Policy: testPolicy(maxAttempts), Concurrency: 2,
		Handler: func(ctx context.Context, m *redeliver.Message) error {
			log.mu.Lock()
			log.runs[m.ID] = append(log.runs[m.ID], m.Attempt)
			i, _ := strconv.Atoi(m.ID[1:])
			failFirst := len(log.runs[m.ID]) == 1 && i%5 == 0
			log.mu.Unlock()
			log.total.Add(1)
			// A slow handler: the work takes 300ms (a restart takes several seconds, so
			// most runs in flight then lose their settlement).
			select {
			case <-time.After(300 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			log.mu.Lock()
			defer log.mu.Unlock()
			if failFirst {
				log.failures[m.ID]++
				return errors.New("first run fails")
			}
			log.done[m.ID] = true
			return nil
		}})
	defer stop()

	pub, err := NewPublisher(t.Context(), PublisherConfig{URL: n.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := range total {
		m := &redeliver.Message{ID: "m" + strconv.Itoa(i), Body: []byte("x")}
		if err := pub.Publish(t.Context(), queue, m); err != nil {
			t.Fatal(err)
		}
	}
	// Restart while handlers run and the rest of the messages sit in the prefetch:
	// after the 4th, 8th and 12th handler run.
	for r := range restarts {
		want := int64(4 * (r + 1))
		eventually(t, 2*time.Minute, fmt.Sprintf("%d handler runs", want), func() bool { return log.total.Load() >= want })
		n.Stop()
		n.Restart()
		t.Logf("restart %d: %d handler runs before it, node back in %v", r+1, want, n.StartTimes()[r+1])
	}

	admin, err := amqp.Dial(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	dlq := func() int {
		ch, err := admin.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(queue+".dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		if err != nil {
			t.Fatal(err)
		}
		return q.Messages
	}
	eventually(t, 2*time.Minute, "every message completed or dead-lettered", func() bool { return log.completed()+dlq() >= total })
	stop()

	dead := dlq()
	log.mu.Lock()
	defer log.mu.Unlock()
	early := 0
	for i := range total {
		id := "m" + strconv.Itoa(i)
		runs := log.runs[id]
		if !log.done[id] {
			if len(runs) < maxAttempts {
				early++
				t.Errorf("%s not completed after %d handler runs (attempts %v): dead-lettered early", id, len(runs), runs)
			}
			continue
		}
		if len(runs) == 0 || runs[0] != 1 {
			t.Errorf("%s: first run was attempt %v, want 1", id, runs)
		}
		for k, a := range runs {
			if a > k+1 {
				t.Errorf("%s: run %d claimed attempt %d (attempts %v)", id, k+1, a, runs)
				break
			}
		}
	}
	if dead != 0 {
		t.Errorf("%d dead letters (%d dead-lettered with fewer than %d handler runs), want none: every message succeeds by its second run", dead, early, maxAttempts)
	}
	t.Logf("%d messages, %d handler runs, %d completed, %d dead letters, %d connects", total, log.total.Load(), len(log.done), dead, src.Connects())
}

// lockedBuffer collects log output from any goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestQueueType declares topologies on a disposable node: quorum queues by default; a
// work queue that exists as a classic queue kept as it is, the Source using classic
// queues throughout and warning; Config.Quorum refusing it; Config.Classic declaring
// classic queues, with the warning of what they lose.
func TestQueueType(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a RabbitMQ node")
	}
	n := rabbitnode.Start(t)
	t.Logf("node %s started in %v", n.Name, n.StartTimes()[0])
	types := func() map[string]string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := n.Ctl(ctx, "list_queues", "-q", "--no-table-headers", "name", "type")
		if err != nil {
			t.Fatalf("rabbitmqctl list_queues: %v\n%s", err, out)
		}
		m := map[string]string{}
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) == 2 {
				m[f[0]] = f[1]
			}
		}
		return m
	}
	admin, err := amqp.Dial(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	declareClassic := func(q string) {
		ch, err := admin.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	const lossWarning = "the queues are classic queues: a crash of their node redelivers messages already acknowledged"
	open := func(cfg Config) (*Source, string, error) {
		var logs lockedBuffer
		cfg.URL, cfg.Delays = n.URL(), testDelays
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		src, err := NewSource(t.Context(), cfg)
		if err == nil {
			t.Cleanup(func() { _ = src.Close(context.Background()) })
		}
		return src, logs.String(), err
	}

	src, logs, err := open(Config{Queue: "fresh"})
	if err != nil {
		t.Fatal(err)
	}
	if !src.Topology().Quorum || strings.Contains(logs, "classic") {
		t.Errorf("default on a new queue: Quorum %v, logs %q; want quorum queues and no warning", src.Topology().Quorum, logs)
	}
	ty := types()
	for _, q := range src.Topology().Queues() {
		if ty[q] != "quorum" {
			t.Errorf("queue %s is %q by default, want quorum", q, ty[q])
		}
	}

	declareClassic("legacy")
	src, logs, err = open(Config{Queue: "legacy"})
	if err != nil {
		t.Fatalf("default on an existing classic work queue: %v", err)
	}
	if src.Topology().Quorum || !strings.Contains(logs, "exists as a classic queue") || !strings.Contains(logs, lossWarning) {
		t.Errorf("default on an existing classic work queue: Quorum %v, logs %q; want classic queues and both warnings", src.Topology().Quorum, logs)
	}
	ty = types()
	for _, q := range src.Topology().Queues() {
		if ty[q] != "classic" {
			t.Errorf("queue %s of an existing classic work queue is %q, want classic", q, ty[q])
		}
	}

	declareClassic("legacy2")
	if _, _, err := open(Config{Queue: "legacy2", Quorum: true}); err == nil || !strings.Contains(err.Error(), "quorum queues wanted") {
		t.Errorf("Config.Quorum on an existing classic work queue: %v, want a refusal saying quorum queues are wanted", err)
	}

	src, logs, err = open(Config{Queue: "chosen", Classic: true})
	if err != nil {
		t.Fatal(err)
	}
	if src.Topology().Quorum || !strings.Contains(logs, lossWarning) || types()["chosen"] != "classic" {
		t.Errorf("Config.Classic: Quorum %v, type %q, logs %q; want classic queues and the warning", src.Topology().Quorum, types()["chosen"], logs)
	}
	if _, _, err := open(Config{Queue: "both", Classic: true, Quorum: true}); !errors.Is(err, ErrConfig) {
		t.Errorf("Classic and Quorum together: %v, want ErrConfig", err)
	}
}

// TestRetryDuringOutage: a handler's first run fails while the broker is down, so its
// retry copy cannot be published and the broker redelivers the original, header
// unchanged. The consumer remembers the failed attempt: the redelivery is attempt 2,
// with the first failure's time.
func TestRetryDuringOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a RabbitMQ node twice")
	}
	n := rabbitnode.Start(t)
	cfg := Config{URL: n.URL(), Queue: "outage", Delays: testDelays, Logger: quiet(),
		Reconnect: retry.Policy{Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond}}
	type run struct {
		attempt int
		first   time.Time
	}
	running, release := make(chan struct{}), make(chan struct{})
	later := make(chan run, 10)
	var runs atomic.Int32
	consume(t, cfg, redeliver.Config{Policy: testPolicy(3), Handler: func(ctx context.Context, m *redeliver.Message) error {
		if runs.Add(1) == 1 {
			close(running)
			<-release
			return errors.New("fails while the broker is down")
		}
		later <- run{m.Attempt, m.FirstFailure}
		return nil
	}})
	pub, err := NewPublisher(t.Context(), PublisherConfig{URL: n.URL()})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(t.Context(), "outage", &redeliver.Message{ID: "m1", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	_ = pub.Close()
	<-running
	n.Stop()
	before := time.Now()
	close(release)
	n.Restart()
	select {
	case r := <-later:
		if r.attempt != 2 {
			t.Errorf("the redelivery after a failure whose retry never reached the broker is attempt %d, want 2", r.attempt)
		}
		if r.first.Before(before) || r.first.After(time.Now()) {
			t.Errorf("its first failure is %v, want the failure, after %v", r.first, before)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the message was not redelivered after the restart")
	}
}
