package history

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMemoryBound: however often Sample is called, at most Window/Interval samples are
// kept, each with at most one entry per series.
func TestMemoryBound(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricRequests, Help: "r"}, []string{"route", "outcome"})
	dur := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metricStoreDur, Help: "d"}, []string{"operation"})
	reg.MustRegister(reqs, dur)
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	h := New(reg, Options{Interval: 10 * time.Second, Window: 10 * time.Minute, Now: func() time.Time { return now }})
	if h.limit != 60 {
		t.Fatalf("limit %d, want 60", h.limit)
	}
	for i := range 1000 {
		now = now.Add(time.Duration(i%7) * time.Second) // often far faster than Interval
		for r := range 5 {
			reqs.WithLabelValues(string(rune('a'+r)), "executed").Inc()
		}
		dur.WithLabelValues("claim").Observe(0.01)
		if err := h.Sample(); err != nil {
			t.Fatal(err)
		}
		if len(h.samples) > h.limit {
			t.Fatalf("after %d samples: %d kept, limit %d", i+1, len(h.samples), h.limit)
		}
	}
	for _, s := range h.samples {
		if len(s.req) > 5 || len(s.op) > 1 {
			t.Fatalf("a sample holds %d request and %d store entries, want at most 5 and 1", len(s.req), len(s.op))
		}
	}
	var claims uint64
	for _, l := range h.StoreLatency() {
		claims += l.Count
	}
	if claims == 0 {
		t.Fatal("no claims in the window")
	}
}

func TestQuantileEdges(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		bounds []float64
		cum    []uint64
		count  uint64
		q      float64
		want   Quantile
	}{
		{"no observations", []float64{1}, []uint64{0}, 0, 0.5, Quantile{Empty: true}},
		{"no finite bucket", nil, nil, 3, 0.5, Quantile{Above: true}},
		{"all above", []float64{1, 2}, []uint64{0, 0}, 4, 0.5, Quantile{Seconds: 2, Above: true}},
		{"first bucket from zero", []float64{2, 4}, []uint64{4, 4}, 4, 0.5, Quantile{Seconds: 1}},
		{"negative first bound", []float64{-1, 4}, []uint64{4, 4}, 4, 0.5, Quantile{Seconds: -1}},
		{"skips empty buckets", []float64{1, 2, 3}, []uint64{0, 0, 10}, 10, 0.5, Quantile{Seconds: 2.5}},
		{"exact top of a bucket", []float64{1, 2}, []uint64{5, 10}, 10, 0.5, Quantile{Seconds: 1}},
		{"mismatched lengths", []float64{1, 2}, []uint64{5}, 10, 0.5, Quantile{Empty: true}},
	} {
		if got := quantile(c.q, c.bounds, c.cum, c.count); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
