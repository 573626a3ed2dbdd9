package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/retrysafe/retrysafe/idempotency"
)

// metrics are the gateway's Prometheus collectors.
type metrics struct {
	requests    *prometheus.CounterVec   // outcome
	requestDur  *prometheus.HistogramVec // outcome
	upstreamDur *prometheus.HistogramVec // result
	storeDur    *prometheus.HistogramVec // operation
	storeErrs   *prometheus.CounterVec   // operation
	inFlight    prometheus.Gauge
}

const namespace, subsystem = "retrysafe", "gateway"

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	latency := prometheus.ExponentialBuckets(0.001, 2, 16) // 1ms … 33s
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "requests_total",
			Help: "Requests by idempotency outcome (executed, replayed, conflict, mismatch, missing-key, released, abandoned, …).",
		}, []string{"outcome"}),
		requestDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "request_duration_seconds",
			Help: "Latency of whole requests through the gateway, by outcome.", Buckets: latency,
		}, []string{"outcome"}),
		upstreamDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "upstream_duration_seconds",
			Help:    "Latency of upstream round trips (body included), by status class (2xx…5xx) or failure (unreachable, timeout, failed, body-failed).",
			Buckets: latency,
		}, []string{"result"}),
		storeDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "store_duration_seconds",
			Help:    "Latency of idempotency store calls, by operation (claim, extend, complete, release, get, delete, delete_expired, list, ping).",
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
	}
	for i, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			for _, r := range m.collectors()[:i] {
				reg.Unregister(r)
			}
			return nil, fmt.Errorf("gateway: registering metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.requestDur, m.upstreamDur, m.storeDur, m.storeErrs, m.inFlight}
}

func (m *metrics) unregister(reg prometheus.Registerer) {
	for _, c := range m.collectors() {
		reg.Unregister(c)
	}
}

// newRegistry is the default registry: the gateway's own, with the Go runtime and
// process collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// instrument returns s wrapped so that every call is timed in m. The wrapper implements
// exactly the optional interfaces (Janitor, Lister, Pinger) that s implements.
func instrument(s idempotency.Store, m *metrics) idempotency.Store {
	base := &timedStore{s: s, m: m}
	j, isJ := s.(idempotency.Janitor)
	l, isL := s.(idempotency.Lister)
	p, isP := s.(idempotency.Pinger)
	tj := &timedJanitor{j: j, m: m}
	tl := &timedLister{l: l, m: m}
	tp := &timedPinger{p: p, m: m}
	switch {
	case isJ && isL && isP:
		return struct {
			*timedStore
			*timedJanitor
			*timedLister
			*timedPinger
		}{base, tj, tl, tp}
	case isJ && isL:
		return struct {
			*timedStore
			*timedJanitor
			*timedLister
		}{base, tj, tl}
	case isJ && isP:
		return struct {
			*timedStore
			*timedJanitor
			*timedPinger
		}{base, tj, tp}
	case isL && isP:
		return struct {
			*timedStore
			*timedLister
			*timedPinger
		}{base, tl, tp}
	case isJ:
		return struct {
			*timedStore
			*timedJanitor
		}{base, tj}
	case isL:
		return struct {
			*timedStore
			*timedLister
		}{base, tl}
	case isP:
		return struct {
			*timedStore
			*timedPinger
		}{base, tp}
	}
	return base
}

// observe records one store call that started at start.
func (m *metrics) observe(op string, start time.Time, err error) {
	m.storeDur.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil && !errors.Is(err, idempotency.ErrNotFound) && !errors.Is(err, idempotency.ErrLeaseLost) {
		m.storeErrs.WithLabelValues(op).Inc()
	}
}

type timedStore struct {
	s idempotency.Store
	m *metrics
}

func (t *timedStore) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	start := time.Now()
	res, err := t.s.Claim(ctx, req)
	t.m.observe("claim", start, err)
	return res, err
}

func (t *timedStore) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error {
	start := time.Now()
	err := t.s.Extend(ctx, scope, key, token, lease)
	t.m.observe("extend", start, err)
	return err
}

func (t *timedStore) Abandon(ctx context.Context, scope, key string, token int64) error {
	start := time.Now()
	err := t.s.Abandon(ctx, scope, key, token)
	t.m.observe("abandon", start, err)
	return err
}

func (t *timedStore) Complete(ctx context.Context, c idempotency.Completion) error {
	start := time.Now()
	err := t.s.Complete(ctx, c)
	t.m.observe("complete", start, err)
	return err
}

func (t *timedStore) Release(ctx context.Context, scope, key string, token int64) error {
	start := time.Now()
	err := t.s.Release(ctx, scope, key, token)
	t.m.observe("release", start, err)
	return err
}

func (t *timedStore) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	start := time.Now()
	rec, err := t.s.Get(ctx, scope, key)
	t.m.observe("get", start, err)
	return rec, err
}

func (t *timedStore) Delete(ctx context.Context, scope, key string) error {
	start := time.Now()
	err := t.s.Delete(ctx, scope, key)
	t.m.observe("delete", start, err)
	return err
}

type timedJanitor struct {
	j idempotency.Janitor
	m *metrics
}

func (t *timedJanitor) DeleteExpired(ctx context.Context, limit int) (int, error) {
	start := time.Now()
	n, err := t.j.DeleteExpired(ctx, limit)
	t.m.observe("delete_expired", start, err)
	return n, err
}

type timedLister struct {
	l idempotency.Lister
	m *metrics
}

func (t *timedLister) List(ctx context.Context, f idempotency.ListFilter) (idempotency.ListPage, error) {
	start := time.Now()
	p, err := t.l.List(ctx, f)
	t.m.observe("list", start, err)
	return p, err
}

type timedPinger struct {
	p idempotency.Pinger
	m *metrics
}

func (t *timedPinger) Ping(ctx context.Context) error {
	start := time.Now()
	err := t.p.Ping(ctx)
	t.m.observe("ping", start, err)
	return err
}
