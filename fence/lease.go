package fence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lease is one acquisition of a named lease: its fencing token, its expiry by the
// database's clock, and a Context that ends when the lease is lost or released. Its
// methods are safe for concurrent use.
type Lease struct {
	s            *Store
	name, holder string
	token        int64
	ttl          time.Duration
	acquired     time.Time

	ctx    context.Context
	cancel context.CancelCauseFunc
	wake   chan struct{} // a manual Renew moved validUntil: the heartbeat recomputes its wait
	exited chan struct{} // closed when the heartbeat goroutine returns

	releaseMu sync.Mutex // serializes Release calls

	mu         sync.Mutex
	expires    time.Time // by the database's clock
	validUntil time.Time // by the application's clock: the lease is certainly held until then
	released   bool
}

type leaseKey struct{}

// FromContext returns the lease whose Context ctx is, or is derived from.
func FromContext(ctx context.Context) (*Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(*Lease)
	return l, ok
}

func (s *Store) newLease(parent context.Context, name, holder string, ttl time.Duration,
	token int64, acquired, expires, sent time.Time) *Lease {
	l := &Lease{
		s: s, name: name, holder: holder, token: token, ttl: ttl, acquired: acquired,
		wake: make(chan struct{}, 1), exited: make(chan struct{}),
		expires: expires, validUntil: sent.Add(ttl),
	}
	l.ctx, l.cancel = context.WithCancelCause(context.WithValue(parent, leaseKey{}, l))
	go l.keep()
	return l
}

// Name returns the lease's name.
func (l *Lease) Name() string { return l.name }

// Holder returns the holder given to Acquire.
func (l *Lease) Holder() string { return l.holder }

// Token returns the fencing token of this acquisition: greater than every token issued
// before it for the same name. Pass it to the conditional writes (Check, Lease.Check,
// Table.UpdateFenced) so that a write by a holder that lost the lease is rejected.
func (l *Lease) Token() int64 { return l.token }

// TTL returns the lease's time to live, given to Acquire.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Acquired returns when the lease was acquired, by the database's clock.
func (l *Lease) Acquired() time.Time { return l.acquired }

// Expires returns the end of the lease by the database's clock, as last learnt: the
// expiry set by the acquisition or the last renewal, or, after a Release that found the
// lease, the release time (or the expiry, if that came first). [Acquired, Expires) after
// Release is the tenure as the database recorded it.
func (l *Lease) Expires() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expires
}

// Context returns a context derived from the one given to Acquire, carrying the lease
// (see FromContext), that is cancelled when the lease is lost (its cause wraps
// ErrLeaseLost: a renewal found the lease expired or taken over, or its TTL passed since
// the last successful renewal was sent, as the database may be unreachable) or released
// (cause ErrReleased). Run the holder's work under it.
func (l *Lease) Context() context.Context { return l.ctx }

// Check is Store.Check for this lease's name and token: inside tx, it verifies that the
// lease is still this acquisition's and unexpired, and locks it until tx ends; otherwise
// it returns an error wrapping ErrStaleToken.
func (l *Lease) Check(ctx context.Context, tx pgx.Tx) error {
	return l.s.Check(ctx, tx, l.name, l.token)
}

// Renew extends the lease to TTL from now by the database's clock. The heartbeat calls
// it every TTL/3 unless Config.ManualRenew is set. When the lease has expired or been
// taken over, Renew cancels the Context and returns an error wrapping ErrLeaseLost; an
// expired lease is never renewed, even when no one has taken it. After Release, or
// once the Context was cancelled for a lost lease, Renew returns that cause without I/O.
func (l *Lease) Renew(ctx context.Context) error {
	if cause := context.Cause(l.ctx); errors.Is(cause, ErrReleased) || errors.Is(cause, ErrLeaseLost) {
		return fmt.Errorf("fence: renew %q token %d: %w", l.name, l.token, cause)
	}
	sent := l.s.clock.Now()
	var until time.Time
	err := l.s.pool.QueryRow(ctx, l.s.sql.renew, l.name, l.token, l.ttl.Microseconds()).Scan(&until)
	if errors.Is(err, pgx.ErrNoRows) {
		l.lose(ctx, "expired or taken over")
		return fmt.Errorf("fence: renew %q token %d: %w", l.name, l.token, ErrLeaseLost)
	}
	if err != nil {
		return fmt.Errorf("fence: renew %q: %w", l.name, err)
	}
	l.mu.Lock()
	if until.After(l.expires) {
		l.expires = until
	}
	if v := sent.Add(l.ttl); v.After(l.validUntil) {
		l.validUntil = v
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

// Release stops the heartbeat, cancels the Context (cause ErrReleased, unless it had
// already ended) and frees the lease, so another holder can acquire it at once. The
// token is not reset: the next acquisition gets a greater one. It returns an error
// wrapping ErrLeaseLost when the lease had expired or been taken over (the lease is
// freed too when it had merely expired). Once it has succeeded or returned ErrLeaseLost,
// later calls return nil. After another error the lease expires at its TTL; Release may
// be called again.
//
// ctx bounds the statement: pass one that is not done (context.WithoutCancel of a
// cancelled one, with a timeout), or the lease stays held until its TTL passes.
func (l *Lease) Release(ctx context.Context) error {
	l.cancel(ErrReleased)
	<-l.exited
	l.releaseMu.Lock()
	defer l.releaseMu.Unlock()
	l.mu.Lock()
	released := l.released
	l.mu.Unlock()
	if released {
		return nil
	}
	var end time.Time
	var valid bool
	err := l.s.pool.QueryRow(ctx, l.s.sql.release, l.name, l.token).Scan(&end, &valid)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("fence: release %q: %w", l.name, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released = true
	if err != nil {
		return fmt.Errorf("fence: release %q token %d: taken over: %w", l.name, l.token, ErrLeaseLost)
	}
	l.expires = end
	if !valid {
		return fmt.Errorf("fence: release %q token %d: expired before release: %w", l.name, l.token, ErrLeaseLost)
	}
	return nil
}

// lose cancels the Context with ErrLeaseLost.
func (l *Lease) lose(ctx context.Context, reason string) {
	if l.ctx.Err() == nil {
		l.s.logger.WarnContext(ctx, "fence: lease lost", "lease", l.name, "holder", l.holder,
			"token", l.token, "reason", reason)
	}
	l.cancel(fmt.Errorf("%w: %s", ErrLeaseLost, reason))
}

// keep is the heartbeat: it renews the lease every TTL/3 (unless ManualRenew) and
// cancels the Context when the TTL passed since the last renewal that succeeded was
// sent. It returns when the Context ends.
func (l *Lease) keep() {
	defer close(l.exited)
	clock := l.s.clock
	interval := l.ttl / 3
	next := clock.Now().Add(interval)
	for {
		l.mu.Lock()
		until := l.validUntil
		l.mu.Unlock()
		now := clock.Now()
		left := until.Sub(now)
		if left <= 0 {
			l.lose(l.ctx, "its TTL passed without a successful renewal")
			return
		}
		wait := left
		if !l.s.manual {
			wait = min(wait, next.Sub(now))
		}
		if wait > 0 {
			c, stop := clock.After(wait)
			select {
			case <-l.ctx.Done():
				stop()
				return
			case <-l.wake:
				stop()
				continue
			case <-c:
			}
		}
		if l.s.manual {
			continue
		}
		now = clock.Now()
		if now.Before(next) {
			continue
		}
		rctx, cancel := context.WithTimeout(l.ctx, max(until.Sub(now), time.Millisecond))
		err := l.Renew(rctx)
		cancel()
		switch {
		case err == nil:
			next = now.Add(interval)
		case l.ctx.Err() != nil: // lost (Renew cancelled it), released, or the parent ended
			return
		default:
			l.s.logger.WarnContext(l.ctx, "fence: lease renewal failed", "lease", l.name,
				"token", l.token, "err", err)
			next = now.Add(max(interval/4, time.Millisecond))
		}
	}
}
