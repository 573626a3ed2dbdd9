package memstore_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// The memory store says, as its one warning, that nothing survives the process.
func TestInspect(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	found, err := s.Inspect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 || found[0].Level != idempotency.FindingWarn || found[0].Check != memstore.CheckPersistence ||
		!strings.Contains(found[0].Detail, "nothing survives the process") {
		t.Errorf("findings %+v, want one warning that nothing survives the process", found)
	}
	_ = s.Close()
	if _, err := s.Inspect(t.Context()); !errors.Is(err, idempotency.ErrClosed) {
		t.Errorf("Inspect on a closed store: %v, want ErrClosed", err)
	}
}
