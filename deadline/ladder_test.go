package deadline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestLadderSlot(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	tests := []struct {
		name        string
		cfg         LadderConfig
		left        time.Duration
		hasDeadline bool
		stepsLeft   int
		d           time.Duration
		bounded     bool
		skip        bool
	}{
		{"per step below budget", LadderConfig{PerStep: 200 * ms}, 300 * ms, true, 3, 200 * ms, true, false},
		{"budget below per step", LadderConfig{PerStep: 200 * ms}, 100 * ms, true, 1, 100 * ms, true, false},
		{"equal share by default", LadderConfig{}, 300 * ms, true, 3, 100 * ms, true, false},
		{"last step gets the rest", LadderConfig{}, 300 * ms, true, 1, 300 * ms, true, false},
		{"share floored at MinStep", LadderConfig{MinStep: 150 * ms}, 300 * ms, true, 3, 150 * ms, true, false},
		{"below MinStep skips", LadderConfig{PerStep: 200 * ms, MinStep: 150 * ms}, 100 * ms, true, 2, 0, false, true},
		{"MinStep lowered to PerStep", LadderConfig{PerStep: 100 * ms, MinStep: time.Second}, 150 * ms, true, 2, 100 * ms, true, false},
		{"negative fields are defaults", LadderConfig{PerStep: -ms, MinStep: -ms}, 300 * ms, true, 2, 150 * ms, true, false},
		{"no deadline, per step", LadderConfig{PerStep: 200 * ms, MinStep: time.Hour}, 0, false, 3, 200 * ms, true, false},
		{"no deadline, no per step", LadderConfig{}, 0, false, 3, 0, false, false},
		{"zero steps left is safe", LadderConfig{}, 300 * ms, true, 0, 300 * ms, true, false},
	}
	for _, tt := range tests {
		d, bounded, skip := tt.cfg.slot(tt.left, tt.hasDeadline, tt.stepsLeft)
		if d != tt.d || bounded != tt.bounded || skip != tt.skip {
			t.Errorf("%s: slot = %v, %v, %v; want %v, %v, %v", tt.name, d, bounded, skip, tt.d, tt.bounded, tt.skip)
		}
	}
}

// hang waits for its context and counts its calls.
func hang(calls *atomic.Int64) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		calls.Add(1)
		<-ctx.Done()
		return "", ctx.Err()
	}
}

func answer(s string, calls *atomic.Int64) func(context.Context) (string, error) {
	return func(context.Context) (string, error) {
		calls.Add(1)
		return s, nil
	}
}

func fail(err error, calls *atomic.Int64) func(context.Context) (string, error) {
	return func(context.Context) (string, error) {
		calls.Add(1)
		return "", err
	}
}

func TestLadderCutsAHangingStep(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var first, second atomic.Int64
	start := time.Now()
	v, err := Ladder(ctx, LadderConfig{PerStep: 50 * time.Millisecond}, hang(&first), answer("B", &second))
	took := time.Since(start)
	if err != nil || v != "B" {
		t.Fatalf("Ladder = %q, %v; want B, nil", v, err)
	}
	if took < 50*time.Millisecond || took > time.Second {
		t.Errorf("took %v, want about 50ms (the first step's cut)", took)
	}
	if first.Load() != 1 || second.Load() != 1 {
		t.Errorf("calls = %d, %d; want 1, 1", first.Load(), second.Load())
	}
}

func TestLadderFirstSuccessReturnsAtOnce(t *testing.T) {
	t.Parallel()
	var a, b, c atomic.Int64
	start := time.Now()
	v, err := Ladder(context.Background(), LadderConfig{PerStep: time.Second}, answer("A", &a), hang(&b), hang(&c))
	if err != nil || v != "A" {
		t.Fatalf("Ladder = %q, %v; want A, nil", v, err)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("took %v", took)
	}
	if a.Load() != 1 || b.Load() != 0 || c.Load() != 0 {
		t.Errorf("calls = %d, %d, %d; want 1, 0, 0", a.Load(), b.Load(), c.Load())
	}
}

func TestLadderAllFail(t *testing.T) {
	t.Parallel()
	errA, errB := errors.New("provider A: 500"), errors.New("provider B: 429")
	var a, b, c atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := Ladder(ctx, LadderConfig{PerStep: 30 * time.Millisecond}, fail(errA, &a), fail(errB, &b), hang(&c))
	if err == nil || v != "" {
		t.Fatalf("Ladder = %q, %v; want an error", v, err)
	}
	if !errors.Is(err, errA) || !errors.Is(err, errB) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v; want it to match each step's error", err)
	}
	for i := range 3 {
		if !strings.Contains(err.Error(), fmt.Sprintf("ladder step %d:", i)) {
			t.Errorf("err does not mention step %d: %v", i, err)
		}
	}
	var se *StepError
	if !errors.As(err, &se) || se.Step != 0 || !errors.Is(se, errA) {
		t.Errorf("first StepError = %+v", se)
	}
	if ctx.Err() != nil {
		t.Error("the parent ended; the steps should have failed on their own")
	}
	if a.Load()+b.Load()+c.Load() != 3 {
		t.Errorf("calls = %d, %d, %d; want 1 each", a.Load(), b.Load(), c.Load())
	}
}

// Three steps of 200ms under a 300ms budget: the ladder ends by ~300ms, never runs the
// third step, and says the budget ran out.
func TestLadderNeverExceedsTheTotal(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var a, b, c atomic.Int64
	start := time.Now()
	_, err := Ladder(ctx, LadderConfig{PerStep: 200 * time.Millisecond}, hang(&a), hang(&b), hang(&c))
	took := time.Since(start)
	if took < 290*time.Millisecond || took > 450*time.Millisecond {
		t.Errorf("took %v, want about 300ms", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want DeadlineExceeded", err)
	}
	if a.Load() != 1 || b.Load() != 1 || c.Load() != 0 {
		t.Errorf("calls = %d, %d, %d; want 1, 1, 0", a.Load(), b.Load(), c.Load())
	}
}

// Without PerStep, the budget is shared equally among the steps not yet tried.
func TestLadderEqualShares(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var ends []time.Duration
	start := time.Now()
	step := func(ctx context.Context) (int, error) {
		<-ctx.Done()
		ends = append(ends, time.Since(start))
		return 0, ctx.Err()
	}
	_, err := Ladder(ctx, LadderConfig{}, step, step, step)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v", err)
	}
	if len(ends) != 3 {
		t.Fatalf("%d steps ran, want 3 (one share each)", len(ends))
	}
	if ends[0] < 90*time.Millisecond || ends[0] > 200*time.Millisecond {
		t.Errorf("the first step ended at %v, want about 100ms", ends[0])
	}
	if ends[2] > 450*time.Millisecond {
		t.Errorf("the last step ended at %v, want about 300ms", ends[2])
	}
}

func TestLadderMinStepSkips(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var a, b, c atomic.Int64
	start := time.Now()
	_, err := Ladder(ctx, LadderConfig{PerStep: 200 * time.Millisecond, MinStep: 150 * time.Millisecond},
		hang(&a), hang(&b), hang(&c))
	took := time.Since(start)
	if took > 280*time.Millisecond {
		t.Errorf("took %v; want to stop after the first step (~200ms), not wait out the budget", took)
	}
	if a.Load() != 1 || b.Load() != 0 || c.Load() != 0 {
		t.Errorf("calls = %d, %d, %d; want 1, 0, 0", a.Load(), b.Load(), c.Load())
	}
	if !errors.Is(err, ErrExhausted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want ErrExhausted", err)
	}
	for i := range 3 {
		if !strings.Contains(err.Error(), fmt.Sprintf("ladder step %d:", i)) {
			t.Errorf("err does not mention step %d: %v", i, err)
		}
	}
}

func TestLadderParentCanceled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var b atomic.Int64
	first := func(context.Context) (string, error) {
		cancel()
		return "", errors.New("boom")
	}
	_, err := Ladder(ctx, LadderConfig{}, first, answer("B", &b))
	if !errors.Is(err, context.Canceled) || b.Load() != 0 {
		t.Errorf("err = %v, second called %d times; want Canceled and no call", err, b.Load())
	}
	cause := errors.New("shutting down")
	ctx, cancelCause := context.WithCancelCause(context.Background())
	cancelCause(cause)
	_, err = Ladder(ctx, LadderConfig{}, answer("A", &b))
	if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) || b.Load() != 0 {
		t.Errorf("err = %v; want Canceled and its cause, no step called", err)
	}
}

func TestLadderNoDeadline(t *testing.T) {
	t.Parallel()
	var had bool
	_, err := Ladder(context.Background(), LadderConfig{}, func(ctx context.Context) (int, error) {
		_, had = ctx.Deadline()
		return 1, nil
	})
	if err != nil || had {
		t.Errorf("err = %v, step had a deadline = %v; want none", err, had)
	}
	_, err = Ladder(context.Background(), LadderConfig{PerStep: time.Second}, func(ctx context.Context) (int, error) {
		_, had = ctx.Deadline()
		return 1, nil
	})
	if err != nil || !had {
		t.Errorf("err = %v, step had a deadline = %v; want PerStep's", err, had)
	}
}

func TestLadderBadInput(t *testing.T) {
	t.Parallel()
	if _, err := Ladder[int](context.Background(), LadderConfig{}); !errors.Is(err, ErrNoSteps) {
		t.Errorf("no steps: err = %v", err)
	}
	var calls atomic.Int64
	v, err := Ladder(context.Background(), LadderConfig{}, nil, answer("B", &calls))
	if err != nil || v != "B" {
		t.Errorf("nil first step: %q, %v; want B", v, err)
	}
	_, err = Ladder[string](context.Background(), LadderConfig{}, nil)
	var se *StepError
	if !errors.As(err, &se) || se.Step != 0 {
		t.Errorf("only a nil step: err = %v", err)
	}
	var nilCtx context.Context
	if v, err := Ladder(nilCtx, LadderConfig{}, answer("A", &calls)); err != nil || v != "A" {
		t.Errorf("nil context: %q, %v", v, err)
	}
}
