package rabbitmq

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

// The delay buckets a user chooses are taken as given or refused, never reordered or
// merged behind the user's back: they name the queues, which must match on every
// consumer of the work queue.
func TestDelaysValidated(t *testing.T) {
	t.Parallel()
	url := "amqp://guest:guest@127.0.0.1:1/" // never dialled: the check comes first
	for _, tt := range []struct {
		name   string
		delays []time.Duration
		want   string
	}{
		{"unsorted", []time.Duration{2 * time.Second, time.Second}, "ascending"},
		{"duplicate", []time.Duration{time.Second, time.Second}, "ascending"},
		{"zero", []time.Duration{0, time.Second}, "positive"},
		{"negative", []time.Duration{-time.Second}, "positive"},
		{"below a millisecond", []time.Duration{time.Microsecond}, "millisecond"},
		{"not whole milliseconds", []time.Duration{1500 * time.Microsecond}, "millisecond"},
		{"beyond the TTL limit", []time.Duration{1000 * time.Hour}, "TTL"},
	} {
		_, err := NewSource(context.Background(), Config{URL: url, Queue: "q", Delays: tt.delays})
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s %v: %v, want an error about %q", tt.name, tt.delays, err, tt.want)
		}
	}
}

// The default topology is the work queue, its DLQ and one delay queue per default
// bucket: 13 queues, the number the package documentation and retrysafe dlq --help
// give.
func TestDefaultTopology(t *testing.T) {
	t.Parallel()
	topo, err := Config{Queue: "q"}.Topology()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(topo.Queues()); n != 13 || len(topo.Delays) != len(DefaultDelays()) {
		t.Errorf("%d queues (%d delay queues), want 13 (the documented number)", n, len(topo.Delays))
	}
}

// A custom set of buckets declares exactly those delay queues, and a retry goes to
// the nearest of them.
func TestCustomDelays(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, false)
	custom := []time.Duration{150 * time.Millisecond, 1200 * time.Millisecond}
	cfg := r.config()
	cfg.Delays = custom
	topo, err := cfg.Topology()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{r.queue, r.queue + ".dlq", r.queue + ".delay.150ms", r.queue + ".delay.1200ms"}
	if got := topo.Queues(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("queues %v, want %v", got, want)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := DeleteTopology(ctx, r.admin, topo); err != nil {
			t.Errorf("deleting the custom topology: %v", err)
		}
	})
	// Waits of 100ms (below the shortest bucket: 150ms) and 800ms (above the geometric
	// mean of 150ms and 1200ms, about 424ms: 1200ms).
	policy := testPolicy(3)
	policy.Backoff = retry.Policy{Base: 100 * time.Millisecond, Cap: 800 * time.Millisecond, Jitter: retry.JitterNone}
	var mu sync.Mutex
	var via []string
	var at []time.Time
	done := make(chan struct{})
	consume(t, cfg, redeliver.Config{Policy: policy, Handler: func(_ context.Context, m *redeliver.Message) error {
		mu.Lock()
		defer mu.Unlock()
		via = append(via, m.Header["x-first-death-queue"])
		at = append(at, time.Now())
		switch m.Attempt {
		case 1:
			return errors.New("first")
		case 2:
			return retry.After(800*time.Millisecond, errors.New("second"))
		}
		close(done)
		return nil
	}})
	ch, err := r.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for _, q := range want {
		if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
			t.Fatalf("queue %s not declared: %v", q, err)
		}
	}
	r.publish(t, "c1")
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no third attempt")
	}
	mu.Lock()
	defer mu.Unlock()
	if via[1] != r.queue+".delay.150ms" {
		t.Errorf("first retry through %q, want the 150ms bucket", via[1])
	}
	if gap1, gap2 := at[1].Sub(at[0]), at[2].Sub(at[1]); gap1 < 150*time.Millisecond || gap2 < 1200*time.Millisecond {
		t.Errorf("waits %v and %v, want at least the buckets' 150ms and 1200ms", gap1, gap2)
	}
}

// A replayed message carries none of RabbitMQ's dead-lettering headers from its first
// life (x-death, x-first-death-*, x-last-death-*), nor the retry count or the first
// failure: it starts clean, as a new publish would.
func TestReplayDropsBrokerDeathHeaders(t *testing.T) {
	t.Parallel()
	r := newRMQ(t, false)
	_, stop := consume(t, r.config(), redeliver.Config{Policy: testPolicy(2), Handler: func(_ context.Context, m *redeliver.Message) error {
		return errors.New("down") // a retry through a delay queue, then the DLQ
	}})
	r.publish(t, "x1")
	eventually(t, 10*time.Second, "the dead letter", func() bool { return r.count(t, r.topo.DLQ) == 1 })
	ch, err := r.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	// The dead letter went through a delay queue, so the broker's headers are there.
	dead, ok, err := ch.Get(r.topo.DLQ, false)
	if err != nil || !ok {
		t.Fatalf("reading the DLQ: %v %v", ok, err)
	}
	if _, has := dead.Headers["x-death"]; !has {
		t.Fatalf("the dead letter has no x-death header: %v", dead.Headers)
	}
	if err := dead.Nack(false, true); err != nil {
		t.Fatal(err)
	}
	// Stop consuming (the replayed copy must stay in the work queue), then replay.
	stop()
	dl, err := OpenDeadLetters(t.Context(), DeadLettersConfig{URL: r.url, Queue: r.queue})
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	if n, err := dl.Replay(t.Context()); err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	var m amqp.Delivery
	eventually(t, 5*time.Second, "the replayed copy", func() bool {
		var err error
		m, ok, err = ch.Get(r.queue, true)
		return err == nil && ok
	})
	if m.MessageId != "x1" || string(m.Body) != "x1" || m.Headers["app"] != "yes" {
		t.Errorf("replayed copy %q %q %v: the message is not kept", m.MessageId, m.Body, m.Headers)
	}
	for k, v := range m.Headers {
		if k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-") ||
			k == redeliver.DefaultHeader || strings.HasPrefix(k, "redeliver-") {
			t.Errorf("replayed copy keeps %s = %v", k, v)
		}
	}
}
