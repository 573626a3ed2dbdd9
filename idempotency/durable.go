package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strconv"
	"sync/atomic"
	"time"
)

// This file holds what the middleware does about writes whose outcome it does not know:
// a store call that failed may still have been applied (its answer lost), or applied on
// a primary without the acknowledgement of the replicas the store's configuration asks
// for (ErrNotDurable), and so be lost by a failover. A write counts only when the store
// acknowledged it: a held answer is written again until a write of it is acknowledged
// (pending.go), a claim whose outcome is unknown is released in the background (unclaim),
// and while the store says it cannot make writes durable, new requests are refused
// before anything is claimed (durability).

// durability is what this process last learned of whether the store can make writes
// durable: a call that returned ErrNotDurable says it cannot; a ping or a write that the
// store acknowledged says it can again. While it cannot, claims are refused at once
// (503), since a claim the store took but could not make durable may be lost by a
// failover and its request run a second time, and every one of them would wait for its
// store call to time out meanwhile.
type durability struct {
	down atomic.Bool
}

// notDurable reports whether the store said last that it cannot make writes durable.
func (h *health) notDurable() bool { return h.durable.down.Load() }

// noteDurability records what the store call op, which returned err, says of the store's
// durability, and logs a change.
func (m *Middleware) noteDurability(op StoreOp, err error) {
	switch {
	case errors.Is(err, ErrNotDurable):
		if !m.health.durable.down.Swap(true) {
			m.cfg.Logger.Error("idempotency: the store cannot make writes durable; keyed requests are refused (503) until it can",
				"op", string(op), "err", err)
		}
	case err != nil, op == StoreGet, op == StoreClaim:
		// A read says nothing of what the store can make durable, nor does a claim, which
		// may have been one (a replay, a key in flight).
	case m.health.durable.down.Load():
		if m.health.durable.down.Swap(false) {
			m.cfg.Logger.Warn("idempotency: the store makes writes durable again; keyed requests are served", "op", string(op))
		}
	}
}

// StoreNotDurable reports whether the middleware refuses keyed requests because the store
// said it cannot make writes durable (a store call or the probe's ping returned
// ErrNotDurable, and no acknowledged write or ping has followed). It is shared by every
// middleware over the store (With).
func (m *Middleware) StoreNotDurable() bool { return m.health.notDurable() }

// claimIDs draws the IDs of the claims of this process (ClaimRequest.ID): a random prefix
// drawn once, unique to the process, and a counter, so that an ID costs no system call.
type claimIDs struct {
	prefix string
	n      atomic.Uint64
}

func newClaimIDs() claimIDs {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return claimIDs{prefix: base64.RawURLEncoding.EncodeToString(b[:]) + "."}
}

// next returns a new ID, in one allocation.
func (c *claimIDs) next() string {
	var buf [48]byte
	b := append(buf[:0], c.prefix...)
	return string(strconv.AppendUint(b, c.n.Add(1), 36))
}

// unclaim releases, in the background, the claim req may have made: its call failed, so
// the store may have applied it with the answer lost, and then the key would stay in
// progress for a whole lease with nobody working on it. It sends the claim again (with
// its ID, taking nothing over) until the store answers: a claim granted is the one that
// failed, or a new one that nothing has run under, and is released; one refused means
// the key is not this claim's. The request was answered without running, so releasing
// its claim runs nothing twice. It gives up when Shutdown is called, leaving the key to
// its lease: unlike a held answer, nothing is lost by that, and a store that stays down
// would hold the shutdown.
func (m *Middleware) unclaim(req ClaimRequest) {
	req.NoTakeover, req.TakeoverBy = true, time.Time{}
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		var token int64
		granted := m.retryStore(m.probeCtx, func(ctx context.Context) (bool, error) {
			res, err := m.cfg.Store.Claim(ctx, req)
			token = res.Token
			return res.Claimed, err
		}, StoreClaim)
		if !granted {
			if m.probeCtx.Err() != nil {
				m.cfg.Logger.Warn("idempotency: a claim whose outcome was unknown was not released before shutdown; if the store took it, its key stays in progress until its lease ends",
					"key", req.Key)
			}
			return
		}
		released := m.retryStore(m.probeCtx, func(ctx context.Context) (bool, error) {
			err := m.cfg.Store.Release(ctx, req.Scope, req.Key, token)
			if errors.Is(err, ErrLeaseLost) {
				return true, nil
			}
			return err == nil, err
		}, StoreRelease)
		if !released {
			m.cfg.Logger.Warn("idempotency: a claim whose outcome was unknown was not released before shutdown; its key stays in progress until its lease ends",
				"key", req.Key)
		}
	}()
}

// retryStore runs the store call f, bounded by StoreTimeout, until it returns no error,
// waiting longer after each failure (up to a second, and a quarter of the lease), and
// returns what it returned then; false when ctx ends first.
func (m *Middleware) retryStore(ctx context.Context, f func(context.Context) (bool, error), op StoreOp) bool {
	wait := 50 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		var ok bool
		err := m.storeCall(ctx, op, func(ctx context.Context) (err error) {
			ok, err = f(ctx)
			return err
		})
		if err == nil {
			return ok
		}
		wait = min(2*wait, time.Second, m.cfg.Lease/4)
	}
}
