package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
)

// BenchmarkSQLiteNewKey is what a new key costs the SQLite store alone, batched as the
// gateway runs it (synchronous=FULL): 32 goroutines, each claiming a new key and
// completing it with a payment's answer, on a table that already holds 20,000
// records. An op is one claim and its completion.
//
//	cpu-µs/op      the process's CPU (getrusage), the store's goroutines and the
//	               runtime's included
//	writes/op      write system calls (pwrite: SQLite writes a WAL frame's header and
//	               its page in two), from /proc/self/io: exact, where CPU is noisy
//	written-B/op   the bytes they wrote: WAL frames and checkpoints
func BenchmarkSQLiteNewKey(b *testing.B) {
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: filepath.Join(b.TempDir(), "idem.db"), Batch: true})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	body := []byte(`{"id":"pay_7f3a9c2e1b8d4f6a","amount":1250,"currency":"EUR","status":"succeeded","created_at":"2026-12-06T04:00:00Z"}`)
	header := http.Header{"Content-Type": {"application/json"}, "Date": {"Sun, 06 Dec 2026 04:00:00 GMT"},
		"Content-Length": {strconv.Itoa(len(body))}}
	var next atomic.Int64
	run := func(last int64) {
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for range 32 {
			wg.Go(func() {
				for i := next.Add(1); i <= last; i = next.Add(1) {
					key := fmt.Sprintf("%08x-4e1f-4a2b-9c3d-%012x", i*2654435761%(1<<32), i)
					res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "POST /payments", Key: key,
						Fingerprint: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
						ID:          key, Lease: time.Minute, TTL: 24 * time.Hour})
					if err == nil && !res.Claimed {
						err = fmt.Errorf("claim of the new key %s not granted: %+v", key, res)
					}
					if err == nil {
						err = s.Complete(ctx, idempotency.Completion{Scope: "POST /payments", Key: key, Token: res.Token,
							TTL: 24 * time.Hour, Response: idempotency.Response{Status: 201, Header: header, Body: body}})
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	run(20_000)
	next.Store(1 << 40) // keys apart from the table's first 20,000
	b.ResetTimer()
	cpu0, io0 := processCPU(b), selfIO(b)
	run(1<<40 + int64(b.N))
	cpu, io := processCPU(b)-cpu0, selfIO(b)
	b.StopTimer()
	b.ReportMetric(float64(cpu)/1e3/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(io["syscw"]-io0["syscw"])/float64(b.N), "writes/op")
	b.ReportMetric(float64(io["wchar"]-io0["wchar"])/float64(b.N), "written-B/op")
}

// selfIO returns /proc/self/io's counters (Linux): wchar, syscw and the others.
func selfIO(b *testing.B) map[string]int64 {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		b.Skipf("no /proc/self/io: %v", err)
	}
	defer func() { _ = f.Close() }()
	counters := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			b.Fatalf("/proc/self/io: %q: %v", sc.Text(), err)
		}
		counters[name] = n
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	return counters
}
