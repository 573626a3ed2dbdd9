package history_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/retrysafe/retrysafe/console/history"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// net/http's idle connection helpers of the gateway test outlive it by a moment.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

// clock is a settable clock for Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// gatewayMetrics are collectors named and labelled as the gateway's, in a real registry.
type gatewayMetrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	storeDur *prometheus.HistogramVec
	storeErr *prometheus.CounterVec
}

func newGatewayMetrics(t testing.TB, buckets []float64) *gatewayMetrics {
	t.Helper()
	if buckets == nil {
		buckets = prometheus.ExponentialBuckets(0.0001, 2, 17)
	}
	m := &gatewayMetrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "retrysafe", Subsystem: "gateway",
			Name: "requests_total", Help: "requests"}, []string{"route", "outcome"}),
		storeDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "retrysafe", Subsystem: "gateway",
			Name: "store_duration_seconds", Help: "store", Buckets: buckets}, []string{"operation"}),
		storeErr: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "retrysafe", Subsystem: "gateway",
			Name: "store_errors_total", Help: "errors"}, []string{"operation"}),
	}
	m.reg.MustRegister(m.requests, m.storeDur, m.storeErr)
	return m
}

func (m *gatewayMetrics) add(route, outcome string, n float64) {
	m.requests.WithLabelValues(route, outcome).Add(n)
}

// routeOf returns the RouteOutcomes of route in os, failing the test when it is absent.
func routeOf(t *testing.T, os []history.RouteOutcomes, route string) history.RouteOutcomes {
	t.Helper()
	for _, o := range os {
		if o.Route == route {
			return o
		}
	}
	t.Fatalf("route %q not in %+v", route, os)
	return history.RouteOutcomes{}
}

func opOf(t *testing.T, ls []history.OpLatency, op string) history.OpLatency {
	t.Helper()
	for _, l := range ls {
		if l.Operation == op {
			return l
		}
	}
	t.Fatalf("operation %q not in %+v", op, ls)
	return history.OpLatency{}
}

// total returns the number of requests in os.
func total(os []history.RouteOutcomes) uint64 {
	var n uint64
	for _, o := range os {
		n += o.Totals.Total()
	}
	return n
}

// checkSums checks that each route's totals are the sums of its buckets and of its
// outcomes.
func checkSums(t *testing.T, os []history.RouteOutcomes) {
	t.Helper()
	for _, o := range os {
		var sum history.Counts
		for _, b := range o.Buckets {
			for c, n := range b.Counts {
				sum[c] += n
			}
		}
		if sum != o.Totals {
			t.Errorf("%s: buckets sum to %v, totals %v", o.Route, sum, o.Totals)
		}
		var byOutcome history.Counts
		for _, oc := range o.Outcomes {
			byOutcome[oc.Class] += oc.Count
		}
		if byOutcome != o.Totals {
			t.Errorf("%s: outcomes sum to %v, totals %v", o.Route, byOutcome, o.Totals)
		}
	}
}

func TestDeltasAndBaseline(t *testing.T) {
	t.Parallel()
	m := newGatewayMetrics(t, nil)
	clk := newClock()
	h := history.New(m.reg, history.Options{Now: clk.Now})

	m.add("POST /pay", "executed", 7) // before the baseline: not counted
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	if got := routeOf(t, h.Outcomes(), "POST /pay").Totals.Total(); got != 0 {
		t.Fatalf("after the baseline: %d requests, want 0", got)
	}
	if !h.Since().Equal(clk.Now()) {
		t.Errorf("Since = %v, want %v", h.Since(), clk.Now())
	}

	clk.Add(10 * time.Second)
	m.add("POST /pay", "executed", 3)
	m.add("POST /pay", "replayed", 2)
	m.add("POST /pay", "conflict", 1)
	m.add("POST /pay", "no-route", 4)    // other 4xx
	m.add("/", "mismatch", 5)            // a series new since the baseline: counts from zero
	m.add("/", "some-future-outcome", 6) // unknown: other
	m.add("/", "abandoned", 1)           // upstream failure
	m.add("POST /idle", "executed", 0)   // a series with no request in the window
	m.storeDur.WithLabelValues("claim").Observe(0.001)
	m.storeErr.WithLabelValues("claim").Inc()
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	clk.Add(70 * time.Second) // the next bucket
	m.add("POST /pay", "executed", 10)
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}

	os := h.Outcomes()
	checkSums(t, os)
	if len(os) != 3 || os[0].Route != "/" || os[1].Route != "POST /idle" || os[2].Route != "POST /pay" {
		t.Fatalf("routes %+v, want /, POST /idle, POST /pay in order", os)
	}
	pay := os[2]
	want := history.Counts{history.ClassExecuted: 13, history.ClassReplayed: 2, history.ClassInFlight: 1, history.ClassOther4xx: 4}
	if pay.Totals != want {
		t.Errorf("POST /pay totals %v, want %v", pay.Totals, want)
	}
	root := os[0].Totals
	if root[history.ClassMismatch] != 5 || root[history.ClassOther] != 6 || root[history.ClassUpstreamFailure] != 1 {
		t.Errorf("/ totals %v", root)
	}
	if os[1].Totals.Total() != 0 {
		t.Errorf("POST /idle totals %v, want none", os[1].Totals)
	}
	if n := len(pay.Buckets); n != 61 {
		t.Errorf("%d buckets, want 61 (one hour of minutes and the current one)", n)
	}
	last := pay.Buckets[len(pay.Buckets)-1]
	prev := pay.Buckets[len(pay.Buckets)-2]
	if last.Counts[history.ClassExecuted] != 10 || prev.Counts[history.ClassExecuted] != 3 {
		t.Errorf("executed by bucket: last %v, one before %v; want 10 and 3", last.Counts, prev.Counts)
	}
	if !last.Start.Equal(clk.Now().Truncate(time.Minute)) {
		t.Errorf("last bucket starts at %v, want %v", last.Start, clk.Now().Truncate(time.Minute))
	}
	if len(pay.Outcomes) != 4 || pay.Outcomes[0].Outcome != "conflict" || pay.Outcomes[1].Outcome != "executed" || pay.Outcomes[1].Count != 13 {
		t.Errorf("outcomes %+v, want conflict, executed (13), no-route, replayed", pay.Outcomes)
	}

	claim := opOf(t, h.StoreLatency(), "claim")
	if claim.Count != 1 || claim.Errors != 1 {
		t.Errorf("claim: %d calls, %d errors; want 1 and 1", claim.Count, claim.Errors)
	}
}

func TestWindowEviction(t *testing.T) {
	t.Parallel()
	m := newGatewayMetrics(t, nil)
	clk := newClock()
	h := history.New(m.reg, history.Options{Now: clk.Now, Window: 10 * time.Minute, Interval: time.Minute, Bucket: time.Minute})
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	// One request a minute for 30 minutes: the window holds the last 10.
	for range 30 {
		clk.Add(time.Minute)
		m.add("/", "executed", 1)
		m.storeDur.WithLabelValues("claim").Observe(0.001)
		if err := h.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	ro := routeOf(t, h.Outcomes(), "/")
	checkSums(t, []history.RouteOutcomes{ro})
	if got := ro.Totals[history.ClassExecuted]; got != 10 {
		t.Errorf("executed over the window: %d, want 10", got)
	}
	if got := opOf(t, h.StoreLatency(), "claim").Count; got != 10 {
		t.Errorf("claims over the window: %d, want 10", got)
	}
	// Readers place the window on their own clock: five minutes later, five are left.
	clk.Add(5 * time.Minute)
	if got := routeOf(t, h.Outcomes(), "/").Totals[history.ClassExecuted]; got != 5 {
		t.Errorf("five minutes on: %d executed, want 5", got)
	}
	clk.Add(time.Hour)
	if got := routeOf(t, h.Outcomes(), "/").Totals.Total(); got != 0 {
		t.Errorf("an hour on: %d requests, want 0", got)
	}
}

func TestSamplingFasterThanInterval(t *testing.T) {
	t.Parallel()
	m := newGatewayMetrics(t, nil)
	clk := newClock()
	// Room for 6 samples; 60 are taken within the window: the counts must all stay.
	h := history.New(m.reg, history.Options{Now: clk.Now, Window: time.Minute, Interval: 10 * time.Second})
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	for range 60 {
		clk.Add(500 * time.Millisecond)
		m.add("/", "replayed", 1)
		m.storeDur.WithLabelValues("get").Observe(0.002)
		if err := h.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	if got := routeOf(t, h.Outcomes(), "/").Totals[history.ClassReplayed]; got != 60 {
		t.Errorf("replayed: %d, want 60", got)
	}
	if got := opOf(t, h.StoreLatency(), "get").Count; got != 60 {
		t.Errorf("gets: %d, want 60", got)
	}

	// Room for one sample only.
	one := history.New(m.reg, history.Options{Now: clk.Now, Window: 10 * time.Second, Interval: time.Minute})
	if err := one.Sample(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		clk.Add(time.Second)
		m.add("/", "replayed", 1)
		m.storeDur.WithLabelValues("get").Observe(0.002)
		if err := one.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	if got := routeOf(t, one.Outcomes(), "/").Totals[history.ClassReplayed]; got != 3 {
		t.Errorf("one sample kept: replayed %d, want 3", got)
	}
	if got := opOf(t, one.StoreLatency(), "get").Count; got != 3 {
		t.Errorf("one sample kept: gets %d, want 3", got)
	}
}

func TestResets(t *testing.T) {
	t.Parallel()
	m := newGatewayMetrics(t, []float64{0.01, 0.1, 1})
	clk := newClock()
	h := history.New(m.reg, history.Options{Now: clk.Now})
	m.add("/", "executed", 100)
	m.storeDur.WithLabelValues("claim").Observe(0.05)
	m.storeErr.WithLabelValues("claim").Add(20)
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}

	// The series is removed and made again, lower: a reset, counted from zero.
	clk.Add(10 * time.Second)
	m.requests.DeleteLabelValues("/", "executed")
	m.add("/", "executed", 4)
	m.storeDur.DeleteLabelValues("claim")
	m.storeDur.WithLabelValues("claim").Observe(0.5)
	m.storeErr.DeleteLabelValues("claim")
	m.storeErr.WithLabelValues("claim").Add(2)
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	if got := routeOf(t, h.Outcomes(), "/").Totals[history.ClassExecuted]; got != 4 {
		t.Errorf("after a reset: %d executed, want 4", got)
	}
	claim := opOf(t, h.StoreLatency(), "claim")
	if claim.Count != 1 || claim.Errors != 2 {
		t.Errorf("after a reset: %d claims, %d errors; want 1 and 2", claim.Count, claim.Errors)
	}

	// The series disappears for a sample (a reload that drops the route), then comes
	// back higher than it was: it counts from zero, not from its old value.
	clk.Add(10 * time.Second)
	m.requests.DeleteLabelValues("/", "executed")
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	clk.Add(10 * time.Second)
	m.add("/", "executed", 9)
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	if got := routeOf(t, h.Outcomes(), "/").Totals[history.ClassExecuted]; got != 13 {
		t.Errorf("after a gap: %d executed, want 4+9", got)
	}

	// A whole new registry (a gateway made again), every series lower.
	clk.Add(10 * time.Second)
	m2 := newGatewayMetrics(t, []float64{0.01, 0.1, 1})
	m2.add("/", "executed", 1)
	var cur atomic.Pointer[prometheus.Registry]
	cur.Store(m.reg)
	h2 := history.New(prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return cur.Load().Gather() }),
		history.Options{Now: clk.Now})
	if err := h2.Sample(); err != nil { // m's: the baseline
		t.Fatal(err)
	}
	clk.Add(10 * time.Second)
	cur.Store(m2.reg)
	if err := h2.Sample(); err != nil {
		t.Fatal(err)
	}
	for _, ro := range h2.Outcomes() {
		for _, b := range ro.Buckets {
			for _, n := range b.Counts {
				if n > math.MaxInt64 {
					t.Fatalf("a negative count wrapped around: %v", b.Counts)
				}
			}
		}
	}
	if got := routeOf(t, h2.Outcomes(), "/").Totals[history.ClassExecuted]; got != 1 {
		t.Errorf("a new registry: %d executed, want 1", got)
	}
}

// TestClockSetBack: a sample taken on a clock set back is kept in order, and counted.
func TestClockSetBack(t *testing.T) {
	t.Parallel()
	m := newGatewayMetrics(t, nil)
	clk := newClock()
	h := history.New(m.reg, history.Options{Now: clk.Now, Window: 10 * time.Minute})
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	for _, step := range []time.Duration{time.Minute, -30 * time.Second, time.Minute, 8 * time.Minute} {
		clk.Add(step)
		m.add("/", "executed", 1)
		if err := h.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	// The second sample, taken at 18:00:30, is stamped 18:01, as the first. At 18:10:45
	// the window starts at 18:00:45: all four are in it.
	clk.Add(75 * time.Second)
	if got := routeOf(t, h.Outcomes(), "/").Totals[history.ClassExecuted]; got != 4 {
		t.Errorf("executed %d, want 4", got)
	}
	clk.Add(30 * time.Second) // 18:11:15: the first two are out
	if got := routeOf(t, h.Outcomes(), "/").Totals[history.ClassExecuted]; got != 2 {
		t.Errorf("executed %d, want 2", got)
	}
}

func TestGatherFailureRecordsNothing(t *testing.T) {
	t.Parallel()
	m := newGatewayMetrics(t, nil)
	clk := newClock()
	var fail atomic.Bool
	errDown := errors.New("collector down")
	g := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := m.reg.Gather()
		if fail.Load() {
			return mfs[:0], errDown // partial: every series missing
		}
		return mfs, err
	})
	h := history.New(g, history.Options{Now: clk.Now})
	m.add("/", "executed", 1)
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	clk.Add(10 * time.Second)
	m.add("/", "executed", 2)
	fail.Store(true)
	if err := h.Sample(); !errors.Is(err, errDown) {
		t.Fatalf("Sample = %v, want %v", err, errDown)
	}
	if !errors.Is(h.Err(), errDown) {
		t.Errorf("Err = %v, want %v", h.Err(), errDown)
	}
	clk.Add(10 * time.Second)
	m.add("/", "executed", 3)
	fail.Store(false)
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	if h.Err() != nil {
		t.Errorf("Err = %v after a good sample", h.Err())
	}
	if got := routeOf(t, h.Outcomes(), "/").Totals[history.ClassExecuted]; got != 5 {
		t.Errorf("executed: %d, want 2+3 (counted once, not twice)", got)
	}
	if err := history.New(nil, history.Options{}).Sample(); err == nil {
		t.Error("Sample without a gatherer: no error")
	}
}

func TestQuantiles(t *testing.T) {
	t.Parallel()
	clk := newClock()
	m := newGatewayMetrics(t, prometheus.LinearBuckets(0.001, 0.001, 1000)) // 1ms … 1s by 1ms
	h := history.New(m.reg, history.Options{Now: clk.Now})
	m.storeDur.WithLabelValues("claim").Observe(5) // before the baseline
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	clk.Add(10 * time.Second)
	// Uniform on (0, 1s]: quantile q is q seconds.
	for i := 1; i <= 10000; i++ {
		m.storeDur.WithLabelValues("claim").Observe(float64(i) / 10000)
	}
	// Exponential with a mean of 100ms, by its quantile function.
	for i := range 10000 {
		p := (float64(i) + 0.5) / 10000
		m.storeDur.WithLabelValues("get").Observe(-0.1 * math.Log(1-p))
	}
	// Half at 0.5ms, half beyond the largest bucket.
	for range 50 {
		m.storeDur.WithLabelValues("complete").Observe(0.0005)
		m.storeDur.WithLabelValues("complete").Observe(30)
	}
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	ls := h.StoreLatency()
	near := func(name string, q history.Quantile, want, tol float64) {
		t.Helper()
		if q.Empty || q.Above || math.Abs(q.Seconds-want) > tol {
			t.Errorf("%s = %+v, want %.4fs ± %.4f", name, q, want, tol)
		}
	}
	claim := opOf(t, ls, "claim")
	if claim.Count != 10000 {
		t.Errorf("claims %d, want 10000", claim.Count)
	}
	near("claim p50", claim.P50, 0.5, 0.001)
	near("claim p90", claim.P90, 0.9, 0.001)
	near("claim p99", claim.P99, 0.99, 0.001)
	get := opOf(t, ls, "get")
	near("get p50", get.P50, 0.1*math.Ln2, 0.001)
	near("get p90", get.P90, -0.1*math.Log(0.1), 0.001)
	// Above p99 (0.46s) the buckets still hold the tail: within one bucket.
	near("get p99", get.P99, -0.1*math.Log(0.01), 0.001)

	c := opOf(t, ls, "complete")
	// Rank 50 of 100: the top of the first bucket, interpolated from zero to 1ms.
	near("complete p50", c.P50, 0.001, 1e-9)
	if !c.P90.Above || math.Abs(c.P90.Seconds-1) > 1e-9 || c.P99.String() != "> 1s" {
		t.Errorf("complete p90 %+v, p99 %q: want above the largest bucket (1s)", c.P90, c.P99.String())
	}

	// Interpolation inside one bucket, as histogram_quantile: buckets 1, 2, 4 with 10,
	// 30 and 60 observations. 40 are at or below 2, so rank 50 (p50) lies 10 into the
	// 60 of (2, 4]: 2 + 2·10/60.
	m3 := newGatewayMetrics(t, []float64{1, 2, 4})
	h3 := history.New(m3.reg, history.Options{Now: clk.Now})
	_ = h3.Sample()
	for range 10 {
		m3.storeDur.WithLabelValues("ping").Observe(0.5)
	}
	for range 30 {
		m3.storeDur.WithLabelValues("ping").Observe(1.5)
	}
	for range 60 {
		m3.storeDur.WithLabelValues("ping").Observe(3)
	}
	if err := h3.Sample(); err != nil {
		t.Fatal(err)
	}
	ping := opOf(t, h3.StoreLatency(), "ping")
	near("ping p50", ping.P50, 2+2*10.0/60, 1e-9)
	near("ping p90", ping.P90, 2+2*50.0/60, 1e-9)
	m3.storeDur.WithLabelValues("idle") // a series with no observation
	if err := h3.Sample(); err != nil {
		t.Fatal(err)
	}
	idle := opOf(t, h3.StoreLatency(), "idle")
	if !idle.P50.Empty || idle.P50.String() != "–" || idle.Count != 0 {
		t.Errorf("idle operation: %+v, want no observations", idle)
	}
}

func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	m := newGatewayMetrics(t, nil)
	h := history.New(m.reg, history.Options{Interval: time.Millisecond})
	if err := h.Sample(); err != nil { // the baseline, before any request
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var sampler, writers, readers sync.WaitGroup
	sampler.Go(func() { h.Run(ctx) })
	const nw, each = 4, 500
	for w := range nw {
		writers.Go(func() {
			route := []string{"POST /a", "POST /b"}[w%2]
			for i := range each {
				m.add(route, []string{"executed", "replayed", "conflict"}[i%3], 1)
				m.storeDur.WithLabelValues("claim").Observe(0.001)
			}
		})
	}
	stop := make(chan struct{})
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, o := range h.Outcomes() {
					_ = history.Chart(history.OutcomeChart(o))
				}
				_ = h.StoreLatency()
				_ = h.Err()
			}
		})
	}
	writers.Wait()
	cancel()
	sampler.Wait()
	close(stop)
	readers.Wait()
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	os := h.Outcomes()
	checkSums(t, os)
	var counted uint64
	for _, o := range os {
		counted += o.Totals.Total()
	}
	if counted != nw*each {
		t.Errorf("counted %d requests, want %d", counted, nw*each)
	}
	if got := opOf(t, h.StoreLatency(), "claim").Count; got != nw*each {
		t.Errorf("counted %d claims, want %d", got, nw*each)
	}
}

// TestRun: Run samples at once, then every Interval, until its context ends.
func TestRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newGatewayMetrics(t, nil)
		h := history.New(m.reg, history.Options{}) // time.Now: the bubble's clock
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			h.Run(ctx)
			close(done)
		}()
		synctest.Wait()
		if h.Since().IsZero() {
			t.Fatal("Run took no baseline at once")
		}
		m.add("/", "executed", 3)
		time.Sleep(history.DefaultInterval - time.Nanosecond)
		synctest.Wait()
		if got := total(h.Outcomes()); got != 0 {
			t.Fatalf("sampled before Interval: %d requests", got)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if got := routeOf(t, h.Outcomes(), "/").Totals[history.ClassExecuted]; got != 3 {
			t.Fatalf("after Interval: %d executed, want 3", got)
		}
		time.Sleep(history.DefaultWindow)
		synctest.Wait()
		if got := routeOf(t, h.Outcomes(), "/").Totals.Total(); got != 0 {
			t.Fatalf("after the window: %d requests, want 0", got)
		}
		cancel()
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("Run did not return when its context ended")
		}
	})
}
