package gateway

import (
	"context"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/promreg"
)

// metrics are the gateway's Prometheus collectors.
type metrics struct {
	requests    *prometheus.CounterVec   // outcome
	requestDur  *prometheus.HistogramVec // outcome
	upstreamDur *prometheus.HistogramVec // result
	storeDur    *prometheus.HistogramVec // operation
	storeErrs   *prometheus.CounterVec   // operation
	inFlight    prometheus.Gauge
	waiting     prometheus.GaugeFunc // waiting() when scraped
	notDurable  prometheus.GaugeFunc // 1 while the store says it cannot make writes durable
	bodyMemory  prometheus.GaugeFunc // bodyMemory() when scraped

	// The children of storeDur and storeErrs, by operation: a vector's WithLabelValues
	// checks and hashes the labels and takes a lock on every call.
	storeOps series[storeSeries]
}

type storeSeries struct {
	dur  prometheus.Observer
	errs prometheus.Counter
}

// series caches the children of metric vectors by one label value, made on first use
// (a series appears in /metrics once it has been observed, as with WithLabelValues),
// so that a request finds its own without hashing its labels or taking the vector's
// lock. The label values are few and all of them are seen early, so the cache is a
// plain map replaced whole when a value is added: a request's lookup is one read of a
// small map, with no lock, where a sync.Map would hash an interface and walk a trie.
type series[T any] struct {
	m    atomic.Pointer[map[string]T] // label value → T; nil until the first value
	mu   sync.Mutex                   // held to add a value
	make func(string) T
}

func (s *series[T]) of(v string) T {
	if m := s.m.Load(); m != nil {
		if c, ok := (*m)[v]; ok {
			return c
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.m.Load()
	if old != nil {
		if c, ok := (*old)[v]; ok {
			return c // added while this one waited
		}
	}
	m := map[string]T{}
	if old != nil {
		m = maps.Clone(*old)
	}
	c := s.make(v)
	m[v] = c
	s.m.Store(&m)
	return c
}

// routeSeries are the series of one route: its requests by outcome, its upstream
// round trips by result.
type routeSeries struct {
	outcomes series[outcomeSeries]
	upstream series[prometheus.Observer]
}

type outcomeSeries struct {
	requests prometheus.Counter
	dur      prometheus.Observer
}

// forRoute returns the series of the route labelled route, whose upstream is host.
func (m *metrics) forRoute(route, host string) *routeSeries {
	rs := &routeSeries{}
	rs.outcomes.make = func(outcome string) outcomeSeries {
		return outcomeSeries{m.requests.WithLabelValues(route, outcome), m.requestDur.WithLabelValues(route, outcome)}
	}
	rs.upstream.make = func(result string) prometheus.Observer { return m.upstreamDur.WithLabelValues(host, result) }
	return rs
}

const namespace, subsystem = "retrysafe", "gateway"

// newMetrics makes and registers the gateway's collectors; waiting reports the requests
// waiting for keys in progress (the wait conflict policy), notDurable whether the
// store said it cannot make writes durable, and bodyMemory the body bytes held in memory
// (idempotency.Middleware.BodyMemory). With shared, collectors another instance
// registered with reg are adopted (promreg.Register).
func newMetrics(reg prometheus.Registerer, shared bool, waiting func() int, notDurable func() bool, bodyMemory func() int64) (*metrics, error) {
	latency := prometheus.ExponentialBuckets(0.001, 2, 16) // 1ms … 33s
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "requests_total",
			Help: "Requests by route (its pattern) and idempotency outcome (executed, replayed, conflict, mismatch, missing-key, released, abandoned, …).",
		}, []string{"route", "outcome"}),
		requestDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "request_duration_seconds",
			Help: "Latency of whole requests through the gateway, by route and outcome.", Buckets: latency,
		}, []string{"route", "outcome"}),
		upstreamDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "upstream_duration_seconds",
			Help:    "Latency of upstream round trips (body included), by upstream (host:port) and status class (2xx…5xx) or failure (unreachable, timeout, failed, body-failed).",
			Buckets: latency,
		}, []string{"upstream", "result"}),
		storeDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "store_duration_seconds",
			Help:    "Latency of idempotency store calls, by operation (claim, extend, complete, release, abandon, get, delete_expired, ping).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 17), // 0.1ms … 6.5s
		}, []string{"operation"}),
		storeErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "store_errors_total",
			Help: "Idempotency store calls that failed (not counting not-found and lost-lease answers), by operation.",
		}, []string{"operation"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "keys_in_flight",
			Help: "Keys this gateway holds in progress while their requests are forwarded.",
		}),
		waiting: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "requests_waiting",
			Help: "Duplicates waiting for a key in progress to finish (conflict policy wait).",
		}, func() float64 { return float64(waiting()) }),
		notDurable: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "store_not_durable",
			Help: "1 while the store says it cannot make writes durable (a synchronous standby or the replicas asked for do not acknowledge them, or it may evict records): keyed requests are refused with 503 until it can.",
		}, func() float64 {
			if notDurable() {
				return 1
			}
			return 0
		}),
		bodyMemory: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "body_memory_bytes",
			Help: "Body bytes of keyed requests held in memory, both ways (requests, answers kept to be stored and sent, replays), against the ceiling Idempotency.MaxBodyMemory.",
		}, func() float64 { return float64(bodyMemory()) }),
	}
	if err := promreg.Register(reg, "gateway", shared, m.slots()...); err != nil {
		return nil, err
	}
	m.storeOps.make = func(op string) storeSeries {
		return storeSeries{m.storeDur.WithLabelValues(op), m.storeErrs.WithLabelValues(op)}
	}
	return m, nil
}

func (m *metrics) slots() []promreg.Slot {
	return []promreg.Slot{promreg.Field(&m.requests), promreg.Field(&m.requestDur), promreg.Field(&m.upstreamDur),
		promreg.Field(&m.storeDur), promreg.Field(&m.storeErrs), promreg.Field(&m.inFlight), promreg.Field(&m.waiting),
		promreg.Field(&m.notDurable), promreg.Field(&m.bodyMemory)}
}

// newRegistry is the default registry: the gateway's own, with the Go runtime and
// process collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// observeStore records one store call: the middleware's (Config.OnStoreCall), the
// janitor's and the readiness probe's. Not-found and lost-lease answers are answers, not
// errors.
func (m *metrics) observeStore(op string, took time.Duration, err error) {
	s := m.storeOps.of(op)
	s.dur.Observe(took.Seconds())
	if err != nil && !errors.Is(err, idempotency.ErrNotFound) && !errors.Is(err, idempotency.ErrLeaseLost) {
		s.errs.Inc()
	}
}

// timedJanitor times the janitor's sweeps.
type timedJanitor struct {
	j idempotency.Janitor
	m *metrics
}

func (t timedJanitor) DeleteExpired(ctx context.Context, limit int) (int, error) {
	start := time.Now()
	n, err := t.j.DeleteExpired(ctx, limit)
	t.m.observeStore("delete_expired", time.Since(start), err)
	return n, err
}
