package retry

import (
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/retrysafe/retrysafe/internal/clock"
)

// Jitter is how a Policy randomizes its waits. The zero value is JitterFull.
type Jitter int

const (
	// JitterFull waits rand(0, min(cap, base·2ⁿ)): the AWS study's best spread, the default.
	JitterFull Jitter = iota
	// JitterEqual waits v/2 + rand(0, v/2) with v = min(cap, base·2ⁿ): never less than half
	// the exponential step.
	JitterEqual
	// JitterDecorrelated waits min(cap, rand(base, 3·previous wait)).
	JitterDecorrelated
	// JitterNone waits min(cap, base·2ⁿ) exactly. Synchronized clients retry together:
	// use it only where there is one client.
	JitterNone
)

func (j Jitter) String() string {
	switch j {
	case JitterFull:
		return "full"
	case JitterEqual:
		return "equal"
	case JitterDecorrelated:
		return "decorrelated"
	case JitterNone:
		return "none"
	}
	return "jitter(" + strconv.Itoa(int(j)) + ")"
}

// The defaults of Policy's fields.
const (
	DefaultMaxAttempts    = 5
	DefaultBase           = 300 * time.Millisecond
	DefaultCap            = 10 * time.Second
	DefaultMaxServerDelay = time.Minute
	// DefaultMinAttempt is the least time left before the context's deadline that is
	// worth another attempt: a request across a network with less than this left
	// rarely gets an answer, and a server given so little time does no useful work.
	DefaultMinAttempt = 10 * time.Millisecond
)

// Policy says how often and how long to retry. The zero value of each field means the
// default documented on it; the zero Policy is DefaultPolicy().
type Policy struct {
	// MaxAttempts is the most attempts, the first included. Default DefaultMaxAttempts
	// (5); negative means no limit but MaxElapsed and the context.
	MaxAttempts int
	// Base is the first wait's scale. Default DefaultBase (300ms).
	Base time.Duration
	// Cap bounds every wait computed from Base. Default DefaultCap (10s).
	Cap time.Duration
	// MaxElapsed bounds the whole call, waits included. Default 0: only MaxAttempts and
	// the context's deadline bound it.
	MaxElapsed time.Duration
	// Jitter randomizes the waits. Default JitterFull.
	Jitter Jitter
	// MaxServerDelay caps a wait the server asks for (Retry-After, rate-limit reset).
	// A server asking for longer ends the retries. Default DefaultMaxServerDelay (1
	// minute).
	MaxServerDelay time.Duration
	// MinAttempt is the least time worth starting another attempt with: when the wait
	// before it would leave less than MinAttempt before the context's deadline, the
	// loop stops at once (ErrDeadline) instead of sending an attempt that cannot
	// finish. The first attempt is always made. Default DefaultMinAttempt (10ms);
	// negative means none: only a wait that would outlive the deadline stops the loop.
	MinAttempt time.Duration

	// Retryable decides whether an error is worth another attempt. Default Retryable.
	Retryable func(error) bool
	// Budget, when set, is charged for each retryable failure and refunded for each
	// success; a retry is skipped (ErrBudget) while it is spent. Share one Budget among
	// all the calls to one dependency. Default nil: no budget for Do and DoValue (a
	// Transport keeps budgets of its own: see Transport.Budget).
	Budget *Budget
	// OnRetry, when set, is called before each wait.
	OnRetry func(Attempt)

	// Rand returns a float in [0, 1). Default math/rand/v2's Float64. Tests inject one.
	Rand func() float64
	// Clock is the time source and the timer of the waits. Default (nil) the real
	// clock: time.Now and time.Timer. Tests inject one.
	Clock Clock
}

// Clock is what a Policy reads time from and waits on.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives after d, and a function that stops the timer.
	After(d time.Duration) (<-chan time.Time, func() bool)
}

// DefaultPolicy is a client's policy, the zero Policy's: DefaultMaxAttempts (5)
// attempts, full jitter from DefaultBase (300ms), waits capped at DefaultCap (10s).
func DefaultPolicy() Policy {
	return Policy{MaxAttempts: DefaultMaxAttempts, Base: DefaultBase, Cap: DefaultCap, Jitter: JitterFull}
}

// ServicePolicy is a service-to-service policy: 3 retries
// (4 attempts), equal jitter from 500ms, waits capped at 30s.
func ServicePolicy() Policy {
	return Policy{MaxAttempts: 4, Base: 500 * time.Millisecond, Cap: 30 * time.Second, Jitter: JitterEqual}
}

// withDefaults returns p with its zero fields set to their defaults.
func (p Policy) withDefaults() Policy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.Base <= 0 {
		p.Base = DefaultBase
	}
	if p.Cap <= 0 {
		p.Cap = DefaultCap
	}
	if p.Cap < p.Base {
		p.Cap = p.Base
	}
	if p.MaxServerDelay <= 0 {
		p.MaxServerDelay = DefaultMaxServerDelay
	}
	switch {
	case p.MinAttempt == 0:
		p.MinAttempt = DefaultMinAttempt
	case p.MinAttempt < 0:
		p.MinAttempt = 0
	}
	if p.Retryable == nil {
		p.Retryable = Retryable
	}
	if p.Rand == nil {
		p.Rand = rand.Float64
	}
	if p.Clock == nil {
		p.Clock = clock.Real{}
	}
	return p
}

// Backoff returns the wait before retry number n (n = 0 is the wait after the first
// failed attempt); prev is the previous wait (used by JitterDecorrelated; pass 0 for the
// first). It never returns more than Cap or less than zero.
func (p Policy) Backoff(n int, prev time.Duration) time.Duration {
	p = p.withDefaults()
	exp := p.exponential(n)
	switch p.Jitter {
	case JitterEqual:
		return exp/2 + time.Duration(p.Rand()*float64(exp-exp/2))
	case JitterDecorrelated:
		if prev < p.Base {
			prev = p.Base
		}
		hi := 3 * float64(prev)
		d := time.Duration(float64(p.Base) + p.Rand()*(hi-float64(p.Base)))
		return min(d, p.Cap)
	case JitterNone:
		return exp
	default:
		return time.Duration(p.Rand() * float64(exp))
	}
}

// exponential is min(Cap, Base·2ⁿ) without overflow.
func (p Policy) exponential(n int) time.Duration {
	if n < 0 {
		n = 0
	}
	f := float64(p.Base) * math.Pow(2, float64(n))
	if f >= float64(p.Cap) || math.IsInf(f, 0) {
		return p.Cap
	}
	return time.Duration(f)
}
