package memstore_test

import (
	"context"
	"errors"
	"fmt"
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

// Inspect says what the store's setup means for the promise that a keyed request runs
// once; every store implements it (idempotency.Inspector).
func ExampleStore_Inspect() {
	s := memstore.New()
	defer s.Close()
	found, err := s.Inspect(context.Background())
	if err != nil {
		panic(err)
	}
	for _, f := range found {
		fmt.Printf("%s %s: %s\n", f.Level, f.Check, f.Detail)
	}
	// Output:
	// warn memory.persistence: nothing survives the process: after a restart every key would run again, and a retry that reaches another process runs again
}
