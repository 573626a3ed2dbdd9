package history_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/retrysafe/retrysafe/console/history"
)

// benchOutcomes are eight outcome values, one of each class.
var benchOutcomes = [...]string{"executed", "replayed", "conflict", "mismatch", "missing-key", "store-error", "released", "pass-through"}

// BenchmarkSample: one sample of 20 routes × 8 outcomes and 8 store operations, every
// series changed since the last one, in steady state (the window full).
func BenchmarkSample(b *testing.B) {
	for _, withRuntime := range []bool{false, true} {
		name := "gateway-metrics"
		if withRuntime {
			name = "with-go-and-process-collectors" // as the gateway's default registry
		}
		b.Run(name, func(b *testing.B) {
			m := newGatewayMetrics(b, nil)
			if withRuntime {
				m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			}
			var counters []prometheus.Counter
			for r := range 20 {
				for _, o := range benchOutcomes {
					counters = append(counters, m.requests.WithLabelValues("POST /route"+strconv.Itoa(r)+"/", o))
				}
			}
			var ops []prometheus.Observer
			for _, op := range []string{"claim", "extend", "complete", "release", "abandon", "get", "delete_expired", "ping"} {
				ops = append(ops, m.storeDur.WithLabelValues(op))
				m.storeErr.WithLabelValues(op)
			}
			now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
			h := history.New(m.reg, history.Options{Now: func() time.Time { return now }})
			step := func() {
				for _, c := range counters {
					c.Inc()
				}
				for _, o := range ops {
					o.Observe(0.003)
				}
				now = now.Add(history.DefaultInterval)
			}
			for range 400 { // more than an hour of samples: the window is full
				step()
				if err := h.Sample(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				step()
				b.StartTimer()
				if err := h.Sample(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRead: what a page costs: the outcomes of 20 routes over a full hour, their
// charts, and the store latencies.
func BenchmarkRead(b *testing.B) {
	m := newGatewayMetrics(b, nil)
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	h := history.New(m.reg, history.Options{Now: func() time.Time { return now }})
	for range 400 {
		for r := range 20 {
			for _, o := range benchOutcomes {
				m.add("POST /route"+strconv.Itoa(r)+"/", o, 1)
			}
		}
		m.storeDur.WithLabelValues("claim").Observe(0.002)
		now = now.Add(history.DefaultInterval)
		if err := h.Sample(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, o := range h.Outcomes() {
			_ = history.Chart(history.OutcomeChart(o))
		}
		_ = h.StoreLatency()
	}
}

// BenchmarkGather: the registry's part of BenchmarkSample, Gather alone.
func BenchmarkGather(b *testing.B) {
	m := newGatewayMetrics(b, nil)
	for r := range 20 {
		for _, o := range benchOutcomes {
			m.add("POST /route"+strconv.Itoa(r)+"/", o, 1)
		}
	}
	for _, op := range []string{"claim", "extend", "complete", "release", "abandon", "get", "delete_expired", "ping"} {
		m.storeDur.WithLabelValues(op).Observe(1)
		m.storeErr.WithLabelValues(op)
	}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = m.reg.Gather()
	}
}
