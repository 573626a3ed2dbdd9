package reconcile_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/retrysafe/retrysafe/fence"
	"github.com/retrysafe/retrysafe/reconcile"
	"github.com/retrysafe/retrysafe/retry"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var quiet = slog.New(slog.DiscardHandler)

// fast retries quickly, so failing repairs do not slow the tests.
var fast = retry.Policy{MaxAttempts: 3, Base: time.Millisecond, Cap: time.Millisecond}

// side is one side of a reconciliation in memory.
type side struct {
	mu    sync.Mutex
	items map[string]string
	lists atomic.Int64
	err   error // returned by List when set
}

func newSide(items map[string]string) *side { return &side{items: maps.Clone(items)} }

func (s *side) List(context.Context) (map[string]string, error) {
	s.lists.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	return maps.Clone(s.items), nil
}

func (s *side) snapshot() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.items)
}

// apply repairs actual so that it matches d.
func (s *side) apply(d reconcile.Drift[string]) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.Kind == reconcile.Extra {
		delete(s.items, d.Key)
	} else {
		s.items[d.Key] = d.Desired
	}
}

var (
	wantDesired = map[string]string{"a": "1", "b": "2", "c": "3", "d": "4"}
	// drifted: b missing, c different, x extra.
	drifted = map[string]string{"a": "1", "c": "three", "d": "4", "x": "9"}
)

func TestDiff(t *testing.T) {
	t.Parallel()
	eq := func(a, b string) bool { return a == b }
	got := reconcile.Diff(wantDesired, drifted, eq)
	want := []reconcile.Drift[string]{
		{Key: "b", Kind: reconcile.Missing, Desired: "2"},
		{Key: "c", Kind: reconcile.Different, Desired: "3", Actual: "three"},
		{Key: "x", Kind: reconcile.Extra, Actual: "9"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Diff = %+v, want %+v", got, want)
	}
	for _, tc := range []struct {
		name            string
		desired, actual map[string]string
		n               int
	}{
		{"both empty", nil, nil, 0},
		{"equal", wantDesired, wantDesired, 0},
		{"actual empty", wantDesired, nil, 4},
		{"desired empty", nil, wantDesired, 4},
	} {
		if got := reconcile.Diff(tc.desired, tc.actual, eq); len(got) != tc.n {
			t.Errorf("%s: %d drifted, want %d", tc.name, len(got), tc.n)
		}
	}
	if s := reconcile.Kind(9).String(); s != "kind(9)" {
		t.Errorf("Kind(9) = %q", s)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	l := newSide(nil)
	for _, tc := range []struct {
		name string
		cfg  reconcile.Config[string]
	}{
		{"no desired", reconcile.Config[string]{Actual: l}},
		{"no actual", reconcile.Config[string]{Desired: l}},
		{"negative interval", reconcile.Config[string]{Desired: l, Actual: l, Interval: -1}},
		{"negative ttl", reconcile.Config[string]{Desired: l, Actual: l, LeaseTTL: -time.Second}},
		{"tiny ttl", reconcile.Config[string]{Desired: l, Actual: l, LeaseTTL: time.Microsecond}},
		{"negative max", reconcile.Config[string]{Desired: l, Actual: l, MaxRepairs: -1}},
		{"jitter over 1", reconcile.Config[string]{Desired: l, Actual: l, Jitter: 1.5}},
	} {
		if _, err := reconcile.New(tc.cfg); err == nil {
			t.Errorf("%s: New succeeded", tc.name)
		}
	}
	reg := prometheus.NewRegistry()
	if _, err := reconcile.New(reconcile.Config[string]{Desired: l, Actual: l, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := reconcile.New(reconcile.Config[string]{Desired: l, Actual: l, Registerer: reg}); err == nil {
		t.Error("a second reconciler with the same name registered its metrics")
	}
	if _, err := reconcile.New(reconcile.Config[string]{Name: "other", Desired: l, Actual: l, Registerer: reg}); err != nil {
		t.Errorf("a reconciler with another name: %v", err)
	}
}

// Injected drift of each kind is found in one pass and repaired; the next pass finds
// none. The metrics count it.
func TestRunOnceRepairs(t *testing.T) {
	t.Parallel()
	desired, actual := newSide(wantDesired), newSide(drifted)
	reg := prometheus.NewRegistry()
	var repaired []string
	r, err := reconcile.New(reconcile.Config[string]{
		Name: "grants", Desired: desired, Actual: actual, Logger: quiet, Registerer: reg, Retry: fast,
		Repair: func(ctx context.Context, d reconcile.Drift[string]) error {
			repaired = append(repaired, d.Kind.String()+" "+d.Key)
			actual.apply(d)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunOnce(t.Context())
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	if rep.Missing != 1 || rep.Extra != 1 || rep.Different != 1 || rep.Repaired != 3 || rep.Failed != 0 ||
		rep.Desired != 4 || rep.Actual != 4 || rep.Drifted() != 3 || rep.Skipped || rep.Token != 0 {
		t.Errorf("report %+v", rep)
	}
	if want := []string{"missing b", "different c", "extra x"}; !slices.Equal(repaired, want) {
		t.Errorf("repairs %v, want %v", repaired, want)
	}
	for _, it := range rep.Items {
		if !it.Repaired || it.Attempts != 1 || it.Err != nil {
			t.Errorf("item %+v", it)
		}
	}
	if !maps.Equal(actual.snapshot(), wantDesired) {
		t.Errorf("actual after the pass %v, want %v", actual.snapshot(), wantDesired)
	}
	if rep.Finished.Before(rep.Started) {
		t.Errorf("finished %s before started %s", rep.Finished, rep.Started)
	}

	rep, err = r.RunOnce(t.Context())
	if err != nil || rep.Drifted() != 0 || len(rep.Items) != 0 {
		t.Errorf("second pass: %+v, %v", rep, err)
	}

	for _, tc := range []struct {
		name string
		got  float64
		want float64
	}{
		{"found missing", metric(t, reg, "retrysafe_reconcile_drift_found_total", "missing"), 1},
		{"found extra", metric(t, reg, "retrysafe_reconcile_drift_found_total", "extra"), 1},
		{"repaired different", metric(t, reg, "retrysafe_reconcile_repaired_total", "different"), 1},
		{"failed missing", metric(t, reg, "retrysafe_reconcile_repair_failed_total", "missing"), 0},
		{"drift now", metric(t, reg, "retrysafe_reconcile_drift_items", "missing"), 0},
		{"passes ok", metric(t, reg, "retrysafe_reconcile_passes_total", "ok"), 2},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "retrysafe_reconcile_pass_duration_seconds" {
			if n := f.GetMetric()[0].GetHistogram().GetSampleCount(); n != 2 {
				t.Errorf("pass duration: %d observations, want 2", n)
			}
			if l := f.GetMetric()[0].GetLabel(); len(l) != 1 || l[0].GetName() != "reconciler" || l[0].GetValue() != "grants" {
				t.Errorf("pass duration labels %v, want reconciler=grants", l)
			}
		}
	}
}

// metric returns the value of one series of reg, by name and the value of its variable
// label (kind or result).
func metric(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if (lp.GetName() == "kind" || lp.GetName() == "result") && lp.GetValue() == label {
					if m.GetCounter() != nil {
						return m.GetCounter().GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no series %s{%s}", name, label)
	return 0
}

func TestReportOnly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		repair bool
	}{{"no Repair", false}, {"ReportOnly", true}} {
		actual := newSide(drifted)
		calls := 0
		cfg := reconcile.Config[string]{Desired: newSide(wantDesired), Actual: actual, Logger: quiet, ReportOnly: tc.repair}
		if tc.repair {
			cfg.Repair = func(context.Context, reconcile.Drift[string]) error { calls++; return nil }
		}
		r, err := reconcile.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := r.RunOnce(t.Context())
		if err != nil || rep.Drifted() != 3 || rep.Repaired != 0 || calls != 0 {
			t.Errorf("%s: %+v, %v, %d repairs", tc.name, rep, err, calls)
		}
		if !maps.Equal(actual.snapshot(), drifted) {
			t.Errorf("%s: actual changed", tc.name)
		}
	}
}

func TestRepairRetries(t *testing.T) {
	t.Parallel()
	errBoom := errors.New("boom")
	var mu sync.Mutex
	calls := map[string]int{}
	r, err := reconcile.New(reconcile.Config[string]{
		Desired: newSide(map[string]string{"flaky": "1", "broken": "1", "stale": "1", "fine": "1"}),
		Actual:  newSide(nil), Logger: quiet, Retry: fast,
		Repair: func(ctx context.Context, d reconcile.Drift[string]) error {
			mu.Lock()
			calls[d.Key]++
			n := calls[d.Key]
			mu.Unlock()
			switch d.Key {
			case "flaky":
				if n < 3 {
					return errBoom
				}
			case "broken":
				return errBoom
			case "stale":
				return fence.ErrStaleToken
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunOnce(t.Context())
	if !errors.Is(err, reconcile.ErrRepairFailed) || !errors.Is(err, errBoom) {
		t.Errorf("RunOnce error %v, want ErrRepairFailed wrapping the first failure", err)
	}
	if rep.Repaired != 2 || rep.Failed != 2 {
		t.Errorf("repaired %d, failed %d; want 2 and 2", rep.Repaired, rep.Failed)
	}
	want := map[string]struct {
		attempts int
		ok       bool
		err      error
	}{
		"broken": {3, false, retry.ErrMaxAttempts},
		"fine":   {1, true, nil},
		"flaky":  {3, true, nil},
		"stale":  {1, false, fence.ErrStaleToken}, // not retried
	}
	for _, it := range rep.Items {
		w := want[it.Key]
		if it.Attempts != w.attempts || it.Repaired != w.ok || !errors.Is(it.Err, w.err) {
			t.Errorf("%s: attempts %d, repaired %v, err %v; want %d, %v, %v", it.Key, it.Attempts, it.Repaired, it.Err,
				w.attempts, w.ok, w.err)
		}
	}
}

func TestMaxRepairs(t *testing.T) {
	t.Parallel()
	calls := 0
	r, err := reconcile.New(reconcile.Config[string]{
		Desired: newSide(wantDesired), Actual: newSide(nil), Logger: quiet, MaxRepairs: 3,
		Repair: func(context.Context, reconcile.Drift[string]) error { calls++; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunOnce(t.Context())
	if !errors.Is(err, reconcile.ErrTooMuchDrift) || calls != 0 || rep.Missing != 4 {
		t.Errorf("RunOnce: %+v, %v, %d repairs; want ErrTooMuchDrift and none", rep, err, calls)
	}
}

func TestListFailure(t *testing.T) {
	t.Parallel()
	errDown := errors.New("down")
	actual := newSide(nil)
	actual.err = retry.Permanent(errDown)
	reg := prometheus.NewRegistry()
	r, err := reconcile.New(reconcile.Config[string]{
		Desired: newSide(wantDesired), Actual: actual, Logger: quiet, Registerer: reg, Retry: fast,
		Repair: func(context.Context, reconcile.Drift[string]) error { t.Error("Repair called"); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(t.Context()); !errors.Is(err, errDown) {
		t.Errorf("RunOnce: %v, want the listing's error", err)
	}
	if got := metric(t, reg, "retrysafe_reconcile_passes_total", "failed"); got != 1 {
		t.Errorf("failed passes %v, want 1", got)
	}

	// A transient listing failure is retried within the pass.
	flaky := newSide(nil)
	var n atomic.Int64
	r, err = reconcile.New(reconcile.Config[string]{
		Desired: reconcile.ListerFunc[string](func(ctx context.Context) (map[string]string, error) {
			if n.Add(1) == 1 {
				return nil, errDown
			}
			return wantDesired, nil
		}),
		Actual: flaky, Logger: quiet, Retry: fast,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(t.Context()); err != nil || rep.Missing != 4 {
		t.Errorf("RunOnce after a transient listing failure: %+v, %v", rep, err)
	}
}

// Run runs a pass at once and then one per interval, with the configured jitter, on the
// injected clock, and returns the context's cause.
func TestRun(t *testing.T) {
	t.Parallel()
	clock := &stepClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	ctx, cancel := context.WithCancelCause(t.Context())
	errStop := errors.New("stop")
	desired := newSide(wantDesired)
	var passes atomic.Int64
	rands := []float64{0, 0.5, 0.999}
	var ri atomic.Int64
	r, err := reconcile.New(reconcile.Config[string]{
		Desired: reconcile.ListerFunc[string](func(ctx context.Context) (map[string]string, error) {
			if passes.Add(1) == 4 {
				cancel(errStop)
			}
			return desired.List(ctx)
		}),
		Actual: newSide(wantDesired), Logger: quiet, Clock: clock, Interval: time.Minute, Jitter: 0.2,
		Rand: func() float64 { return rands[int(ri.Add(1)-1)%len(rands)] },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); !errors.Is(err, errStop) {
		t.Errorf("Run returned %v, want the context's cause", err)
	}
	if passes.Load() != 4 {
		t.Errorf("%d passes, want 4", passes.Load())
	}
	want := []time.Duration{48 * time.Second, time.Minute, 71976 * time.Millisecond}
	if got := clock.waits(); len(got) < 3 || !slices.Equal(got[:3], want) {
		t.Errorf("waits %v, want %v first", got, want)
	}
}

// stepClock is a clock whose timers fire at once, advancing it.
type stepClock struct {
	mu     sync.Mutex
	now    time.Time
	waited []time.Duration
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) After(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waited = append(c.waited, d)
	c.now = c.now.Add(d)
	ch := make(chan time.Time, 1)
	ch <- c.now
	return ch, func() bool { return false }
}

func (c *stepClock) waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.waited)
}
