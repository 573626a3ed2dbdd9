package gateway

import (
	"context"
	"path/filepath"
	"testing"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
)

// The traced store keeps exactly the optional interfaces the middleware asks for:
// Immediate (no store deadline) and Pinger (the store probe).
func TestTracedStoreKeepsInterfaces(t *testing.T) {
	t.Parallel()
	sq, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: filepath.Join(t.TempDir(), "s.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sq.Close() })
	mem := memstore.New()
	tr := newTracing(noop.NewTracerProvider(), mem)
	for _, c := range []struct {
		name            string
		store           idempotency.Store
		immediate, ping bool
	}{
		{"memory", mem, true, true},
		{"sqlite", sq, false, true},
		{"plain", struct{ idempotency.Store }{mem}, false, false},
		{"immediate", immediateOnly{mem}, true, false},
	} {
		w := tr.wrapStore(c.store)
		_, imm := w.(idempotency.Immediate)
		_, ping := w.(idempotency.Pinger)
		if imm != c.immediate || ping != c.ping {
			t.Errorf("%s: wrapped store Immediate %v Pinger %v, want %v %v", c.name, imm, ping, c.immediate, c.ping)
		}
	}
	if got := storeName(sq); got != "sqlite" {
		t.Errorf("storeName(sqlite) = %q", got)
	}
}

// immediateOnly is the memory store without its Pinger.
type immediateOnly struct{ idempotency.Store }

func (immediateOnly) Immediate() {}
