package deadline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
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
		{"no time left skips", LadderConfig{}, 0, true, 2, 0, false, true},
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

// The ladder tests that wait for deadlines run in a synctest bubble: the time is
// virtual, passes only while every goroutine waits, and so is exact, whatever the
// machine's load.

func TestLadderCutsAHangingStep(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// Uncut, the first step would hang until the parent ends (30s).
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var first, second atomic.Int64
		start := time.Now()
		v, err := Ladder(ctx, LadderConfig{PerStep: 50 * time.Millisecond}, hang(&first), answer("B", &second))
		took := time.Since(start)
		if err != nil || v != "B" {
			t.Fatalf("Ladder = %q, %v; want B, nil", v, err)
		}
		if took != 50*time.Millisecond {
			t.Errorf("took %v, want 50ms (the first step's cut)", took)
		}
		if first.Load() != 1 || second.Load() != 1 {
			t.Errorf("calls = %d, %d; want 1, 1", first.Load(), second.Load())
		}
	})
}

func TestLadderFirstSuccessReturnsAtOnce(t *testing.T) {
	t.Parallel()
	var a, b, c atomic.Int64
	start := time.Now()
	// A ladder that went on to the hanging steps would take a minute each.
	v, err := Ladder(context.Background(), LadderConfig{PerStep: time.Minute}, answer("A", &a), hang(&b), hang(&c))
	if err != nil || v != "A" {
		t.Fatalf("Ladder = %q, %v; want A, nil", v, err)
	}
	if took := time.Since(start); took > 10*time.Second {
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
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

// stepRun is what a step saw: when it was called, its context's deadline, and when it
// returned.
type stepRun struct{ entered, deadline, ended time.Time }

// recordingSteps returns a step that hangs until its context ends and records each of
// its runs. Ladder calls steps one at a time, so no lock is needed.
func recordingSteps() (step func(context.Context) (string, error), runs *[]stepRun) {
	runs = new([]stepRun)
	step = func(ctx context.Context) (string, error) {
		r := stepRun{entered: time.Now()}
		r.deadline, _ = ctx.Deadline()
		<-ctx.Done()
		r.ended = time.Now()
		*runs = append(*runs, r)
		return "", ctx.Err()
	}
	return step, runs
}

// Three steps of 900ms under a 1.5s budget: the second step's context ends with the
// budget, the third step never runs, and the ladder says the budget ran out.
func TestLadderNeverExceedsTheTotal(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const budget, perStep = 1500 * time.Millisecond, 900 * time.Millisecond
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		total, _ := ctx.Deadline()
		step, runs := recordingSteps()
		var c atomic.Int64
		_, err := Ladder(ctx, LadderConfig{PerStep: perStep}, step, step, hang(&c))
		took := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want DeadlineExceeded", err)
		}
		if len(*runs) != 2 || c.Load() != 0 {
			t.Fatalf("calls = %d, %d; want 2 (the recording steps), 0", len(*runs), c.Load())
		}
		first, second := (*runs)[0], (*runs)[1]
		if !first.entered.Equal(start) || !first.deadline.Equal(start.Add(perStep)) {
			t.Errorf("first step called %v and due %v after the ladder began, want at once and PerStep (%v) later",
				first.entered.Sub(start), first.deadline.Sub(start), perStep)
		}
		if !second.entered.Equal(start.Add(perStep)) || !second.deadline.Equal(total) {
			t.Errorf("second step called %v and due %v after the ladder began, want when the first ended (%v), due at the budget's end (%v)",
				second.entered.Sub(start), second.deadline.Sub(start), perStep, total.Sub(start))
		}
		if took != budget {
			t.Errorf("took %v, want the budget, %v", took, budget)
		}
	})
}

// Without PerStep, the budget is shared equally among the steps not yet tried.
func TestLadderEqualShares(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const budget = 1500 * time.Millisecond // 500ms a share
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		step, runs := recordingSteps()
		_, err := Ladder(ctx, LadderConfig{}, step, step, step)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v", err)
		}
		if len(*runs) != 3 {
			t.Fatalf("%d steps ran, want 3 (one share each)", len(*runs))
		}
		// Each step gets 1/n of the time left among the n steps not yet tried: 1500/3,
		// then 1000/2, then the last 500ms.
		for i, r := range *runs {
			entered, due := time.Duration(i)*budget/3, time.Duration(i+1)*budget/3
			if r.entered.Sub(start) != entered || r.deadline.Sub(start) != due || r.ended.Sub(start) != due {
				t.Errorf("step %d called %v, due %v, ended %v after the ladder began; want %v, %v, %v",
					i, r.entered.Sub(start), r.deadline.Sub(start), r.ended.Sub(start), entered, due, due)
			}
		}
	})
}

// With PerStep 1s and MinStep 950ms under a 1.9s budget, the first step is cut at 1s and
// leaves 900ms, less than MinStep: the other steps are skipped and the ladder returns at
// once, 900ms before the budget ends, instead of waiting it out.
func TestLadderMinStepSkips(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 1900*time.Millisecond)
		defer cancel()
		var a, b, c atomic.Int64
		start := time.Now()
		_, err := Ladder(ctx, LadderConfig{PerStep: time.Second, MinStep: 950 * time.Millisecond},
			hang(&a), hang(&b), hang(&c))
		if took := time.Since(start); took != time.Second || ctx.Err() != nil {
			t.Errorf("took %v (context: %v); want to stop after the first step (1s), not wait out the budget (1.9s)", took, ctx.Err())
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
	})
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

// Ladder's error is one line, whatever its steps return, and still unwraps to every
// step's error and to the context's error and cause.
func TestLadderErrorIsOneLine(t *testing.T) {
	t.Parallel()
	errA, errB, errC := errors.New("provider A: 500"), errors.New("provider B: 429"), errors.New("provider C: 503")
	cause := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(context.Background())
	var calls atomic.Int64
	_, err := Ladder(ctx, LadderConfig{},
		fail(errA, &calls),
		func(context.Context) (string, error) { return "", errors.Join(errB, errC) }, // two lines of its own
		func(context.Context) (string, error) { cancel(cause); return "", errors.New("cut\r\noff") },
		answer("never", &calls))
	if err == nil {
		t.Fatal("want an error")
	}
	msg := err.Error()
	want := "deadline: ladder step 0: provider A: 500; deadline: ladder step 1: provider B: 429; provider C: 503; " +
		"deadline: ladder step 2: cut; off; context canceled; shutting down"
	if msg != want {
		t.Errorf("err = %q\nwant  %q", msg, want)
	}
	for _, target := range []error{errA, errB, errC, context.Canceled, cause} {
		if !errors.Is(err, target) {
			t.Errorf("err does not match %v", target)
		}
	}
	var se *StepError
	if !errors.As(err, &se) || se.Step != 0 {
		t.Errorf("errors.As found %+v, want step 0", se)
	}
	if u, ok := err.(interface{ Unwrap() []error }); !ok || len(u.Unwrap()) != 4 {
		t.Errorf("err does not unwrap to the three steps and the context: %#v", err)
	}
}
