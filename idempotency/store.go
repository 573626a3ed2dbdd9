package idempotency

import (
	"context"
	"errors"
	"fmt"
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
	// ErrRecordGone: the caller's record no longer exists — an operator deleted it, the
	// janitor removed it, or the backend evicted it — rather than another request
	// holding it. It matches ErrLeaseLost too: the caller owns nothing any more. Stores
	// return it from Extend, Abandon, Complete and Release when they find no record, so
	// that a record that vanished under its owner is reported as that, never as a
	// takeover.
	ErrRecordGone = fmt.Errorf("idempotency: record gone (deleted, expired or evicted): %w", ErrLeaseLost)
	// ErrNotDurable: the store could not make a write durable the way its configuration
	// promises across a failover — a synchronous standby or the replicas asked for did
	// not acknowledge it, or the store knows it cannot acknowledge writes now. The
	// write's outcome is unknown: it may be applied on the primary alone and lost by a
	// failover. The caller must treat it as any store failure (nothing it claimed may
	// run; an answer it was storing stays held and is written again), and must not
	// confirm it by reading the record back from the node that may be lost.
	ErrNotDurable = errors.New("idempotency: the store could not make the write durable")
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
	// Header holds the response's headers as the handler set them, byte for byte
	// (values need not be UTF-8), each name's values in their order, Set-Cookie
	// included: a replay goes only to a request with the same key in the same scope,
	// and carries the body whole, so it carries the cookies the first answer set too
	// (the client whose answer was lost never got them). Left out, as they are not
	// the answer's own or are made again for each sending:
	//   - Date: a replay's Date is when the replay was sent (net/http's server sets
	//     it), as Date says when a message was made;
	//   - Content-Length and Trailer: a replay sets them from the stored body and
	//     trailers;
	//   - the hop-by-hop headers (Connection, Keep-Alive, Proxy-Connection,
	//     Proxy-Authenticate, Proxy-Authorization, TE, Transfer-Encoding, Upgrade)
	//     and the names the answer's Connection header lists, which belong to one
	//     connection;
	//   - Authorization, a request's credential that an answer only echoes;
	//   - Idempotent-Replayed and Idempotent-Body-Omitted, which Replay sets.
	Header http.Header
	// Trailer holds the response's trailers, kept like Header; nil when there were
	// none.
	Trailer http.Header
	Body    []byte
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
	Token int64
	// Abandoned is true when the owner gave up on the request without knowing its
	// outcome (Store.Abandon): nobody renews the lease, which runs out at LeaseUntil.
	Abandoned bool
	// Attempts is 1 + the takeovers of the current claim, for operators, when the
	// store counts them (PostgreSQL, in Get and List); 0 when it does not.
	Attempts int
	// Route is what the record was claimed under (ClaimRequest.Route), for operators'
	// tools: set by Get and List (a ClaimResult's Existing need not have it, as a claim
	// does not use it); "" for a record claimed without one, or written before the store
	// kept routes.
	Route      string
	CreatedAt  time.Time
	LeaseUntil time.Time // meaningful while in progress
	ExpiresAt  time.Time // the record may be deleted after this instant
	// Response is the stored response of a done record. In a ClaimResult's Existing it
	// is set only when the request is a replay (the record is done and has the
	// request's fingerprint): a store need not read a response it will not replay.
	Response *Response
}

// ClaimRequest asks a store to claim a key. Lease and expiry are durations: the store
// turns them into instants with its own clock, so that processes whose clocks disagree
// still agree on when a lease ends.
type ClaimRequest struct {
	Scope       string
	Key         string
	Fingerprint string
	// ID names this claim, chosen by the claimer and unique to it (the middleware draws
	// one per request). A claim that finds an in-progress record created or taken over
	// by a claim with the same ID is granted with that record's token and changes
	// nothing: it is the claimer's own earlier attempt, whose answer was lost (a
	// connection broken after the write), so a claim may be sent again. The store keeps
	// the ID with the record for as long as the claim owns it. Empty: no ID, and a
	// claim never recognises a record as its own.
	ID string
	// Lease is how long the claim is honoured, from the store's now, before another
	// request may take the key over (its owner is presumed dead). Positive.
	Lease time.Duration
	// TTL is how long the record is kept, from the store's now. Longer than Lease.
	TTL time.Duration
	// Route is what the record is filed under, for operators' tools (Config.Route): the
	// store writes it with a record it creates, and a takeover writes it again (the
	// route the request now runs under). It decides nothing. Empty for none.
	Route string
	// NoTakeover reports an in-progress record whose lease has run out as Existing
	// instead of taking it over. The middleware sets it for a lease after it saw the
	// store fail: an owner cut off by the same outage could not renew its lease, and is
	// presumed alive.
	NoTakeover bool
	// TakeoverBy, when set, is the last instant of the store's clock at which the claim
	// may take an in-progress record over: a claim that reaches the store later (held by
	// a partition, sent again by a client library) was decided on what its sender knew
	// before, and an outage since may have kept the owner from renewing. Zero: no bound.
	TakeoverBy time.Time
}

// MayTakeOver reports whether the claim may take over (or replace) an in-progress record
// whose lease has run out, at the store's instant now.
func (r ClaimRequest) MayTakeOver(now time.Time) bool {
	return !r.NoTakeover && (r.TakeoverBy.IsZero() || !now.After(r.TakeoverBy))
}

// TakeoverLimit is MayTakeOver as one instant, for stores that decide in a query or a
// script: the claim may take a record over at the store's instant now when now is not
// after the limit. It is the epoch for NoTakeover, and far in the future when there is
// no bound.
func (r ClaimRequest) TakeoverLimit() time.Time {
	switch {
	case r.NoTakeover:
		return time.Unix(0, 0).UTC()
	case r.TakeoverBy.IsZero():
		return time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	}
	return r.TakeoverBy
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
	// when Claimed is false and err is nil. Its Response is set only for a replay (see
	// Record.Response).
	Existing *Record
	// Now is the store's clock at the decision: the instant Existing's LeaseUntil and
	// ExpiresAt were compared with.
	Now time.Time
}

// Completion stores the final response of the owner holding Token.
type Completion struct {
	Scope    string
	Key      string
	Token    int64
	Response Response
	// TTL is how long the completed record is kept, from the store's now.
	TTL time.Duration
}

// Store persists idempotency records. Every method is atomic with respect to every
// other call on the same scope and key, from any goroutine or process sharing the
// backend. Lease and expiry instants come from the store's clock: the server's for
// stores shared by several hosts (PostgreSQL, Redis), the process's for one-host stores
// (SQLite, memory); callers pass durations. The conformance suite in package
// idempotencytest defines the behaviour exactly.
type Store interface {
	// Claim atomically creates an in-progress record for (Scope, Key) owned by the
	// caller, with LeaseUntil = now+Lease and ExpiresAt = now+TTL, and reports Claimed
	// true with the new fencing token, when:
	//   - no record exists, or the existing one is done and ExpiresAt <= now (it is
	//     replaced); or
	//   - the existing record is in progress with LeaseUntil <= now, the request
	//     MayTakeOver at now, and it has the same Fingerprint (a takeover: TookOver
	//     true, Token greater than the old token) or ExpiresAt <= now (replaced as by a
	//     fresh claim).
	// An in-progress record whose lease runs is never replaced, whatever its ExpiresAt.
	// An in-progress record claimed under req.ID (not empty) is the caller's own: Claim
	// changes nothing and reports Claimed true with its token (TookOver false), whatever
	// its lease. Otherwise Claim changes nothing and returns Claimed false with the
	// existing record. Of any number of concurrent claims on one key with distinct IDs,
	// exactly one is Claimed.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)

	// Extend moves the lease of the in-progress record owned by token to now+lease, and
	// its ExpiresAt to now+lease if that is later, so that a record never expires while
	// its owner renews it. It returns ErrRecordGone when the record is absent, and
	// ErrLeaseLost when it is done or has another token.
	Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error

	// Abandon marks the in-progress record owned by token abandoned: its owner gave up
	// without knowing whether the work was done, and will not renew the lease. The
	// record stays in progress until its lease ends, after which a claim takes it over.
	// It returns ErrRecordGone when the record is absent, and ErrLeaseLost when it is
	// done or has another token.
	Abandon(ctx context.Context, scope, key string, token int64) error

	// Complete marks the in-progress record owned by c.Token done with c.Response and
	// ExpiresAt = now+c.TTL. A record already done under c.Token (this completion sent
	// again, after an answer that was lost or not acknowledged as durable) is written
	// again, its stored response and expiry left as they are, and Complete returns nil:
	// that write's acknowledgement is what confirms the first, on a backend where an
	// unacknowledged write may be lost by a failover. It returns ErrRecordGone when the
	// record is absent, and ErrLeaseLost when it has another token; then nothing is
	// written. A response is stored whole or not at all.
	Complete(ctx context.Context, c Completion) error

	// Release deletes the in-progress record owned by token, so that a retry executes
	// again. It returns ErrRecordGone when the record is absent, and ErrLeaseLost when it
	// is done or has another token; then nothing is deleted.
	Release(ctx context.Context, scope, key string, token int64) error

	// Get returns the whole record for (scope, key), response included, or
	// ErrNotFound. A record past its ExpiresAt may still be returned until it is
	// deleted; Claim treats it as described above.
	Get(ctx context.Context, scope, key string) (*Record, error)

	// Delete removes the record in any state (an operator's eviction). Deleting a
	// missing record is not an error. An owner of a deleted in-progress record gets
	// ErrRecordGone on Complete, Extend, Abandon and Release.
	Delete(ctx context.Context, scope, key string) error
}

// Janitor is implemented by stores that need expired records deleted by the caller
// (SQL stores). Stores whose backend expires records itself (Redis TTLs) need not.
type Janitor interface {
	// DeleteExpired deletes at most limit records with ExpiresAt <= now on the store's
	// clock, except in-progress records whose lease still runs, and returns how many it
	// deleted. Repeated calls eventually delete every such record.
	DeleteExpired(ctx context.Context, limit int) (int, error)
}

// ListFilter selects records for Lister.List. Zero fields match everything.
type ListFilter struct {
	Scope string // exact scope; empty matches every scope
	State State  // empty matches every state
	Route string // exact route (Record.Route); empty matches every route
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

// Immediate is implemented by stores whose calls finish in the caller's goroutine, with
// no I/O and no wait but for their own short critical sections, such as the memory
// store. The middleware calls them without a Config.StoreTimeout deadline: a deadline
// would cost a timer per call and bound nothing.
type Immediate interface {
	Immediate()
}

// Pinger is implemented by stores that can check their backend is reachable.
type Pinger interface {
	Ping(ctx context.Context) error
}

// FindingLevel says what a store setting means for the promise that a keyed request runs
// once.
type FindingLevel string

// Finding levels, from the least to the most serious.
const (
	// FindingOK: the setting keeps the promise.
	FindingOK FindingLevel = "ok"
	// FindingWarn: the setting narrows the promise; the Finding says how.
	FindingWarn FindingLevel = "warn"
	// FindingRefuse: the setting breaks the promise; a gateway refuses to run on it
	// unless the operator allows it explicitly.
	FindingRefuse FindingLevel = "refuse"
)

// Finding is what one setting of a store's backend means for the promise that a keyed
// request runs once. The queue backends (redeliver/jetstream, redeliver/rabbitmq) report
// their brokers' settings with it too, for what a message's handling keeps.
type Finding struct {
	Level FindingLevel
	// Check names the check, stably, for flags and tests: "redis.eviction",
	// "postgres.standby", "sqlite.synchronous".
	Check string
	// Setting is the setting as the backend reports it: "maxmemory-policy=allkeys-lru",
	// "standby s1: sync_state=async".
	Setting string
	// Detail says in one sentence what can happen: "a failover can lose the last
	// completed keys; they would run again".
	Detail string
}

// Inspector is implemented by stores that can report what their backend's settings —
// persistence, replication, eviction — mean for the promise that a keyed request runs
// once. Inspect reads settings only; what it cannot read (a role without the privilege)
// it reports as a warning, not an error. Its error is for a backend that did not answer.
type Inspector interface {
	Inspect(ctx context.Context) ([]Finding, error)
}
