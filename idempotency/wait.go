package idempotency

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Conflict is what a request does when it finds its key in progress, held by another
// request with the same fingerprint.
type Conflict string

const (
	// ConflictReject answers 409 with Retry-After at once: the client retries later with
	// the same key, as the IETF draft (The Idempotency-Key HTTP Header Field) answers.
	// The zero value of Config.Conflict. retrysafe gateway and its configuration file
	// default to ConflictWait instead (configfile.DefaultConflict).
	ConflictReject Conflict = "reject"
	// ConflictWait waits, up to Config.WaitTimeout, for the request that holds the key to
	// finish, and then answers with its stored response (Idempotent-Replayed: true), as a
	// retry would have been answered; at the bound it answers the 409 of ConflictReject.
	// For clients that take a 409 as final (many SDKs do), so that a duplicate of a slow
	// request still gets the answer rather than an error.
	ConflictWait Conflict = "wait"
)

// ParseConflict returns the Conflict named s: "reject" or "wait" ("" is reject).
func ParseConflict(s string) (Conflict, error) {
	switch c := Conflict(s); c {
	case "", ConflictReject:
		return ConflictReject, nil
	case ConflictWait:
		return c, nil
	}
	return "", fmt.Errorf("idempotency: conflict policy %q: want reject or wait", s)
}

// Defaults of the wait policy's bounds.
const (
	DefaultWaitTimeout      = 10 * time.Second
	DefaultMaxWaiters       = 1024
	DefaultMaxWaitersPerKey = 128
)

// The poll of the store while waiting: waiters in this process are woken when the owner
// here finishes, and a waiter whose owner is another replica learns of its end from the
// store, first after firstPoll, then at most every maxPoll.
const (
	firstPoll = 50 * time.Millisecond
	maxPoll   = time.Second
)

// waiters are the requests of this process waiting for keys in progress, so that they
// are bounded (in all and per key) and woken when the owner here finishes. They are
// shared by the middlewares over one store: a key is one record, whichever route its
// owner and its waiters came through.
type waiters struct {
	mu    sync.Mutex
	total int
	keys  map[scopeKey]*keyWaiters
}

type keyWaiters struct {
	n    int
	done chan struct{} // closed by wake; replaced for the waiters that wait on
}

// join counts a new waiter of k, or reports false when a bound is reached.
func (ws *waiters) join(k scopeKey, maxTotal, maxPerKey int) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	kw := ws.keys[k]
	if ws.total >= maxTotal || kw != nil && kw.n >= maxPerKey {
		return false
	}
	if kw == nil {
		if ws.keys == nil {
			ws.keys = make(map[scopeKey]*keyWaiters)
		}
		kw = &keyWaiters{done: make(chan struct{})}
		ws.keys[k] = kw
	}
	kw.n++
	ws.total++
	return true
}

func (ws *waiters) leave(k scopeKey) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if kw := ws.keys[k]; kw != nil {
		kw.n--
		ws.total--
		if kw.n == 0 {
			delete(ws.keys, k)
		}
	}
}

// signal returns the channel the next wake of k closes.
func (ws *waiters) signal(k scopeKey) <-chan struct{} {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if kw := ws.keys[k]; kw != nil {
		return kw.done
	}
	return nil
}

// wake wakes the waiters of k: the key's owner in this process has finished (stored,
// released or abandoned it).
func (ws *waiters) wake(k scopeKey) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if kw := ws.keys[k]; kw != nil {
		close(kw.done)
		kw.done = make(chan struct{})
	}
}

func (ws *waiters) count() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.total
}

// Waiting returns how many requests are waiting for keys in progress (ConflictWait),
// through m and every middleware it shares its store state with (With): the count
// MaxWaiters bounds.
func (m *Middleware) Waiting() int { return m.waiting.count() }

// mustWait reports whether a request that lost its claim to res waits for the owner: the
// policy says so, the key is in progress, and by the same request (another request
// under the key is a 422 at once). A key its owner abandoned (the outcome unknown)
// moves only when its lease ends: when that is no sooner than the wait's bound left,
// the request would wait for nothing, and is answered 409 at once, its Retry-After the
// rest of the lease.
func (m *Middleware) mustWait(res ClaimResult, fp string, left time.Duration) bool {
	rec := res.Existing
	return m.cfg.Conflict == ConflictWait && !res.Claimed && rec.State == StateInProgress && rec.Fingerprint == fp &&
		!(rec.Abandoned && rec.LeaseUntil.Sub(res.Now) >= left)
}

// await waits for the owner of req's key to finish and claims again, until the claim
// says something other than "in progress" (done: a replay; free: this request runs),
// WaitTimeout passes, or ctx ends. A waiter is woken by the owner in this process, or
// learns from the store, polled with backoff, that an owner elsewhere has finished. When
// the bounds on waiters are reached it does not wait: the caller answers 409. held is a
// response this process holds for the key (its store was unreachable when it was
// stored), to be replayed.
func (m *Middleware) await(ctx context.Context, req ClaimRequest, res ClaimResult, wait time.Duration) (_ ClaimResult, _ time.Duration, held *pending, err error) {
	k := scopeKey{req.Scope, req.Key}
	// MaxWaiters is the group's (With keeps it equal); MaxWaitersPerKey is this
	// middleware's, against all the key's waiters.
	if !m.waiting.join(k, m.cfg.MaxWaiters, m.cfg.MaxWaitersPerKey) {
		return res, wait, nil, nil
	}
	defer m.waiting.leave(k)
	deadline := time.Now().Add(m.cfg.WaitTimeout)
	bound := time.NewTimer(m.cfg.WaitTimeout)
	defer bound.Stop()
	poll := firstPoll
	for {
		woken := m.waiting.signal(k)
		next := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			next.Stop()
			return res, wait, nil, ctx.Err()
		case <-bound.C:
			next.Stop()
			return res, wait, nil, nil
		case <-woken:
		case <-next.C:
		}
		next.Stop()
		poll = min(2*poll, maxPoll)
		if p := m.pendingFor(req.Scope, req.Key); p != nil {
			return res, wait, p, nil
		}
		if res, wait, err = m.claim(ctx, req); err != nil || !m.mustWait(res, req.Fingerprint, time.Until(deadline)) {
			return res, wait, nil, err
		}
	}
}
