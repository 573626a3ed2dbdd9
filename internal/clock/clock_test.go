package clock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/clock"
)

// fired is a Timer whose waits are over at once.
type fired struct{ waits int }

func (f *fired) After(time.Duration) (<-chan time.Time, func() bool) {
	f.waits++
	c := make(chan time.Time, 1)
	c <- time.Time{}
	return c, func() bool { return false }
}

func TestSleep(t *testing.T) {
	f := &fired{}
	if err := clock.Sleep(context.Background(), f, time.Hour); err != nil || f.waits != 1 {
		t.Errorf("Sleep = %v after %d waits, want nil after 1", err, f.waits)
	}
	if err := clock.Sleep(context.Background(), f, 0); err != nil || f.waits != 1 {
		t.Errorf("Sleep(0) = %v after %d waits, want nil without waiting", err, f.waits)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 100 {
		if err := clock.Sleep(ctx, f, time.Hour); !errors.Is(err, context.Canceled) {
			t.Fatalf("Sleep with an ended context = %v, want context.Canceled", err)
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := clock.Sleep(ctx, clock.Real{}, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Sleep past the deadline = %v, want context.DeadlineExceeded", err)
	}
	start := time.Now()
	if err := clock.Sleep(context.Background(), clock.Real{}, 5*time.Millisecond); err != nil || time.Since(start) < 5*time.Millisecond {
		t.Errorf("Sleep(5ms) = %v after %v", err, time.Since(start))
	}
}
