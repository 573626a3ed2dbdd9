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

// flush stores p, retrying until the store takes it, says the key is no longer p's, or
// Shutdown's deadline passes.
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
			m.cfg.Logger.Info("idempotency: response stored after the store came back", "key", c.Key)
			return
		case errors.Is(err, ErrLeaseLost):
			// An earlier attempt may have stored it with its answer lost.
			if m.storedByUs(c) {
				m.dropPending(p)
				return
			}
			m.dropPending(p)
			m.cfg.Logger.Warn("idempotency: held response not stored, the key was taken over or deleted", "key", c.Key)
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

// storedByUs reports whether the record of c is done under c's token.
func (m *Middleware) storedByUs(c *Claim) bool {
	var rec *Record
	err := m.storeCall(m.flushCtx, StoreGet, func(ctx context.Context) (err error) {
		rec, err = m.cfg.Store.Get(ctx, c.Scope, c.Key)
		return err
	})
	return err == nil && rec.State == StateDone && rec.Token == c.Token
}
