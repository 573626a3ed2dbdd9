package idempotency

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/retrysafe/retrysafe/internal/dueq"
	"github.com/retrysafe/retrysafe/internal/lazyctx"
)

// This file is the owner's side of a keyed request: the Claim the handler holds, and
// execute, which runs the handler under it, renews its lease, and then stores, releases
// or abandons the key.

// Claim is the ownership of one key by the request being executed. The middleware puts
// it in the request context; handlers reach it with ClaimFromContext. Transaction-mode
// helpers (pgstore.Store.WithTx) use it to complete the record in the handler's own
// transaction.
type Claim struct {
	Scope       string
	Key         string
	Fingerprint string
	Token       int64

	ttl  time.Duration
	body *reqBody // the request's body, for DropBody; nil without one

	mu        sync.Mutex
	completed bool
	release   bool
	abandon   bool
	abort     bool
	stored    chan struct{} // closed once the response is stored or held to be stored

	// The lease's end, as a context for Detach: made when first asked for (most
	// requests detach nothing), and ended, with leaseEnd as its cause, when the lease is
	// lost or the request is over.
	lease    context.Context
	endLease context.CancelCauseFunc
	leaseEnd error // nil while the lease runs
}

// ClaimKey is the context key of a request's claim, which ClaimFromContext looks up. A
// context that holds a claim in a field of its own, as a ClaimHandler's may, answers
// Value(ClaimKey{}) with it, for the code below that looks for it.
type ClaimKey struct{}

// ClaimFromContext returns the claim of the request executing under the middleware, if
// the request carried a key and won it.
func ClaimFromContext(ctx context.Context) (*Claim, bool) {
	c, ok := ctx.Value(ClaimKey{}).(*Claim)
	return c, ok
}

// NewContext returns ctx carrying c. The middleware does this; it is exported for
// stores' tests and for frameworks that claim keys themselves.
func NewContext(ctx context.Context, c *Claim) context.Context {
	return context.WithValue(ctx, ClaimKey{}, c)
}

// NewClaim returns a claim for a key won with token. ttl is the retention of the
// completed record.
func NewClaim(scope, key, fingerprint string, token int64, ttl time.Duration) *Claim {
	c := &Claim{}
	c.init(scope, key, fingerprint, token, ttl)
	return c
}

func (c *Claim) init(scope, key, fingerprint string, token int64, ttl time.Duration) {
	c.Scope, c.Key, c.Fingerprint, c.Token, c.ttl = scope, key, fingerprint, token, ttl
	c.stored = make(chan struct{})
}

// leaseContext returns the context that ends with the lease.
func (c *Claim) leaseContext() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lease == nil {
		c.lease, c.endLease = context.WithCancelCause(context.Background())
		if c.leaseEnd != nil {
			c.endLease(c.leaseEnd)
		}
	}
	return c.lease
}

// end ends the lease with cause; the first cause stays, as a context's does.
func (c *Claim) end(cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leaseEnd == nil {
		c.leaseEnd = cause
	}
	if c.endLease != nil {
		c.endLease(cause)
	}
}

// errRequestOver ends a claim's lease context when its request is over.
var errRequestOver = errors.New("idempotency: the request is over")

// ClaimHandler is a handler that is handed its key's claim. Given one as the handler,
// the middleware calls ServeClaimed for a request that won its key, with the request as
// it came, where it would call ServeHTTP with the claim in the request's context; the
// requests it passes through still go to ServeHTTP. It is for a handler that detaches
// its work from the request whatever happens, as a proxy detaches a keyed upstream call
// whose answer a retry will want: giving the claim in the context costs every request a
// copy of itself and a context, which such a handler never waits on. The request's
// context is then the one the middleware was given: it does not end when the lease is
// lost, and neither ClaimFromContext nor Detach finds the claim in it unless the
// handler gives its own contexts the claim (ClaimKey).
type ClaimHandler interface {
	http.Handler
	ServeClaimed(w http.ResponseWriter, r *http.Request, c *Claim)
}

// Detach returns a context for work whose answer a retry will want (the handler's
// business write, in transaction mode): it carries ctx's values but not its
// cancellation nor its deadline, so a client that leaves, or whose budget runs out,
// does not cancel the work — the middleware stores its answer for the client's retry —
// and it ends when the claim in ctx loses its lease (another request took the key
// over: context.Cause is ErrLeaseLost), or when its request is over. Without a claim in
// ctx, Detach returns ctx itself. Call cancel when the work is done.
func Detach(ctx context.Context) (context.Context, context.CancelFunc) {
	c, ok := ClaimFromContext(ctx)
	if !ok {
		return ctx, func() {}
	}
	lease := c.leaseContext()
	dctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(lease, func() { cancel(context.Cause(lease)) })
	return dctx, func() {
		stop()
		cancel(nil)
	}
}

// Completion returns the Completion that stores resp under this claim, with the
// retention the middleware is configured with.
func (c *Claim) Completion(resp Response) Completion {
	return Completion{Scope: c.Scope, Key: c.Key, Token: c.Token, Response: resp, TTL: c.ttl}
}

// MarkCompleted records that the key was completed elsewhere (in the handler's
// transaction), so the middleware must not complete it again.
func (c *Claim) MarkCompleted() {
	c.mu.Lock()
	c.completed = true
	c.mu.Unlock()
	c.markStored()
}

// Release asks the middleware to release the key when the handler returns, whatever
// response was written: the work was not done (for example the transaction rolled
// back), so a retry must execute again.
func (c *Claim) Release() {
	c.mu.Lock()
	c.release = true
	c.mu.Unlock()
}

// Abandon asks the middleware to leave the key in progress when the handler returns:
// the outcome is unknown (a request was sent upstream and its answer never came), so
// neither storing nor releasing is safe. The key becomes claimable again when its lease
// ends, and the retry that takes it over executes again.
func (c *Claim) Abandon() {
	c.mu.Lock()
	c.abandon = true
	c.mu.Unlock()
}

// Stored returns a channel that is closed once the response of the request is stored,
// or held by the middleware to be stored as soon as the store answers: from then on,
// nothing the handler still does changes what a retry gets. It happens when the
// handler returns, or earlier, while it is still writing, for a response larger than
// the stored-response limit (its record is completed without the body as soon as the
// limit is passed).
func (c *Claim) Stored() <-chan struct{} { return c.stored }

func (c *Claim) markStored() {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.stored:
	default:
		close(c.stored)
	}
}

// Abort says the response the handler is writing is broken: its body broke off after
// its status was written (an upstream's answer cut short). The key is left to its lease,
// as with Abandon, unless the response was already stored; nothing more of the response
// is sent, and the client's connection is cut (Serve returns ErrAborted), so that the
// client cannot take a truncated answer for a whole one.
func (c *Claim) Abort() {
	c.mu.Lock()
	c.abandon, c.abort = true, true
	c.mu.Unlock()
}

// claimState is what the handler declared of its claim.
type claimState struct{ completed, release, abandon, abort bool }

func (c *Claim) state() claimState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return claimState{c.completed, c.release, c.abandon, c.abort}
}

// execution is the state of one owned request while execute runs it, in one
// allocation: the claim, the handler's context, the recorder of its answer, the lease's
// renewal (heartbeat) and the outcome of a record completed while the handler still
// wrote.
type execution struct {
	m     *Middleware
	r     *http.Request
	c     *Claim // &claim
	claim Claim
	ctx   context.Context // the handler's: &hctx
	hctx  handlerContext
	rec   recorder
	early Outcome // set when the record was completed while the handler wrote

	// The heartbeat renews the lease while the handler runs (heartbeat.go): most
	// handlers finish long before the first renewal is due.
	mu      sync.Mutex
	stopped bool
	beat    dueq.Item[*execution] // in the middleware's queue of heartbeats
	t       *time.Timer           // a renewal sooner than the queue's, after one failed
	renewal sync.WaitGroup        // a renewal in flight
}

// handlerContext is the handler's context: the claim as its value (ClaimFromContext),
// over the request's context, ended with ErrLeaseLost when the lease is lost and when
// the request is over. Its own cancellation is made only when something needs it
// (lazyctx): most handlers never wait on it (a proxy's keyed call is detached from it),
// and a cancellation of its own costs every request a context linked into its parent's,
// its channel, and the link's removal.
type handlerContext struct {
	lazyctx.Context
	c *Claim
}

func (h *handlerContext) Value(key any) any {
	if key == (ClaimKey{}) {
		return h.c
	}
	return h.Context.Value(key)
}

// execute runs the handler as the owner of the key won with token, then stores, releases
// or abandons the key, and only then sends the response: a client never sees an answer
// its retry might not get again. All the state of the owned request is in e (what the
// handler wrote, in e.rec) and in its claim (what the handler declared).
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, rb *reqBody, next http.Handler, scope, key, fp string, token int64) (Outcome, error) {
	e := &execution{m: m, r: r}
	c := &e.claim
	c.init(scope, key, fp, token, m.cfg.TTL)
	c.body = rb
	e.c = c
	// Requests waiting here for the key (ConflictWait) look again once it is settled.
	defer m.waiting.wake(scopeKey{c.Scope, c.Key})
	e.hctx.Init(r.Context(), time.Time{}, nil)
	e.hctx.c = c
	e.ctx = &e.hctx
	defer e.hctx.End(nil)
	defer c.end(errRequestOver)
	e.startHeartbeat()
	e.rec.init(w, m.cfg.MaxResponse, e, &m.bodies, rb)
	defer e.rec.release() // the answer's memory, when it has been sent (or on a panic)
	rec := &e.rec

	panicked := true
	defer func() {
		if !panicked {
			return
		}
		// A panic says the work was not done (or not finished): release the key so a
		// retry runs again, then let the panic go on to the server. A handler that
		// declared the outcome unknown (Abandon) keeps the key to its lease, and one
		// whose response was already stored keeps it stored.
		e.stopHeartbeat()
		st := c.state()
		switch {
		case e.early != "" || st.completed:
			m.report(r, OutcomeDoneAborted)
		case st.abandon:
			m.abandon(r, c)
			m.report(r, OutcomeAbandoned)
		default:
			m.release(r, c, "handler panicked")
			m.report(r, OutcomeReleased)
		}
	}()
	if ch, ok := next.(ClaimHandler); ok {
		ch.ServeClaimed(rec, r, c)
	} else {
		next.ServeHTTP(rec, r.WithContext(e.ctx))
	}
	panicked = false
	e.stopHeartbeat()
	// One return below the defers: with more, the compiler makes them records on the
	// stack, run through the runtime's defer chain, rather than calls at the return.
	return e.settle()
}

// settle stores, releases or abandons the key as the handler left it, sends its
// answer, and returns what it did.
func (e *execution) settle() (Outcome, error) {
	m, r, c, rec := e.m, e.r, e.c, &e.rec
	st := c.state()
	switch {
	case st.abort && (e.early != "" || st.completed):
		// Stored, then the answer broke off on its way: a retry gets the replay; the
		// client's connection is cut, and nothing more is sent on it.
		return OutcomeDoneAborted, ErrAborted
	case st.abort:
		m.abandon(r, c)
		return OutcomeAbandoned, ErrAborted
	case e.early != "":
		rec.send()
		return e.early, nil
	case st.completed: // in the handler's transaction; a renewal racing its commit is moot
		rec.send()
		return OutcomeExecuted, nil
	case errors.Is(context.Cause(e.ctx), ErrLeaseLost):
		rec.send()
		return OutcomeLeaseLost, nil
	case st.abandon, rec.incomplete():
		m.abandon(r, c)
		rec.send()
		return OutcomeAbandoned, nil
	case st.release, rec.wrote() && m.cfg.Release(rec.answerStatus()):
		m.release(r, c, "work not done")
		rec.send()
		return OutcomeReleased, nil
	case (!rec.wrote() || rec.answerStatus() == statusClientClosed) && r.Context().Err() != nil:
		// The client is gone and the handler gave up: it wrote nothing, or 499, with
		// which RPC frameworks (Connect, grpc-gateway) answer a call its client cancelled.
		m.release(r, c, "client gone")
		rec.send()
		return OutcomeClientGone, nil
	}
	o := m.finish(r, c, rec.response())
	rec.send()
	return o, nil
}

// statusClientClosed is 499 Client Closed Request, a status of no standard but common
// use: what a server answers a request whose client went away.
const statusClientClosed = 499

// overflowed completes the record without its body, when the handler's answer passes
// the stored-response limit: the work is done, and its status and headers are final.
func (e *execution) overflowed() {
	e.stopHeartbeat()
	e.early = e.m.finish(e.r, e.c, e.rec.response())
}

// finish stores resp. When the store cannot take it, the response is held and stored
// as soon as the store answers (see pending); the client gets it meanwhile.
func (m *Middleware) finish(r *http.Request, c *Claim, resp Response) Outcome {
	err := m.storeCall(context.WithoutCancel(r.Context()), StoreComplete, func(ctx context.Context) error {
		return m.cfg.Store.Complete(ctx, c.Completion(resp))
	})
	switch {
	case err == nil:
		c.markStored()
		m.waiting.wake(scopeKey{c.Scope, c.Key}) // stored: the waiters can replay it now
		return OutcomeExecuted
	case errors.Is(err, ErrLeaseLost):
		m.cfg.Logger.WarnContext(r.Context(), "idempotency: response not stored: "+lostWhy(err), "key", c.Key)
		return OutcomeLeaseLost
	}
	m.cfg.Logger.WarnContext(r.Context(), "idempotency: the store did not take the response; it is held and stored when the store answers",
		"key", c.Key, "err", err)
	m.holdPending(c, resp)
	c.markStored()
	return OutcomeStoredLater
}

func (m *Middleware) release(r *http.Request, c *Claim, why string) {
	err := m.storeCall(context.WithoutCancel(r.Context()), StoreRelease, func(ctx context.Context) error {
		return m.cfg.Store.Release(ctx, c.Scope, c.Key, c.Token)
	})
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		m.cfg.Logger.ErrorContext(r.Context(), "idempotency: release failed; the key stays in progress until its lease ends",
			"key", c.Key, "why", why, "err", err)
	}
}

// abandon marks the key abandoned, so that retries are told when its lease ends. The
// key stays in progress whether or not this succeeds.
func (m *Middleware) abandon(r *http.Request, c *Claim) {
	err := m.storeCall(context.WithoutCancel(r.Context()), StoreAbandon, func(ctx context.Context) error {
		return m.cfg.Store.Abandon(ctx, c.Scope, c.Key, c.Token)
	})
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		m.cfg.Logger.WarnContext(r.Context(), "idempotency: could not mark the key abandoned", "key", c.Key, "err", err)
	}
}
