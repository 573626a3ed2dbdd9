package redeliver

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are a Consumer's Prometheus collectors. A nil *metrics records nothing.
type metrics struct {
	receivedC     *prometheus.CounterVec   // queue
	succeededC    *prometheus.CounterVec   // queue
	retriedC      *prometheus.CounterVec   // queue, error_class
	deadC         *prometheus.CounterVec   // queue, error_class
	releasedC     *prometheus.CounterVec   // queue
	settleErrC    *prometheus.CounterVec   // queue, op
	handlerSecond *prometheus.HistogramVec // queue
}

const namespace, subsystem = "retrysafe", "redeliver"

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		receivedC: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "received_total",
			Help: "Deliveries received, by queue.",
		}, []string{"queue"}),
		succeededC: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "succeeded_total",
			Help: "Messages handled successfully, by queue.",
		}, []string{"queue"}),
		retriedC: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "retried_total",
			Help: "Messages scheduled for another attempt, by queue and error class.",
		}, []string{"queue", "error_class"}),
		deadC: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "dead_lettered_total",
			Help: "Messages moved to the dead-letter queue, by queue and error class.",
		}, []string{"queue", "error_class"}),
		releasedC: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "released_total",
			Help: "Messages handed back unprocessed at shutdown, by queue.",
		}, []string{"queue"}),
		settleErrC: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "settle_errors_total",
			Help: "Acks, retries, dead-letterings and releases that failed (the broker redelivers), by queue and operation.",
		}, []string{"queue", "op"}),
		handlerSecond: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "handler_duration_seconds",
			Help: "Time spent in the handler, by queue.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}, []string{"queue"}),
	}
	// Several consumers may share a registry: reuse the collectors already there.
	var err error
	if m.receivedC, err = register(reg, m.receivedC); err != nil {
		return nil, err
	}
	if m.succeededC, err = register(reg, m.succeededC); err != nil {
		return nil, err
	}
	if m.retriedC, err = register(reg, m.retriedC); err != nil {
		return nil, err
	}
	if m.deadC, err = register(reg, m.deadC); err != nil {
		return nil, err
	}
	if m.releasedC, err = register(reg, m.releasedC); err != nil {
		return nil, err
	}
	if m.settleErrC, err = register(reg, m.settleErrC); err != nil {
		return nil, err
	}
	if m.handlerSecond, err = register(reg, m.handlerSecond); err != nil {
		return nil, err
	}
	return m, nil
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		var zero C
		return zero, fmt.Errorf("redeliver: registering metrics: %w", err)
	}
	return c, nil
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
