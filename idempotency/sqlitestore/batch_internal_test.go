package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
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

// A write transaction of many claims and completions decides every call as it is
// decided alone. The same calls on two copies of the same records, in one transaction
// and one by one, give the same results and leave the same records: new keys, a
// replay, a request in flight, the claimer's own record, a takeover, an expired record
// replaced; completions made, one with another's token, one of a missing record, one
// sent again.
func TestBatchDecidesAsAlone(t *testing.T) {
	ctx := context.Background()
	now := time.UnixMilli(1_700_000_000_000).UTC()
	var clock atomic.Int64
	clock.Store(now.UnixMilli())
	setup := func() (*Store, map[string]int64) {
		s, err := Open(ctx, Config{Path: filepath.Join(t.TempDir(), "b.db"), Batch: true,
			Clock: func() time.Time { return time.UnixMilli(clock.Load()) }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		tokens := map[string]int64{}
		for _, c := range []struct {
			key      string
			ttl      time.Duration
			complete bool
		}{
			{"done", time.Hour, true}, {"running", time.Hour, false}, {"mine", time.Hour, false},
			{"stale", time.Hour, false}, {"expired", time.Minute + time.Second, true},
			{"c-ok1", time.Hour, false}, {"c-ok2", time.Hour, false}, {"c-other", time.Hour, false},
			{"c-again", time.Hour, true},
		} {
			res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: c.key, Fingerprint: "fp", ID: c.key + "-id",
				Lease: time.Minute, TTL: c.ttl})
			if err != nil || !res.Claimed {
				t.Fatalf("claim %s: %+v, %v", c.key, res, err)
			}
			tokens[c.key] = res.Token
			if c.complete {
				if err := s.Complete(ctx, idempotency.Completion{Scope: "s", Key: c.key, Token: res.Token, TTL: c.ttl,
					Response: idempotency.Response{Status: 201, Body: []byte(c.key)}}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := s.Extend(ctx, "s", "running", tokens["running"], 10*time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Extend(ctx, "s", "mine", tokens["mine"], 10*time.Minute); err != nil {
			t.Fatal(err)
		}
		return s, tokens
	}
	batched, tokens := setup()
	clock.Store(now.UnixMilli())
	alone, _ := setup()
	clock.Store(now.UnixMilli())
	viaRaw, _ := setup()
	clock.Store(now.Add(2 * time.Minute).UnixMilli()) // the leases of stale and the c-* keys have run out, expired has expired

	ops := func() []*writeOp {
		claim := func(key, fp, id string) *writeOp {
			return &writeOp{absent: true, claim: &idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: fp, ID: id,
				Lease: time.Minute, TTL: time.Hour, Route: "r"}}
		}
		complete := func(key string, token int64) *writeOp {
			return &writeOp{complete: &idempotency.Completion{Scope: "s", Key: key, Token: token, TTL: time.Hour,
				Response: idempotency.Response{Status: 200, Header: map[string][]string{"X-Key": {key}}, Body: []byte(key)}}}
		}
		return []*writeOp{
			claim("new1", "fp", "a"), claim("new2", "fp", "b"), claim("done", "fp", "c"), claim("running", "other", "d"),
			claim("mine", "fp", "mine-id"), claim("stale", "fp", "e"), claim("expired", "other", "f"), claim("new3", "fp", "g"),
			complete("c-ok1", tokens["c-ok1"]), complete("c-ok2", tokens["c-ok2"]), complete("c-other", tokens["c-ok1"]),
			complete("c-gone", tokens["c-ok2"]), complete("c-again", tokens["c-again"]),
		}
	}
	inBatch, oneByOne, tried := ops(), ops(), ops()
	if err := batched.writeBatch(ctx, inBatch); err != nil {
		t.Fatal(err)
	}
	for _, op := range oneByOne {
		alone.writeOne(ctx, op)
	}
	// The driver-level path gives up on this batch (it holds claims of keys that have
	// records, and completions that change nothing), writes nothing, and leaves it to
	// database/sql's.
	if err := viaRaw.writeRaw(ctx, tried); !errors.Is(err, errNotRaw) {
		t.Fatalf("writeRaw of a batch it does not decide: %v, want errNotRaw", err)
	}
	if _, err := viaRaw.Get(ctx, "s", "new1"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("new1 after a batch given up: %v, want not found", err)
	}
	tried = ops()
	viaRaw.writeOps(ctx, tried)
	// Tokens are compared apart: a transaction of several claims reserves one for each,
	// and those of the claims that lose are never issued (tokens may skip values), while
	// a claim alone that loses rolls its reservation back.
	kind := func(err error) error {
		for _, e := range []error{idempotency.ErrRecordGone, idempotency.ErrLeaseLost} {
			if errors.Is(err, e) {
				return e
			}
		}
		return err
	}
	issued := map[int64]string{}
	for i, op := range inBatch {
		want := oneByOne[i]
		var name string
		if op.claim != nil {
			name = op.claim.Key
		} else {
			name = "completion of " + op.complete.Key
		}
		if kind(op.err) != kind(want.err) {
			t.Errorf("%s: error %v, alone %v", name, op.err, want.err)
		}
		got, alone := op.res, want.res
		if got.Claimed && alone.Claimed && name != "mine" {
			if got.Token <= tokens["c-again"] || issued[got.Token] != "" {
				t.Errorf("%s: token %d, want a new one above %d (issued: %v)", name, got.Token, tokens["c-again"], issued)
			}
			issued[got.Token] = name
			got.Token, alone.Token = 0, 0
		}
		if !reflect.DeepEqual(got, alone) {
			t.Errorf("%s: %+v, alone %+v", name, op.res, want.res)
		}
		viaTried := tried[i]
		if kind(viaTried.err) != kind(want.err) || viaTried.res.Claimed != want.res.Claimed ||
			viaTried.res.TookOver != want.res.TookOver || !reflect.DeepEqual(viaTried.res.Existing, want.res.Existing) {
			t.Errorf("%s through writeOps: %+v, %v; alone %+v, %v", name, viaTried.res, viaTried.err, want.res, want.err)
		}
	}
	for _, key := range []string{"new1", "new2", "new3", "done", "running", "mine", "stale", "expired", "c-ok1", "c-ok2", "c-other", "c-gone", "c-again"} {
		got, gotErr := batched.Get(ctx, "s", key)
		want, wantErr := alone.Get(ctx, "s", key)
		if got != nil && want != nil && issued[got.Token] == key {
			got.Token, want.Token = 0, 0
		}
		if kind(gotErr) != kind(wantErr) || !reflect.DeepEqual(got, want) {
			t.Errorf("record %s: %+v, %v; alone %+v, %v", key, got, gotErr, want, wantErr)
		}
	}
	// What the calls above are, beside being the same.
	if r := inBatch[0].res; !r.Claimed {
		t.Errorf("new1: %+v", r)
	}
	if !errors.Is(inBatch[10].err, idempotency.ErrLeaseLost) || !errors.Is(inBatch[11].err, idempotency.ErrRecordGone) || inBatch[12].err != nil {
		t.Errorf("completions with another's token, of a missing record, sent again: %v, %v, %v",
			inBatch[10].err, inBatch[11].err, inBatch[12].err)
	}
	if r := inBatch[5].res; !r.Claimed || !r.TookOver {
		t.Errorf("stale: %+v, want taken over", r)
	}
	if r := inBatch[4].res; !r.Claimed || r.Token != tokens["mine"] {
		t.Errorf("mine: %+v, want its own token %d granted again", r, tokens["mine"])
	}
}

// A batch of new keys' claims and of completions that find their claims is decided
// through the driver (writeRaw), and gives the results and leaves the records that
// each call alone does through database/sql.
func TestRawBatchDecidesAsAlone(t *testing.T) {
	ctx := context.Background()
	now := time.UnixMilli(1_700_000_000_000).UTC()
	open := func() (*Store, map[string]int64) {
		s, err := Open(ctx, Config{Path: filepath.Join(t.TempDir(), "r.db"), Batch: true, Clock: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		tokens := map[string]int64{}
		for _, key := range []string{"c1", "c2"} {
			res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
			if err != nil || !res.Claimed {
				t.Fatalf("claim %s: %+v, %v", key, res, err)
			}
			tokens[key] = res.Token
		}
		return s, tokens
	}
	raw, tokens := open()
	alone, _ := open()
	ops := func() []*writeOp {
		claim := func(key, route string) *writeOp {
			return &writeOp{absent: true, claim: &idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "fp-" + key,
				ID: key + "-id", Lease: time.Minute, TTL: 2 * time.Hour, Route: route}}
		}
		return []*writeOp{
			claim("new1", "POST /a"), claim("new2", ""),
			{complete: &idempotency.Completion{Scope: "s", Key: "c1", Token: tokens["c1"], TTL: 3 * time.Hour,
				Response: idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
					Trailer: http.Header{"X-Sum": {"1"}}, Body: []byte(`{"id":1}`)}}},
			{complete: &idempotency.Completion{Scope: "s", Key: "c2", Token: tokens["c2"], TTL: time.Hour,
				Response: idempotency.Response{Status: 500, Body: []byte("part"), BodyOmitted: true}}},
		}
	}
	viaRaw, oneByOne := ops(), ops()
	if err := raw.writeRaw(ctx, viaRaw); err != nil {
		t.Fatalf("writeRaw: %v", err)
	}
	for _, op := range oneByOne {
		alone.writeOne(ctx, op)
	}
	for i, op := range viaRaw {
		want := oneByOne[i]
		if op.err != nil || want.err != nil {
			t.Fatalf("op %d: %v, alone %v", i, op.err, want.err)
		}
		if op.claim != nil && (!op.res.Claimed || op.res.Token <= tokens["c2"]) {
			t.Errorf("claim of %s: %+v, want granted with a token above %d", op.claim.Key, op.res, tokens["c2"])
		}
		got := op.res
		got.Token, want.res.Token = 0, 0
		if !reflect.DeepEqual(got, want.res) {
			t.Errorf("op %d: %+v, alone %+v", i, op.res, want.res)
		}
	}
	for _, key := range []string{"new1", "new2", "c1", "c2"} {
		got, err := raw.Get(ctx, "s", key)
		if err != nil {
			t.Fatalf("record %s: %v", key, err)
		}
		want, err := alone.Get(ctx, "s", key)
		if err != nil {
			t.Fatalf("record %s alone: %v", key, err)
		}
		if key == "new1" || key == "new2" {
			got.Token, want.Token = 0, 0
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("record %s: %+v, alone %+v", key, got, want)
		}
	}
	// The claim's ID was written: the same claim made again is granted again, under
	// the token it was granted.
	res, err := raw.Claim(ctx, *viaRaw[0].claim)
	if err != nil || !res.Claimed || res.Token != viaRaw[0].res.Token {
		t.Errorf("new1's claim again: %+v, %v; want granted again under token %d", res, err, viaRaw[0].res.Token)
	}
	if raw.raw == nil {
		t.Error("no statements prepared on the driver's connection")
	}
	if err := raw.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if raw.raw != nil {
		t.Error("Close left the driver-level statements open")
	}
}

// A driver-level batch whose callers' context has ended by BEGIN writes nothing, keeps
// its connection, and leaves it out of any transaction: the next batch on it commits.
func TestRawBatchAfterBeginCut(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Config{Path: filepath.Join(t.TempDir(), "r.db"), Batch: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	claim := func(key string) []*writeOp {
		return []*writeOp{{absent: true, claim: &idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "fp",
			Lease: time.Minute, TTL: time.Hour}}}
	}
	conn, err := s.write.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	cut, cancel := context.WithCancel(ctx)
	cancel()
	var firstErr, cutErr, nextErr error
	var kept bool
	if err := conn.Raw(func(dc any) error {
		firstErr = s.rawBatch(ctx, dc, claim("first"))
		stmts := s.raw
		cutErr = s.rawBatch(cut, dc, claim("cut"))
		kept = s.raw == stmts && stmts != nil // the connection was not given up
		nextErr = s.rawBatch(ctx, dc, claim("next"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if firstErr != nil {
		t.Fatalf("first batch: %v", firstErr)
	}
	if !kept {
		t.Error("a batch cut before BEGIN gave its connection up")
	}
	if !errors.Is(cutErr, context.Canceled) {
		t.Errorf("batch under an ended context: %v, want context.Canceled", cutErr)
	}
	if nextErr != nil {
		t.Errorf("the next batch on the connection: %v", nextErr)
	}
	_ = conn.Close()
	if _, err := s.Get(ctx, "s", "cut"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("cut: %v, want not found", err)
	}
	if rec, err := s.Get(ctx, "s", "next"); err != nil || rec.State != idempotency.StateInProgress {
		t.Errorf("next: %+v, %v; want claimed", rec, err)
	}
}

// invalidConn is a driver connection that reports itself no longer valid.
type invalidConn struct{}

func (invalidConn) IsValid() bool { return false }

// The driver-level statements of a connection database/sql will discard are closed
// while it is still held, and prepared again on the next one.
func TestRawStatementsLeaveAnInvalidConnection(t *testing.T) {
	s := &Store{}
	valid := &rawStmts{conn: "another connection"}
	s.raw = valid
	s.keepRawIfValid(valid.conn)
	if s.raw != valid {
		t.Fatal("statements of a connection that is not a driver.Validator were dropped")
	}
	s.raw = &rawStmts{conn: invalidConn{}}
	s.keepRawIfValid(invalidConn{})
	if s.raw != nil {
		t.Fatal("statements of an invalid connection kept")
	}
}
