package memstore_test

import (
	"time"

	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

func TestConformance(t *testing.T) {
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T, clock func() time.Time) idempotency.Store { return memstore.NewWithClock(clock) },
		Down: func(t *testing.T) idempotency.Store {
			s := memstore.New()
			_ = s.Close()
			return s
		},
	})
}
