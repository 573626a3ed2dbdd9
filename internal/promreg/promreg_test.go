package promreg_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/internal/promreg"
)

type metrics struct {
	a *prometheus.CounterVec
	b prometheus.Gauge
}

func newMetrics() *metrics {
	return &metrics{
		a: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "a_total", Help: "A."}, []string{"q"}),
		b: prometheus.NewGauge(prometheus.GaugeOpts{Name: "b", Help: "B."}),
	}
}

func (m *metrics) slots() []promreg.Slot {
	return []promreg.Slot{promreg.Field(&m.a), promreg.Field(&m.b)}
}

func TestAllOrNone(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "b", Help: "B."}))
	m := newMetrics()
	err := promreg.Register(reg, "pkg", false, m.slots()...)
	if err == nil || !strings.HasPrefix(err.Error(), "pkg: registering metrics: ") {
		t.Fatalf("Register = %v, want a pkg error", err)
	}
	if err := reg.Register(m.a); err != nil {
		t.Errorf("the collector registered before the failure is still registered: %v", err)
	}
}

func TestShared(t *testing.T) {
	reg := prometheus.NewRegistry()
	first, second := newMetrics(), newMetrics()
	if err := promreg.Register(reg, "pkg", true, first.slots()...); err != nil {
		t.Fatal(err)
	}
	if err := promreg.Register(reg, "pkg", true, second.slots()...); err != nil {
		t.Fatal(err)
	}
	if second.a != first.a || second.b != first.b {
		t.Error("the second instance did not adopt the registered collectors")
	}
	if err := promreg.Register(reg, "pkg", false, newMetrics().slots()...); err == nil {
		t.Error("Register without shared accepted collectors already registered")
	}
}

func TestUnregister(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics()
	if err := promreg.Register(reg, "pkg", false, m.slots()...); err != nil {
		t.Fatal(err)
	}
	promreg.Unregister(reg, m.slots()...)
	if err := promreg.Register(reg, "pkg", false, newMetrics().slots()...); err != nil {
		t.Errorf("Register after Unregister = %v", err)
	}
}
