package fence_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/fence"
	"github.com/retrysafe/retrysafe/harness/testenv"
)

func TestNew(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://127.0.0.1:1/none") // lazy: never dialled
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, tc := range []struct {
		name string
		cfg  fence.Config
		ok   bool
	}{
		{"defaults", fence.Config{Pool: pool}, true},
		{"names", fence.Config{Pool: pool, Schema: "app_1", Table: "_leases"}, true},
		{"nil pool", fence.Config{}, false},
		{"upper case", fence.Config{Pool: pool, Schema: "App"}, false},
		{"quote", fence.Config{Pool: pool, Table: `a"; DROP TABLE x; --`}, false},
		{"leading digit", fence.Config{Pool: pool, Table: "1leases"}, false},
		{"schema too long", fence.Config{Pool: pool, Schema: strings.Repeat("s", 64)}, false},
		{"table too long", fence.Config{Pool: pool, Table: strings.Repeat("t", 54)}, false},
	} {
		if _, err := fence.New(tc.cfg); (err == nil) != tc.ok {
			t.Errorf("%s: New error %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	// Both schemas are named before the pool, which is closed before they are dropped.
	freshSchema := testenv.Schema(t, "fence")
	pool, schema := newEnv(t, 4)
	st := newStore(t, pool, schema, fence.Config{})
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	// Replicas starting together on a database without the schema.
	fresh := sameTable(t, pool, freshSchema, fence.Config{})
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- fresh.Migrate(t.Context()) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Migrate: %v", err)
		}
	}
}

func TestAcquireRelease(t *testing.T) {
	t.Parallel()
	pool, schema := newEnv(t, 4)
	st := newStore(t, pool, schema, fence.Config{})
	ctx := t.Context()

	for _, tc := range []struct {
		name, lease string
		ttl         time.Duration
	}{{"empty name", "", time.Second}, {"zero ttl", "x", 0}, {"negative ttl", "x", -time.Second}, {"tiny ttl", "x", time.Microsecond}} {
		if l, err := st.Acquire(ctx, tc.lease, "h", tc.ttl); err == nil {
			_ = l.Release(ctx)
			t.Errorf("%s: Acquire succeeded", tc.name)
		}
	}
	if _, err := st.Acquire(ctx, "nul\x00", "h", time.Second); err == nil {
		t.Error("Acquire of a name with NUL succeeded")
	}

	a, err := st.Acquire(ctx, "job", "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	release(t, a)
	if a.Name() != "job" || a.Holder() != "a" || a.TTL() != time.Minute || a.Token() <= 0 {
		t.Errorf("lease %q %q %s token %d", a.Name(), a.Holder(), a.TTL(), a.Token())
	}
	if d := a.Expires().Sub(a.Acquired()); d < time.Minute-time.Millisecond || d > time.Minute+time.Millisecond {
		t.Errorf("Expires - Acquired = %s, want the TTL", d)
	}
	if l, ok := fence.FromContext(a.Context()); !ok || l != a {
		t.Error("FromContext(lease.Context()) is not the lease")
	}

	for _, holder := range []string{"b", "a"} { // the same holder gets ErrHeld too
		_, err = st.Acquire(ctx, "job", holder, time.Minute)
		var held *fence.HeldError
		if !errors.Is(err, fence.ErrHeld) || !errors.As(err, &held) {
			t.Fatalf("second Acquire by %s: %v, want ErrHeld", holder, err)
		}
		if held.Holder != "a" || held.Token != a.Token() || !held.Expires.Equal(a.Expires()) {
			t.Errorf("HeldError %+v, want holder a, token %d, expiry %s", held, a.Token(), a.Expires())
		}
	}
	other, err := st.Acquire(ctx, "other-job", "b", time.Minute)
	if err != nil {
		t.Fatalf("Acquire of another name: %v", err)
	}
	release(t, other)

	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Errorf("second Release: %v", err)
	}
	if cause := context.Cause(a.Context()); !errors.Is(cause, fence.ErrReleased) {
		t.Errorf("Context cause after Release: %v", cause)
	}
	if err := a.Renew(ctx); !errors.Is(err, fence.ErrReleased) {
		t.Errorf("Renew after Release: %v", err)
	}
	if a.Expires().After(time.Now().Add(time.Second)) || a.Expires().Before(a.Acquired()) {
		t.Errorf("Expires after Release = %s, want the release time", a.Expires())
	}

	b, err := st.Acquire(ctx, "job", "b", time.Minute)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	release(t, b)
	if b.Token() <= a.Token() || b.Token() <= other.Token() {
		t.Errorf("token after release %d, want > %d and > %d", b.Token(), a.Token(), other.Token())
	}
	if b.Acquired().Before(a.Expires()) {
		t.Errorf("b acquired at %s, before a's release at %s", b.Acquired(), a.Expires())
	}
}

// The database decides expiry: a lease expires by its clock, whatever the application's
// clock says.
func TestExpiry(t *testing.T) {
	t.Parallel()
	pool, schema := newEnv(t, 4)
	frozen := frozenClock{time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)} // the app's clock never moves
	st := newStore(t, pool, schema, fence.Config{ManualRenew: true, Clock: frozen})
	b := sameTable(t, pool, schema, fence.Config{})
	ctx := t.Context()

	// A TTL of seconds, so that a loaded machine still tries b's Acquire before the
	// expiry; then the test waits for the database's clock to pass it.
	const ttl = 2 * time.Second
	a, err := st.Acquire(ctx, "job", "a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	release(t, a)
	if _, err := b.Acquire(ctx, "job", "b", time.Second); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire before expiry: %v", err)
	}
	waitExpired(t, pool, a)
	if a.Context().Err() != nil {
		t.Error("the Context ended though the application's clock did not move")
	}
	// A minute: the takeover must outlast the checks below even when a busy machine
	// delays its renewals (its Release says whether it was still held).
	l, err := b.Acquire(ctx, "job", "b", time.Minute)
	if err != nil {
		t.Fatalf("Acquire after expiry: %v", err)
	}
	release(t, l)
	if l.Token() <= a.Token() {
		t.Errorf("takeover token %d, want > %d", l.Token(), a.Token())
	}
	if err := a.Renew(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Renew of a taken-over lease: %v", err)
	}
	if cause := waitDone(t, a.Context(), 10*time.Second); !errors.Is(cause, fence.ErrLeaseLost) {
		t.Errorf("Context cause: %v", cause)
	}
	if err := a.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release of a taken-over lease: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}

	// Expired but not taken over: not renewed, and Release says it was lost.
	c, err := st.Acquire(ctx, "job2", "c", 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	waitExpired(t, pool, c)
	if err := c.Renew(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Renew of an expired lease: %v", err)
	}
	if err := c.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release of an expired lease: %v", err)
	}
}

func TestHeartbeat(t *testing.T) {
	t.Parallel()
	pool, schema := newEnv(t, 4)
	st := newStore(t, pool, schema, fence.Config{})
	ctx := t.Context()

	// Renewals every 2s keep a 6s lease: a loaded machine may delay one by 4s before the
	// lease (and its Context) ends. The database's clock decides expiry, so the TTL is
	// real time; 1.5s, a second's slack, was lost beside CPU hogs.
	const ttl = 6 * time.Second
	a, err := st.Acquire(ctx, "job", "a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	release(t, a)
	first := a.Expires()
	// Wait for a renewal sent more than two TTLs after the acquisition: its expiry is
	// more than three TTLs after it. The renewals come from the heartbeat, by the
	// application's clock, and the expiry they set is the database's.
	renewedPast := a.Acquired().Add(3 * ttl)
	testenv.Eventually(t, 10*ttl, func() bool { return a.Context().Err() != nil || a.Expires().After(renewedPast) },
		"a renewal more than two TTLs after the acquisition")
	if err := a.Context().Err(); err != nil {
		t.Fatalf("Context ended while the heartbeat ran: %v", context.Cause(a.Context()))
	}
	if _, err := st.Acquire(ctx, "job", "b", time.Second); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire of a renewed lease: %v", err)
	}
	if !a.Expires().After(first) {
		t.Errorf("Expires %s not after the first expiry %s", a.Expires(), first)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return a.Check(ctx, tx) }); err != nil {
		t.Errorf("Check of a renewed lease: %v", err)
	}

	// Someone takes the lease over (here by force): the heartbeat notices and cancels.
	if _, err := pool.Exec(ctx, "UPDATE "+schema+".retrysafe_leases SET expires_at = clock_timestamp() WHERE name = 'job'"); err != nil {
		t.Fatal(err)
	}
	b, err := st.Acquire(ctx, "job", "b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	release(t, b)
	if cause := waitDone(t, a.Context(), 10*time.Second); !errors.Is(cause, fence.ErrLeaseLost) {
		t.Errorf("Context cause after a takeover: %v", cause)
	}
	if err := b.Context().Err(); err != nil {
		t.Errorf("the new holder's Context ended: %v", err)
	}
}

// A holder cut off from the database stops by itself when its TTL has passed.
func TestLocalDeadline(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	// In a synctest bubble, as "manual renew" below: the TTL runs on the bubble's clock,
	// which stands still while the test and the heartbeat run, so the local deadline is
	// checked exactly, however slowly a busy machine runs them.
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			pool, schema := newEnv(t, 2)
			newStore(t, pool, schema, fence.Config{})
			cut := testenv.PostgresPool(t, 2)
			st := sameTable(t, cut, schema, fence.Config{})
			ctx := t.Context()
			const ttl = time.Second
			a, err := st.Acquire(ctx, "job", "a", ttl)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now() // the instant Acquire was sent: a query takes no virtual time
			cut.Close()         // every renewal fails from now on
			if cause := waitDone(t, a.Context(), 3*ttl); !errors.Is(cause, fence.ErrLeaseLost) {
				t.Errorf("Context cause: %v", cause)
			}
			if d := time.Since(start); d > ttl {
				t.Errorf("Context ended %s after the cut, want within the TTL", d)
			}
			if err := a.Release(ctx); err == nil {
				t.Error("Release through a closed pool succeeded")
			}
		})
	})

	// The local deadline is kept by the application's clock, here the virtual clock of a
	// synctest bubble: the TTLs pass without the test waiting for them, and each sleep
	// returns only once the heartbeat has acted on everything due before its end. The
	// database's clock is real and barely moves meanwhile; nothing here depends on it.
	t.Run("manual renew", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			// The pool is made in the bubble, so that its goroutines and timers are the
			// bubble's and end in it.
			pool, schema := newEnv(t, 2)
			st := newStore(t, pool, schema, fence.Config{ManualRenew: true})
			ctx := t.Context()
			const ttl = 1500 * time.Millisecond
			a, err := st.Acquire(ctx, "job", "a", ttl)
			if err != nil {
				t.Fatal(err)
			}
			acquired := time.Now() // the first TTL ends before acquired+ttl
			release(t, a)
			time.Sleep(ttl / 2)   // virtual: the bubble's clock
			renewed := time.Now() // the renewed TTL ends after renewed+ttl
			if err := a.Renew(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Until(acquired.Add(ttl + 200*time.Millisecond))) // virtual: past the first TTL
			if err := a.Context().Err(); err != nil {
				t.Fatalf("Context ended after a renewal: %v", context.Cause(a.Context()))
			}
			if cause := waitDone(t, a.Context(), 2*ttl); !errors.Is(cause, fence.ErrLeaseLost) {
				t.Errorf("Context cause: %v", cause)
			}
			if d := time.Since(renewed); d < ttl {
				t.Errorf("Context ended %s after the renewal was sent, before the renewed TTL", d)
			}
			if err := a.Renew(ctx); !errors.Is(err, fence.ErrLeaseLost) {
				t.Errorf("Renew after the local deadline: %v", err)
			}
		})
	})

	t.Run("parent context", func(t *testing.T) {
		t.Parallel()
		pool, schema := newEnv(t, 2)
		st := newStore(t, pool, schema, fence.Config{})
		pctx, cancel := context.WithCancel(ctx)
		a, err := st.Acquire(pctx, "job", "a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		if cause := waitDone(t, a.Context(), time.Second); !errors.Is(cause, context.Canceled) {
			t.Errorf("Context cause: %v", cause)
		}
		if err := a.Release(ctx); err != nil { // still held: the heartbeat stopped, the lease did not end
			t.Errorf("Release: %v", err)
		}
	})
}

func TestCheck(t *testing.T) {
	t.Parallel()
	pool, schema := newEnv(t, 4)
	st := newStore(t, pool, schema, fence.Config{})
	ctx := t.Context()
	check := func(name string, token int64) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return st.Check(ctx, tx, name, token) })
	}
	a, err := st.Acquire(ctx, "job", "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := check("job", a.Token()); err != nil {
		t.Errorf("Check of the current token: %v", err)
	}
	for _, tc := range []struct {
		name  string
		lease string
		token int64
	}{{"unknown lease", "nope", a.Token()}, {"older token", "job", a.Token() - 1}, {"newer token", "job", a.Token() + 1}} {
		if err := check(tc.lease, tc.token); !errors.Is(err, fence.ErrStaleToken) {
			t.Errorf("%s: %v, want ErrStaleToken", tc.name, err)
		}
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := check("job", a.Token()); !errors.Is(err, fence.ErrStaleToken) {
		t.Errorf("Check after Release: %v, want ErrStaleToken", err)
	}
}

// frozenClock is an application clock that never moves.
type frozenClock struct{ t time.Time }

func (c frozenClock) Now() time.Time { return c.t }
func (c frozenClock) After(time.Duration) (<-chan time.Time, func() bool) {
	return nil, func() bool { return true }
}
