package redeliver

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/internal/promreg"
)

// metrics are a Consumer's Prometheus collectors. A nil *metrics records nothing.
type metrics struct {
	receivedC     *prometheus.CounterVec   // queue
	succeededC    *prometheus.CounterVec   // queue
	duplicateC    *prometheus.CounterVec   // queue
	retriedC      *prometheus.CounterVec   // queue, error_class
	deadC         *prometheus.CounterVec   // queue, error_class
	releasedC     *prometheus.CounterVec   // queue
	settleErrC    *prometheus.CounterVec   // queue, op
	handlerSecond *prometheus.HistogramVec // queue
}

const namespace, subsystem = "retrysafe", "redeliver"

// newMetrics returns the collectors registered with reg, or nil (no metrics) when reg is
// nil. Several Consumers may share a registry: the collectors already there are used.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: name, Help: help,
		}, labels)
	}
	m := &metrics{
		receivedC:  counter("received_total", "Deliveries received, by queue.", "queue"),
		succeededC: counter("succeeded_total", "Messages handled successfully, by queue.", "queue"),
		duplicateC: counter("duplicates_total",
			"Deliveries of messages the inbox had recorded, acknowledged without running the handler, by queue.", "queue"),
		retriedC: counter("retried_total",
			"Messages scheduled for another attempt, by queue and error class.", "queue", "error_class"),
		deadC: counter("dead_lettered_total",
			"Messages moved to the dead-letter queue, by queue and error class.", "queue", "error_class"),
		releasedC: counter("released_total", "Messages handed back unprocessed at shutdown, by queue.", "queue"),
		settleErrC: counter("settle_errors_total",
			"Acks, retries, dead-letterings and releases that failed (the broker redelivers), by queue and operation.",
			"queue", "op"),
		handlerSecond: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "handler_duration_seconds",
			Help: "Time spent in the handler, by queue.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}, []string{"queue"}),
	}
	err := promreg.Register(reg, "redeliver", true,
		promreg.Field(&m.receivedC), promreg.Field(&m.succeededC), promreg.Field(&m.duplicateC), promreg.Field(&m.retriedC),
		promreg.Field(&m.deadC), promreg.Field(&m.releasedC), promreg.Field(&m.settleErrC),
		promreg.Field(&m.handlerSecond))
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) received(q string) {
	if m != nil {
		m.receivedC.WithLabelValues(q).Inc()
	}
}

func (m *metrics) succeeded(q string) {
	if m != nil {
		m.succeededC.WithLabelValues(q).Inc()
	}
}

func (m *metrics) duplicated(q string) {
	if m != nil {
		m.duplicateC.WithLabelValues(q).Inc()
	}
}

func (m *metrics) retried(q string, c Class) {
	if m != nil {
		m.retriedC.WithLabelValues(q, string(c)).Inc()
	}
}

func (m *metrics) deadLettered(q string, c Class) {
	if m != nil {
		m.deadC.WithLabelValues(q, string(c)).Inc()
	}
}

func (m *metrics) released(q string) {
	if m != nil {
		m.releasedC.WithLabelValues(q).Inc()
	}
}

func (m *metrics) settleFailed(q, op string) {
	if m != nil {
		m.settleErrC.WithLabelValues(q, op).Inc()
	}
}

func (m *metrics) observe(q string, d time.Duration) {
	if m != nil {
		m.handlerSecond.WithLabelValues(q).Observe(d.Seconds())
	}
}
