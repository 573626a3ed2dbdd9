// Package inflight counts an idempotency store's requests in flight: from the start of
// their claim to their completion, release or abandonment. A store's batch groups
// gather for half of them (batch.Group.Callers): fewer requests than a batch's size
// cannot fill it, and would otherwise wait out the gathering window at every call.
package inflight

import (
	"sync"
	"sync/atomic"
	"time"
)

// Claims counts a store's requests between the start of their Claim and their
// completion, release or abandonment. A request that never settles (its lease was lost,
// or its process gave up on the store) stops counting once its lease, as last claimed
// or extended here, has run out, so that the count cannot creep up over a process's
// life. The zero value is ready.
type Claims struct {
	claiming atomic.Int64 // Claim calls running
	n        atomic.Int64 // len(until)

	mu    sync.Mutex
	until map[int64]time.Time // by token: when the lease ends, on this process's clock
	sweep time.Time           // when to next drop the entries whose lease has ended
}

// sweepEvery is how often, at most, Claimed drops the entries whose lease has ended.
const sweepEvery = time.Second

// Count is the number of requests in flight.
func (o *Claims) Count() int { return int(o.claiming.Load() + o.n.Load()) }

// Begin notes a Claim's start; the function it returns, its end.
func (o *Claims) Begin() func() {
	o.claiming.Add(1)
	return func() { o.claiming.Add(-1) }
}

// Claimed notes the grant of token, its lease ending after lease.
func (o *Claims) Claimed(token int64, lease time.Duration) {
	now := time.Now()
	o.mu.Lock()
	if o.until == nil {
		o.until = make(map[int64]time.Time)
	}
	o.until[token] = now.Add(lease)
	if now.After(o.sweep) {
		o.sweep = now.Add(sweepEvery)
		for t, u := range o.until {
			if now.After(u) {
				delete(o.until, t)
			}
		}
	}
	o.n.Store(int64(len(o.until)))
	o.mu.Unlock()
}

// Extended notes the renewal of token's lease, when it is in flight.
func (o *Claims) Extended(token int64, lease time.Duration) {
	o.mu.Lock()
	if _, ok := o.until[token]; ok {
		o.until[token] = time.Now().Add(lease)
	}
	o.mu.Unlock()
}

// Settled notes the completion, release or abandonment of token.
func (o *Claims) Settled(token int64) {
	o.mu.Lock()
	delete(o.until, token)
	o.n.Store(int64(len(o.until)))
	o.mu.Unlock()
}
