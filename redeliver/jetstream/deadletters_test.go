package jetstream

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

// dlq replay puts dead letters back on the work queue, id kept and attempt count reset,
// and they are processed; show and list read without removing.
func TestReplay(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		ctx := context.Background()
		cfg := newConfig(t, url)
		var broken atomic.Bool
		broken.Store(true)
		rec := newRecorder()
		run(t, cfg, func(_ context.Context, m *redeliver.Message) error {
			rec.delivered(m)
			if broken.Load() {
				return retry.Permanent(errors.New("downstream rejects it"))
			}
			rec.succeeded(m.ID)
			return nil
		}, nil)
		nc := connect(t, url)
		publish(t, nc, cfg, "r-1", "r-2", "r-3")
		dl := deadLetters(t, cfg)
		eventually(t, 10*time.Second, "three dead letters", func() bool {
			l, err := dl.List(ctx, 0)
			return err == nil && len(l) == 3
		})
		all, _ := dl.List(ctx, 0)
		if l, err := dl.List(ctx, 2); err != nil || len(l) != 2 || l[0].ID != all[0].ID || l[1].ID != all[1].ID {
			t.Fatalf("List(2) = %v, %v; want the first two of %v", ids(l), err, ids(all))
		}
		if _, err := dl.Get(ctx, "nope"); !errors.Is(err, redeliver.ErrNotFound) {
			t.Errorf("Get(unknown) = %v, want ErrNotFound", err)
		}
		if l, _ := dl.List(ctx, 0); len(l) != 3 {
			t.Fatalf("listing removed dead letters: %d left", len(l))
		}

		broken.Store(false)
		if n, err := dl.Replay(ctx, "r-2"); err != nil || n != 1 {
			t.Fatalf("Replay(r-2) = %d, %v", n, err)
		}
		eventually(t, 10*time.Second, "r-2 processed", func() bool { return rec.success("r-2") == 1 })
		if l, _ := dl.List(ctx, 0); len(l) != 2 {
			t.Errorf("%d dead letters after replaying one, want 2", len(l))
		}
		if n, err := dl.Replay(ctx); err != nil || n != 2 {
			t.Fatalf("Replay() = %d, %v", n, err)
		}
		eventually(t, 10*time.Second, "all processed", func() bool { return rec.totalSuccesses() == 3 })
		rec.mu.Lock()
		for _, id := range []string{"r-1", "r-2", "r-3"} {
			// The first delivery failed (attempt 1); the replayed copy starts at 1 again.
			if a := rec.attempts[id]; len(a) != 2 || a[0] != 1 || a[1] != 1 {
				t.Errorf("%s attempts %v, want [1 1]", id, a)
			}
		}
		rec.mu.Unlock()
		eventually(t, 5*time.Second, "empty queues", func() bool { return queueState(t, nc, cfg) == state{} })
	})
}

func TestPurge(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, url string) {
		ctx := context.Background()
		cfg := newConfig(t, url)
		run(t, cfg, func(context.Context, *redeliver.Message) error {
			return redeliver.Decode(errors.New("garbage"))
		}, nil)
		nc := connect(t, url)
		publish(t, nc, cfg, "p-1", "p-2", "p-3")
		dl := deadLetters(t, cfg)
		eventually(t, 10*time.Second, "three dead letters", func() bool {
			l, err := dl.List(ctx, 0)
			return err == nil && len(l) == 3
		})
		if n, err := dl.Purge(ctx, "p-2", "unknown"); err != nil || n != 1 {
			t.Fatalf("Purge(p-2) = %d, %v", n, err)
		}
		if l, _ := dl.List(ctx, 0); len(l) != 2 || l[0].ID == "p-2" || l[1].ID == "p-2" {
			t.Fatalf("after purging p-2: %v", ids(l))
		}
		if n, err := dl.Purge(ctx); err != nil || n != 2 {
			t.Fatalf("Purge() = %d, %v", n, err)
		}
		if l, _ := dl.List(ctx, 0); len(l) != 0 {
			t.Fatalf("after purging all: %v", ids(l))
		}
		if n, err := dl.Purge(ctx); err != nil || n != 0 {
			t.Errorf("Purge() of an empty DLQ = %d, %v", n, err)
		}
		_ = dl.Close()
		if _, err := dl.List(ctx, 0); !errors.Is(err, redeliver.ErrClosed) {
			t.Errorf("List after Close = %v, want ErrClosed", err)
		}
	})
}

func TestNewDeadLettersWithoutStream(t *testing.T) {
	t.Parallel()
	cfg := newConfig(t, embeddedURL)
	_, err := NewDeadLetters(context.Background(), cfg)
	if !errors.Is(err, redeliver.ErrNotFound) {
		t.Fatalf("NewDeadLetters of an undeclared queue = %v, want ErrNotFound", err)
	}
}

func ids(l []redeliver.DeadLetter) []string {
	out := make([]string, len(l))
	for i, d := range l {
		out[i] = d.ID
	}
	return out
}
