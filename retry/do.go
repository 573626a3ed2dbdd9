package retry

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/internal/clock"
)

// Reasons a retry loop stopped before success. An *ExhaustedError matches its reason with
// errors.Is, as well as the last error.
var (
	ErrMaxAttempts = errors.New("retry: attempts exhausted")
	ErrMaxElapsed  = errors.New("retry: time budget exhausted")
	// ErrDeadline: the next wait could not end at least Policy.MinAttempt before the
	// context's deadline, so the loop stopped at once instead of sleeping into a failure
	// or sending an attempt with no time to finish.
	ErrDeadline = errors.New("retry: too little time left before the deadline")
	// ErrServerDelay: the server asked for a wait longer than Policy.MaxServerDelay.
	ErrServerDelay = errors.New("retry: the server asked for too long a wait")
	// ErrBudget: the retry budget is spent (the dependency is failing for everyone).
	ErrBudget = errors.New("retry: retry budget exhausted")
)

// ExhaustedError is returned when a loop gives up on a retryable error.
type ExhaustedError struct {
	Attempts int   // attempts made, the first included
	Last     error // the last attempt's error
	Reason   error // why it stopped: ErrMaxAttempts, ErrDeadline, a context error …
}

// Error reads "<reason> after <n> attempt(s): <last error>", on one line.
func (e *ExhaustedError) Error() string {
	unit := " attempts: "
	if e.Attempts == 1 {
		unit = " attempt: "
	}
	return message(e.Reason) + " after " + strconv.Itoa(e.Attempts) + unit + message(e.Last)
}

// Unwrap returns the last error and the reason, so errors.Is matches either.
func (e *ExhaustedError) Unwrap() []error { return []error{e.Last, e.Reason} }

// message returns err's message on one line: an error string ends up in a log line or
// an HTTP body, where a line break would split it or forge a record. Each line break
// (errors.Join puts one between the errors it joins) becomes "; ".
func message(err error) string {
	if err == nil {
		return "<nil>"
	}
	return oneLine(err.Error())
}

func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	s = strings.ReplaceAll(s, "\r\n", "\n")
	s = strings.ReplaceAll(s, "\r", "\n")
	return strings.ReplaceAll(s, "\n", "; ")
}

// lineError keeps the message of a wrapping error on one line.
type lineError struct{ err error }

func (e *lineError) Error() string { return message(e.err) }
func (e *lineError) Unwrap() error { return e.err }

// errorf is fmt.Errorf whose message stays on one line whatever the errors it wraps say.
func errorf(format string, a ...any) error {
	err := fmt.Errorf(format, a...)
	if strings.ContainsAny(err.Error(), "\r\n") {
		return &lineError{err}
	}
	return err
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as not worth retrying: the loop returns it at once. The returned
// error unwraps to err. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type delayError struct {
	err error
	d   time.Duration
}

func (e *delayError) Error() string                     { return e.err.Error() }
func (e *delayError) Unwrap() error                     { return e.err }
func (e *delayError) RetryAfter() (time.Duration, bool) { return e.d, true }

// After marks err as retryable after exactly d (plus upward jitter), as a server's
// Retry-After does. The returned error unwraps to err.
func After(d time.Duration, err error) error {
	if err == nil {
		return nil
	}
	return &delayError{err: err, d: max(0, d)}
}

// Attempt describes a retry about to happen, for Policy.OnRetry.
type Attempt struct {
	N    int           // the attempt that failed (1 is the first)
	Wait time.Duration // how long the loop waits before attempt N+1
	Err  error         // why attempt N failed
}

// Do calls fn until it returns nil, a non-retryable error (returned as it is), or the
// policy is exhausted (an *ExhaustedError). A wait never outlives ctx's deadline: when
// the next one could not end before it, Do stops at once.
func Do(ctx context.Context, p Policy, fn func(context.Context) error) error {
	_, err := DoValue(ctx, p, func(ctx context.Context) (struct{}, error) { return struct{}{}, fn(ctx) })
	return err
}

// DoValue is Do for a function that returns a value.
func DoValue[T any](ctx context.Context, p Policy, fn func(context.Context) (T, error)) (T, error) {
	var v T
	err := p.withDefaults().run(ctx, func(ctx context.Context, _ int) error {
		var err error
		v, err = fn(ctx)
		return err
	}, nil, nil)
	if err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}

// run is the loop Do, DoValue and Transport share; p has its defaults set. It calls
// attempt (n = 1 for the first) until it returns nil, an error that is Permanent or that
// p.Retryable rejects (returned as it is), or the policy is exhausted (an
// *ExhaustedError). Before each wait it calls p.OnRetry, then retrying (when not nil);
// when p.Budget starts refusing retries it calls refused (when not nil).
func (p Policy) run(ctx context.Context, attempt func(ctx context.Context, n int) error, retrying func(Attempt), refused func()) error {
	var start time.Time // read only when MaxElapsed needs it
	if p.MaxElapsed > 0 {
		start = p.Clock.Now()
	}
	var prev time.Duration
	for n := 1; ; n++ {
		err := attempt(ctx, n)
		if err == nil {
			p.Budget.success()
			return nil
		}
		var perm *permanentError
		if errors.As(err, &perm) || !p.Retryable(err) {
			return err
		}
		p.Budget.failure()
		wait, reason := p.next(ctx, n, &prev, start, err)
		if reason == nil {
			if ok, started := p.Budget.allow(); !ok {
				reason = ErrBudget
				if started && refused != nil {
					refused()
				}
			}
		}
		if reason != nil {
			return &ExhaustedError{Attempts: n, Last: err, Reason: reason}
		}
		a := Attempt{N: n, Wait: wait, Err: err}
		if p.OnRetry != nil {
			p.OnRetry(a)
		}
		if retrying != nil {
			retrying(a)
		}
		if clock.Sleep(ctx, p.Clock, wait) != nil {
			return &ExhaustedError{Attempts: n, Last: err, Reason: context.Cause(ctx)}
		}
	}
}

// next returns the wait before the attempt after attempt, or why there is none.
func (p Policy) next(ctx context.Context, attempt int, prev *time.Duration, start time.Time, err error) (time.Duration, error) {
	if cerr := ctx.Err(); cerr != nil {
		return 0, context.Cause(ctx)
	}
	if p.MaxAttempts > 0 && attempt >= p.MaxAttempts {
		return 0, ErrMaxAttempts
	}
	var wait time.Duration
	var asked interface{ RetryAfter() (time.Duration, bool) }
	if errors.As(err, &asked) {
		if d, ok := asked.RetryAfter(); ok {
			if d > p.MaxServerDelay {
				return 0, ErrServerDelay
			}
			wait = p.upward(d)
		}
	}
	if wait == 0 {
		wait = p.Backoff(attempt-1, *prev)
		*prev = wait
	}
	now := p.Clock.Now()
	if p.MaxElapsed > 0 && now.Add(wait).Sub(start) > p.MaxElapsed {
		return 0, ErrMaxElapsed
	}
	if dl, ok := ctx.Deadline(); ok {
		if left := dl.Sub(now.Add(wait)); left <= 0 || left < p.MinAttempt {
			return 0, ErrDeadline
		}
	}
	return wait, nil
}

// upward adds jitter to a server-requested delay, never below it: up to a tenth of the
// delay, and at most Base, so clients told the same instant do not return together.
func (p Policy) upward(d time.Duration) time.Duration {
	spread := min(d/10, p.Base)
	if d == 0 {
		spread = p.Base / 10
	}
	return d + time.Duration(p.Rand()*float64(spread))
}
