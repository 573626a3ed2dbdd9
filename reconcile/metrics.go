package reconcile

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/internal/promreg"
)

// metrics are a reconciler's Prometheus collectors; a nil *metrics records nothing.
type metrics struct {
	passes      *prometheus.CounterVec // result: ok, failed, skipped
	found       *prometheus.CounterVec // kind
	drift       *prometheus.GaugeVec   // kind
	repaired    *prometheus.CounterVec // kind
	failed      *prometheus.CounterVec // kind
	duration    prometheus.Histogram
	lastSuccess prometheus.Gauge
}

const namespace, subsystem = "retrysafe", "reconcile"

// newMetrics returns the collectors, labelled reconciler=name, registered with reg, or
// nil (no metrics) when reg is nil.
func newMetrics(reg prometheus.Registerer, name string) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	labels := prometheus.Labels{"reconciler": name}
	opts := func(metric, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: namespace, Subsystem: subsystem, Name: metric, Help: help, ConstLabels: labels}
	}
	m := &metrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts(opts("passes_total",
			"Reconciliation passes by result: ok (converged or reported), failed (listing, repairs, lost lease), skipped (another replica holds the lease).")),
			[]string{"result"}),
		found: prometheus.NewCounterVec(prometheus.CounterOpts(opts("drift_found_total",
			"Drifted items found, by kind (missing, extra, different), counted once per pass that saw them.")),
			[]string{"kind"}),
		drift: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("drift_items",
			"Drifted items found by the last pass this replica ran, by kind.")),
			[]string{"kind"}),
		repaired: prometheus.NewCounterVec(prometheus.CounterOpts(opts("repaired_total",
			"Drifted items repaired, by kind.")),
			[]string{"kind"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts(opts("repair_failed_total",
			"Drifted items whose repair failed after its retries, by kind.")),
			[]string{"kind"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "pass_duration_seconds", ConstLabels: labels,
			Help:    "Duration of the passes this replica ran (not skipped ones), listing and repairs included.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16), // 10ms … 5.5min
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts(opts("last_success_timestamp_seconds",
			"Unix time of the end of the last pass of this replica that succeeded."))),
	}
	err := promreg.Register(reg, "reconcile", false,
		promreg.Field(&m.passes), promreg.Field(&m.found), promreg.Field(&m.drift), promreg.Field(&m.repaired),
		promreg.Field(&m.failed), promreg.Field(&m.duration), promreg.Field(&m.lastSuccess))
	if err != nil {
		return nil, err
	}
	// Export every series from the start, so that rates and alerts see zeros.
	for _, r := range []string{"ok", "failed", "skipped"} {
		m.passes.WithLabelValues(r)
	}
	for _, k := range kinds {
		m.found.WithLabelValues(k.String())
		m.drift.WithLabelValues(k.String())
		m.repaired.WithLabelValues(k.String())
		m.failed.WithLabelValues(k.String())
	}
	return m, nil
}

func (m *metrics) skipped() {
	if m != nil {
		m.passes.WithLabelValues("skipped").Inc()
	}
}

// noLease records a pass that failed to acquire the lease.
func (m *metrics) noLease() {
	if m != nil {
		m.passes.WithLabelValues("failed").Inc()
	}
}

// pass records a pass that ran; counts is nil when the pass failed before its diff.
func (m *metrics) pass(counts map[Kind]int, d time.Duration, end time.Time, err error) {
	if m == nil {
		return
	}
	for _, k := range kinds {
		if counts == nil {
			break
		}
		m.found.WithLabelValues(k.String()).Add(float64(counts[k]))
		m.drift.WithLabelValues(k.String()).Set(float64(counts[k]))
	}
	m.duration.Observe(d.Seconds())
	if err != nil {
		m.passes.WithLabelValues("failed").Inc()
		return
	}
	m.passes.WithLabelValues("ok").Inc()
	m.lastSuccess.Set(float64(end.UnixNano()) / 1e9)
}

func (m *metrics) repair(k Kind, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.failed.WithLabelValues(k.String()).Inc()
		return
	}
	m.repaired.WithLabelValues(k.String()).Inc()
}
