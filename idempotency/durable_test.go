package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// replicated is a store on a primary with one synchronous standby, as PostgreSQL with
// synchronous_standby_names or Redis with WAIT: a write is applied on the primary, and
// acknowledged once the standby has every write the primary applied until then. While
// the standby is lost, a write is still applied on the primary but its call fails with
// ErrNotDurable (PostgreSQL: the commit's wait for the standby cancelled; Redis: WAIT
// short of its replica); a call that writes nothing (a refused completion, a read)
// answers at once, as on the real servers. failover replaces the primary by the standby,
// with only what the standby had: the primary's unacknowledged writes are lost.
//
// The standby is a second memory store that replays the primary's writes in their
// order, each on the clock reading it was made at, so that it holds what the primary
// held, tokens included.
type replicated struct {
	mu          sync.Mutex
	clock       func() time.Time
	primary     *memstore.Store
	standby     *memstore.Store
	log         []func(*memstore.Store) // the primary's writes the standby has not replayed
	replaying   bool                    // the standby replays a write made at replayAt
	replayAt    time.Time
	standbyDown bool
}

func newReplicated() *replicated {
	r := &replicated{clock: time.Now}
	r.primary, r.standby = memstore.NewWithClock(r.now), memstore.NewWithClock(r.now)
	return r
}

// now is the clock of both stores: the time, but while the standby replays a write, the
// time that write was made at. The stores read it under r.mu, held by every call.
func (r *replicated) now() time.Time {
	if r.replaying {
		return r.replayAt
	}
	return r.clock()
}

// write runs op on the primary. A call that succeeded wrote: it is logged for the
// standby, and acknowledged (nil) only when the standby is up to take it.
func (r *replicated) write(ctx context.Context, op func(context.Context, *memstore.Store) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := r.clock()
	if err := op(ctx, r.primary); err != nil {
		return err
	}
	r.log = append(r.log, func(s *memstore.Store) {
		r.replaying, r.replayAt = true, at
		_ = op(context.Background(), s)
		r.replaying = false
	})
	if r.standbyDown {
		return fmt.Errorf("replicated: the standby did not acknowledge the write: %w", idempotency.ErrNotDurable)
	}
	r.replicate()
	return nil
}

// replicate has the standby replay the primary's writes it lacks. Called with r.mu held.
func (r *replicated) replicate() {
	for _, w := range r.log {
		w(r.standby)
	}
	r.log = nil
}

func (r *replicated) setStandbyDown(down bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.standbyDown = down
	if !down {
		r.replicate()
	}
}

// failover promotes the standby: the primary, and the writes it alone held, are lost.
// The tests fail over once, so the new primary runs without a standby of its own: its
// writes are acknowledged at once.
func (r *replicated) failover() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.primary, r.log, r.standbyDown = r.standby, nil, false
	r.standby = memstore.NewWithClock(r.now)
}

func (r *replicated) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	var res idempotency.ClaimResult
	err := r.write(ctx, func(ctx context.Context, s *memstore.Store) error {
		var err error
		res, err = s.Claim(ctx, req)
		if err == nil && !res.Claimed {
			return errWroteNothing
		}
		return err
	})
	if errors.Is(err, errWroteNothing) {
		return res, nil
	}
	return res, err
}

// errWroteNothing marks a call that wrote nothing: its answer needs no acknowledgement.
var errWroteNothing = errors.New("wrote nothing")

func (r *replicated) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error {
	return r.write(ctx, func(ctx context.Context, s *memstore.Store) error { return s.Extend(ctx, scope, key, token, lease) })
}

func (r *replicated) Abandon(ctx context.Context, scope, key string, token int64) error {
	return r.write(ctx, func(ctx context.Context, s *memstore.Store) error { return s.Abandon(ctx, scope, key, token) })
}

func (r *replicated) Complete(ctx context.Context, c idempotency.Completion) error {
	return r.write(ctx, func(ctx context.Context, s *memstore.Store) error { return s.Complete(ctx, c) })
}

func (r *replicated) Release(ctx context.Context, scope, key string, token int64) error {
	return r.write(ctx, func(ctx context.Context, s *memstore.Store) error { return s.Release(ctx, scope, key, token) })
}

func (r *replicated) Delete(ctx context.Context, scope, key string) error {
	return r.write(ctx, func(ctx context.Context, s *memstore.Store) error { return s.Delete(ctx, scope, key) })
}

// Get reads the primary, as a client does: what it says may be lost by a failover.
func (r *replicated) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.primary.Get(ctx, scope, key)
}

// Ping is the store's probe of durability: a write the standby must acknowledge.
func (r *replicated) Ping(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.standbyDown {
		return fmt.Errorf("replicated: the standby does not acknowledge writes: %w", idempotency.ErrNotDurable)
	}
	return nil
}

// replicatedHandler is a handler that counts its executions and answers 201 "payment N";
// during returns what it does during the upstream call (a fault).
func replicatedHandler(runs *atomic.Int64, during func()) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		if during != nil {
			during()
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, "payment %d", n)
	})
}

// retryUntilAnswered sends the request again every second, as a client does after a 409
// or a 503, until it is answered otherwise or tries run out, and returns the last answer.
func retryUntilAnswered(h http.Handler, key string, tries int) *httptest.ResponseRecorder {
	w := post(h, key, "{}")
	for ; tries > 0 && (w.Code == http.StatusConflict || w.Code == http.StatusServiceUnavailable); tries-- {
		elapse(time.Second)
		w = post(h, key, "{}")
	}
	return w
}

// TestHeldAnswerConfirmedByAWrite: the synchronous standby is lost while the upstream
// runs, so the completion is applied on the primary alone and not acknowledged; then the
// primary is lost and the standby promoted, without the completion. The owner keeps its
// answer held and writes it again until a write is acknowledged — it never takes the
// record it reads back from the primary, done under its token, for stored — so the
// answer is stored on the promoted server and the retry replays it: one execution.
func TestHeldAnswerConfirmedByAWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newReplicated()
		var runs atomic.Int64
		quiet := slog.New(slog.DiscardHandler)
		owner, err := idempotency.New(idempotency.Config{Store: st, Lease: 3 * time.Second, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { shutdown(t, owner) })
		w := post(owner.Handler(replicatedHandler(&runs, func() { st.setStandbyDown(true) })), "k", "{}")
		if w.Code != http.StatusCreated || w.Body.String() != "payment 1" {
			t.Fatalf("first: %d %q", w.Code, w.Body)
		}
		elapse(5 * time.Second) // the owner writes its answer again, unacknowledged
		if rec, err := st.Get(context.Background(), "", "k"); err != nil || rec.State != idempotency.StateDone {
			t.Fatalf("the primary's record: %+v, %v; want it done (unacknowledged)", rec, err)
		}
		st.failover()
		elapse(2 * time.Second)
		rec, err := st.Get(context.Background(), "", "k")
		if err != nil || rec.State != idempotency.StateDone || string(rec.Response.Body) != "payment 1" {
			t.Fatalf("the promoted server's record: %+v, %v; want the held answer stored", rec, err)
		}
		// The client's retry reaches another replica, which holds nothing of its own.
		other, err := idempotency.New(idempotency.Config{Store: st, Lease: 3 * time.Second, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { shutdown(t, other) })
		w = retryUntilAnswered(other.Handler(replicatedHandler(&runs, nil)), "k", 20)
		if runs.Load() != 1 || w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "payment 1" {
			t.Errorf("retry: %d %q %v; %d executions, want 1", w.Code, w.Body, w.Header(), runs.Load())
		}
	})
}

// claimCounter counts the claims that reach the store.
type claimCounter struct {
	idempotency.Store
	claims atomic.Int64
}

func (c *claimCounter) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, r)
}

func (c *claimCounter) Ping(ctx context.Context) error { return c.Store.(idempotency.Pinger).Ping(ctx) }

// TestNotDurableFailsFastAndReleases: while the synchronous standby is lost, a claim the
// primary applied is not acknowledged: its request is answered 503 store-not-durable
// without running, and later requests are refused at once, without a store call, until
// the store acknowledges writes again; then the claim that may have committed is
// released, so that the key is free at once, not after its lease.
func TestNotDurableFailsFastAndReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newReplicated()
		store := &claimCounter{Store: st}
		var runs atomic.Int64
		mw, err := idempotency.New(idempotency.Config{Store: store, Lease: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { shutdown(t, mw) })
		h := mw.Handler(replicatedHandler(&runs, nil))
		// The first keyed request starts the durability probe, which pings at once: made
		// while the standby is up, and waited for, so that the request below meets the
		// lost standby with its claim, not a ping that got there first.
		if w := post(h, "warm", "{}"); w.Code != http.StatusCreated {
			t.Fatalf("a request while the store is durable: %d %q", w.Code, w.Body)
		}
		synctest.Wait()
		warm := runs.Load()
		st.setStandbyDown(true)
		wantProblem(t, post(h, "k", "{}"), http.StatusServiceUnavailable, idempotency.ProblemStoreNotDurable)
		if rec, err := st.Get(context.Background(), "", "k"); err != nil || rec.State != idempotency.StateInProgress {
			t.Fatalf("the primary's record: %+v, %v; want the claim applied, unacknowledged", rec, err)
		}
		elapse(3 * time.Second)
		if !mw.StoreNotDurable() {
			t.Error("StoreNotDurable = false while the standby is lost")
		}
		before := store.claims.Load()
		for _, key := range []string{"a", "b", "k"} {
			wantProblem(t, post(h, key, "{}"), http.StatusServiceUnavailable, idempotency.ProblemStoreNotDurable)
		}
		if n := store.claims.Load() - before; n != 0 {
			t.Errorf("%d claims reached the store while it could not make them durable, want 0", n)
		}
		st.setStandbyDown(false)
		elapse(2 * time.Second) // the probe's ping is acknowledged; the unknown claim released
		if mw.StoreNotDurable() {
			t.Error("StoreNotDurable = true after the standby came back")
		}
		if _, err := st.Get(context.Background(), "", "k"); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("the unacknowledged claim's record: %v, want it released", err)
		}
		if w := post(h, "k", "{}"); w.Code != http.StatusCreated || runs.Load()-warm != 1 {
			t.Errorf("the retry once the store is durable again: %d %q, %d executions; want 201, 1", w.Code, w.Body, runs.Load()-warm)
		}
	})
}

// lostAnswer applies the next claim and fails its call, as a connection broken after
// the store applied the write.
type lostAnswer struct {
	idempotency.Store
	lose atomic.Bool
}

func (l *lostAnswer) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	res, err := l.Store.Claim(ctx, r)
	if err == nil && l.lose.CompareAndSwap(true, false) {
		return idempotency.ClaimResult{}, errors.New("connection reset by peer")
	}
	return res, err
}

// TestClaimWithLostAnswerReleased: a claim the store applied but whose answer was lost
// is answered 503 (nothing ran) and released in the background, so that the client's
// retry runs the request at once instead of meeting 409 for a whole lease.
func TestClaimWithLostAnswerReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &lostAnswer{Store: memstore.New()}
		store.lose.Store(true)
		var runs atomic.Int64
		mw, err := idempotency.New(idempotency.Config{Store: store, Lease: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { shutdown(t, mw) })
		h := mw.Handler(replicatedHandler(&runs, nil))
		wantProblem(t, post(h, "k", "{}"), http.StatusServiceUnavailable, idempotency.ProblemStoreUnavailable)
		elapse(time.Second)
		if w := post(h, "k", "{}"); w.Code != http.StatusCreated || runs.Load() != 1 {
			t.Errorf("the retry a second later: %d %q, %d executions; want 201, 1", w.Code, w.Body, runs.Load())
		}
	})
}

// TestVanishedRecordIsNotATakeover: an owner whose record vanished while its handler ran
// (an operator's eviction; a Redis that evicts) logs that, never that the key was taken
// over by another request.
func TestVanishedRecordIsNotATakeover(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	var logs strings.Builder
	var mu sync.Mutex
	mw, err := idempotency.New(idempotency.Config{Store: store, Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, mw) })
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := store.Delete(r.Context(), "", "k"); err != nil {
			t.Error(err)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	if w := post(h, "k", "{}"); w.Code != http.StatusCreated {
		t.Errorf("answer: %d", w.Code)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "record vanished") || strings.Contains(logs.String(), "taken over") {
		t.Errorf("log does not say the record vanished:\n%s", logs.String())
	}
}
