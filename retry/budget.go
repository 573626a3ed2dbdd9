package retry

import "sync"

// Budget limits retries to a fraction of traffic, as gRPC's retry throttling does: a
// token bucket that starts full, loses one token per failed attempt and gains Ratio
// tokens per success; retries are allowed only while more than half the tokens remain.
// When a dependency fails for everyone, each client soon stops retrying and sends each
// request once, so the dependency sees about 1 + Ratio·… extra load instead of N×
// attempts. A Budget is safe for concurrent use; share one per dependency.
type Budget struct {
	mu     sync.Mutex
	max    float64
	ratio  float64
	tokens float64
}

// NewBudget returns a full budget. maxTokens ≤ 0 means 10 and ratio ≤ 0 means 0.1
// (gRPC's defaults): after a burst of failures, a client needs ten successes to earn a
// retry back.
func NewBudget(maxTokens, ratio float64) *Budget {
	if maxTokens <= 0 {
		maxTokens = 10
	}
	if ratio <= 0 {
		ratio = 0.1
	}
	return &Budget{max: maxTokens, ratio: ratio, tokens: maxTokens}
}

// Tokens returns the tokens left (0 for a nil Budget).
func (b *Budget) Tokens() float64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens
}

func (b *Budget) success() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.tokens = min(b.max, b.tokens+b.ratio)
	b.mu.Unlock()
}

func (b *Budget) failure() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.tokens = max(0, b.tokens-1)
	b.mu.Unlock()
}

// allow reports whether a retry may be made now.
func (b *Budget) allow() bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens > b.max/2
}
