package pgstore

import (
	"sync"
	"sync/atomic"
	"time"
)

// openClaims counts a Store's requests between the start of their Claim and their
// completion, release or abandonment: the callers that may soon make a call of each
// batched kind, which a gathering batch waits for half of (batch.Group.Callers). A
// request that never settles (its lease was lost, or its process gave up on the store)
// stops counting once its lease, as last claimed or extended here, has run out, so
// that the count cannot creep up over a process's life.
type openClaims struct {
	claiming atomic.Int64 // Claim calls running
	n        atomic.Int64 // len(until)

	mu    sync.Mutex
	until map[int64]time.Time // by token: when the lease ends, on this process's clock
	sweep time.Time           // when to next drop the entries whose lease has ended
}

// sweepEvery is how often, at most, claimed drops the entries whose lease has ended.
const sweepEvery = time.Second

// count is the number of requests open.
func (o *openClaims) count() int { return int(o.claiming.Load() + o.n.Load()) }

// begin notes a Claim's start; the function it returns, its end.
func (o *openClaims) begin() func() {
	o.claiming.Add(1)
	return func() { o.claiming.Add(-1) }
}

// claimed notes the grant of token, its lease ending after lease.
func (o *openClaims) claimed(token int64, lease time.Duration) {
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

// extended notes the renewal of token's lease, when it is open.
func (o *openClaims) extended(token int64, lease time.Duration) {
	o.mu.Lock()
	if _, ok := o.until[token]; ok {
		o.until[token] = time.Now().Add(lease)
	}
	o.mu.Unlock()
}

// settled notes the completion, release or abandonment of token.
func (o *openClaims) settled(token int64) {
	o.mu.Lock()
	delete(o.until, token)
	o.n.Store(int64(len(o.until)))
	o.mu.Unlock()
}
