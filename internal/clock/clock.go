// Package clock is the real clock behind retry.Clock, and the wait on such a clock, for
// the packages that schedule with one (retry, fence, reconcile). Their Config.Clock is a
// retry.Clock, nil meaning Real; components that only read the time take a
// Clock func() time.Time instead, nil meaning time.Now.
package clock

import (
	"context"
	"time"
)

// Real is the process's clock: time.Now, and time.Timer for waits.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// After returns a timer's channel, which receives after d, and its Stop.
func (Real) After(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// Timer is the waiting half of retry.Clock.
type Timer interface {
	After(d time.Duration) (<-chan time.Time, func() bool)
}

// Sleep waits d on t, and returns nil, or ctx's error as soon as ctx ends: at once when
// it already has, so an ended context never sleeps however a fake Timer behaves. A d of
// zero or less does not wait.
func Sleep(ctx context.Context, t Timer, d time.Duration) error {
	if err := ctx.Err(); err != nil || d <= 0 {
		return err
	}
	c, stop := t.After(d)
	defer stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c:
		return nil
	}
}
