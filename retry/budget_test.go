package retry

import (
	"sync"
	"testing"
)

func TestBudget(t *testing.T) {
	t.Parallel()
	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		b := NewBudget(0, -1)
		if b.Tokens() != 10 || b.ratio != 0.1 {
			t.Errorf("NewBudget(0, -1) = %v tokens, ratio %v; want gRPC's 10 and 0.1", b.Tokens(), b.ratio)
		}
	})
	t.Run("all failing stops retries after max/2 failures", func(t *testing.T) {
		t.Parallel()
		for _, max := range []float64{10, 4, 100} {
			b := NewBudget(max, 0.1)
			failures := 0
			for b.allow() {
				b.failure()
				failures++
				if failures > 1000 {
					t.Fatal("never stops")
				}
			}
			if failures != int(max/2) {
				t.Errorf("max %v: retries stop after %d failures, want %v", max, failures, max/2)
			}
		}
	})
	t.Run("successes earn retries back", func(t *testing.T) {
		t.Parallel()
		b := NewBudget(10, 0.5)
		for range 30 {
			b.failure()
		}
		if b.Tokens() != 0 || b.allow() {
			t.Fatalf("tokens %v after 30 failures", b.Tokens())
		}
		for range 10 {
			b.success()
		}
		if b.allow() {
			t.Errorf("5 tokens (half): retries must still wait")
		}
		b.success()
		if !b.allow() {
			t.Errorf("5.5 tokens: a retry is earned back")
		}
		for range 100 {
			b.success()
		}
		if b.Tokens() != 10 {
			t.Errorf("tokens %v, want capped at 10", b.Tokens())
		}
	})
	t.Run("nil budget allows everything", func(t *testing.T) {
		t.Parallel()
		var b *Budget
		b.failure()
		b.success()
		if !b.allow() || b.Tokens() != 0 {
			t.Error("a nil budget limits")
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		t.Parallel()
		b := NewBudget(10, 0.1)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 500 {
					b.failure()
					b.success()
					b.allow()
				}
			})
		}
		wg.Wait()
		if tk := b.Tokens(); tk < 0 || tk > 10 {
			t.Errorf("tokens %v out of [0, 10]", tk)
		}
	})
}
