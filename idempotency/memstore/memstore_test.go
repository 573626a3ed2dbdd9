package memstore_test

import (
	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

func TestConformance(t *testing.T) {
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T) idempotency.Store { return memstore.New() },
		Down: func(t *testing.T) idempotency.Store {
			s := memstore.New()
			_ = s.Close()
			return s
		},
	})
}
