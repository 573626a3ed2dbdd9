package sqlitestore_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
)

func open(t testing.TB, path string) *sqlitestore.Store {
	t.Helper()
	return openConfig(t, sqlitestore.Config{Path: path})
}

func openConfig(t testing.TB, cfg sqlitestore.Config) *sqlitestore.Store {
	t.Helper()
	s, err := sqlitestore.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	for _, b := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%t", b), func(t *testing.T) { conformance(t, b) })
	}
}

func conformance(t *testing.T, b bool) {
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T, clock func() time.Time) idempotency.Store {
			return openConfig(t, sqlitestore.Config{Path: filepath.Join(t.TempDir(), "idem.db"), Batch: b, Clock: clock})
		},
		Down: func(t *testing.T) idempotency.Store {
			s := openConfig(t, sqlitestore.Config{Path: filepath.Join(t.TempDir(), "idem.db"), Batch: b})
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}

// at returns a clock that always shows now.
func at(now time.Time) func() time.Time { return func() time.Time { return now } }

// claimReq is a claim of key with a one-minute lease and a one-day retention.
func claimReq(key string) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: 24 * time.Hour}
}

// claim claims key with claimReq.
func claim(t *testing.T, s idempotency.Store, key string) idempotency.ClaimResult {
	t.Helper()
	res, err := s.Claim(context.Background(), claimReq(key))
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestReopenKeepsRecordsAndTokens(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	now := time.UnixMilli(1_700_000_000_000)

	s, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: path, Clock: at(now)})
	if err != nil {
		t.Fatal(err)
	}
	done := claim(t, s, "done")
	if err := s.Complete(ctx, idempotency.Completion{Scope: "s", Key: "done", Token: done.Token,
		TTL: time.Hour, Response: idempotency.Response{Status: 201, Body: []byte("ok")}}); err != nil {
		t.Fatal(err)
	}
	gone := claim(t, s, "gone")
	if err := s.Delete(ctx, "s", "gone"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openConfig(t, sqlitestore.Config{Path: path, Clock: at(now)})
	rec, err := s.Get(ctx, "s", "done")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != idempotency.StateDone || rec.Response.Status != 201 || string(rec.Response.Body) != "ok" {
		t.Fatalf("after reopen: %+v %+v", rec, rec.Response)
	}
	// The token counter is persistent too: a key claimed after the restart never gets a
	// token the previous process handed out.
	if again := claim(t, s, "gone"); again.Token <= gone.Token {
		t.Fatalf("token after reopen %d, want > %d", again.Token, gone.Token)
	}
}

// TestMain lets the test binary act as a second process on a shared database file, and
// checks that no goroutine (a batch's, with Config.Batch) outlives the tests.
func TestMain(m *testing.M) {
	if path := os.Getenv("SQLITESTORE_CHILD_DB"); path != "" {
		child(path)
		return
	}
	goleak.VerifyTestMain(m)
}

var childNow = time.UnixMilli(1_700_000_000_000)

// child claims "k", claims and completes "done", reports "ready" and waits to be killed.
// Its standard input is a pipe its parent holds open: it reads it to the end, so a child
// whose parent died without killing it exits rather than lingering.
func child(path string) {
	ctx := context.Background()
	fail := func(err error) {
		fmt.Println("child:", err)
		os.Exit(1)
	}
	s, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: path, Clock: at(childNow)})
	if err != nil {
		fail(err)
	}
	if _, err := s.Claim(ctx, claimReq("k")); err != nil {
		fail(err)
	}
	res, err := s.Claim(ctx, claimReq("done"))
	if err != nil {
		fail(err)
	}
	if err := s.Complete(ctx, idempotency.Completion{Scope: "s", Key: "done", Token: res.Token,
		TTL: time.Hour, Response: idempotency.Response{Status: 201}}); err != nil {
		fail(err)
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(1)
}

// A second process sees the first one's claims while it runs, and its records survive
// when it is killed without closing anything.
func TestOtherProcessAndKill(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SQLITESTORE_CHILD_DB="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// The child waits on its standard input; the pipe stays open until the test ends.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close() })
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("child said %q, %v", line, err)
	}

	s := openConfig(t, sqlitestore.Config{Path: path, Clock: at(childNow)})
	if res := claim(t, s, "k"); res.Claimed {
		t.Fatalf("claimed a key the other process holds: %+v", res)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no checkpoint, no close
		t.Fatal(err)
	}
	_ = cmd.Wait()

	// Reopening recovers the WAL the killed process left; the clock is past the lease.
	s = openConfig(t, sqlitestore.Config{Path: path, Clock: at(childNow.Add(2 * time.Minute))})

	rec, err := s.Get(context.Background(), "s", "done")
	if err != nil || rec.State != idempotency.StateDone || rec.Response.Status != 201 {
		t.Fatalf("completed record after the kill: %+v, %v", rec, err)
	}
	old, err := s.Get(context.Background(), "s", "k")
	if err != nil {
		t.Fatal(err)
	}
	res := claim(t, s, "k")
	if !res.Claimed || !res.TookOver || res.Token <= old.Token {
		t.Fatalf("takeover of the killed process's key: %+v, old token %d", res, old.Token)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	notDB := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(notDB, []byte(strings.Repeat("not a database\n", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  sqlitestore.Config
		want string
	}{
		{"no path", sqlitestore.Config{}, "Path is required"},
		{"memory", sqlitestore.Config{Path: ":memory:"}, ":memory:"},
		{"missing directory", sqlitestore.Config{Path: filepath.Join(dir, "nope", "idem.db")}, filepath.Join(dir, "nope", "idem.db")},
		{"directory", sqlitestore.Config{Path: dir}, dir},
		{"not a database", sqlitestore.Config{Path: notDB}, "not a database"},
		{"bad table", sqlitestore.Config{Path: filepath.Join(dir, "a.db"), Table: "x; DROP TABLE y"}, "invalid Config.Table"},
		{"bad synchronous", sqlitestore.Config{Path: filepath.Join(dir, "c.db"), Synchronous: "OFF"}, "Synchronous"},
		{"negative timeout", sqlitestore.Config{Path: filepath.Join(dir, "b.db"), BusyTimeout: -time.Second}, "BusyTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := sqlitestore.Open(context.Background(), tc.cfg)
			if err == nil {
				_ = s.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.HasPrefix(err.Error(), "sqlitestore: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to mention %q", err, tc.want)
			}
		})
	}
}

// A path with URI metacharacters is a plain file name, not a DSN.
func TestOpenOddPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a %41?b#c")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "idem.db?mode=ro")
	s := open(t, path)
	claim(t, s, "k")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database not at the configured path: %v", err)
	}
}

func TestTwoStoresOneFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	now := time.UnixMilli(1_700_000_000_000)
	a := openConfig(t, sqlitestore.Config{Path: path, Clock: at(now)})
	b := openConfig(t, sqlitestore.Config{Path: path, Synchronous: "normal", Clock: at(now)})

	// Both race for the same keys: exactly one wins each, and tokens stay unique.
	const keys = 20
	var wins atomic.Int64
	errc := make(chan error, 2*keys)
	tokens := make(chan int64, 2*keys)
	for i := range keys {
		for _, s := range []*sqlitestore.Store{a, b} {
			go func() {
				res, err := s.Claim(ctx, claimReq(fmt.Sprint(i)))
				if res.Claimed {
					wins.Add(1)
					tokens <- res.Token
				}
				errc <- err
			}()
		}
	}
	for range 2 * keys {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if wins.Load() != keys {
		t.Fatalf("%d claims won on %d keys", wins.Load(), keys)
	}
	close(tokens)
	seen := map[int64]bool{}
	for tok := range tokens {
		if seen[tok] {
			t.Fatalf("token %d issued twice", tok)
		}
		seen[tok] = true
	}

	// A completion through one store is replayed through the other.
	res := claim(t, a, "x")
	if err := a.Complete(ctx, idempotency.Completion{Scope: "s", Key: "x", Token: res.Token,
		TTL: time.Hour, Response: idempotency.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
	if got := claim(t, b, "x"); got.Claimed || got.Existing.State != idempotency.StateDone {
		t.Fatalf("second store: %+v", got)
	}
}

// Two Stores on one file, each issuing tokens from a range it reserved: every token is
// larger than every token issued before it, by either, so that a takeover of a key the
// other Store held gets a larger token than its holder's, whether the Store read the
// record first (a key it met) or inserted first (one it did not); and a reservation in a
// transaction that did not commit (a lost claim) is never issued.
func TestTokensGrowAcrossStores(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	var now atomic.Int64
	now.Store(1_700_000_000_000)
	clock := func() time.Time { return time.UnixMilli(now.Load()) }
	a := openConfig(t, sqlitestore.Config{Path: path, Synchronous: "normal", Clock: clock})
	b := openConfig(t, sqlitestore.Config{Path: path, Synchronous: "normal", Clock: clock})

	var last int64
	issued := func(who string, res idempotency.ClaimResult, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if !res.Claimed {
			t.Fatalf("%s: claim lost: %+v", who, res)
		}
		if res.Token <= last {
			t.Fatalf("%s: token %d issued after %d", who, res.Token, last)
		}
		last = res.Token
	}
	// Each takes the key over from the other once its lease has run out.
	for i := range 6 {
		s, who := a, "a"
		if i%2 == 1 {
			s, who = b, "b"
		}
		res, err := s.Claim(ctx, claimReq("x"))
		issued(who+" takes x over", res, err)
		if i > 0 && !res.TookOver {
			t.Fatalf("%s: claim of x after its lease: %+v, want a takeover", who, res)
		}
		res, err = s.Claim(ctx, claimReq(fmt.Sprint("new-", i)))
		issued(who+" claims a new key", res, err)
		now.Add(time.Minute.Milliseconds())
	}
	// a takes over a key b claimed last, one a never met, while b's reservation has
	// overtaken a's.
	res, err := a.Claim(ctx, claimReq("new-5"))
	issued("a takes over b's key", res, err)
	if !res.TookOver {
		t.Fatalf("a: claim of b's key after its lease: %+v, want a takeover", res)
	}

	// a's claim of a key b holds loses, and rolls back what it reserved. b then issues
	// more tokens than a reservation holds, and a after it.
	res, err = b.Claim(ctx, claimReq("held"))
	issued("b claims held", res, err)
	if res := claim(t, a, "held"); res.Claimed {
		t.Fatalf("a claimed a key b holds: %+v", res)
	}
	for i := range 1100 {
		res, err := b.Claim(ctx, claimReq(fmt.Sprint("b-", i)))
		issued("b", res, err)
	}
	res, err = a.Claim(ctx, claimReq("after"))
	issued("a, after b's claims", res, err)
}

// The schema lands under the configured name, and the file is in WAL mode.
func TestCustomTableAndWAL(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	s := openConfig(t, sqlitestore.Config{Path: path, Table: "order"}) // a reserved word
	claim(t, s, "k")
	if err := s.Migrate(ctx); err != nil { // idempotent
		t.Fatal(err)
	}
	db := openDB(t, path)
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM "order"`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("count = %d, %v", n, err)
	}
	var mode string
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode = %q, %v", mode, err)
	}
}

func openDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// The transaction-mode contract, on a store sharing the application's database (New),
// limited to one connection as New advises for concurrent writers.
func TestTx(t *testing.T) {
	for _, b := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%t", b), func(t *testing.T) {
			idempotencytest.RunTx(t, idempotencytest.TxHarness{New: func(t *testing.T, clock func() time.Time) idempotencytest.TxStore {
				return txStore(t, b, clock)
			}})
		})
	}
}

// txStore returns a store made with New on a fresh database that also holds a business
// table, payments, whose rows WithTx writes through the transaction.
func txStore(t *testing.T, batch bool, clock func() time.Time) idempotencytest.TxStore {
	t.Helper()
	ctx := context.Background()
	db := openDB(t, filepath.Join(t.TempDir(), "app.db"))
	db.SetMaxOpenConns(1)
	s, err := sqlitestore.New(ctx, db, sqlitestore.Config{Batch: batch, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (name TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return idempotencytest.TxStore{
		Store: s,
		WithTx: func(ctx context.Context, work idempotencytest.TxWork) (idempotency.Response, error) {
			return s.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) (idempotency.Response, error) {
				return work(ctx, func(row string) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO payments (name) VALUES (?)`, row)
					return err
				})
			})
		},
		Rows: func(t *testing.T, row string) int {
			t.Helper()
			var n int
			if err := db.QueryRowContext(ctx, `SELECT count(*) FROM payments WHERE name = ?`, row).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

func BenchmarkClaimComplete(b *testing.B) {
	for _, sync := range []string{"FULL", "NORMAL"} {
		b.Run(sync, func(b *testing.B) {
			benchmarkClaimComplete(b, openConfig(b, sqlitestore.Config{Path: filepath.Join(b.TempDir(), "idem.db"), Synchronous: sync}))
		})
	}
}

func benchmarkClaimComplete(b *testing.B, s *sqlitestore.Store) {
	ctx := context.Background()
	var next atomic.Int64
	resp := idempotency.Response{Status: 200, Body: []byte(`{"id":"pay_123","status":"ok"}`),
		Header: map[string][]string{"Content-Type": {"application/json"}}}
	b.SetParallelism(8) // many requests per CPU, as a server has
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := fmt.Sprint(next.Add(1))
			res, err := s.Claim(ctx, claimReq(key))
			if err != nil || !res.Claimed {
				b.Fatal(res, err)
			}
			if err := s.Complete(ctx, idempotency.Completion{Scope: "s", Key: key, Token: res.Token,
				TTL: time.Hour, Response: resp}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkClaimReplay(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "idem.db"))
	ctx := context.Background()
	req := claimReq("k")
	res, err := s.Claim(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, idempotency.Completion{Scope: "s", Key: "k", Token: res.Token,
		TTL: time.Hour, Response: idempotency.Response{Status: 200, Body: make([]byte, 1024)}}); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(8) // many requests per CPU, as a server has
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if res, err := s.Claim(ctx, req); err != nil || res.Claimed {
				b.Fatal(res, err)
			}
		}
	})
}
