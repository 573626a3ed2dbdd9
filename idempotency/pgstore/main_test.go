package pgstore_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The package starts goroutines (batches run in goroutines of their own): none may
// outlive the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
