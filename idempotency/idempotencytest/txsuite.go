package idempotencytest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// TxHarness tells RunTx how to make a store with a transaction mode: a WithTx that
// commits a handler's business write and the completion of its claimed key in one
// transaction, or neither.
type TxHarness struct {
	// New returns a new, empty store isolated from every other store New returns, whose
	// lease and expiry decisions read the time from clock (nil: the store's own clock),
	// with a business table of its own in the database the store's transactions write
	// to. Register cleanup with t.Cleanup.
	New func(t *testing.T, clock func() time.Time) TxStore
}

// TxStore is a store and its transaction mode, as TxHarness.New makes them.
type TxStore struct {
	Store idempotency.Store
	// WithTx runs work through the store's WithTx and returns what it returns: in one
	// transaction, work's business writes and, when ctx carries an idempotency.Claim,
	// the completion of the claimed key with work's response. The write function given
	// to work adds one row, named row, to the business table in that transaction, on the
	// context work was given. The table must take a name twice (no unique constraint),
	// so that work done twice shows as two rows rather than as an error.
	WithTx func(ctx context.Context, work TxWork) (idempotency.Response, error)
	// Rows returns how many committed rows named row the business table holds.
	Rows func(t *testing.T, row string) int
}

// TxWork is a handler's work in transaction mode: write adds a row to the business
// table within the transaction, and the response is what the claimed key is completed
// with.
type TxWork func(ctx context.Context, write func(row string) error) (idempotency.Response, error)

// txTTL is the retention the claims of RunTx carry: not the claim requests' ttl, so
// that a record's expiry shows which of the two its completion used.
const txTTL = 2 * time.Hour

// RunTx runs the transaction-mode contract against the stores h makes: a commit stores
// the handler's response with its business write, once; a handler error or a lost
// lease commits neither and leaves the key to the middleware, which releases it so that
// a retry executes again; a replay returns the stored response without running the
// handler again.
func RunTx(t *testing.T, h TxHarness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("idempotencytest: TxHarness.New is nil")
	}
	cases := []struct {
		name string
		fn   func(t *testing.T, s TxStore, c *Clock)
	}{
		{"Commit", testTxCommit},
		{"HandlerError", testTxHandlerError},
		{"TakenOver", testTxTakenOver},
		{"Deleted", testTxDeleted},
		{"CompletedTwice", testTxCompletedTwice},
		{"ClientLeaves", testTxClientLeaves},
		{"WithoutClaim", testTxWithoutClaim},
		{"MiddlewareReplay", testTxMiddlewareReplay},
		{"MiddlewareRollback", testTxMiddlewareRollback},
		{"MiddlewareTakeover", testTxMiddlewareTakeover},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clock := NewClock()
			c.fn(t, txNew(t, h, clock.Now), clock)
		})
	}
	t.Run("StoreClock", func(t *testing.T) {
		t.Parallel()
		testTxStoreClock(t, txNew(t, h, nil))
	})
}

func txNew(t *testing.T, h TxHarness, clock func() time.Time) TxStore {
	t.Helper()
	s := h.New(t, clock)
	if s.Store == nil || s.WithTx == nil || s.Rows == nil {
		t.Fatal("idempotencytest: TxHarness.New returned a TxStore without Store, WithTx or Rows")
	}
	return s
}

// txScope has bytes that a text column or a string literal would mangle.
const txScope = "s\\x41\x00\xff"

// txResponse is what the handlers of RunTx answer: header and trailer bytes that are not
// UTF-8 included, which the transaction's completion must keep as they are.
func txResponse(body string) idempotency.Response {
	return idempotency.Response{Status: http.StatusCreated,
		Header:  http.Header{"Content-Type": {"application/json"}, "X-Raw": {"\xff\x00"}, "Link": {"</a>", "</b>"}},
		Trailer: http.Header{"X-Sum": {"\x80"}},
		Body:    []byte(body)}
}

// txClaim claims key in txScope and returns a context carrying the claim, as the
// middleware's request context does.
func txClaim(t *testing.T, s idempotency.Store, key string) (context.Context, *idempotency.Claim) {
	t.Helper()
	tok := mustClaim(t, s, req(txScope, key, "fp"))
	c := idempotency.NewClaim(txScope, key, "fp", tok, txTTL)
	return idempotency.NewContext(context.Background(), c), c
}

// txBook is work that writes row and answers resp.
func txBook(row string, resp idempotency.Response) TxWork {
	return func(ctx context.Context, write func(string) error) (idempotency.Response, error) {
		if err := write(row); err != nil {
			return idempotency.Response{}, err
		}
		return resp, nil
	}
}

// txMarked reports whether the claim was marked completed (or its response stored):
// after a commit the middleware must not complete the key again.
func txMarked(c *idempotency.Claim) bool {
	select {
	case <-c.Stored():
		return true
	default:
		return false
	}
}

func txRows(t *testing.T, s TxStore, row string, want int, what string) {
	t.Helper()
	if got := s.Rows(t, row); got != want {
		t.Errorf("%s: %d business rows %q, want %d", what, got, row, want)
	}
}

// testTxCommit: the business write and the completion commit together. The record is
// done with the handler's response, byte for byte, kept for the claim's TTL from the
// completion on the store's clock; there is one business row; the claim is marked
// completed; a claim of the key replays the response.
func testTxCommit(t *testing.T, s TxStore, c *Clock) {
	ctx, claim := txClaim(t, s.Store, "k")
	c.Advance(time.Minute) // the completion's instant, not the claim's, starts the retention
	want := txResponse(`{"id":1}`)
	got, err := s.WithTx(ctx, txBook("k", want))
	if err != nil {
		t.Fatalf("WithTx: %v", err)
	}
	sameResponse(t, &got, want)
	rec := mustGet(t, s.Store, txScope, "k")
	if rec.State != idempotency.StateDone || rec.Token != claim.Token {
		t.Errorf("record %+v, want done with token %d", rec, claim.Token)
	}
	sameResponse(t, rec.Response, want)
	sameTime(t, "ExpiresAt", rec.ExpiresAt, c.Now().Add(txTTL))
	txRows(t, s, "k", 1, "after the commit")
	if !txMarked(claim) {
		t.Error("the claim is not marked completed: the middleware would complete the key again")
	}
	replay := mustNotClaim(t, s.Store, req(txScope, "k", "fp"))
	if replay.State != idempotency.StateDone {
		t.Errorf("claim after the commit: %+v, want the done record", replay)
	}
	sameResponse(t, replay.Response, want)
}

// testTxStoreClock: on the store's own clock, the retention runs from the completion as
// the store reads the time (on this machine, near the process clock).
func testTxStoreClock(t *testing.T, s TxStore) {
	ctx, _ := txClaim(t, s.Store, "k")
	before := time.Now()
	if _, err := s.WithTx(ctx, txBook("k", txResponse("ok"))); err != nil {
		t.Fatalf("WithTx: %v", err)
	}
	after := time.Now()
	rec := mustGet(t, s.Store, txScope, "k")
	if rec.State != idempotency.StateDone ||
		rec.ExpiresAt.Before(before.Add(txTTL-time.Second)) || rec.ExpiresAt.After(after.Add(txTTL+time.Second)) {
		t.Errorf("record %+v; want done, expiring about %v", rec, before.Add(txTTL))
	}
	txRows(t, s, "k", 1, "after the commit")
}

// testTxHandlerError: a handler that fails after its business write rolls it back, and
// WithTx returns the handler's error. WithTx leaves the record as it is (in progress,
// the claim's): releasing the key is the middleware's, once the handler returns.
func testTxHandlerError(t *testing.T, s TxStore, _ *Clock) {
	ctx, claim := txClaim(t, s.Store, "k")
	boom := errors.New("boom")
	_, err := s.WithTx(ctx, func(ctx context.Context, write func(string) error) (idempotency.Response, error) {
		if err := write("k"); err != nil {
			return idempotency.Response{}, err
		}
		return txResponse("not done"), boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("WithTx error %v, want the handler's %v", err, boom)
	}
	txRows(t, s, "k", 0, "after the handler failed")
	if rec := mustGet(t, s.Store, txScope, "k"); rec.State != idempotency.StateInProgress || rec.Token != claim.Token {
		t.Errorf("record %+v, want still in progress with token %d", rec, claim.Token)
	}
	if txMarked(claim) {
		t.Error("the claim is marked completed after a rollback")
	}
}

// testTxTakenOver: an owner whose lease ran out and whose key another request took over
// does not commit its business write: the completion finds the record no longer its
// own and the transaction rolls back. The new owner's work commits, once.
func testTxTakenOver(t *testing.T, s TxStore, c *Clock) {
	stale, old := txClaim(t, s.Store, "k")
	c.Advance(lease + time.Millisecond)
	res, err := s.Store.Claim(context.Background(), req(txScope, "k", "fp"))
	if err != nil || !res.Claimed || !res.TookOver {
		t.Fatalf("takeover: %+v, %v", res, err)
	}
	if _, err := s.WithTx(stale, txBook("k", txResponse("stale"))); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("WithTx of the stale owner: error %v, want ErrLeaseLost", err)
	}
	txRows(t, s, "k", 0, "after the stale owner's transaction")
	if rec := mustGet(t, s.Store, txScope, "k"); rec.State != idempotency.StateInProgress || rec.Token != res.Token {
		t.Errorf("record %+v, want the new owner's (token %d), in progress", rec, res.Token)
	}
	if txMarked(old) {
		t.Error("the stale claim is marked completed")
	}

	owner := idempotency.NewClaim(txScope, "k", "fp", res.Token, txTTL)
	want := txResponse("new owner")
	if _, err := s.WithTx(idempotency.NewContext(context.Background(), owner), txBook("k", want)); err != nil {
		t.Fatalf("WithTx of the new owner: %v", err)
	}
	txRows(t, s, "k", 1, "after the new owner's commit")
	sameResponse(t, mustGet(t, s.Store, txScope, "k").Response, want)
}

// testTxDeleted: an owner whose record was deleted (an operator, the janitor) does not
// commit its business write, and the completion recreates nothing.
func testTxDeleted(t *testing.T, s TxStore, _ *Clock) {
	ctx, _ := txClaim(t, s.Store, "k")
	if err := s.Store.Delete(context.Background(), txScope, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WithTx(ctx, txBook("k", txResponse("gone"))); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("WithTx after the record was deleted: error %v, want ErrLeaseLost", err)
	}
	txRows(t, s, "k", 0, "after the transaction")
	if _, err := s.Store.Get(context.Background(), txScope, "k"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get after the transaction: %v, want ErrNotFound", err)
	}
}

// testTxCompletedTwice: a second transaction under a claim already completed (a handler
// that calls WithTx twice) finds the claim stale and commits nothing; the stored
// response stays the first.
func testTxCompletedTwice(t *testing.T, s TxStore, _ *Clock) {
	ctx, _ := txClaim(t, s.Store, "k")
	first := txResponse("first")
	if _, err := s.WithTx(ctx, txBook("k", first)); err != nil {
		t.Fatalf("first WithTx: %v", err)
	}
	if _, err := s.WithTx(ctx, txBook("k", txResponse("second"))); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("second WithTx: error %v, want ErrLeaseLost", err)
	}
	txRows(t, s, "k", 1, "after two transactions under one claim")
	sameResponse(t, mustGet(t, s.Store, txScope, "k").Response, first)
}

// testTxClientLeaves: a client that gives up while its handler's transaction runs does
// not roll the work back: it commits with its completion, for the client's retry to
// replay. The work runs on a context the caller's cancellation does not reach.
func testTxClientLeaves(t *testing.T, s TxStore, _ *Clock) {
	claimed, _ := txClaim(t, s.Store, "k")
	c, _ := idempotency.ClaimFromContext(claimed)
	ctx, leave := context.WithCancel(idempotency.NewContext(context.Background(), c))
	defer leave()
	_, err := s.WithTx(ctx, func(wctx context.Context, write func(string) error) (idempotency.Response, error) {
		leave()
		<-ctx.Done() // the client is gone before the business write
		if err := wctx.Err(); err != nil {
			return idempotency.Response{}, fmt.Errorf("the work's context ended with the caller's: %w", err)
		}
		return txBook("k", txResponse("ok"))(wctx, write)
	})
	if err != nil {
		t.Fatalf("WithTx after the client left: %v", err)
	}
	txRows(t, s, "k", 1, "after the commit")
	if rec := mustGet(t, s.Store, txScope, "k"); rec.State != idempotency.StateDone {
		t.Errorf("record %+v, want done", rec)
	}
}

// testTxWithoutClaim: without a claim in the context WithTx is a plain transaction: the
// business write commits and no record is written.
func testTxWithoutClaim(t *testing.T, s TxStore, _ *Clock) {
	if _, err := s.WithTx(context.Background(), txBook("k", txResponse("plain"))); err != nil {
		t.Fatalf("WithTx without a claim: %v", err)
	}
	txRows(t, s, "k", 1, "after the commit")
	if _, err := s.Store.Get(context.Background(), txScope, "k"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get: %v, want ErrNotFound (no claim, no record)", err)
	}
}

// txServer is the middleware in front of a handler in transaction mode, remembering
// what it did with each request.
type txServer struct {
	h  http.Handler
	mu sync.Mutex
	o  map[string]idempotency.Outcome // by the request's X-Request-Id
}

func newTxServer(t *testing.T, s idempotency.Store, handler http.HandlerFunc) *txServer {
	t.Helper()
	ts := &txServer{o: map[string]idempotency.Outcome{}}
	mw, err := idempotency.New(idempotency.Config{Store: s, Lease: lease, TTL: txTTL,
		Scope:  func(*http.Request) string { return txScope },
		Logger: slog.New(slog.DiscardHandler),
		OnOutcome: func(r *http.Request, o idempotency.Outcome) {
			ts.mu.Lock()
			ts.o[r.Header.Get("X-Request-Id")] = o
			ts.mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mw.Shutdown(context.Background()) })
	ts.h = mw.Handler(handler)
	return ts
}

// do sends the payment of key as request id and returns the answer and what the
// middleware did.
func (ts *txServer) do(key, id string) (*httptest.ResponseRecorder, idempotency.Outcome) {
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("X-Request-Id", id)
	w := httptest.NewRecorder()
	ts.h.ServeHTTP(w, r)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return w, ts.o[id]
}

// txHandler is a handler in transaction mode: it runs work through WithTx on the
// request's context and writes the response, or 500 when WithTx fails.
func txHandler(s TxStore, work func(r *http.Request) TxWork) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		resp, err := s.WithTx(r.Context(), work(r))
		if err != nil {
			http.Error(w, "not done: "+err.Error(), http.StatusInternalServerError)
			return
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.Status)
		_, _ = w.Write(resp.Body)
	}
}

func txSameAnswer(t *testing.T, what string, w *httptest.ResponseRecorder, want idempotency.Response) {
	t.Helper()
	if w.Code != want.Status || w.Body.String() != string(want.Body) || w.Header().Get("X-Raw") != want.Header.Get("X-Raw") {
		t.Errorf("%s: %d %q (X-Raw %q), want %d %q (X-Raw %q)", what, w.Code, w.Body, w.Header().Get("X-Raw"),
			want.Status, want.Body, want.Header.Get("X-Raw"))
	}
}

// testTxMiddlewareReplay: under the middleware, the handler's transaction completes
// the key; a retry is answered with the stored response and the handler does not run
// again.
func testTxMiddlewareReplay(t *testing.T, s TxStore, _ *Clock) {
	var mu sync.Mutex
	runs := 0
	want := txResponse(`{"id":1}`)
	ts := newTxServer(t, s.Store, txHandler(s, func(*http.Request) TxWork {
		mu.Lock()
		runs++
		mu.Unlock()
		return txBook("k", want)
	}))
	w, o := ts.do("k", "first")
	txSameAnswer(t, "first request", w, want)
	if o != idempotency.OutcomeExecuted {
		t.Errorf("first request: outcome %q, want %q", o, idempotency.OutcomeExecuted)
	}
	w, o = ts.do("k", "retry")
	txSameAnswer(t, "retry", w, want)
	if o != idempotency.OutcomeReplayed {
		t.Errorf("retry: outcome %q, want %q", o, idempotency.OutcomeReplayed)
	}
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 {
		t.Errorf("the handler ran %d times, want 1", runs)
	}
	txRows(t, s, "k", 1, "after a request and its retry")
	if rec := mustGet(t, s.Store, txScope, "k"); rec.State != idempotency.StateDone {
		t.Errorf("record %+v, want done", rec)
	}
}

// testTxMiddlewareRollback: under the middleware, a handler whose transaction rolled
// back (its work failed) has its key released whatever it answered, so the retry
// executes again; the business row is written once, by the retry.
func testTxMiddlewareRollback(t *testing.T, s TxStore, _ *Clock) {
	var mu sync.Mutex
	runs := 0
	boom := errors.New("boom")
	want := txResponse(`{"id":2}`)
	ts := newTxServer(t, s.Store, txHandler(s, func(*http.Request) TxWork {
		mu.Lock()
		runs++
		first := runs == 1
		mu.Unlock()
		if !first {
			return txBook("k", want)
		}
		return func(ctx context.Context, write func(string) error) (idempotency.Response, error) {
			if err := write("k"); err != nil {
				return idempotency.Response{}, err
			}
			return idempotency.Response{}, boom
		}
	}))
	w, o := ts.do("k", "first")
	if w.Code != http.StatusInternalServerError || o != idempotency.OutcomeReleased {
		t.Errorf("failed request: %d, outcome %q; want 500 and %q", w.Code, o, idempotency.OutcomeReleased)
	}
	txRows(t, s, "k", 0, "after the rollback")
	if _, err := s.Store.Get(context.Background(), txScope, "k"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get after the rollback: %v, want ErrNotFound (the key released)", err)
	}
	w, o = ts.do("k", "retry")
	txSameAnswer(t, "retry", w, want)
	if o != idempotency.OutcomeExecuted {
		t.Errorf("retry: outcome %q, want %q (executed again)", o, idempotency.OutcomeExecuted)
	}
	w, o = ts.do("k", "replay")
	txSameAnswer(t, "replay", w, want)
	if o != idempotency.OutcomeReplayed {
		t.Errorf("second retry: outcome %q, want %q", o, idempotency.OutcomeReplayed)
	}
	mu.Lock()
	defer mu.Unlock()
	if runs != 2 {
		t.Errorf("the handler ran %d times, want 2 (the failure and the retry)", runs)
	}
	txRows(t, s, "k", 1, "after the retry")
}

// testTxMiddlewareTakeover: under the middleware, a request whose lease ran out while
// its handler had not yet written (a stalled process) is taken over by its retry. The
// retry's transaction commits; the stalled one's then finds the key no longer its own
// and commits nothing. Later retries replay the retry's response.
func testTxMiddlewareTakeover(t *testing.T, s TxStore, c *Clock) {
	stalled, resume := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	runs := 0
	ts := newTxServer(t, s.Store, txHandler(s, func(*http.Request) TxWork {
		mu.Lock()
		runs++
		n := runs
		mu.Unlock()
		if n == 1 {
			close(stalled)
			<-resume
		}
		return txBook("k", txResponse(fmt.Sprintf(`{"run":%d}`, n)))
	}))
	type answer struct {
		w *httptest.ResponseRecorder
		o idempotency.Outcome
	}
	first := make(chan answer, 1)
	go func() {
		w, o := ts.do("k", "stalled")
		first <- answer{w, o}
	}()
	select {
	case <-stalled:
	case a := <-first:
		t.Fatalf("the first request did not run its handler: %d %q, outcome %q", a.w.Code, a.w.Body, a.o)
	}
	c.Advance(lease + time.Second) // the stalled request's lease runs out on the store's clock
	want := txResponse(`{"run":2}`)
	w, o := ts.do("k", "retry")
	close(resume)
	txSameAnswer(t, "the retry that took the key over", w, want)
	if o != idempotency.OutcomeExecuted {
		t.Errorf("retry: outcome %q, want %q", o, idempotency.OutcomeExecuted)
	}
	a := <-first
	if a.w.Code < 300 {
		t.Errorf("the stalled request answered %d %q after losing its key; its work was not done", a.w.Code, a.w.Body)
	}
	txRows(t, s, "k", 1, "after the takeover and the stalled transaction")
	w, o = ts.do("k", "replay")
	txSameAnswer(t, "replay", w, want)
	if o != idempotency.OutcomeReplayed {
		t.Errorf("replay: outcome %q, want %q", o, idempotency.OutcomeReplayed)
	}
}
