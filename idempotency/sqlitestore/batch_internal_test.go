package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// With Config.Batch, concurrent claims and completions share write transactions, and
// each still gets its own outcome.
func TestBatchSharesTransactions(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Config{Path: filepath.Join(t.TempDir(), "b.db"), Batch: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	var mu sync.Mutex
	var sizes []int
	run := s.writes.Run
	s.writes.Run = func(ops []*writeOp) {
		mu.Lock()
		sizes = append(sizes, len(ops))
		mu.Unlock()
		run(ops)
	}
	together := func(n int, f func(i int)) {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { <-start; f(i) })
		}
		close(start)
		wg.Wait()
	}
	const n = 64
	res := make([]idempotency.ClaimResult, n+8)
	errs := make([]error, n+8)
	together(n+8, func(i int) {
		key := fmt.Sprint("k", i)
		if i >= n {
			key = "dup" // 8 claims of one key
		}
		res[i], errs[i] = s.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "f",
			Lease: time.Minute, TTL: time.Hour, Route: "POST /" + key})
	})
	tokens := map[int64]bool{}
	won := 0
	for i := range n + 8 {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		if i < n && (!res[i].Claimed || tokens[res[i].Token]) {
			t.Fatalf("claim %d: %+v: want claimed with a token of its own", i, res[i])
		}
		tokens[res[i].Token] = true
		if i >= n && res[i].Claimed {
			won++
		}
	}
	if won != 1 {
		t.Errorf("8 concurrent claims of one key: %d won", won)
	}
	claimBatches := len(sizes)
	together(n, func(i int) {
		c := idempotency.Completion{Scope: "s", Key: fmt.Sprint("k", i), Token: res[i].Token,
			Response: idempotency.Response{Status: 200 + i}, TTL: time.Hour}
		if i == 0 {
			c.Token++ // not its token
		}
		errs[i] = s.Complete(ctx, c)
	})
	if !errors.Is(errs[0], idempotency.ErrLeaseLost) {
		t.Errorf("completion with another token: %v, want ErrLeaseLost", errs[0])
	}
	for i := 1; i < n; i++ {
		if errs[i] != nil {
			t.Fatalf("completion %d: %v", i, errs[i])
		}
		rec, err := s.Get(ctx, "s", fmt.Sprint("k", i))
		if err != nil || rec.State != idempotency.StateDone || rec.Response.Status != 200+i || rec.Route != fmt.Sprint("POST /k", i) {
			t.Fatalf("record %d: %+v, %v", i, rec, err)
		}
	}
	if rec, err := s.Get(ctx, "s", "k0"); err != nil || rec.State != idempotency.StateInProgress {
		t.Errorf("k0 after a refused completion: %+v, %v", rec, err)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("write transactions: %d for %d claims, %d for %d completions", claimBatches, n+8, len(sizes)-claimBatches, n)
	if claimBatches > (n+8)/2 || len(sizes)-claimBatches > n/2 {
		t.Errorf("write transactions %v: batching should need far fewer than one per call", sizes)
	}
}

// A batch that waits for another process's write lock gives up when its callers'
// deadlines have passed, and writes nothing: its statements run under a context that
// nothing cancels, but its BEGIN, which is what waits, does not.
func TestBatchGivesUpWaitingForTheLock(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "b.db")
	s, err := Open(ctx, Config{Path: path, Batch: true, BusyTimeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ran := make(chan struct{}, 1)
	run := s.writes.Run
	s.writes.Run = func(ops []*writeOp) {
		run(ops)
		ran <- struct{}{}
	}
	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	lock, err := other.BeginTx(ctx, nil) // another process's writer holds the write lock
	if err != nil {
		t.Fatal(err)
	}
	claimed := make(chan error, 1)
	go func() {
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := s.Claim(short, idempotency.ClaimRequest{Key: "gone", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		claimed <- err
	}()
	select {
	case err := <-claimed:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("claim behind the lock: %v, want DeadlineExceeded", err)
		}
	case <-time.After(time.Minute): // a bound on a hang, not a margin
		_ = lock.Rollback()
		t.Fatal("the claim waited for the lock past its deadline (a minute on, and BusyTimeout is 10)")
	}
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	<-ran
	if rec, err := s.Get(ctx, "", "gone"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("the given-up claim was written: %v %+v", err, rec)
	}
}
