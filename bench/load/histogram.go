package load

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Histogram layout, as in HdrHistogram with 2 significant decimal digits: values below
// 2^(subBits+1) ns have a bucket each; above, every power of two is split into 2^subBits
// buckets, so a bucket is at most 1/128 (0.8%) of its values wide. 64-bit values need
// 256 + 56*128 = 7424 buckets (58 KiB), whatever the number of samples.
const (
	subBits    = 7
	subCount   = 1 << subBits       // buckets per power of two
	linearTop  = 1 << (subBits + 1) // values below it have a bucket each
	numBuckets = linearTop + (64-(subBits+1))*subCount
)

// Histogram counts latencies in nanoseconds in log-linear buckets: bounded memory, a
// relative error of at most 1/128 on any quantile, exact count, min, max and mean. It is
// safe for concurrent use: Record is a few atomic adds, so all the clients of a run
// share one. The zero value is not usable; call NewHistogram.
type Histogram struct {
	counts []atomic.Int64
	n      atomic.Int64
	sum    atomic.Int64 // nanoseconds; overflows only after 292 years of latency
	min    atomic.Int64
	max    atomic.Int64
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram {
	h := &Histogram{counts: make([]atomic.Int64, numBuckets)}
	h.min.Store(math.MaxInt64)
	return h
}

// bucketOf returns the bucket of v (v ≥ 0).
func bucketOf(v uint64) int {
	if v < linearTop {
		return int(v)
	}
	shift := bits.Len64(v) - (subBits + 1) // ≥ 1
	m := v >> uint(shift)                  // in [subCount, 2*subCount)
	return linearTop + (shift-1)*subCount + int(m-subCount)
}

// bucketRange returns the lowest and highest value of bucket i.
func bucketRange(i int) (lo, hi uint64) {
	if i < linearTop {
		return uint64(i), uint64(i)
	}
	shift := uint((i-linearTop)/subCount + 1)
	m := uint64((i-linearTop)%subCount + subCount)
	lo = m << shift
	return lo, lo + (1 << shift) - 1
}

// Record adds one latency. A negative duration counts as 0.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[bucketOf(uint64(v))].Add(1)
	h.n.Add(1)
	h.sum.Add(v)
	for {
		cur := h.min.Load()
		if v >= cur || h.min.CompareAndSwap(cur, v) {
			break
		}
	}
	for {
		cur := h.max.Load()
		if v <= cur || h.max.CompareAndSwap(cur, v) {
			break
		}
	}
}

// Merge adds the counts of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o == nil || o.n.Load() == 0 {
		return
	}
	for i := range o.counts {
		if c := o.counts[i].Load(); c != 0 {
			h.counts[i].Add(c)
		}
	}
	h.n.Add(o.n.Load())
	h.sum.Add(o.sum.Load())
	for v := o.min.Load(); ; {
		cur := h.min.Load()
		if v >= cur || h.min.CompareAndSwap(cur, v) {
			break
		}
	}
	for v := o.max.Load(); ; {
		cur := h.max.Load()
		if v <= cur || h.max.CompareAndSwap(cur, v) {
			break
		}
	}
}

// Count returns the number of latencies recorded.
func (h *Histogram) Count() int64 { return h.n.Load() }

// Min returns the smallest latency recorded, 0 when none was.
func (h *Histogram) Min() time.Duration {
	if h.n.Load() == 0 {
		return 0
	}
	return time.Duration(h.min.Load())
}

// Max returns the largest latency recorded, exactly.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max.Load()) }

// Mean returns the mean latency, exactly; 0 when none was recorded.
func (h *Histogram) Mean() time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / n)
}

// Quantile returns the latency at quantile q (0 ≤ q ≤ 1; 0.99 is p99): the highest value
// of the bucket holding the ⌈q·n⌉-th smallest latency, capped at the maximum, so it is
// never below the true quantile and at most 0.8% above it. 0 when nothing was recorded;
// q outside [0, 1] is clamped.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	switch {
	case math.IsNaN(q) || q <= 0:
		return h.Min()
	case q >= 1:
		return h.Max()
	}
	rank := int64(math.Ceil(q * float64(n)))
	if rank < 1 {
		rank = 1
	}
	var seen int64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			_, hi := bucketRange(i)
			v := time.Duration(hi)
			if mx := h.Max(); v > mx {
				v = mx
			}
			if mn := h.Min(); v < mn {
				v = mn
			}
			return v
		}
	}
	return h.Max() // only when counts moved under a concurrent Record
}

// Summary is a histogram's figures, in milliseconds, as they appear in a Result.
type Summary struct {
	Count  int64   `json:"count"`
	MinMS  float64 `json:"min_ms"`
	MeanMS float64 `json:"mean_ms"`
	P50MS  float64 `json:"p50_ms"`
	P90MS  float64 `json:"p90_ms"`
	P99MS  float64 `json:"p99_ms"`
	P999MS float64 `json:"p999_ms"`
	MaxMS  float64 `json:"max_ms"`
}

// Summary returns h's figures.
func (h *Histogram) Summary() Summary {
	return Summary{
		Count:  h.Count(),
		MinMS:  ms(h.Min()),
		MeanMS: ms(h.Mean()),
		P50MS:  ms(h.Quantile(0.50)),
		P90MS:  ms(h.Quantile(0.90)),
		P99MS:  ms(h.Quantile(0.99)),
		P999MS: ms(h.Quantile(0.999)),
		MaxMS:  ms(h.Max()),
	}
}

// ms converts d to milliseconds rounded to the microsecond.
func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }
