package history_test

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/console/history"
)

// A History over a registry: in the console it is the gateway's (gateway.Config.Registerer),
// sampled by Run; here, counters named as the gateway's and two samples by hand.
func Example() {
	reg := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "retrysafe_gateway_requests_total", Help: "Requests by route and outcome.",
	}, []string{"route", "outcome"})
	reg.MustRegister(requests)

	now := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
	h := history.New(reg, history.Options{Now: func() time.Time { return now }})
	_ = h.Sample() // the baseline

	requests.WithLabelValues("POST /payments", "executed").Add(12)
	requests.WithLabelValues("POST /payments", "replayed").Add(3)
	requests.WithLabelValues("POST /payments", "conflict").Add(1)
	now = now.Add(10 * time.Second)
	_ = h.Sample()

	for _, r := range h.Outcomes() {
		fmt.Println(r.Route)
		for _, c := range history.Classes() {
			if n := r.Totals[c]; n > 0 {
				fmt.Printf("  %-14s %d\n", c, n)
			}
		}
		svg := history.Chart(history.OutcomeChart(r)) // template.HTML, for a page
		fmt.Println(len(svg) > 0)
	}
	// Output:
	// POST /payments
	//   executed       12
	//   replayed       3
	//   409 in flight  1
	// true
}
