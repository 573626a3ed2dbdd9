package idempotency_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// RunJanitor sweeps on its interval, in batches: an expired record is gone after the
// next sweep, a live one stays, and the janitor stops with its context. The bubble's
// clock is virtual, so the minutes pass at once.
func TestRunJanitorSweepsOnItsInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New() // time.Now in the bubble is the bubble's clock
		ctx := context.Background()
		claim := func(key string, ttl time.Duration) {
			res, err := store.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "f", Lease: time.Second, TTL: ttl})
			if err != nil || !res.Claimed {
				t.Fatalf("claim %s: %+v %v", key, res, err)
			}
			if err := store.Complete(ctx, idempotency.Completion{Key: key, Token: res.Token, TTL: ttl,
				Response: idempotency.Response{Status: 201}}); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range []string{"a", "b", "c", "d", "e"} {
			claim(k, 90*time.Second)
		}
		claim("kept", time.Hour)

		jctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			idempotency.RunJanitor(jctx, store, idempotency.JanitorConfig{Interval: time.Minute, Batch: 2,
				Logger: slog.New(slog.DiscardHandler)})
		}()
		gone := func(key string) bool {
			_, err := store.Get(ctx, "", key)
			return errors.Is(err, idempotency.ErrNotFound)
		}
		time.Sleep(time.Minute) // the first sweep after start found nothing expired
		synctest.Wait()
		if gone("a") {
			t.Fatal("a record was swept before it expired")
		}
		time.Sleep(time.Minute) // 2m: all five expired at 1m30s; this sweep takes them
		synctest.Wait()
		for _, k := range []string{"a", "b", "c", "d", "e"} {
			if !gone(k) {
				t.Errorf("%s: still there after the sweep that followed its expiry", k)
			}
		}
		if gone("kept") {
			t.Error("a live record was swept")
		}
		stop()
		<-done
	})
}
