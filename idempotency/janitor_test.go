package idempotency_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
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

// janitorOutage is an outage whose store is also swept: the janitor's DeleteExpired goes
// over the same link, and fails while it is down.
type janitorOutage struct {
	outage
	j idempotency.Janitor
}

func (o janitorOutage) DeleteExpired(ctx context.Context, limit int) (int, error) {
	if err := o.fail(ctx); err != nil {
		return 0, err
	}
	return o.j.DeleteExpired(ctx, limit)
}

// An outage of the store outlasts a record's TTL while its owner holds the answer it
// could not store: the record is expired and its lease has run out when the store
// returns. A janitor held back by the middleware (JanitorConfig.Middleware) leaves it
// to the owner, which stores the answer, and a retry replays it; a janitor not held
// back deletes it at its first sweep, and the retry runs the request again.
func TestJanitorHeldBackAfterOutage(t *testing.T) {
	for _, held := range []bool{true, false} {
		t.Run(map[bool]string{true: "held back", false: "not held back"}[held], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var down atomic.Bool
				mem := memstore.New()
				store := janitorOutage{outage{mem, &down}, mem}
				mw, err := idempotency.New(idempotency.Config{Store: store, Lease: 3 * time.Second, TTL: 5 * time.Second,
					Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					t.Fatal(err)
				}
				runs := 0
				h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs++
					if runs == 1 {
						down.Store(true) // the store goes away while the first run works
					}
					w.WriteHeader(http.StatusCreated)
				}))
				jcfg := idempotency.JanitorConfig{Interval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
				if held {
					jcfg.Middleware = mw
				}
				jctx, stop := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() {
					defer close(done)
					idempotency.RunJanitor(jctx, store, jcfg)
				}()
				if w := post(h, "k", "{}"); w.Code != http.StatusCreated {
					t.Fatalf("first: %d", w.Code)
				}
				elapse(20 * time.Second) // the outage outlasts the TTL and the lease
				down.Store(false)
				elapse(3 * time.Second) // the held answer is retried at least every second
				rec, err := mem.Get(context.Background(), "", "k")
				stored := err == nil && rec.State == idempotency.StateDone
				post(h, "k", "{}")
				if held && (!stored || runs != 1) {
					t.Errorf("held back: record %+v (%v), %d runs; want the answer stored and 1 run", rec, err, runs)
				}
				if !held && (stored || runs != 2) {
					t.Errorf("not held back: record %+v (%v), %d runs; want the record swept and the retry run again", rec, err, runs)
				}
				stop()
				<-done
				if err := mw.Shutdown(context.Background()); err != nil {
					t.Errorf("Shutdown: %v", err)
				}
			})
		})
	}
}

// A janitor held back by a middleware that has served no request yet still sweeps: the
// janitor's pings, a sweep interval apart, are no gaps in contact, since the middleware's
// probe keeps its word from the store fresh.
func TestJanitorHeldBackSweepsWhenIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		mem := memstore.New()
		store := janitorOutage{outage{mem, &down}, mem}
		mw, err := idempotency.New(idempotency.Config{Store: store, Lease: 30 * time.Second,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		res, err := mem.Claim(ctx, idempotency.ClaimRequest{Key: "old", Fingerprint: "f", Lease: time.Second, TTL: 90 * time.Second})
		if err != nil || !res.Claimed {
			t.Fatalf("claim: %+v %v", res, err)
		}
		if err := mem.Complete(ctx, idempotency.Completion{Key: "old", Token: res.Token, TTL: 90 * time.Second,
			Response: idempotency.Response{Status: 201}}); err != nil {
			t.Fatal(err)
		}
		jctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			idempotency.RunJanitor(jctx, store, idempotency.JanitorConfig{Interval: time.Minute, Middleware: mw,
				Logger: slog.New(slog.DiscardHandler)})
		}()
		elapse(3*time.Minute + time.Second) // expired at 1m30s; the sweeps at 2m and 3m
		if _, err := mem.Get(ctx, "", "old"); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("an idle middleware's janitor did not sweep the expired record: %v", err)
		}
		stop()
		<-done
		if err := mw.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
}
