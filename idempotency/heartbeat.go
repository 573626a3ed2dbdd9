package idempotency

import (
	"context"
	"errors"
	"time"
)

// The heartbeat renews the lease of a running handler every Lease/3, on the
// middleware's queue of heartbeats (dueq): every request queues its first renewal, and
// most take it out again, their handlers finishing long before it is due. A renewal
// sooner than that (after one failed) has a timer of its own.

// startHeartbeat renews the lease every Lease/3 while the handler runs, and sooner after
// a renewal failed, so that an owner cut off from the store renews as soon as it answers
// again. When the lease is lost it ends the handler's context with ErrLeaseLost.
func (e *execution) startHeartbeat() {
	e.m.beats.Push(&e.beat, e)
}

func (e *execution) renew() {
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return
	}
	e.renewal.Add(1)
	e.mu.Unlock()
	defer e.renewal.Done()
	m, c := e.m, e.c
	err := m.storeCall(context.WithoutCancel(e.ctx), StoreExtend, func(sctx context.Context) error {
		return m.cfg.Store.Extend(sctx, c.Scope, c.Key, c.Token, m.cfg.Lease)
	})
	every := m.beats.Every()
	next := every
	switch {
	case errors.Is(err, ErrLeaseLost):
		m.cfg.Logger.WarnContext(e.ctx, "idempotency: lease lost while the handler ran: "+lostWhy(err), "key", c.Key)
		c.end(ErrLeaseLost)
		e.hctx.End(ErrLeaseLost)
		return
	case err != nil:
		m.cfg.Logger.WarnContext(e.ctx, "idempotency: lease renewal failed", "key", c.Key, "err", err)
		next = min(every, time.Second)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.stopped:
	case next == every:
		m.beats.Push(&e.beat, e)
	case e.t == nil:
		e.t = time.AfterFunc(next, e.renew)
	default:
		e.t.Reset(next)
	}
}

// stopHeartbeat stops the renewals, and waits for one in progress, so that no renewal
// races the completion.
func (e *execution) stopHeartbeat() {
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return
	}
	e.stopped = true
	if e.t != nil {
		e.t.Stop()
	}
	e.mu.Unlock()
	e.m.beats.Remove(&e.beat)
	e.renewal.Wait() // a renewal in flight ends before the request is finished
}
