package deadline

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// In a synctest bubble the time stands still while the test runs, so Remaining is exact,
// however long a busy machine stalls the test between setting a deadline and reading it.
func TestRemaining(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		if d, ok := Remaining(context.Background()); ok || d != 0 {
			t.Errorf("no deadline: Remaining = %v, %v; want 0, false", d, ok)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if d, ok := Remaining(ctx); !ok || d != time.Minute {
			t.Errorf("Remaining = %v, %v; want 1m, true", d, ok)
		}
		past, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel2()
		if d, ok := Remaining(past); !ok || d != -time.Second {
			t.Errorf("past deadline: Remaining = %v, %v; want -1s, true", d, ok)
		}
	})
}

func TestReserveEndsBeforeParent(t *testing.T) {
	t.Parallel()
	parentDeadline := time.Now().Add(time.Hour)
	parent, cancel := context.WithDeadline(context.Background(), parentDeadline)
	defer cancel()
	for _, tt := range []struct {
		d, want time.Duration // want: how long before the parent the child ends
	}{
		{300 * time.Millisecond, 300 * time.Millisecond},
		{time.Minute, time.Minute},
		{0, 0},
		{-time.Second, 0}, // nothing reserved; never later than the parent
	} {
		child, cancelChild := Reserve(parent, tt.d)
		dl, ok := child.Deadline()
		if !ok || parentDeadline.Sub(dl) != tt.want {
			t.Errorf("Reserve(%v): child ends %v before the parent (deadline %v), want %v", tt.d, parentDeadline.Sub(dl), ok, tt.want)
		}
		if child.Err() != nil {
			t.Errorf("Reserve(%v): child done already: %v", tt.d, child.Err())
		}
		cancelChild()
		if !errors.Is(child.Err(), context.Canceled) {
			t.Errorf("Reserve(%v): after cancel, Err = %v", tt.d, child.Err())
		}
	}
	if parent.Err() != nil {
		t.Errorf("canceling a child ended the parent: %v", parent.Err())
	}
}

func TestReserveRealTime(t *testing.T) {
	t.Parallel()
	// The child ends 200ms in, long before the parent (8s): a child that kept no
	// reserve would end with the parent, far past the bound below.
	parent, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	child, cancelChild := Reserve(parent, 8*time.Second-200*time.Millisecond)
	defer cancelChild()
	start := time.Now()
	<-child.Done()
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("child ended after %v, want about 200ms", took)
	}
	if parent.Err() != nil {
		t.Errorf("parent ended with the child: %v", parent.Err())
	}
	if !errors.Is(child.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(child), ErrExhausted) {
		t.Errorf("child Err = %v, Cause = %v", child.Err(), context.Cause(child))
	}
}

func TestReserveNoParentDeadline(t *testing.T) {
	t.Parallel()
	child, cancel := Reserve(context.Background(), time.Second)
	if _, ok := child.Deadline(); ok {
		t.Error("child has a deadline, its parent none")
	}
	if child.Err() != nil {
		t.Fatalf("child done: %v", child.Err())
	}
	cancel()
	if !errors.Is(child.Err(), context.Canceled) {
		t.Errorf("after cancel, Err = %v", child.Err())
	}
	var nilCtx context.Context // a nil context must not panic
	child, cancel = Reserve(nilCtx, time.Second)
	defer cancel()
	if child == nil || child.Err() != nil {
		t.Errorf("Reserve(nil) = %v", child)
	}
}

// In a synctest bubble, so that the parent's second does not run out while a busy
// machine stalls the test.
func TestReserveAtLeastRemainingIsDone(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		parent, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		for _, d := range []time.Duration{time.Second, time.Hour} {
			child, cancelChild := Reserve(parent, d)
			select {
			case <-child.Done():
			default:
				t.Errorf("Reserve(%v) with 1s left: child not done", d)
			}
			if !errors.Is(child.Err(), context.DeadlineExceeded) {
				t.Errorf("Reserve(%v): Err = %v, want DeadlineExceeded", d, child.Err())
			}
			if !errors.Is(context.Cause(child), ErrExhausted) || !errors.Is(context.Cause(child), context.DeadlineExceeded) {
				t.Errorf("Reserve(%v): Cause = %v, want ErrExhausted", d, context.Cause(child))
			}
			cancelChild()
		}
		if parent.Err() != nil {
			t.Errorf("parent ended: %v", parent.Err())
		}
	})
}

func TestReserveParentCanceled(t *testing.T) {
	t.Parallel()
	parent, cancel := context.WithTimeout(context.Background(), time.Hour)
	child, cancelChild := Reserve(parent, time.Second)
	defer cancelChild()
	cancel()
	<-child.Done()
	if !errors.Is(child.Err(), context.Canceled) {
		t.Errorf("Err = %v, want Canceled", child.Err())
	}
}

func TestErrExhausted(t *testing.T) {
	t.Parallel()
	if !errors.Is(ErrExhausted, context.DeadlineExceeded) {
		t.Error("ErrExhausted does not match context.DeadlineExceeded")
	}
	if errors.Is(context.DeadlineExceeded, ErrExhausted) {
		t.Error("context.DeadlineExceeded matches ErrExhausted")
	}
	var timeout interface{ Timeout() bool }
	if !errors.As(ErrExhausted, &timeout) || !timeout.Timeout() {
		t.Error("ErrExhausted is not a timeout")
	}
}
