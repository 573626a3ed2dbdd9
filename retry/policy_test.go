package retry

import (
	"math"
	"testing"
	"time"
)

const almostOne = 0.9999999

func TestBackoffBounds(t *testing.T) {
	t.Parallel()
	const base, capD = 100 * time.Millisecond, 2 * time.Second
	tests := []struct {
		name   string
		jitter Jitter
		n      int
		prev   time.Duration
		rnd    float64
		lo, hi time.Duration // want lo <= d <= hi
	}{
		{"full n=0 rand=0", JitterFull, 0, 0, 0, 0, 0},
		{"full n=0 rand≈1", JitterFull, 0, 0, almostOne, base - time.Microsecond, base},
		{"full n=3 rand≈1", JitterFull, 3, 0, almostOne, 8*base - time.Microsecond, 8 * base},
		{"full n=3 rand=0", JitterFull, 3, 0, 0, 0, 0},
		{"full capped", JitterFull, 10, 0, almostOne, capD - time.Microsecond, capD},
		{"equal n=0 rand=0", JitterEqual, 0, 0, 0, base / 2, base / 2},
		{"equal n=0 rand≈1", JitterEqual, 0, 0, almostOne, base - time.Microsecond, base},
		{"equal n=2 rand=0", JitterEqual, 2, 0, 0, 2 * base, 2 * base},
		{"equal capped rand=0", JitterEqual, 10, 0, 0, capD / 2, capD / 2},
		{"equal capped rand≈1", JitterEqual, 10, 0, almostOne, capD - time.Microsecond, capD},
		{"decorrelated first rand=0", JitterDecorrelated, 0, 0, 0, base, base},
		{"decorrelated first rand≈1", JitterDecorrelated, 0, 0, almostOne, 3*base - time.Microsecond, 3 * base},
		{"decorrelated prev rand≈1", JitterDecorrelated, 5, 500 * time.Millisecond, almostOne, 1500*time.Millisecond - time.Microsecond, 1500 * time.Millisecond},
		{"decorrelated prev rand=0", JitterDecorrelated, 5, 500 * time.Millisecond, 0, base, base},
		{"decorrelated capped", JitterDecorrelated, 5, time.Second, almostOne, capD, capD},
		{"none n=0", JitterNone, 0, 0, 0.5, base, base},
		{"none n=4", JitterNone, 4, 0, 0.5, 16 * base, 16 * base},
		{"none capped", JitterNone, 20, 0, 0.5, capD, capD},
		{"negative n", JitterNone, -3, 0, 0.5, base, base},
		{"overflow n=64", JitterNone, 64, 0, 0.5, capD, capD},
		{"overflow n=10000", JitterFull, 10000, 0, almostOne, capD - time.Microsecond, capD},
		{"overflow n=MaxInt", JitterEqual, math.MaxInt, 0, almostOne, capD - time.Microsecond, capD},
		{"unknown jitter is full", Jitter(42), 0, 0, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := Policy{Base: base, Cap: capD, Jitter: tc.jitter, Rand: func() float64 { return tc.rnd }}
			d := p.Backoff(tc.n, tc.prev)
			if d < tc.lo || d > tc.hi {
				t.Errorf("Backoff(%d, %v) = %v, want in [%v, %v]", tc.n, tc.prev, d, tc.lo, tc.hi)
			}
		})
	}
}

// Decorrelated jitter grows by up to 3× per retry until the cap.
func TestBackoffDecorrelatedGrowth(t *testing.T) {
	t.Parallel()
	p := Policy{Base: 10 * time.Millisecond, Cap: time.Second, Jitter: JitterDecorrelated, Rand: func() float64 { return almostOne }}
	var prev time.Duration
	var got []time.Duration
	for n := range 8 {
		prev = p.Backoff(n, prev)
		got = append(got, prev.Round(time.Millisecond))
	}
	want := []time.Duration{30, 90, 270, 810, 1000, 1000, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits = %v, want %v ms", got, want)
		}
	}
}

// Under full jitter, waits spread over [0, exp) with a real random source.
func TestBackoffFullSpread(t *testing.T) {
	t.Parallel()
	p := Policy{Base: time.Second, Cap: time.Minute}
	lo, hi := time.Hour, time.Duration(0)
	for range 1000 {
		d := p.Backoff(2, 0)
		if d < 0 || d >= 4*time.Second {
			t.Fatalf("Backoff = %v, out of [0, 4s)", d)
		}
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo > 400*time.Millisecond || hi < 3600*time.Millisecond {
		t.Errorf("waits spread over [%v, %v] only", lo, hi)
	}
}

func TestPolicyDefaults(t *testing.T) {
	t.Parallel()
	p := Policy{Base: time.Second, Cap: time.Millisecond}.withDefaults()
	if p.Cap != time.Second {
		t.Errorf("Cap below Base: %v, want raised to Base", p.Cap)
	}
	z := Policy{}.withDefaults()
	d := DefaultPolicy()
	if z.MaxAttempts != d.MaxAttempts || z.Base != d.Base || z.Cap != d.Cap || z.Jitter != d.Jitter || z.MaxServerDelay != time.Minute {
		t.Errorf("zero Policy = %+v, want DefaultPolicy %+v", z, d)
	}
	s := ServicePolicy()
	if s.MaxAttempts != 4 || s.Base != 500*time.Millisecond || s.Cap != 30*time.Second || s.Jitter != JitterEqual {
		t.Errorf("ServicePolicy = %+v", s)
	}
	for j, want := range map[Jitter]string{JitterFull: "full", JitterEqual: "equal", JitterDecorrelated: "decorrelated", JitterNone: "none", 9: "jitter(9)"} {
		if j.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(j), j.String(), want)
		}
	}
}
