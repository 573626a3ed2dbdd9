package bench

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
)

// BenchmarkGatewayStoresInProcess is BenchmarkGatewayInProcess from 32 concurrent
// clients on the memory store and on SQLite (the embedded default: a file in the test's
// temporary directory, synchronous=FULL, batching on, as the gateway opens it): what
// the store costs the gateway's process per request, with no network on either side.
// cpu-ns/op is the process's CPU per request, the SQLite fsyncs' system time included.
//
//	cd bench && go test -run '^$' -bench BenchmarkGatewayStoresInProcess -benchmem -cpuprofile cpu.out
func BenchmarkGatewayStoresInProcess(b *testing.B) {
	u, _ := url.Parse("http://upstream.invalid")
	stores := []struct {
		name string
		open func(b *testing.B) idempotency.Store
	}{
		{"memory", func(*testing.B) idempotency.Store { return memstore.New() }},
		{"sqlite", func(b *testing.B) idempotency.Store {
			st, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: filepath.Join(b.TempDir(), "gw.db"), Batch: true})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = st.Close() })
			return st
		}},
	}
	for _, s := range stores {
		for _, c := range []string{"new-key", "replay"} {
			b.Run(s.name+"/"+c, func(b *testing.B) {
				gw, err := gateway.New(gateway.Config{Upstream: u, Logger: slog.New(slog.DiscardHandler), Transport: cannedUpstream{},
					Idempotency: idempotency.Config{Store: s.open(b)}})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
				key := func(i int64) string { return "k-" + strconv.FormatInt(i, 10) }
				if c == "replay" {
					key = func(int64) string { return "same" }
				}
				serveKeyedParallel(b, gw, key)
			})
		}
	}
}

// serveKeyedParallel is serveKeyed from 32 goroutines, each with its own writer and
// client address (its own scope's keys never collide with another's).
func serveKeyedParallel(b *testing.B, h http.Handler, key func(int64) string) {
	var n atomic.Int64
	serve := func(w *reusedWriter, i int64) int {
		r, err := http.NewRequest(http.MethodPost, "http://gateway.invalid/payments", strings.NewReader(paymentBody))
		if err != nil {
			b.Fatal(err)
		}
		r.RemoteAddr = "192.0.2.1:1234"
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", key(i))
		w.reset()
		h.ServeHTTP(w, r)
		return w.status
	}
	serve(&reusedWriter{h: make(http.Header)}, n.Add(1))
	b.ReportAllocs()
	b.SetParallelism(16)
	cpu0 := processCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := &reusedWriter{h: make(http.Header)}
		for pb.Next() {
			if code := serve(w, n.Add(1)); code != http.StatusCreated {
				b.Errorf("status %d", code)
				return
			}
		}
	})
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
}
