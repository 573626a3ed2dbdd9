package idempotency

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// health is what this process knows of the store's reachability, for one decision:
// whether a claim may take over a key whose lease ran out. A lease runs out when its
// owner stops renewing it — because the owner died, or because the owner could not
// reach the store. After an outage, an owner that is alive renews (or stores its
// result) as soon as the store answers again; until it has had a lease to do so, its
// key is not taken over. An outage is what this process saw: a store call that failed,
// or took a third of a lease or more (a renewal as slow as that may have missed its
// turn), or no contact with the store for two thirds of a lease (so nothing is known;
// the probe keeps contact every third of a lease). A process that has not yet heard from
// the store for a lease knows nothing of that lease, and holds takeovers back as well
// (settling).
//
// One health serves every middleware over the store (see Middleware.With), whose leases
// may differ, so each rule takes the lease that makes it cautious for all of them: what
// counts as trouble (a slow call, a gap in contact) is judged by the shortest lease,
// whose owners renew most often and so are the first to miss a renewal, and the probe
// pings every third of it; takeovers are held back for the longest lease after trouble,
// the time the slowest-renewing owner needs to renew once the store answers again. The
// range only widens: a middleware left behind by a reload may still have requests
// running under its lease.
type health struct {
	mu       sync.Mutex
	shortest time.Duration // the shortest lease of the middlewares sharing this health
	longest  time.Duration // and the longest
	trouble  time.Time     // the last instant the store was seen failing
	contact  time.Time     // the end of the last call the store answered in time
	started  time.Time     // when this process began
	first    atomic.Int64  // the store's instant in the answer to this process's first claim (Unix ns); 0: none yet
	durable  durability    // whether the store said it cannot make writes durable
	narrowed chan struct{} // signalled when shortest shrinks, so the probe speeds up at once
}

func newHealth(lease time.Duration) *health {
	// A process starts with no word of the store's past: see settling.
	now := time.Now()
	return &health{shortest: lease, longest: lease, contact: now, started: now, narrowed: make(chan struct{}, 1)}
}

// settling returns how long, at the store's instant now, claims must still leave
// expired leases alone because this process has not yet heard from the store for a
// (longest) lease: it knows nothing of the lease before that, in which an outage it
// never saw (it was not running, or not yet talking to the store) may have kept a live
// owner elsewhere from renewing, and a takeover then would run the owner's request a
// second time beside it. The lease is counted on the store's clock, from the first
// claim this process made (heard) — the clock the owner's lease runs on. The cost: a
// dead owner's key waits up to a lease from a process's first claim.
func (h *health) settling(now time.Time) time.Duration {
	first := time.Unix(0, h.heard(now))
	h.mu.Lock()
	defer h.mu.Unlock()
	return max(0, first.Add(h.longest).Sub(now))
}

// heard notes now, the store's instant in the answer to a claim, as the first word from
// the store if there was none, and returns the first (in Unix nanoseconds; 0 for none,
// as when a store left the instant out). Lock-free: every claim calls it.
func (h *health) heard(now time.Time) int64 {
	if first := h.first.Load(); first != 0 || now.IsZero() {
		return first
	}
	h.first.CompareAndSwap(0, now.UnixNano())
	return h.first.Load()
}

// startWait returns how long the janitor must still leave records alone because this
// process started less than a (longest) lease ago, for the reason settling gives.
func (h *health) startWait() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return max(0, time.Until(h.started.Add(h.longest)))
}

// widen takes a middleware with lease into the leases this health answers for.
func (h *health) widen(lease time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.longest = max(h.longest, lease)
	if lease < h.shortest {
		h.shortest = lease
		select {
		case h.narrowed <- struct{}{}:
		default:
		}
	}
}

// shortestLease returns the shortest lease of the middlewares sharing h.
func (h *health) shortestLease() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.shortest
}

// observe records a store call that began at start and ended now with err. Answers
// that say something about a record (not found, lease lost) are answers, and a call
// cut short by its caller says nothing.
func (h *health) observe(start, now time.Time, err error) {
	failed := err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrLeaseLost) &&
		!errors.Is(err, context.Canceled)
	h.mu.Lock()
	defer h.mu.Unlock()
	slow := now.Sub(start) >= h.shortest/3
	switch {
	case failed || slow:
		h.trouble = now
	default:
		if start.Sub(h.contact) > 2*h.shortest/3 {
			h.trouble = start // a gap with no word from the store: it may have been down
		}
		h.contact = now
	}
}

// takeoverWait returns how long claims must still leave expired leases alone: zero
// once the store has answered for a whole (longest) lease since this process last saw
// it fail.
func (h *health) takeoverWait() time.Duration {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if now.Sub(h.contact) > 2*h.shortest/3 {
		return h.longest // no recent word: as if it failed now
	}
	return max(0, h.trouble.Add(h.longest).Sub(now))
}

// probe pings the store every third of the shortest lease until ctx ends, so that a
// process with no traffic still learns of an outage that stopped other owners'
// renewals. The period is read again after every ping, and a shorter lease joining
// (With) brings the next ping forward, so contact is never lost for longer than the
// shortest lease allows. While the store says it cannot make writes durable, it pings
// every second at most, since requests are refused until a ping says it can again.
func (m *Middleware) probe(ctx context.Context, p Pinger) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.health.narrowed:
			t.Stop()
		}
		start := time.Now()
		_ = m.storeCall(ctx, StorePing, p.Ping)
		every := m.health.shortestLease() / 3
		if m.health.notDurable() {
			every = min(every, time.Second)
		}
		t.Reset(max(0, every-time.Since(start)))
	}
}
