package sim

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: synctest already refuses a
// bubble that ends with goroutines blocked in it, and the conformance suite runs the
// handle outside any bubble.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
