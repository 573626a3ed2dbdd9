package deadline

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// ErrNoSteps is returned by Ladder when it is given no steps.
var ErrNoSteps = errors.New("deadline: ladder has no steps")

// errNilStep is a StepError's Err for a nil step function.
var errNilStep = errors.New("deadline: nil step function")

// StepError is one failed (or skipped) step of a Ladder. It unwraps to the step's error.
type StepError struct {
	Step int   // index of the step in Ladder's steps, 0 for the first
	Err  error // what the step returned, or why it was skipped
}

func (e *StepError) Error() string {
	return "deadline: ladder step " + strconv.Itoa(e.Step) + ": " + message(e.Err)
}

// Unwrap returns the step's error.
func (e *StepError) Unwrap() error { return e.Err }

// LadderConfig bounds the steps of a Ladder. The zero value of every field means the
// default documented on it.
type LadderConfig struct {
	// PerStep is the most time one step may take: each step runs with a context that
	// ends after min(PerStep, the time left in ctx). Default: an equal share of the time
	// left among the steps not yet tried (time left / steps left), so a first step that
	// hangs cannot starve the others, and a step that fails fast leaves its time to the
	// rest. Without a deadline on ctx that default cannot be computed and steps are
	// bounded only by ctx: give the ladder a deadline, or set PerStep. Negative means
	// the default.
	PerStep time.Duration

	// MinStep is the least time worth starting a step with: when less than MinStep is
	// left in ctx, the steps not yet tried are skipped (each reported as a StepError
	// matching ErrExhausted) and Ladder returns at once, instead of starting a call that
	// cannot finish. With the default PerStep it is also the smallest share a step gets.
	// It is ignored when ctx has no deadline. Default 0: a step starts whenever time is
	// left. A MinStep above PerStep is lowered to PerStep; negative means 0.
	MinStep time.Duration
}

// Ladder tries steps in order, each with its own slice of ctx's budget (see
// LadderConfig), and returns the first success: a ladder of providers (say, AI models
// in order of preference), made to fit inside one budget. A step that succeeds ends the ladder; later steps are not called.
//
// When every step fails, Ladder returns the zero T and the steps' errors joined, each
// wrapped in a *StepError carrying its index: one error that unwraps to all of them
// (Unwrap() []error, as errors.Join's does), so errors.Is and errors.As find any, and
// whose message is theirs separated by "; ", on one line, so it survives a log line or
// an http.Error body. When ctx ends (its deadline passes or it is canceled),
// Ladder stops at once, tries no further step, and returns the errors so far joined with
// ctx's error (and its cause, when that differs), so errors.Is(err,
// context.DeadlineExceeded) holds when the budget ran out.
//
// Every step's context is a child of ctx, so the ladder as a whole never runs past ctx's
// deadline, provided each step returns when its context ends, as every context-aware
// call does. Ladder starts no goroutine and cannot abandon a step that ignores its
// context. With no steps it returns ErrNoSteps; a nil step fails as a StepError.
func Ladder[T any](ctx context.Context, cfg LadderConfig, steps ...func(context.Context) (T, error)) (T, error) {
	var zero T
	if ctx == nil {
		ctx = context.Background()
	}
	if len(steps) == 0 {
		return zero, ErrNoSteps
	}
	errs := make([]error, 0, len(steps)+1)
	for i, step := range steps {
		if ctx.Err() != nil {
			return zero, join(append(errs, contextErr(ctx))...)
		}
		if step == nil {
			errs = append(errs, &StepError{Step: i, Err: errNilStep})
			continue
		}
		left, hasDeadline := Remaining(ctx)
		d, bounded, skip := cfg.slot(left, hasDeadline, len(steps)-i)
		if skip {
			for j := i; j < len(steps); j++ {
				errs = append(errs, &StepError{Step: j, Err: fmt.Errorf("%w: %v left, below MinStep %v: step skipped",
					ErrExhausted, max(left, 0).Round(time.Microsecond), cfg.minStep())})
			}
			return zero, join(errs...)
		}
		v, err := runStep(ctx, d, bounded, step)
		if err == nil {
			return v, nil
		}
		errs = append(errs, &StepError{Step: i, Err: err})
	}
	if ctx.Err() != nil {
		errs = append(errs, contextErr(ctx))
	}
	return zero, join(errs...)
}

func runStep[T any](ctx context.Context, d time.Duration, bounded bool, step func(context.Context) (T, error)) (T, error) {
	if !bounded {
		return step(ctx)
	}
	sctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return step(sctx)
}

// minStep is MinStep clamped to [0, PerStep].
func (c LadderConfig) minStep() time.Duration {
	m := max(c.MinStep, 0)
	if c.PerStep > 0 {
		m = min(m, c.PerStep)
	}
	return m
}

// slot returns how long the next step may run, given the time left (when hasDeadline)
// and the number of steps not yet tried, counting this one; bounded is false when the
// step runs with ctx as it is, and skip is true when too little time is left to start.
func (c LadderConfig) slot(left time.Duration, hasDeadline bool, stepsLeft int) (d time.Duration, bounded, skip bool) {
	if !hasDeadline {
		if c.PerStep > 0 {
			return c.PerStep, true, false
		}
		return 0, false, false
	}
	minStep := c.minStep()
	// No time left is never enough, whatever MinStep: the deadline has passed even
	// when ctx does not say so yet (its timer has not fired), and a step started now
	// gets a context that is already done.
	if left <= 0 || left < minStep {
		return 0, false, true
	}
	per := c.PerStep
	if per <= 0 {
		per = max(left/time.Duration(max(stepsLeft, 1)), minStep)
	}
	return min(per, left), true, false
}
