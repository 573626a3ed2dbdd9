package demo_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/retrysafe/retrysafe/cmd/retrysafe/internal/demo"
)

// Run the demo for two seconds with a fixed seed; `retrysafe demo` does the same with
// the defaults and exits 1 when the result is not OK.
func ExampleRun() {
	res, err := demo.Run(context.Background(), demo.Config{Duration: 2 * time.Second, Seed: 42}, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if !res.OK() {
		os.Exit(1)
	}
}
