package bench

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/binary"
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
	run := newKeys(b, s, 32)
	run(0, 20_000)
	b.ResetTimer()
	cpu0, io0 := processCPU(b), selfIO(b)
	run(1<<40, b.N) // keys apart from the table's first 20,000
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

// BenchmarkSQLiteWALFrames says which of the table's B-trees the WAL frames of a new
// key go to: the pages each claim and completion dirty, which SQLite writes to the WAL,
// checksums, syncs and later checkpoints. It runs the store's writes as
// BenchmarkSQLiteNewKey does (batched, synchronous=FULL, on a table of 20,000 records)
// with the given number of goroutines, with checkpoints off on the one connection, and
// reads the WAL's frame headers after b.N keys; dbstat names the B-tree of each page.
//
//	frames/key          every frame (a page written by a commit)
//	table/key           the table's rows (rowid order: new rows at its right edge)
//	key-index/key       the (scope, key) primary key's index: each new key's entry lands
//	                    on a leaf of its own, the keys being random
//	expiry-index/key    the janitor's index on expires_at
//	header/key          page 1, whose header holds the file's size in pages: written by
//	                    every commit that grows the file
//	keys/commit         claims (and their completions) per commit
//
//	cd bench && go test -run '^$' -bench BenchmarkSQLiteWALFrames -benchtime 3000x
func BenchmarkSQLiteWALFrames(b *testing.B) {
	for _, clients := range []int{8, 32} {
		b.Run("clients="+strconv.Itoa(clients), func(b *testing.B) { walFrames(b, clients) })
	}
}

func walFrames(b *testing.B, clients int) {
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "idem.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"+
		"&_pragma=synchronous(FULL)&_pragma=wal_autocheckpoint(0)&_txlock=immediate")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	db.SetMaxOpenConns(1) // the one connection whose checkpoints are off
	s, err := sqlitestore.New(ctx, db, sqlitestore.Config{Batch: true})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	run := newKeys(b, s, clients)
	run(0, 20_000)
	if _, err := db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	run(1<<40, b.N)
	b.StopTimer()

	wal, err := os.ReadFile(path + "-wal")
	if err != nil {
		b.Fatal(err)
	}
	owner := map[uint32]string{}
	rows, err := db.QueryContext(ctx, `SELECT name, pageno FROM dbstat`)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var name string
		var page uint32
		if err := rows.Scan(&name, &page); err != nil {
			b.Fatal(err)
		}
		owner[page] = name
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	// The WAL: a 32-byte header (the page size at bytes 8–11), then frames of a 24-byte
	// header (the page number at 0–3, the file's size in pages after a commit's last
	// frame at 4–7, else 0) and a page.
	if len(wal) < 32 {
		b.Fatalf("WAL of %d bytes", len(wal))
	}
	pageSize := int(binary.BigEndian.Uint32(wal[8:12]))
	by := map[string]int{}
	frames, commits := 0, 0
	for off := 32; off+24+pageSize <= len(wal); off += 24 + pageSize {
		frames++
		if binary.BigEndian.Uint32(wal[off+4:off+8]) != 0 {
			commits++
		}
		by[owner[binary.BigEndian.Uint32(wal[off:off+4])]]++
	}
	n := float64(b.N)
	b.ReportMetric(float64(frames)/n, "frames/key")
	b.ReportMetric(float64(by["retrysafe_idempotency"])/n, "table/key")
	b.ReportMetric(float64(by["sqlite_autoindex_retrysafe_idempotency_1"])/n, "key-index/key")
	b.ReportMetric(float64(by["retrysafe_idempotency_expires_at"])/n, "expiry-index/key")
	b.ReportMetric(float64(by["sqlite_schema"])/n, "header/key")
	b.ReportMetric(n/float64(commits), "keys/commit")
}

// newKeys returns a function that claims n new keys, those after the from-th, with
// clients goroutines, and completes each with a payment's answer: a gateway's new keys
// as the store sees them.
func newKeys(b *testing.B, s *sqlitestore.Store, clients int) func(from int64, n int) {
	ctx := context.Background()
	body := []byte(`{"id":"pay_7f3a9c2e1b8d4f6a","amount":1250,"currency":"EUR","status":"succeeded","created_at":"2026-12-06T04:00:00Z"}`)
	header := http.Header{"Content-Type": {"application/json"}, "Date": {"Sun, 06 Dec 2026 04:00:00 GMT"},
		"Content-Length": {strconv.Itoa(len(body))}}
	return func(from int64, n int) {
		var next atomic.Int64
		next.Store(from)
		last := from + int64(n)
		var failed atomic.Pointer[error]
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				for i := next.Add(1); i <= last && failed.Load() == nil; i = next.Add(1) {
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
						failed.CompareAndSwap(nil, &err)
					}
				}
			})
		}
		wg.Wait()
		if err := failed.Load(); err != nil {
			b.Fatal(*err)
		}
	}
}
