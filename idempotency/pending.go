package idempotency

import (
	"context"
	"errors"
	"time"
)

// pending is a response the store could not take when the request finished. Its owner
// is alive and holds the key's token: nobody else can have stored or run the request
// meanwhile, because claims leave an expired lease alone for a lease after this process
// saw the store fail (health). The middleware keeps trying to store it, and answers
// retries that reach this process from it, through any middleware over the store
// (With).
type pending struct {
	claim *Claim
	resp  Response
}

type scopeKey struct{ scope, key string }

// holdPending keeps resp to be stored later and starts storing it in the background.
func (m *Middleware) holdPending(c *Claim, resp Response) {
	m.bodies.force(int64(len(resp.Body))) // held in memory until dropPending
	p := &pending{claim: c, resp: resp}
	m.mu.Lock()
	if m.pending == nil {
		m.pending = make(map[scopeKey]*pending)
	}
	m.pending[scopeKey{c.Scope, c.Key}] = p
	m.mu.Unlock()
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		m.flush(p)
	}()
}

// pendingFor returns the response held for (scope, key), if any.
func (m *Middleware) pendingFor(scope, key string) *pending {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pending[scopeKey{scope, key}]
}

// flush stores p, writing it again until a write of it is acknowledged, the store says
// the key is no longer p's, or Shutdown's deadline passes. A write whose outcome is
// unknown (an error) may have been applied, and lost again by a failover; it is never
// confirmed by reading the record back, from a node that may be the one lost: the
// completion is sent again, and the store acknowledges it once it holds it (a completion
// that finds its record done under its token is written again, and its acknowledgement
// confirms the first).
func (m *Middleware) flush(p *pending) {
	c := p.claim
	wait := 50 * time.Millisecond
	for {
		select {
		case <-m.flushCtx.Done():
			m.dropPending(p)
			m.unstored.Add(1)
			m.cfg.Logger.Error("idempotency: response not stored before shutdown; the key stays in progress until its lease ends, then a retry runs the request again",
				"key", c.Key, "status", p.resp.Status)
			return
		case <-time.After(wait):
		}
		err := m.storeCall(m.flushCtx, StoreComplete, func(ctx context.Context) error {
			return m.cfg.Store.Complete(ctx, c.Completion(p.resp))
		})
		switch {
		case err == nil:
			m.dropPending(p)
			m.cfg.Logger.Info("idempotency: held response stored", "key", c.Key)
			return
		case errors.Is(err, ErrLeaseLost):
			m.dropPending(p)
			m.cfg.Logger.Warn("idempotency: held response not stored: "+lostWhy(err), "key", c.Key)
			return
		}
		wait = min(2*wait, time.Second, m.cfg.Lease/4)
	}
}

func (m *Middleware) dropPending(p *pending) {
	m.bodies.give(int64(len(p.resp.Body)))
	m.mu.Lock()
	k := scopeKey{p.claim.Scope, p.claim.Key}
	if m.pending[k] == p {
		delete(m.pending, k)
	}
	m.mu.Unlock()
}

// lostWhy says why a store refused an owner's write with ErrLeaseLost: its record
// vanished, or another request holds its key.
func lostWhy(err error) string {
	if errors.Is(err, ErrRecordGone) {
		return "the key's record vanished (deleted by an operator, expired, or evicted by the store)"
	}
	return "the key was taken over by another request"
}
