package sim_test

import (
	"context"
	"fmt"

	"github.com/retrysafe/retrysafe/cmd/retrysafe/internal/sim"
)

// Three layers retrying three times each, over a service that always fails: 27 calls
// reach it per request, unless each layer has a retry budget.
func ExampleRunLayers() {
	res, err := sim.RunLayers(context.Background(), sim.LayersConfig{Failure: []float64{1}, Requests: 1000, Seed: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	row := res.Rows[0]
	fmt.Printf("no budget: %v calls per request at A, B, C\n", row.NoBudget.Calls)
	fmt.Printf("budgets:   %.2f calls per request at C\n", row.Budget.Bottom())
	// Output:
	// no budget: [3 9 27] calls per request at A, B, C
	// budgets:   1.01 calls per request at C
}

// The blog's study at 100 clients, full jitter against plain exponential backoff.
func ExampleRun() {
	res, err := sim.Run(context.Background(), sim.Config{
		Clients: []int{100}, Runs: 10, Seed: 1,
		Strategies: []sim.Strategy{sim.Exponential, sim.FullJitter},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	exp, _ := res.Point(100, sim.Exponential)
	full, _ := res.Point(100, sim.FullJitter)
	fmt.Printf("full jitter: %.1f× less work, %.0f× sooner\n", exp.Calls/full.Calls, float64(exp.Time)/float64(full.Time))
	// Output:
	// full jitter: 2.3× less work, 13× sooner
}
