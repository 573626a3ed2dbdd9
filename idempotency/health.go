package idempotency

import (
	"context"
	"errors"
	"sync"
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
// the probe keeps contact every third of a lease).
type health struct {
	lease time.Duration

	mu      sync.Mutex
	trouble time.Time // the last instant the store was seen failing
	contact time.Time // the end of the last call the store answered in time
}

func newHealth(lease time.Duration) *health {
	// A process starts presuming the store healthy: if it is down, the first call or
	// probe says so within a third of a lease. (A process started just after an outage
	// ended could take a key over before its owner elsewhere stored its answer; the
	// owner retries within a second of the store's return, so the window is that
	// second.)
	return &health{lease: lease, contact: time.Now()}
}

// observe records a store call that began at start and ended now with err. Answers
// that say something about a record (not found, lease lost) are answers, and a call
// cut short by its caller says nothing.
func (h *health) observe(start time.Time, err error) {
	now := time.Now()
	slow := now.Sub(start) >= h.lease/3
	failed := err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrLeaseLost) &&
		!errors.Is(err, context.Canceled)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case failed || slow:
		h.trouble = now
	default:
		if start.Sub(h.contact) > 2*h.lease/3 {
			h.trouble = start // a gap with no word from the store: it may have been down
		}
		h.contact = now
	}
}

// takeoverWait returns how long claims must still leave expired leases alone: zero
// once the store has answered for a whole lease since this process last saw it fail.
func (h *health) takeoverWait() time.Duration {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if now.Sub(h.contact) > 2*h.lease/3 {
		return h.lease // no recent word: as if it failed now
	}
	return max(0, h.trouble.Add(h.lease).Sub(now))
}

// probe pings the store every third of a lease until ctx ends, so that a process with
// no traffic still learns of an outage that stopped other owners' renewals.
func (m *Middleware) probe(ctx context.Context, p Pinger) {
	t := time.NewTicker(m.cfg.Lease / 3)
	defer t.Stop()
	for {
		_ = m.storeCall(ctx, StorePing, p.Ping)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
