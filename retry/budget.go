package retry

import "sync"

// The defaults of NewBudget, and of the budgets Transport keeps per host.
//
// DefaultBudgetTokens is gRPC's bucket size: once a dependency fails for everyone, a
// budget has allowed 4 retries before it stops them. DefaultBudgetRatio is not gRPC's
// 0.1. At 0.1 a budget stops retries as soon as more than one attempt in eleven fails,
// so a client on a flaky network, one attempt in four failing, spends it within a few
// dozen calls and then sends each failure once, unretried, though three attempts in four
// succeed. At 2 a success earns back two failures: retries go on while at least a third
// of the attempts succeed, and a dependency that fails for most of its callers sees
// little more than one attempt per request.
const (
	DefaultBudgetTokens = 10
	DefaultBudgetRatio  = 2.0
)

// Budget limits retries to what a dependency can bear, as gRPC's retry throttling does:
// a token bucket that starts full, loses one token per failed attempt and gains Ratio
// tokens per success; retries are allowed only while more than half the tokens remain.
// With the defaults, a client keeps its retries while at least a third of its attempts
// succeed. When a dependency fails for everyone, each client soon stops retrying and
// sends each request once, so the dependency sees about one attempt per request instead
// of MaxAttempts; successes earn the retries back.
//
// A Budget is safe for concurrent use; share one per dependency (Transport keeps one per
// host by default). Refused counts the retries it refused, and Transport reports the
// moment a budget starts refusing (Transport.OnBudgetExhausted, and its Logger).
type Budget struct {
	mu       sync.Mutex
	max      float64
	ratio    float64
	tokens   float64
	refusing bool   // the last decision was a refusal
	refused  uint64 // retries refused
}

// NewBudget returns a full budget. maxTokens ≤ 0 means DefaultBudgetTokens (10) and
// ratio ≤ 0 means DefaultBudgetRatio (2).
func NewBudget(maxTokens, ratio float64) *Budget {
	if maxTokens <= 0 {
		maxTokens = DefaultBudgetTokens
	}
	if ratio <= 0 {
		ratio = DefaultBudgetRatio
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

// Refused returns how many retries the budget has refused (0 for a nil Budget).
func (b *Budget) Refused() uint64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refused
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

// allow reports whether a retry may be made now, and started true when it may not and
// the decision before allowed one: the budget starts refusing.
func (b *Budget) allow() (ok, started bool) {
	if b == nil {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens > b.max/2 {
		b.refusing = false
		return true, false
	}
	b.refused++
	started = !b.refusing
	b.refusing = true
	return false, started
}

// full reports whether the budget holds all its tokens: it then says nothing a new
// budget would not.
func (b *Budget) full() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens >= b.max
}
