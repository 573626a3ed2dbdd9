package history

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The defaults of Options, declared once.
const (
	DefaultInterval = 10 * time.Second
	DefaultWindow   = time.Hour
	DefaultBucket   = time.Minute
)

// The gateway's metric families that History reads (package gateway, metrics.go).
const (
	metricRequests  = "retrysafe_gateway_requests_total"         // {route, outcome}
	metricStoreDur  = "retrysafe_gateway_store_duration_seconds" // {operation}
	metricStoreErrs = "retrysafe_gateway_store_errors_total"     // {operation}
)

// Options configures a History. The zero value of every field means its default.
type Options struct {
	// Interval is the time between two samples taken by Run. Default DefaultInterval
	// (10s).
	Interval time.Duration
	// Window is how far back the history reaches: older samples are dropped. Default
	// DefaultWindow (1h).
	Window time.Duration
	// Bucket is the width of one bar of a chart: RouteOutcomes.Buckets has one entry per
	// Bucket of the window. Default DefaultBucket (1m); at most Window.
	Bucket time.Duration
	// Now is the clock that stamps samples and places the window. Default time.Now.
	Now func() time.Time
}

// History keeps the deltas of the gateway's request and store counters over a sliding
// window, sampled from its Prometheus registry. Make one with New. It is safe for
// concurrent use: Run (or Sample) in one goroutine, the readers in others.
type History struct {
	g     prometheus.Gatherer
	opt   Options
	limit int // at most this many samples are kept: Window/Interval

	sampling sync.Mutex // serialises Sample, so that samples are applied in the order gathered

	mu      sync.RWMutex
	based   bool      // the baseline is taken: new series count from zero
	since   time.Time // the baseline's time
	lastErr error
	gen     uint64 // the number of samples applied; marks the series seen in the latest
	reqs    map[reqKey]*reqSeries
	ops     map[string]*opSeries
	samples []sample // oldest first; only those with a delta
	scratch sample   // the sample being gathered: its slices are reused, and copied to their size when kept
}

type reqKey struct{ route, outcome string }

// reqSeries is one series of requests_total: its last cumulative value.
type reqSeries struct {
	route, outcome string
	class          Class
	prev           float64
	gen            uint64
}

// opSeries is one store operation: its last duration histogram and error count.
type opSeries struct {
	op      string
	bounds  []float64 // finite upper bounds; replaced (never modified) when they change
	cum     []uint64  // cumulative counts by bound
	count   uint64
	hasHist bool
	errs    float64
	hasErrs bool
	gen     uint64
}

// sample holds what changed since the previous sample, series by series.
type sample struct {
	t   time.Time
	req []reqDelta
	op  []opDelta
}

type reqDelta struct {
	s *reqSeries
	n uint64
}

type opDelta struct {
	s      *opSeries
	bounds []float64 // the layout cum counts under
	cum    []uint64  // cumulative deltas by bound
	count  uint64
	errs   uint64
}

// New returns a History of the metrics g gathers: the gateway's registry (the
// gateway.Config.Registerer it was given, when that is a *prometheus.Registry). It takes
// no sample until Sample or Run is called.
func New(g prometheus.Gatherer, opt Options) *History {
	if opt.Interval <= 0 {
		opt.Interval = DefaultInterval
	}
	if opt.Window <= 0 {
		opt.Window = DefaultWindow
	}
	if opt.Bucket <= 0 {
		opt.Bucket = DefaultBucket
	}
	opt.Bucket = min(opt.Bucket, opt.Window)
	if opt.Now == nil {
		opt.Now = time.Now
	}
	limit := int((opt.Window + opt.Interval - 1) / opt.Interval)
	return &History{g: g, opt: opt, limit: max(limit, 1), reqs: map[reqKey]*reqSeries{}, ops: map[string]*opSeries{}}
}

// Run takes a sample at once and then every Interval, until ctx ends. It logs nothing:
// Err reports the latest sample's error.
func (h *History) Run(ctx context.Context) {
	t := time.NewTicker(h.opt.Interval)
	defer t.Stop()
	_ = h.Sample()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = h.Sample() // kept for Err
		}
	}
}

// Err returns the error of the latest sample, nil when it succeeded.
func (h *History) Err() error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.lastErr
}

// Since returns the time of the first sample, the baseline the history counts from, or
// the zero time before it.
func (h *History) Since() time.Time {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.since
}

// Sample gathers the metrics now and records what changed since the previous sample.
// The first sample is the baseline: it records nothing, as the counts before it belong
// to no known interval; a series that appears later counts from zero (the gateway
// makes a series on its first request). A value below the previous one is a reset (the
// series was removed and made again): its whole value is the delta, never a negative
// count. When gathering fails nothing is recorded, so that the next sample's deltas
// cover the gap.
func (h *History) Sample() error {
	h.sampling.Lock()
	defer h.sampling.Unlock()
	var mfs []*dto.MetricFamily
	err := errors.New("no gatherer (New was given nil)")
	if h.g != nil {
		mfs, err = h.g.Gather()
	}
	now := h.opt.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.lastErr = fmt.Errorf("history: gather: %w", err)
		return h.lastErr
	}
	h.lastErr = nil
	h.gen++
	if n := len(h.samples); n > 0 && now.Before(h.samples[n-1].t) {
		now = h.samples[n-1].t // a clock set back: the samples stay in order
	}
	s := &h.scratch
	s.t, s.req, s.op = now, s.req[:0], s.op[:0]
	for _, mf := range mfs {
		switch mf.GetName() {
		case metricRequests:
			for _, m := range mf.GetMetric() {
				h.applyRequests(s, m)
			}
		case metricStoreDur:
			for _, m := range mf.GetMetric() {
				h.applyStoreDur(s, m)
			}
		case metricStoreErrs:
			for _, m := range mf.GetMetric() {
				h.applyStoreErrs(s, m)
			}
		}
	}
	for k, rs := range h.reqs {
		if rs.gen != h.gen {
			delete(h.reqs, k) // gone: should it come back, it counts from zero
		}
	}
	for k, os := range h.ops {
		if os.gen != h.gen {
			delete(h.ops, k)
		}
	}
	if !h.based {
		h.based, h.since = true, now
	}
	h.evict(now)
	if len(s.req) > 0 || len(s.op) > 0 {
		kept := sample{t: s.t, req: slices.Clone(s.req), op: slices.Clone(s.op)}
		if len(h.samples) >= h.limit {
			h.foldOldest(&kept)
		}
		h.samples = append(h.samples, kept)
	}
	clear(s.req[:cap(s.req)]) // no pointers kept past their sample
	clear(s.op[:cap(s.op)])
	return nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// delta returns the increase of a counter from prev to cur, a reset when cur is lower.
func delta(prev, cur float64) uint64 {
	d := cur - prev
	if d < 0 {
		d = cur
	}
	if d <= 0 || math.IsNaN(d) {
		return 0
	}
	return uint64(math.Round(d))
}

func (h *History) applyRequests(s *sample, m *dto.Metric) {
	c := m.GetCounter()
	if c == nil {
		return
	}
	v := c.GetValue()
	k := reqKey{label(m, "route"), label(m, "outcome")}
	rs, ok := h.reqs[k]
	prev := 0.0
	switch {
	case ok && rs.gen == h.gen:
		return // a duplicate series in one gather: counted once
	case ok:
		prev = rs.prev
	default:
		class, _ := ClassOf(k.outcome)
		rs = &reqSeries{route: k.route, outcome: k.outcome, class: class}
		h.reqs[k] = rs
		if !h.based {
			prev = v // the baseline: counts before it are not in the window
		}
	}
	rs.prev, rs.gen = v, h.gen
	if n := delta(prev, v); n > 0 {
		s.req = append(s.req, reqDelta{rs, n})
	}
}

// opFor returns the series of store operation op, marking it seen in this sample, and
// whether it existed before.
func (h *History) opFor(op string) (*opSeries, bool) {
	os, ok := h.ops[op]
	if !ok {
		os = &opSeries{op: op}
		h.ops[op] = os
	}
	os.gen = h.gen
	return os, ok
}

// opDeltaOf returns s's delta entry of os, appended on first use.
func opDeltaOf(s *sample, os *opSeries) *opDelta {
	for i := range s.op {
		if s.op[i].s == os {
			return &s.op[i]
		}
	}
	s.op = append(s.op, opDelta{s: os})
	return &s.op[len(s.op)-1]
}

func (h *History) applyStoreDur(s *sample, m *dto.Metric) {
	hist := m.GetHistogram()
	if hist == nil {
		return
	}
	os, _ := h.opFor(label(m, "operation"))
	bs := hist.GetBucket()
	n := len(bs)
	if n > 0 && math.IsInf(bs[n-1].GetUpperBound(), +1) {
		n-- // the +Inf bucket is the sample count
	}
	count := hist.GetSampleCount()
	same := os.hasHist && len(os.bounds) == n
	for i := 0; same && i < n; i++ {
		same = os.bounds[i] == bs[i].GetUpperBound()
	}
	reset := !same || count < os.count
	for i := 0; !reset && i < n; i++ {
		reset = bs[i].GetCumulativeCount() < os.cum[i]
	}
	if !same {
		os.bounds = make([]float64, n)
		for i := range n {
			os.bounds[i] = bs[i].GetUpperBound()
		}
		os.cum = make([]uint64, n)
	}
	// A new layout, or a histogram seen for the first time after the baseline, counts
	// from zero; at the baseline it only sets the previous values.
	count0 := !os.hasHist && !h.based
	var d *opDelta
	if !count0 {
		dc := count
		if !reset {
			dc = count - os.count
		}
		if dc > 0 {
			d = opDeltaOf(s, os)
			d.bounds, d.count = os.bounds, dc
			d.cum = make([]uint64, n)
		}
	}
	for i := range n {
		c := bs[i].GetCumulativeCount()
		if d != nil {
			if reset {
				d.cum[i] = c
			} else {
				d.cum[i] = c - os.cum[i]
			}
		}
		os.cum[i] = c
	}
	os.count, os.hasHist = count, true
}

func (h *History) applyStoreErrs(s *sample, m *dto.Metric) {
	c := m.GetCounter()
	if c == nil {
		return
	}
	os, _ := h.opFor(label(m, "operation"))
	v := c.GetValue()
	prev := os.errs // 0 for a series new since the baseline
	if !os.hasErrs && !h.based {
		prev = v // the baseline
	}
	os.errs, os.hasErrs = v, true
	if n := delta(prev, v); n > 0 {
		opDeltaOf(s, os).errs += n
	}
}

// evict drops the samples that left the window ending at now.
func (h *History) evict(now time.Time) {
	from := now.Add(-h.opt.Window)
	i := 0
	for i < len(h.samples) && !h.samples[i].t.After(from) {
		i++
	}
	if i > 0 {
		clear(h.samples[:i])
		h.samples = slices.Delete(h.samples, 0, i)
	}
}

// foldOldest adds the oldest sample into the one after it (next, the sample about to be
// appended, when it is the only one), so that the number of samples stays bounded when
// Sample is called more often than Interval, without losing counts of the window: the
// merged sample covers both intervals and keeps the later time.
func (h *History) foldOldest(next *sample) {
	if len(h.samples) == 0 {
		return
	}
	a, b := h.samples[0], next
	if len(h.samples) > 1 {
		b = &h.samples[1]
	}
	for _, r := range a.req {
		j := slices.IndexFunc(b.req, func(x reqDelta) bool { return x.s == r.s })
		if j < 0 {
			b.req = append(b.req, r)
		} else {
			b.req[j].n += r.n
		}
	}
	for _, o := range a.op {
		d := opDeltaOf(b, o.s)
		d.errs += o.errs
		switch {
		case o.count == 0:
		case d.count == 0:
			d.bounds, d.cum, d.count = o.bounds, o.cum, o.count
		case slicesSame(d.bounds, o.bounds):
			cum := make([]uint64, len(d.cum))
			for i := range cum {
				cum[i] = d.cum[i] + o.cum[i]
			}
			d.cum, d.count = cum, d.count+o.count
		}
		// Another layout: the older observations are dropped with it, as a quantile
		// cannot be computed across layouts.
	}
	h.samples[0] = sample{}
	h.samples = slices.Delete(h.samples, 0, 1)
}

func slicesSame(a, b []float64) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// RouteOutcomes are one route's requests over the window.
type RouteOutcomes struct {
	// Route is the gateway's route label: its pattern, "/" for the catch-all, "" for
	// requests no route matched.
	Route string
	// Totals are the route's requests over the window by class; equal to the sum of
	// Buckets.
	Totals Counts
	// Outcomes are the totals by the gateway's own outcome value, sorted by it; only
	// those with requests in the window.
	Outcomes []OutcomeCount
	// Buckets are the counts of each Options.Bucket of the window, oldest first,
	// contiguous: the first starts at or before the window's start, the last holds now.
	Buckets []BucketCounts
}

// OutcomeCount is the number of requests of one outcome value.
type OutcomeCount struct {
	Outcome string
	Class   Class
	Count   uint64
}

// BucketCounts are the requests of one bucket of time, by class. A request is placed in
// the bucket of the sample that first counted it.
type BucketCounts struct {
	Start  time.Time
	Counts Counts
}

// buckets returns the starts of the chart buckets that cover the window ending at now.
func (h *History) buckets(now time.Time) (first time.Time, n int) {
	first = now.Add(-h.opt.Window).Truncate(h.opt.Bucket)
	n = int(now.Truncate(h.opt.Bucket).Sub(first)/h.opt.Bucket) + 1
	return first, n
}

// inWindow returns the samples in the window ending at now; h.mu is held.
func (h *History) inWindow(now time.Time) []sample {
	from := now.Add(-h.opt.Window)
	i, _ := slices.BinarySearchFunc(h.samples, from, func(s sample, t time.Time) int {
		if s.t.After(t) {
			return 1
		}
		return -1
	})
	j := len(h.samples)
	for j > i && h.samples[j-1].t.After(now) {
		j-- // taken on a clock ahead of the reader's
	}
	return h.samples[i:j]
}

// Outcomes returns each route's requests over the window ending now, sorted by route:
// every route with requests in the window or a series in the latest sample.
func (h *History) Outcomes() []RouteOutcomes {
	now := h.opt.Now()
	first, n := h.buckets(now)
	h.mu.RLock()
	defer h.mu.RUnlock()
	type acc struct {
		ro       *RouteOutcomes
		outcomes map[string]uint64
	}
	routes := map[string]*acc{}
	get := func(route string) *acc {
		a, ok := routes[route]
		if !ok {
			a = &acc{ro: &RouteOutcomes{Route: route, Buckets: make([]BucketCounts, n)}, outcomes: map[string]uint64{}}
			for i := range a.ro.Buckets {
				a.ro.Buckets[i].Start = first.Add(time.Duration(i) * h.opt.Bucket)
			}
			routes[route] = a
		}
		return a
	}
	for _, rs := range h.reqs {
		get(rs.route)
	}
	for _, s := range h.inWindow(now) {
		b := min(max(int(s.t.Sub(first)/h.opt.Bucket), 0), n-1)
		for _, d := range s.req {
			a := get(d.s.route)
			a.ro.Buckets[b].Counts[d.s.class] += d.n
			a.ro.Totals[d.s.class] += d.n
			a.outcomes[d.s.outcome] += d.n
		}
	}
	out := make([]RouteOutcomes, 0, len(routes))
	for _, a := range routes {
		for o, c := range a.outcomes {
			class, _ := ClassOf(o)
			a.ro.Outcomes = append(a.ro.Outcomes, OutcomeCount{Outcome: o, Class: class, Count: c})
		}
		slices.SortFunc(a.ro.Outcomes, func(x, y OutcomeCount) int { return cmp.Compare(x.Outcome, y.Outcome) })
		out = append(out, *a.ro)
	}
	slices.SortFunc(out, func(x, y RouteOutcomes) int { return cmp.Compare(x.Route, y.Route) })
	return out
}

// OpLatency is one store operation over the window.
type OpLatency struct {
	// Operation is the gateway's operation label: claim, complete, release, abandon,
	// extend, get, delete_expired, ping.
	Operation string
	// Count is the number of calls timed; Errors those that failed.
	Count, Errors uint64
	// P50, P90 and P99 are the latency quantiles of the calls.
	P50, P90, P99 Quantile
}

// Quantile is a latency quantile estimated from histogram buckets, as PromQL's
// histogram_quantile does: the bucket that holds the rank is found, and the value is
// interpolated linearly between its bounds (from zero for the first bucket).
type Quantile struct {
	// Seconds is the estimate. When Above is set it is the largest finite bucket
	// bound, which the quantile exceeds.
	Seconds float64
	// Above says that the quantile lies above the largest finite bucket: only a lower
	// bound is known.
	Above bool
	// Empty says that there were no observations: nothing is known.
	Empty bool
}

// Duration returns q.Seconds as a time.Duration.
func (q Quantile) Duration() time.Duration {
	return time.Duration(math.Round(q.Seconds * float64(time.Second)))
}

// String returns the estimate as a duration: "1.5ms", "> 6.5536s" above the largest
// bucket, "–" without observations.
func (q Quantile) String() string {
	switch {
	case q.Empty:
		return "–"
	case q.Above:
		return "> " + q.Duration().String()
	}
	return q.Duration().String()
}

// quantile estimates the q-quantile of count observations whose cumulative counts by
// finite upper bound are cum.
func quantile(q float64, bounds []float64, cum []uint64, count uint64) Quantile {
	if count == 0 || len(bounds) != len(cum) {
		return Quantile{Empty: true}
	}
	rank := q * float64(count)
	i, _ := slices.BinarySearchFunc(cum, rank, func(c uint64, r float64) int {
		if float64(c) >= r {
			return 1
		}
		return -1
	})
	if i == len(bounds) {
		if i == 0 {
			return Quantile{Above: true} // no finite bucket at all
		}
		return Quantile{Seconds: bounds[i-1], Above: true}
	}
	lo, below := 0.0, 0.0
	if i > 0 {
		lo, below = bounds[i-1], float64(cum[i-1])
	} else if bounds[0] <= 0 {
		return Quantile{Seconds: bounds[0]}
	}
	in := float64(cum[i]) - below
	if in <= 0 {
		return Quantile{Seconds: bounds[i]}
	}
	return Quantile{Seconds: lo + (bounds[i]-lo)*(rank-below)/in}
}

// StoreLatency returns each store operation's calls, errors and latency quantiles over
// the window ending now, sorted by operation: every operation with calls in the window
// or a series in the latest sample.
func (h *History) StoreLatency() []OpLatency {
	now := h.opt.Now()
	h.mu.RLock()
	defer h.mu.RUnlock()
	type acc struct {
		lat    OpLatency
		bounds []float64 // the latest layout's
		cum    []uint64
		count  uint64
	}
	ops := map[string]*acc{}
	get := func(os *opSeries) *acc {
		a, ok := ops[os.op]
		if !ok {
			a = &acc{lat: OpLatency{Operation: os.op}}
			ops[os.op] = a
		}
		return a
	}
	for _, os := range h.ops {
		get(os)
	}
	win := h.inWindow(now)
	for k := len(win) - 1; k >= 0; k-- { // newest first: the latest layout wins
		for _, d := range win[k].op {
			a := get(d.s)
			a.lat.Errors += d.errs
			if d.count == 0 {
				continue
			}
			a.lat.Count += d.count
			if a.bounds == nil {
				a.bounds, a.cum = d.bounds, make([]uint64, len(d.bounds))
			}
			if !slicesSame(a.bounds, d.bounds) {
				continue // an older layout: counted, not in the quantiles
			}
			a.count += d.count
			for i, c := range d.cum {
				a.cum[i] += c
			}
		}
	}
	out := make([]OpLatency, 0, len(ops))
	for _, a := range ops {
		a.lat.P50 = quantile(0.50, a.bounds, a.cum, a.count)
		a.lat.P90 = quantile(0.90, a.bounds, a.cum, a.count)
		a.lat.P99 = quantile(0.99, a.bounds, a.cum, a.count)
		out = append(out, a.lat)
	}
	slices.SortFunc(out, func(x, y OpLatency) int { return cmp.Compare(x.Operation, y.Operation) })
	return out
}
