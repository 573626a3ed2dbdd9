package idempotency

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Claim is the ownership of one key by the request being executed. The middleware puts
// it in the request context; handlers reach it with ClaimFromContext. Transaction-mode
// helpers (pgstore.Store.WithTx) use it to complete the record in the handler's own
// transaction.
type Claim struct {
	Scope       string
	Key         string
	Fingerprint string
	Token       int64

	ttl time.Duration

	mu        sync.Mutex
	completed bool
	release   bool
	abandon   bool
	stored    chan struct{} // closed once the response is stored or held to be stored

	lease    context.Context // ends when the lease is lost, or the request is over
	endLease context.CancelCauseFunc
}

type claimKey struct{}

// ClaimFromContext returns the claim of the request executing under the middleware, if
// the request carried a key and won it.
func ClaimFromContext(ctx context.Context) (*Claim, bool) {
	c, ok := ctx.Value(claimKey{}).(*Claim)
	return c, ok
}

// NewContext returns ctx carrying c. The middleware does this; it is exported for
// stores' tests and for frameworks that claim keys themselves.
func NewContext(ctx context.Context, c *Claim) context.Context {
	return context.WithValue(ctx, claimKey{}, c)
}

// NewClaim returns a claim for a key won with token. ttl is the retention of the
// completed record.
func NewClaim(scope, key, fingerprint string, token int64, ttl time.Duration) *Claim {
	c := &Claim{Scope: scope, Key: key, Fingerprint: fingerprint, Token: token, ttl: ttl,
		stored: make(chan struct{})}
	c.lease, c.endLease = context.WithCancelCause(context.Background())
	return c
}

// errRequestOver ends a claim's lease context when its request is over.
var errRequestOver = errors.New("idempotency: the request is over")

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
	dctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(c.lease, func() { cancel(context.Cause(c.lease)) })
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

func (c *Claim) abandoned() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.abandon
}

func (c *Claim) flags() (completed, release bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.completed, c.release
}
