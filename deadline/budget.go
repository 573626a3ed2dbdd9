package deadline

import (
	"context"
	"fmt"
	"time"
)

// ErrExhausted says that too little of a budget is left to start a call: Transport
// returns it instead of sending a request that cannot finish, Reserve's child context
// reports it as its cause, and Ladder as the reason it skipped a step. It matches
// context.DeadlineExceeded with errors.Is, so code that handles a deadline handles it
// too, and a retry layer does not retry it.
var ErrExhausted error = exhaustedError{}

type exhaustedError struct{}

func (exhaustedError) Error() string { return "deadline: budget exhausted" }

// Is makes ErrExhausted match context.DeadlineExceeded.
func (exhaustedError) Is(target error) bool { return target == context.DeadlineExceeded }

// Timeout reports true, as context.DeadlineExceeded does (net.Error's Timeout).
func (exhaustedError) Timeout() bool { return true }

// Remaining reports the time left before ctx's deadline (zero or negative once it has
// passed) and whether ctx has a deadline at all.
func Remaining(ctx context.Context) (time.Duration, bool) {
	if ctx == nil {
		return 0, false
	}
	dl, ok := ctx.Deadline()
	if !ok {
		return 0, false
	}
	return time.Until(dl), true
}

// Reserve returns a child of ctx that ends d before ctx's deadline, keeping d back for
// the work that must follow (the database write after a slow call, the answer to the
// caller). Call the CancelFunc when done, as with context.WithDeadline.
//
// Without a deadline on ctx the child has none either (it is only cancelable). When d is
// at least the time left, the child is already done; its Err is
// context.DeadlineExceeded and its context.Cause matches ErrExhausted. A d of zero or
// less reserves nothing: the child ends with its parent.
func Reserve(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if ctx == nil {
		ctx = context.Background()
	}
	dl, ok := ctx.Deadline()
	if !ok || d <= 0 {
		return context.WithCancel(ctx)
	}
	cause := fmt.Errorf("%w: %v reserved before the parent's deadline", ErrExhausted, d)
	return context.WithDeadlineCause(ctx, dl.Add(-d), cause)
}

// contextErr returns ctx's error and, when it differs, its cause, joined.
func contextErr(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return join(err, cause)
	}
	return err
}
