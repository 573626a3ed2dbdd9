package idempotency

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// Sentinel errors returned by stores and the middleware. Match them with errors.Is.
var (
	// ErrNotFound: no record exists for the scope and key.
	ErrNotFound = errors.New("idempotency: record not found")
	// ErrLeaseLost: the caller's fencing token is not the record's current token, the
	// record is no longer in progress, or it no longer exists. The caller does not own
	// the key any more and must not write through it.
	ErrLeaseLost = errors.New("idempotency: lease lost (stale fencing token)")
	// ErrInFlight: another request holds the key and its lease has not expired.
	ErrInFlight = errors.New("idempotency: request with this key is in flight")
	// ErrMismatch: the key was used before with a different request fingerprint.
	ErrMismatch = errors.New("idempotency: key reused with a different request")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("idempotency: store closed")
)

// State is the lifecycle state of a Record.
type State string

const (
	// StateInProgress: a request claimed the key and is executing.
	StateInProgress State = "in_progress"
	// StateDone: the response is stored and will be replayed.
	StateDone State = "done"
)

// Response is a stored HTTP response.
type Response struct {
	Status int
	// Header holds the stored response headers, multi-valued headers intact. It never
	// holds Set-Cookie, Authorization, Date or hop-by-hop headers.
	Header http.Header
	Body   []byte
	// BodyOmitted is true when the body was larger than the stored-response limit: the
	// work was done, so the record is complete, but Body is empty.
	BodyOmitted bool
}

// Record is one idempotency key's state in a store.
type Record struct {
	Scope       string
	Key         string
	Fingerprint string
	State       State
	// Token is the fencing token of the current owner. It changes on every claim and
	// takeover; a takeover always issues a token greater than the previous one, and a
	// fresh claim never reuses the token of a deleted or expired record.
	Token      int64
	CreatedAt  time.Time
	LeaseUntil time.Time // meaningful while in progress
	ExpiresAt  time.Time // the record may be deleted after this instant
	Response   *Response // set when State is StateDone
}

// ClaimRequest asks a store to claim a key.
type ClaimRequest struct {
	Scope       string
	Key         string
	Fingerprint string
	// Now is the caller's clock. Stores compare LeaseUntil and ExpiresAt with it, never
	// with their own clock, so that one injected clock drives every store alike.
	Now        time.Time
	LeaseUntil time.Time
	ExpiresAt  time.Time
}

// ClaimResult is the outcome of Store.Claim.
type ClaimResult struct {
	// Claimed is true when the caller now owns the key with fencing token Token.
	Claimed bool
	Token   int64
	// TookOver is true when the claim replaced an in-progress record whose lease had
	// expired (its owner is presumed dead).
	TookOver bool
	// Existing is the record that prevented the claim (Claimed false). It is never nil
	// when Claimed is false and err is nil.
	Existing *Record
}

// Completion stores the final response of the owner holding Token.
type Completion struct {
	Scope     string
	Key       string
	Token     int64
	Response  Response
	Now       time.Time
	ExpiresAt time.Time
}

// Store persists idempotency records. Every method is atomic with respect to every
// other call on the same scope and key, from any goroutine or process sharing the
// backend. Stores never read their own clock for lease or expiry decisions: callers pass
// Now. The conformance suite in package idempotencytest defines the behaviour exactly.
type Store interface {
	// Claim atomically creates an in-progress record for (Scope, Key) owned by the
	// caller, and reports Claimed true with the new fencing token, when:
	//   - no record exists, or the existing one has ExpiresAt <= Now (it is replaced); or
	//   - the existing record is in progress with LeaseUntil <= Now and the same
	//     Fingerprint (takeover: TookOver true, Token greater than the old token).
	// Otherwise it changes nothing and returns Claimed false with the existing record.
	// Of any number of concurrent claims on one key, exactly one is Claimed.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)

	// Extend moves the lease of the in-progress record owned by token to leaseUntil.
	// It returns ErrLeaseLost when the record is absent, done, or has another token.
	Extend(ctx context.Context, scope, key string, token int64, leaseUntil time.Time) error

	// Complete marks the in-progress record owned by c.Token done with c.Response and
	// c.ExpiresAt. It returns ErrLeaseLost when the record is absent, already done, or
	// has another token; then nothing is written. A response is stored whole or not at all.
	Complete(ctx context.Context, c Completion) error

	// Release deletes the in-progress record owned by token, so that a retry executes
	// again. It returns ErrLeaseLost when the record is absent, done, or has another
	// token; then nothing is deleted.
	Release(ctx context.Context, scope, key string, token int64) error

	// Get returns the record for (scope, key), or ErrNotFound. A record past its
	// ExpiresAt may still be returned until it is deleted; Claim treats it as absent.
	Get(ctx context.Context, scope, key string) (*Record, error)

	// Delete removes the record in any state (an operator's eviction). Deleting a
	// missing record is not an error. An owner of a deleted in-progress record gets
	// ErrLeaseLost on Complete, Extend and Release.
	Delete(ctx context.Context, scope, key string) error
}

// Janitor is implemented by stores that need expired records deleted by the caller
// (SQL stores). Stores whose backend expires records itself (Redis TTLs) need not.
type Janitor interface {
	// DeleteExpired deletes at most limit records with ExpiresAt <= now and returns how
	// many it deleted. Repeated calls eventually delete every expired record.
	DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error)
}

// ListFilter selects records for Lister.List. Zero fields match everything.
type ListFilter struct {
	Scope string // exact scope; empty matches every scope
	State State  // empty matches every state
	// After is an opaque cursor from a previous page's ListPage.Next.
	After string
	// Limit caps the page size; zero means 100.
	Limit int
}

// ListPage is one page of records. Next is empty on the last page.
type ListPage struct {
	Records []Record
	Next    string
}

// Lister is implemented by stores that can enumerate records (operators' tools).
// Pages are ordered by (scope, key) where the backend allows it; the Redis store
// returns them in SCAN order. Records come whole, responses included.
type Lister interface {
	List(ctx context.Context, f ListFilter) (ListPage, error)
}

// Pinger is implemented by stores that can check their backend is reachable.
type Pinger interface {
	Ping(ctx context.Context) error
}
