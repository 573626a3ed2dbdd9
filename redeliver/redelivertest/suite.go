// Package redelivertest is the conformance suite every redeliver backend runs against
// its real broker, so that a handler, a producer and the dlq command see one behaviour
// behind each interface whichever broker is under it.
//
// A backend's own tests call Run with a Harness and add only what is specific to their
// broker (topology, reconnects, crash recovery). The suite checks what a handler reads
// (Message.Attempt and Message.FirstFailure on every delivery), what a producer is told
// (a publish the broker deduplicated returns redeliver.ErrDuplicate), what a dead letter
// records (its first publish and the move to the DLQ, the first failure) and that a
// replayed message starts clean.
package redelivertest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

// Harness tells the suite how to make queues on the backend under test.
type Harness struct {
	// New returns a work queue on the broker, declared, empty and isolated from every
	// other queue New returns (its own names), for consumers running policy p. Its
	// retry delays may be rounded (RabbitMQ's delay buckets) but must stay under a
	// second. Register cleanup with t.Cleanup.
	New func(t *testing.T, p redeliver.Policy) *Queue
	// Deduplicates says the broker drops a publish whose message id it stored within
	// its deduplication window (JetStream), which Publish reports as
	// redeliver.ErrDuplicate; false says it stores every publish (RabbitMQ).
	Deduplicates bool
}

// Queue is one work queue of the backend under test.
type Queue struct {
	// Name is the queue (or subject) Publisher.Publish takes.
	Name string
	// Publisher publishes to the broker.
	Publisher redeliver.Publisher
	// NewSource returns a new Source on the queue; the suite's Consumer closes it.
	NewSource func(t *testing.T) redeliver.Source
	// DeadLetters are the queue's dead letters.
	DeadLetters redeliver.DeadLetters
	// Stored returns how many messages the work queue holds. The suite calls it only
	// while no Source of the queue runs.
	Stored func(t *testing.T) int
}

// Run runs the suite against the queues h makes. The cases run in parallel.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("redelivertest: Harness.New is nil")
	}
	for _, c := range []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"AttemptAndFirstFailure", testAttemptAndFirstFailure},
		{"DeadLetterRecords", testDeadLetterRecords},
		{"DuplicatePublish", testDuplicatePublish},
		{"ReplayStartsClean", testReplayStartsClean},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, h)
		})
	}
}

// Policy is the policy the suite's consumers run: 3 attempts, waits of 100ms then
// 200ms.
func Policy() redeliver.Policy {
	return redeliver.Policy{
		MaxAttempts: 3,
		Backoff:     retry.Policy{Base: 100 * time.Millisecond, Cap: 400 * time.Millisecond, Jitter: retry.JitterNone},
		Timeout:     10 * time.Second,
		Header:      redeliver.DefaultHeader,
	}
}

// timeout bounds every wait of the suite.
const timeout = 15 * time.Second

// seen is one delivery as the handler saw it.
type seen struct {
	attempt    int
	first      time.Time
	header     map[string]string
	id         string
	start, end time.Time // around the handler's work
}

// journal records the deliveries a handler saw.
type journal struct {
	mu   sync.Mutex
	seen []seen
	more chan struct{} // signalled after each delivery
}

func newJournal() *journal { return &journal{more: make(chan struct{}, 1)} }

func (j *journal) add(s seen) {
	j.mu.Lock()
	j.seen = append(j.seen, s)
	j.mu.Unlock()
	select {
	case j.more <- struct{}{}:
	default:
	}
}

func (j *journal) all() []seen {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]seen(nil), j.seen...)
}

// waitFor waits until the journal holds n deliveries.
func (j *journal) waitFor(t *testing.T, n int) []seen {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if s := j.all(); len(s) >= n {
			return s
		}
		select {
		case <-j.more:
		case <-deadline.C:
			t.Fatalf("%d deliveries after %v, want %d: %+v", len(j.all()), timeout, n, j.all())
		}
	}
}

// record runs the handler's decision on m, recording the delivery around it.
func (j *journal) record(m *redeliver.Message, decide func(m *redeliver.Message) error) error {
	s := seen{attempt: m.Attempt, first: m.FirstFailure, header: maps.Clone(m.Header), id: m.ID, start: time.Now()}
	err := decide(m)
	s.end = time.Now()
	j.add(s)
	return err
}

// consume runs a Consumer with the handler over a new Source of q until the test ends.
func consume(t *testing.T, q *Queue, h redeliver.Handler) {
	t.Helper()
	c, err := redeliver.New(redeliver.Config{
		Source:        q.NewSource(t),
		Handler:       h,
		Policy:        Policy(),
		ShutdownGrace: 5 * time.Second,
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func message(id string) *redeliver.Message {
	return &redeliver.Message{ID: id, Body: []byte("body of " + id), ContentType: "text/plain",
		Header: map[string]string{"tenant": "acme"}}
}

func publish(t *testing.T, q *Queue, m *redeliver.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := q.Publisher.Publish(ctx, q.Name, m); err != nil {
		t.Fatalf("publishing %s: %v", m.ID, err)
	}
}

// deadLetter waits until the DLQ holds the dead letter with the id.
func deadLetter(t *testing.T, q *Queue, id string) *redeliver.DeadLetter {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		d, err := q.DeadLetters.Get(ctx, id)
		cancel()
		if err == nil {
			return d
		}
		if !errors.Is(err, redeliver.ErrNotFound) {
			t.Fatalf("DeadLetters.Get(%s): %v", id, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dead letter %s after %v", id, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// within reports whether lo <= x <= hi on the wall clock (times read back from a
// broker carry no monotonic reading).
func within(x, lo, hi time.Time) bool {
	x, lo, hi = x.Round(0), lo.Round(0), hi.Round(0)
	return !x.Before(lo) && !x.After(hi)
}

// A handler reads the attempt and the first failure from the message, on every
// broker: attempt 1 has no first failure, the later ones carry the time the first
// attempt failed, unchanged.
func testAttemptAndFirstFailure(t *testing.T, h Harness) {
	q := h.New(t, Policy())
	j := newJournal()
	consume(t, q, func(_ context.Context, m *redeliver.Message) error {
		return j.record(m, func(m *redeliver.Message) error {
			if m.Attempt < 3 {
				return errors.New("not yet")
			}
			return nil
		})
	})
	publish(t, q, message("ff-1"))
	s := j.waitFor(t, 3)
	for i, d := range s[:3] {
		if d.attempt != i+1 {
			t.Errorf("delivery %d: Attempt %d, want %d", i+1, d.attempt, i+1)
		}
	}
	if !s[0].first.IsZero() {
		t.Errorf("attempt 1: FirstFailure %v, want zero (nothing failed yet)", s[0].first)
	}
	if !within(s[1].first, s[0].end, s[1].start) {
		t.Errorf("attempt 2: FirstFailure %v, want the end of attempt 1 (between %v and %v)",
			s[1].first, s[0].end, s[1].start)
	}
	if !s[2].first.Equal(s[1].first) {
		t.Errorf("attempt 3: FirstFailure %v, want attempt 2's %v", s[2].first, s[1].first)
	}
}

// A dead letter records its first failure (the one its handler saw), its first
// publish and the move to the DLQ, each by name. The consumer starts well after the
// publish (more than the second to which RabbitMQ's timestamp is precise), so the two
// times cannot be taken for each other.
func testDeadLetterRecords(t *testing.T, h Harness) {
	q := h.New(t, Policy())
	before := time.Now()
	publish(t, q, message("dl-1"))
	after := time.Now()
	time.Sleep(1500 * time.Millisecond)
	j := newJournal()
	consume(t, q, func(_ context.Context, m *redeliver.Message) error {
		return j.record(m, func(*redeliver.Message) error { return errors.New("always down") })
	})
	d := deadLetter(t, q, "dl-1")
	s := j.waitFor(t, 3)
	if d.Info.Reason != redeliver.ReasonMaxAttempts || d.Info.Attempts != 3 || d.Info.Err != "always down" {
		t.Errorf("dead letter info %+v, want max-attempts after 3 attempts", d.Info)
	}
	if !d.Info.FirstFailure.Equal(s[1].first) || s[1].first.IsZero() {
		t.Errorf("dead letter FirstFailure %v, want the %v the handler saw", d.Info.FirstFailure, s[1].first)
	}
	if !within(d.Info.LastFailure, s[2].end, time.Now()) {
		t.Errorf("dead letter LastFailure %v, want after the last attempt's end %v", d.Info.LastFailure, s[2].end)
	}
	if !within(d.Published, before.Truncate(time.Second), after) {
		t.Errorf("dead letter Published %v, want the first publish (between %v and %v)", d.Published, before, after)
	}
	if !within(d.DeadLettered, s[2].end, time.Now()) {
		t.Errorf("dead letter DeadLettered %v, want the move to the DLQ (after %v)", d.DeadLettered, s[2].end)
	}
	if d.ID != "dl-1" || string(d.Body) != "body of dl-1" || d.ContentType != "text/plain" || d.Header["tenant"] != "acme" {
		t.Errorf("dead letter %q body %q type %q header %v: the message is not kept", d.ID, d.Body, d.ContentType, d.Header)
	}
}

// Publishing an id twice: a broker that deduplicates stores it once and says so with
// ErrDuplicate; one that does not stores both. Never a nil return for a message that
// was not stored.
func testDuplicatePublish(t *testing.T, h Harness) {
	q := h.New(t, Policy())
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := q.Publisher.Publish(ctx, q.Name, message("dup-1")); err != nil {
		t.Fatalf("first publish: %v", err)
	}
	err := q.Publisher.Publish(ctx, q.Name, message("dup-1"))
	switch {
	case h.Deduplicates && !errors.Is(err, redeliver.ErrDuplicate):
		t.Errorf("second publish of an id: %v, want ErrDuplicate", err)
	case !h.Deduplicates && err != nil:
		t.Errorf("second publish of an id: %v, want nil (the broker keeps both)", err)
	}
	if err := q.Publisher.Publish(ctx, q.Name, message("dup-2")); err != nil {
		t.Fatalf("publish of another id: %v", err)
	}
	want := 3
	if h.Deduplicates {
		want = 2
	}
	if n := q.Stored(t); n != want {
		t.Errorf("the work queue holds %d messages, want %d", n, want)
	}
}

// A replayed dead letter starts clean: attempt 1, no first failure, none of the retry,
// dead-letter or broker dead-lettering headers of its first life; its id, body and
// application headers kept; and a failure in its new life is a new first failure.
func testReplayStartsClean(t *testing.T, h Harness) {
	p := Policy()
	q := h.New(t, p)
	var mu sync.Mutex
	replayed := false
	j := newJournal()
	consume(t, q, func(_ context.Context, m *redeliver.Message) error {
		return j.record(m, func(m *redeliver.Message) error {
			mu.Lock()
			again := replayed
			mu.Unlock()
			switch {
			case !again && m.Attempt == 1:
				return errors.New("down for a moment") // through the broker's delay
			case !again:
				return retry.Permanent(errors.New("rejected"))
			case m.Attempt == 1:
				return errors.New("down again")
			}
			return nil
		})
	})
	publish(t, q, message("rp-1"))
	first := deadLetter(t, q, "rp-1")
	if first.Info.Attempts != 2 || first.Info.FirstFailure.IsZero() {
		t.Fatalf("dead letter %+v, want 2 attempts and a first failure", first.Info)
	}
	mu.Lock()
	replayed = true
	mu.Unlock()
	replayAt := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// A RabbitMQ quorum queue makes the message the Get above held ready again a moment
	// after the Get (see rabbitmq.DeadLetters): a Replay right away may find nothing.
	for {
		n, err := q.DeadLetters.Replay(ctx, "rp-1")
		if err != nil || n > 1 {
			t.Fatalf("Replay = %d, %v; want 1", n, err)
		}
		if n == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("Replay found no dead letter rp-1 within %v", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s := j.waitFor(t, 4)
	again := s[2]
	if again.id != "rp-1" || again.attempt != 1 || !again.first.IsZero() {
		t.Errorf("replayed delivery: id %q, Attempt %d, FirstFailure %v; want rp-1, 1 and zero",
			again.id, again.attempt, again.first)
	}
	if again.header["tenant"] != "acme" {
		t.Errorf("replayed delivery lost its application header: %v", again.header)
	}
	for k, v := range again.header {
		lk := strings.ToLower(k)
		if lk == strings.ToLower(p.Header) || strings.HasPrefix(lk, "redeliver-") || strings.HasPrefix(lk, "x-death") ||
			strings.HasPrefix(lk, "x-first-death-") || strings.HasPrefix(lk, "x-last-death-") {
			t.Errorf("replayed delivery keeps %s: %s from its first life", k, v)
		}
	}
	if s[3].attempt != 2 || !within(s[3].first, replayAt, s[3].start) {
		t.Errorf("second delivery after the replay: Attempt %d, FirstFailure %v; want 2 and a failure after the replay at %v",
			s[3].attempt, s[3].first, replayAt)
	}
}
