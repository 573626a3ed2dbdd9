// Package idempotencytest is the conformance suite every idempotency.Store runs.
package idempotencytest

import (
	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
)

// Harness tells the suite how to make stores.
type Harness struct {
	// New returns a new, empty store isolated from every other store New returns (its
	// own schema, file or key prefix). Register cleanup with t.Cleanup.
	New func(t *testing.T) idempotency.Store
	// Down returns a store whose backend is unreachable or closed, so every call fails.
	// Nil skips the outage cases.
	Down func(t *testing.T) idempotency.Store
}

// Run runs the conformance suite against the stores h makes.
func Run(t *testing.T, h Harness) {
	t.Helper()
	_ = h
}
