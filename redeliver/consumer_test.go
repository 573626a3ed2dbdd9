package redeliver_test

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
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeSource hands out the deliveries pushed into it and records how each was settled.
type fakeSource struct {
	ch     chan *fakeDelivery
	closed atomic.Bool
	beat   time.Duration
}

func newFakeSource(n int) *fakeSource { return &fakeSource{ch: make(chan *fakeDelivery, n)} }

func (s *fakeSource) push(m *redeliver.Message) *fakeDelivery {
	d := &fakeDelivery{m: m, beaten: make(chan struct{}, 1), settled: make(chan struct{})}
	s.ch <- d
	return d
}

// pushGated queues a message whose Ack waits until gate is closed.
func (s *fakeSource) pushGated(m *redeliver.Message, gate chan struct{}) *fakeDelivery {
	d := &fakeDelivery{m: m, beaten: make(chan struct{}, 1), settled: make(chan struct{}), gate: gate}
	s.ch <- d
	return d
}

func (s *fakeSource) Receive(ctx context.Context) (redeliver.Delivery, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case d := <-s.ch:
		return d, nil
	}
}

func (s *fakeSource) Close(context.Context) error { s.closed.Store(true); return nil }

type beatingSource struct{ *fakeSource }

func (s beatingSource) Heartbeat() time.Duration { return s.beat }

type fakeDelivery struct {
	m       *redeliver.Message
	mu      sync.Mutex
	op      string
	retry   redeliver.RetryInfo
	dead    redeliver.DeadInfo
	beats   atomic.Int32
	beaten  chan struct{} // signalled (without blocking) by each InProgress
	settled chan struct{}
	// failRetry makes Retry fail, as when the broker went away.
	failRetry bool
	gate      chan struct{} // when set, Ack waits for it to close
}

func (d *fakeDelivery) Message() *redeliver.Message { return d.m }
func (d *fakeDelivery) set(op string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.op != "" {
		return errors.New("settled twice: " + d.op + " then " + op)
	}
	d.op = op
	close(d.settled)
	return nil
}
func (d *fakeDelivery) Ack(ctx context.Context) error {
	if d.gate != nil {
		// A broker that does not answer until gate is closed.
		select {
		case <-d.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return d.set("ack")
}
func (d *fakeDelivery) Retry(_ context.Context, r redeliver.RetryInfo) error {
	d.mu.Lock()
	d.retry = r
	fail := d.failRetry
	d.mu.Unlock()
	if fail {
		_ = d.set("retry-failed")
		return errors.New("broker gone")
	}
	return d.set("retry")
}
func (d *fakeDelivery) DeadLetter(_ context.Context, info redeliver.DeadInfo) error {
	d.mu.Lock()
	d.dead = info
	d.mu.Unlock()
	return d.set("dead")
}
func (d *fakeDelivery) Release(context.Context) error { return d.set("release") }
func (d *fakeDelivery) InProgress(context.Context) error {
	d.beats.Add(1)
	select {
	case d.beaten <- struct{}{}:
	default:
	}
	return nil
}

func (d *fakeDelivery) wait(t *testing.T) string {
	t.Helper()
	select {
	case <-d.settled:
	case <-time.After(5 * time.Second):
		t.Fatal("delivery not settled")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.op
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// run starts a consumer and returns a function that stops it and returns Run's error.
func run(t *testing.T, cfg redeliver.Config) (stop func() error) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	c, err := redeliver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

var testBackoff = retry.Policy{Base: 100 * time.Millisecond, Cap: time.Second, Jitter: retry.JitterNone}

func TestSettlement(t *testing.T) {
	t.Parallel()
	errBoom := errors.New("boom")
	tests := []struct {
		name      string
		header    map[string]string
		count     int // DeliveryCount
		err       error
		wantOp    string
		attempt   int
		delay     time.Duration
		reason    redeliver.Reason
		class     redeliver.Class
		noHandler bool
	}{
		{name: "success", wantOp: "ack", attempt: 1},
		{name: "first failure", err: errBoom, wantOp: "retry", attempt: 1, delay: 100 * time.Millisecond, class: redeliver.ClassTransient},
		{name: "third failure", header: map[string]string{"x-retry-count": "2"}, err: errBoom, wantOp: "retry", attempt: 3, delay: 400 * time.Millisecond, class: redeliver.ClassTransient},
		{name: "last failure", header: map[string]string{"x-retry-count": "4"}, err: errBoom, wantOp: "dead", attempt: 5, reason: redeliver.ReasonMaxAttempts, class: redeliver.ClassTransient},
		{name: "broker count wins", header: map[string]string{"x-retry-count": "1"}, count: 5, err: errBoom, wantOp: "dead", attempt: 5, reason: redeliver.ReasonMaxAttempts, class: redeliver.ClassTransient},
		{name: "broker count beyond max", count: 6, wantOp: "dead", attempt: 6, reason: redeliver.ReasonMaxAttempts, class: redeliver.ClassTransient, noHandler: true},
		{name: "permanent", err: retry.Permanent(errBoom), wantOp: "dead", attempt: 1, reason: redeliver.ReasonPermanent, class: redeliver.ClassPermanent},
		{name: "auth", err: &retry.StatusError{Class: retry.ErrAuth, StatusCode: 401}, wantOp: "dead", attempt: 1, reason: redeliver.ReasonPermanent, class: redeliver.ClassPermanent},
		{name: "decode", err: redeliver.Decode(errBoom), wantOp: "dead", attempt: 1, reason: redeliver.ReasonDecode, class: redeliver.ClassDecode},
		{name: "retry after", err: retry.After(700*time.Millisecond, errBoom), wantOp: "retry", attempt: 1, delay: 700 * time.Millisecond, class: redeliver.ClassTransient},
		{name: "retry after capped", err: retry.After(time.Hour, errBoom), wantOp: "retry", attempt: 1, delay: time.Second, class: redeliver.ClassTransient},
		{name: "bad header", header: map[string]string{"x-retry-count": "x"}, err: errBoom, wantOp: "retry", attempt: 1, delay: 100 * time.Millisecond, class: redeliver.ClassTransient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := newFakeSource(1)
			var calls atomic.Int32
			run(t, redeliver.Config{Source: src, Policy: redeliver.Policy{Backoff: testBackoff},
				Handler: func(ctx context.Context, m *redeliver.Message) error {
					calls.Add(1)
					if m.Attempt != tt.attempt {
						t.Errorf("Attempt = %d, want %d", m.Attempt, tt.attempt)
					}
					return tt.err
				}})
			h := map[string]string{}
			for k, v := range tt.header {
				h[k] = v
			}
			h["keep"] = "me"
			d := src.push(&redeliver.Message{ID: "m1", Queue: "q", Header: h, DeliveryCount: tt.count})
			if op := d.wait(t); op != tt.wantOp {
				t.Fatalf("settled with %s, want %s", op, tt.wantOp)
			}
			if got := calls.Load() == 0; got != tt.noHandler {
				t.Errorf("handler not called = %v, want %v", got, tt.noHandler)
			}
			switch tt.wantOp {
			case "retry":
				r := d.retry
				if r.Delay != tt.delay || r.Attempt != tt.attempt || r.Class != tt.class || r.CountHeader != "x-retry-count" {
					t.Errorf("retry = %+v", r)
				}
				if r.Header["x-retry-count"] != strconv.Itoa(tt.attempt) || r.Header[redeliver.HeaderFirstFailure] == "" {
					t.Errorf("retry header = %v", r.Header)
				}
			case "dead":
				dd := d.dead
				if dd.Reason != tt.reason || dd.Class != tt.class || dd.Queue != "q" || dd.FirstFailure.IsZero() || dd.LastFailure.IsZero() {
					t.Errorf("dead = %+v", dd)
				}
				wantAttempts := tt.attempt
				if tt.noHandler {
					wantAttempts = tt.attempt - 1
				}
				if dd.Attempts != wantAttempts {
					t.Errorf("dead attempts = %d, want %d", dd.Attempts, wantAttempts)
				}
				h := dd.Header()
				if h["x-retry-count"] != strconv.Itoa(wantAttempts) || h[redeliver.HeaderReason] != string(tt.reason) {
					t.Errorf("dead header = %v", h)
				}
			}
		})
	}
}

func TestFirstFailureTravels(t *testing.T) {
	t.Parallel()
	src := newFakeSource(1)
	run(t, redeliver.Config{Source: src, Policy: redeliver.Policy{MaxAttempts: 3},
		Handler: func(context.Context, *redeliver.Message) error { return errors.New("no") }})
	first := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	d := src.push(&redeliver.Message{ID: "a", Queue: "q", Header: map[string]string{
		"x-retry-count": "2", redeliver.HeaderFirstFailure: first.Format(time.RFC3339Nano)}})
	if op := d.wait(t); op != "dead" {
		t.Fatal(op)
	}
	if !d.dead.FirstFailure.Equal(first) || !d.dead.LastFailure.After(first) || d.dead.Err != "no" {
		t.Errorf("dead = %+v", d.dead)
	}
	back := redeliver.ParseDeadInfo(d.dead.Header())
	back.CountHeader = d.dead.CountHeader
	if !back.FirstFailure.Equal(d.dead.FirstFailure) || !back.LastFailure.Equal(d.dead.LastFailure) ||
		back.Reason != d.dead.Reason || back.Attempts != 3 || back.Err != "no" || back.Queue != "q" || back.Class != d.dead.Class {
		t.Errorf("round trip: %+v != %+v", back, d.dead)
	}
}

// The Consumer hands the handler the first failure: from the Source when it set one,
// else from HeaderFirstFailure; a first failure is the retry's own time.
func TestFirstFailureForHandler(t *testing.T) {
	t.Parallel()
	first := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	fromSource := first.Add(time.Hour)
	seen := make(chan time.Time, 3)
	src := newFakeSource(3)
	run(t, redeliver.Config{Source: src, Policy: redeliver.Policy{MaxAttempts: 5},
		Handler: func(_ context.Context, m *redeliver.Message) error { seen <- m.FirstFailure; return errors.New("no") }})
	for _, tt := range []struct {
		name string
		m    *redeliver.Message
		want time.Time // zero: the retry's own time
	}{
		{"header", &redeliver.Message{ID: "h", Header: map[string]string{
			"x-retry-count": "1", redeliver.HeaderFirstFailure: first.Format(time.RFC3339Nano)}}, first},
		{"source", &redeliver.Message{ID: "s", DeliveryCount: 2, FirstFailure: fromSource, Header: map[string]string{
			redeliver.HeaderFirstFailure: first.Format(time.RFC3339Nano)}}, fromSource},
		{"first failure", &redeliver.Message{ID: "f"}, time.Time{}},
	} {
		before := time.Now()
		d := src.push(tt.m)
		if op := d.wait(t); op != "retry" {
			t.Fatalf("%s: %s, want retry", tt.name, op)
		}
		got := <-seen
		if !got.Equal(tt.want) {
			t.Errorf("%s: the handler saw FirstFailure %v, want %v", tt.name, got, tt.want)
		}
		d.mu.Lock()
		r := d.retry
		d.mu.Unlock()
		want := tt.want
		if want.IsZero() && !r.FirstFailure.Before(before) {
			want = r.FirstFailure
		}
		if !r.FirstFailure.Equal(want) || r.Header[redeliver.HeaderFirstFailure] != want.UTC().Format(time.RFC3339Nano) {
			t.Errorf("%s: RetryInfo.FirstFailure %v, header %q; want %v", tt.name, r.FirstFailure,
				r.Header[redeliver.HeaderFirstFailure], want)
		}
	}
}

func TestPanicAndTimeout(t *testing.T) {
	t.Parallel()
	src := newFakeSource(2)
	run(t, redeliver.Config{Source: src, Policy: redeliver.Policy{Timeout: 50 * time.Millisecond, Backoff: testBackoff},
		Handler: func(ctx context.Context, m *redeliver.Message) error {
			if m.ID == "panic" {
				panic("kaboom")
			}
			<-ctx.Done()
			return retry.Permanent(ctx.Err()) // the timeout wins over the handler's own classification
		}})
	p := src.push(&redeliver.Message{ID: "panic", Queue: "q"})
	slow := src.push(&redeliver.Message{ID: "slow", Queue: "q"})
	if op := p.wait(t); op != "retry" || p.retry.Class != redeliver.ClassPanic {
		t.Errorf("panic: %s %+v", op, p.retry)
	}
	if op := slow.wait(t); op != "retry" || slow.retry.Class != redeliver.ClassTimeout {
		t.Errorf("timeout: %s %+v", op, slow.retry)
	}
}

// The consumers run in synctest bubbles: the grace and the handlers' pauses are virtual
// time, and synctest.Wait tells when the consumer's goroutines have all stopped to wait.
func TestShutdown(t *testing.T) {
	t.Parallel()
	t.Run("finishes in-flight", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			src := newFakeSource(1)
			started := make(chan struct{})
			stop := run(t, redeliver.Config{Source: src, ShutdownGrace: 5 * time.Second,
				Handler: func(ctx context.Context, m *redeliver.Message) error {
					close(started)
					// Returns once everything else waits: the test in stop, the consumer
					// in its shutdown, for this handler.
					synctest.Wait()
					return ctx.Err()
				}})
			d := src.push(&redeliver.Message{ID: "a", Queue: "q"})
			<-started
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if op := d.wait(t); op != "ack" {
				t.Errorf("op = %s, want ack", op)
			}
			if !src.closed.Load() {
				t.Error("source not closed")
			}
		})
	})
	t.Run("releases after grace", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			src := newFakeSource(1)
			started := make(chan struct{})
			stop := run(t, redeliver.Config{Source: src, ShutdownGrace: 50 * time.Millisecond,
				Handler: func(ctx context.Context, m *redeliver.Message) error {
					close(started)
					<-ctx.Done()
					return ctx.Err()
				}})
			d := src.push(&redeliver.Message{ID: "a", Queue: "q"})
			<-started
			begin := time.Now()
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if op := d.wait(t); op != "release" {
				t.Errorf("op = %s, want release", op)
			}
			if el := time.Since(begin); el > 10*time.Second { // the grace is 50ms
				t.Errorf("shutdown took %v", el)
			}
		})
	})
}

// The consumer runs in a synctest bubble: the handlers' waits are virtual time, which
// passes only once every goroutine is blocked, so a machine's load does not change what
// runs at once.
func TestConcurrencyLimit(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testConcurrencyLimit)
}

func testConcurrencyLimit(t *testing.T) {
	const n, limit = 40, 4
	src := newFakeSource(n)
	var cur, peak atomic.Int32
	// The first handlers wait until limit of them run at once (2s at most), so that
	// a consumer that starts fewer shows it.
	full := make(chan struct{})
	var fullOnce sync.Once
	run(t, redeliver.Config{Source: src, Concurrency: limit,
		Handler: func(ctx context.Context, m *redeliver.Message) error {
			c := cur.Add(1)
			for {
				p := peak.Load()
				if c <= p || peak.CompareAndSwap(p, c) {
					break
				}
			}
			if c >= limit {
				fullOnce.Do(func() { close(full) })
			}
			select {
			case <-full:
			case <-time.After(2 * time.Second):
			}
			time.Sleep(5 * time.Millisecond) // virtual: every handler runs a while
			cur.Add(-1)
			return nil
		}})
	var ds []*fakeDelivery
	for i := range n {
		ds = append(ds, src.push(&redeliver.Message{ID: strconv.Itoa(i), Queue: "q"}))
	}
	for _, d := range ds {
		d.wait(t)
	}
	if p := peak.Load(); p != limit {
		t.Errorf("peak concurrency = %d, want %d", p, limit)
	}
}

// A settlement the broker does not answer holds no handler slot: with both slots' messages
// waiting for their Ack, the next messages are handled and settled; only MaxSettling
// unsettled messages stop the consumer from receiving more.
func TestSettlementHoldsNoSlot(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testSettlementHoldsNoSlot)
}

func testSettlementHoldsNoSlot(t *testing.T) {
	const concurrency, maxSettling = 2, 5
	src := newFakeSource(16)
	gate := make(chan struct{})
	run(t, redeliver.Config{Source: src, Concurrency: concurrency, MaxSettling: maxSettling,
		SettleTimeout: time.Hour, ShutdownGrace: time.Second,
		Handler: func(context.Context, *redeliver.Message) error { return nil }})
	var stuck []*fakeDelivery
	for i := range concurrency {
		stuck = append(stuck, src.pushGated(&redeliver.Message{ID: "stuck" + strconv.Itoa(i), Queue: "q"}, gate))
	}
	synctest.Wait()
	for i := range 3 {
		d := src.push(&redeliver.Message{ID: strconv.Itoa(i), Queue: "q"})
		if op := d.wait(t); op != "ack" {
			t.Fatalf("message %d settled with %s, want ack", i, op)
		}
	}
	// maxSettling unsettled: two stuck, then three more stuck fill it.
	for i := range maxSettling - concurrency {
		stuck = append(stuck, src.pushGated(&redeliver.Message{ID: "more" + strconv.Itoa(i), Queue: "q"}, gate))
	}
	last := src.push(&redeliver.Message{ID: "last", Queue: "q"})
	synctest.Wait()
	if n := len(src.ch); n != 1 {
		t.Fatalf("%d messages waiting in the source, want 1: the consumer received beyond MaxSettling", n)
	}
	close(gate)
	for _, d := range append(stuck, last) {
		if op := d.wait(t); op != "ack" {
			t.Fatalf("%s settled with %s, want ack", d.m.ID, op)
		}
	}
}

func TestHeartbeat(t *testing.T) {
	t.Parallel()
	src := beatingSource{newFakeSource(1)}
	src.beat = 10 * time.Millisecond
	delivered := make(chan *fakeDelivery, 1)
	run(t, redeliver.Config{Source: src, Handler: func(ctx context.Context, m *redeliver.Message) error {
		// Run until a few heartbeats came (a loaded machine may delay them), 3s at most:
		// a consumer that never beats still settles within d.wait's bound.
		d := <-delivered
		timeout := time.After(3 * time.Second)
		for d.beats.Load() < 3 {
			select {
			case <-d.beaten:
			case <-timeout:
				return nil
			}
		}
		return nil
	}})
	d := src.push(&redeliver.Message{ID: "a", Queue: "q"})
	delivered <- d
	d.wait(t)
	if b := d.beats.Load(); b < 3 {
		t.Errorf("%d heartbeats, want several", b)
	}
}

// The consumers run in a synctest bubble, so that synctest.Wait tells when they have
// finished with the settled deliveries.
func TestMetrics(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testMetrics)
}

func testMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	src := newFakeSource(3)
	src2 := newFakeSource(1)
	h := func(ctx context.Context, m *redeliver.Message) error {
		switch m.ID {
		case "fail":
			return errors.New("x")
		case "perm":
			return retry.Permanent(errors.New("x"))
		}
		return nil
	}
	run(t, redeliver.Config{Source: src, Registerer: reg, Handler: h})
	run(t, redeliver.Config{Source: src2, Registerer: reg, Handler: h}) // shares the collectors
	for _, d := range []*fakeDelivery{
		src.push(&redeliver.Message{ID: "ok", Queue: "q1"}),
		src.push(&redeliver.Message{ID: "fail", Queue: "q1"}),
		src.push(&redeliver.Message{ID: "perm", Queue: "q1"}),
		src2.push(&redeliver.Message{ID: "ok", Queue: "q2"}),
	} {
		d.wait(t)
	}
	want := map[string]float64{
		"retrysafe_redeliver_received_total queue=q1":                            3,
		"retrysafe_redeliver_received_total queue=q2":                            1,
		"retrysafe_redeliver_succeeded_total queue=q1":                           1,
		"retrysafe_redeliver_succeeded_total queue=q2":                           1,
		"retrysafe_redeliver_retried_total error_class=transient queue=q1":       1,
		"retrysafe_redeliver_dead_lettered_total error_class=permanent queue=q1": 1,
	}
	gather := func() map[string]float64 {
		got := map[string]float64{}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				key := mf.GetName()
				for _, l := range m.GetLabel() {
					key += " " + l.GetName() + "=" + l.GetValue()
				}
				if c := m.GetCounter(); c != nil {
					got[key] = c.GetValue()
				}
			}
		}
		return got
	}
	// The counters are bumped right after settling, on the consumer's goroutines: once
	// these all wait for the next delivery, every counter is final.
	synctest.Wait()
	got := gather()
	for key, v := range want {
		if got[key] != v {
			t.Errorf("%s = %v, want %v", key, got[key], v)
		}
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	if _, err := redeliver.New(redeliver.Config{Handler: func(context.Context, *redeliver.Message) error { return nil }}); err == nil {
		t.Error("no source accepted")
	}
	if _, err := redeliver.New(redeliver.Config{Source: newFakeSource(0)}); err == nil {
		t.Error("no handler accepted")
	}
}

func TestAttemptOf(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		h     map[string]string
		count int
		want  int
	}{
		{nil, 0, 1},
		{map[string]string{"x-retry-count": "0"}, 0, 1},
		{map[string]string{"x-retry-count": "3"}, 0, 4},
		{map[string]string{"x-retry-count": " 3 "}, 0, 4},
		{map[string]string{"x-retry-count": "3"}, 7, 7},
		{map[string]string{"x-retry-count": "-3"}, 2, 2},
		{map[string]string{"x-retry-count": "99999999999999"}, 0, 1},
		{map[string]string{"other": "3"}, 0, 1},
	} {
		if got := redeliver.AttemptOf(tt.h, "x-retry-count", tt.count); got != tt.want {
			t.Errorf("AttemptOf(%v, %d) = %d, want %d", tt.h, tt.count, got, tt.want)
		}
	}
}

func TestResetHeaderAndTruncate(t *testing.T) {
	t.Parallel()
	d := redeliver.DeadInfo{Reason: redeliver.ReasonMaxAttempts, Err: string(make([]byte, 5000)), Attempts: 5, CountHeader: "x-retry-count"}
	h := d.Header()
	if len(h[redeliver.HeaderError]) != redeliver.MaxErrorLen {
		t.Errorf("error header not truncated: %d", len(h[redeliver.HeaderError]))
	}
	h["app"] = "1"
	r := redeliver.ResetHeader(h, "x-retry-count")
	if len(r) != 1 || r["app"] != "1" {
		t.Errorf("ResetHeader = %v", r)
	}
}

func TestDecodeJSON(t *testing.T) {
	t.Parallel()
	var v struct{ A int }
	err := redeliver.DecodeJSON(&redeliver.Message{Body: []byte("{")}, &v)
	if !errors.Is(err, redeliver.ErrDecode) || redeliver.DefaultClassify(err) != redeliver.ClassDecode {
		t.Errorf("err = %v", err)
	}
	if err := redeliver.DecodeJSON(&redeliver.Message{Body: []byte(`{"A":1}`)}, &v); err != nil || v.A != 1 {
		t.Errorf("err = %v, v = %v", err, v)
	}
	if redeliver.Decode(nil) != nil {
		t.Error("Decode(nil) != nil")
	}
	if c := redeliver.DefaultClassify(fmt.Errorf("wrapped: %w", context.DeadlineExceeded)); c != redeliver.ClassTimeout {
		t.Errorf("class = %s", c)
	}
}

// headerSource is a fakeSource that counts attempts in the header (as RabbitMQ's does).
type headerSource struct{ *fakeSource }

func (headerSource) CountsInHeader() bool { return true }

// keeperSource is a fakeSource that records failed attempts itself (as JetStream's
// does): its messages carry FailedAttempts.
type keeperSource struct{ *fakeSource }

func (keeperSource) KeepsAttempts() bool { return true }

// TestHeaderCounted: on a Source that counts attempts in the header, or records them
// itself, the broker's delivery count spends no attempt — a message redelivered by
// restarts runs as the attempt its header or record says — and only a delivery count
// beyond MaxDeliveries dead-letters it unrun, as max-deliver. Elsewhere the delivery
// count is an attempt.
func TestHeaderCounted(t *testing.T) {
	t.Parallel()
	policy := redeliver.Policy{MaxAttempts: 3, MaxDeliveries: 5, Backoff: testBackoff}
	if got := (redeliver.Policy{MaxAttempts: 3}).WithDefaults().MaxDeliveries; got != redeliver.DefaultMinMaxDeliveries {
		t.Errorf("default MaxDeliveries for 3 attempts: %d, want %d", got, redeliver.DefaultMinMaxDeliveries)
	}
	if got := (redeliver.Policy{MaxAttempts: 10}).WithDefaults().MaxDeliveries; got != 40 {
		t.Errorf("default MaxDeliveries for 10 attempts: %d, want 40", got)
	}
	published := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		header   bool
		keeper   bool
		count    int    // DeliveryCount
		failed   int    // FailedAttempts
		retries  string // count header
		attempt  int    // Attempt the handler sees; 0: it must not run
		op       string
		reason   redeliver.Reason
		attempts int
	}{
		{"restarts spend nothing", true, false, 5, 0, "", 1, "ack", "", 0},
		{"header counts", true, false, 4, 0, "1", 2, "ack", "", 0},
		{"beyond max deliveries", true, false, 6, 0, "1", 0, "dead", redeliver.ReasonMaxDeliver, 1},
		{"record: restarts spend nothing", false, true, 5, 0, "", 1, "ack", "", 0},
		{"record counts", false, true, 4, 1, "", 2, "ack", "", 0},
		{"record: a reset delivery count", false, true, 1, 2, "", 3, "ack", "", 0},
		{"record: the larger of header and record", false, true, 1, 1, "2", 3, "ack", "", 0},
		{"record: beyond max attempts", false, true, 4, 3, "", 0, "dead", redeliver.ReasonMaxAttempts, 3},
		{"record: beyond max deliveries", false, true, 6, 1, "", 0, "dead", redeliver.ReasonMaxDeliver, 1},
		{"delivery count is the attempt elsewhere", false, false, 2, 0, "", 2, "ack", "", 0},
		{"beyond max attempts elsewhere", false, false, 4, 0, "", 0, "dead", redeliver.ReasonMaxAttempts, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFakeSource(1)
			var src redeliver.Source = fs
			switch {
			case tc.header:
				src = headerSource{fs}
			case tc.keeper:
				src = keeperSource{fs}
			}
			ran := make(chan int, 1)
			run(t, redeliver.Config{Source: src, Policy: policy, Handler: func(ctx context.Context, m *redeliver.Message) error {
				ran <- m.Attempt
				return nil
			}})
			h := map[string]string{}
			if tc.retries != "" {
				h[redeliver.DefaultHeader] = tc.retries
			}
			d := fs.push(&redeliver.Message{ID: "m", Queue: "q", Header: h, DeliveryCount: tc.count, FailedAttempts: tc.failed, Published: published})
			if op := d.wait(t); op != tc.op {
				t.Fatalf("settled by %s, want %s", op, tc.op)
			}
			select {
			case a := <-ran:
				if a != tc.attempt {
					t.Errorf("handler ran as attempt %d, want %d", a, tc.attempt)
				}
			default:
				if tc.attempt != 0 {
					t.Errorf("handler did not run, want attempt %d", tc.attempt)
				}
			}
			if tc.op == "dead" {
				d.mu.Lock()
				info := d.dead
				d.mu.Unlock()
				if info.Reason != tc.reason || info.Attempts != tc.attempts {
					t.Errorf("dead letter %+v, want reason %s, attempts %d", info, tc.reason, tc.attempts)
				}
				if tc.reason == redeliver.ReasonMaxDeliver && (info.Class != redeliver.ClassUnknown || !info.FirstFailure.Equal(published)) {
					t.Errorf("max-deliver dead letter %+v: want class unknown, first failure the publish", info)
				}
			}
		})
	}
}

// TestRetriedAttemptKept: a Retry that succeeded (copy stored, original acked) may still
// see the original come back, header unchanged, when the broker never got the ack (its
// node stopped first). That delivery is still the attempt after the failed one.
func TestRetriedAttemptKept(t *testing.T) {
	t.Parallel()
	src := headerSource{newFakeSource(2)}
	runs := make(chan *redeliver.Message, 3)
	var n atomic.Int32
	run(t, redeliver.Config{Source: src, Policy: redeliver.Policy{MaxAttempts: 3, Backoff: testBackoff},
		Handler: func(ctx context.Context, m *redeliver.Message) error {
			runs <- m
			if n.Add(1) == 1 {
				return errors.New("fails once")
			}
			return nil
		}})
	d := src.push(&redeliver.Message{ID: "m", Queue: "q", DeliveryCount: 1})
	if op := d.wait(t); op != "retry" {
		t.Fatalf("first delivery settled by %s, want retry", op)
	}
	<-runs
	again := src.push(&redeliver.Message{ID: "m", Queue: "q", DeliveryCount: 2}) // the original, its ack lost
	if op := again.wait(t); op != "ack" {
		t.Fatalf("redelivery settled by %s, want ack", op)
	}
	if m := <-runs; m.Attempt != 2 || m.FirstFailure.IsZero() {
		t.Errorf("the original redelivered after a successful retry: attempt %d, first failure %v; want 2 and the first run's failure", m.Attempt, m.FirstFailure)
	}
	other := src.push(&redeliver.Message{ID: "other", Queue: "q", DeliveryCount: 1})
	if op := other.wait(t); op != "ack" {
		t.Fatalf("other message settled by %s", op)
	}
	if m := <-runs; m.Attempt != 1 {
		t.Errorf("another message: attempt %d, want 1", m.Attempt)
	}
}

// TestFailedRetryRemembered: an attempt whose Retry failed (the broker went away) still
// counts when the broker redelivers the message, header unchanged, to the same
// Consumer, and its failure time is the first failure.
func TestFailedRetryRemembered(t *testing.T) {
	t.Parallel()
	src := headerSource{newFakeSource(2)}
	runs := make(chan *redeliver.Message, 3)
	var n atomic.Int32
	run(t, redeliver.Config{Source: src, Policy: redeliver.Policy{MaxAttempts: 3, Backoff: testBackoff},
		Handler: func(ctx context.Context, m *redeliver.Message) error {
			runs <- m
			if n.Add(1) == 1 {
				return errors.New("down")
			}
			return nil
		}})
	d := &fakeDelivery{m: &redeliver.Message{ID: "m", Queue: "q", DeliveryCount: 1}, beaten: make(chan struct{}, 1),
		settled: make(chan struct{}), failRetry: true}
	src.ch <- d
	if op := d.wait(t); op != "retry-failed" {
		t.Fatalf("first delivery settled by %s, want a failed retry", op)
	}
	first := <-runs
	again := src.push(&redeliver.Message{ID: "m", Queue: "q", DeliveryCount: 2})
	if op := again.wait(t); op != "ack" {
		t.Fatalf("redelivery settled by %s, want ack", op)
	}
	m := <-runs
	if m.Attempt != 2 || m.FirstFailure.IsZero() || m.FirstFailure.Before(first.Received) {
		t.Errorf("redelivery: attempt %d, first failure %v; want 2 and the first run's failure (after %v)", m.Attempt, m.FirstFailure, first.Received)
	}
	other := src.push(&redeliver.Message{ID: "other", Queue: "q", DeliveryCount: 2})
	if op := other.wait(t); op != "ack" {
		t.Fatalf("other message settled by %s", op)
	}
	if m := <-runs; m.Attempt != 1 || !m.FirstFailure.IsZero() {
		t.Errorf("another message: attempt %d, first failure %v; want 1 and none", m.Attempt, m.FirstFailure)
	}
}
