// Package memstore is an in-process idempotency.Store: the reference implementation of
// the store contract, and the store for tests and examples.
//
// Records live in a map guarded by one mutex, so every operation is atomic. A record
// keeps its response encoded in one byte slice, without pointers, so that a store of
// many records gives the garbage collector little to scan. Nothing survives the process: use it where losing every key on a restart is acceptable (tests,
// single-process tools), never in front of payments. Fencing tokens come from one
// counter per Store, so they are never reused, even after Delete or expiry. Inspect
// (idempotency.Inspector) says so as a warning, for `retrysafe doctor` and the
// gateway's start.
package memstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/headercodec"
	"github.com/retrysafe/retrysafe/internal/listcursor"
)

type id struct{ scope, key string }

// record is a key's record as the store keeps it: the Record's fields but its scope and
// key (the map's key) and its response, which is encoded (encodeResponse).
type record struct {
	fingerprint string
	route       string // shares the claim's string: a claim copies no bytes
	claimID     string // the ClaimRequest.ID of the claim that owns it
	state       idempotency.State
	token       int64
	abandoned   bool
	createdAt   time.Time
	leaseUntil  time.Time
	expiresAt   time.Time
	response    []byte // nil: no response (in progress)
}

// Store is an in-memory idempotency.Store. The zero value is not usable; call New.
type Store struct {
	now     func() time.Time
	mu      sync.Mutex
	records map[id]*record
	token   int64
	closed  bool
}

var (
	_ idempotency.Store     = (*Store)(nil)
	_ idempotency.Janitor   = (*Store)(nil)
	_ idempotency.Lister    = (*Store)(nil)
	_ idempotency.Pinger    = (*Store)(nil)
	_ idempotency.Immediate = (*Store)(nil)
)

// New returns an empty store on the process clock.
func New() *Store { return NewWithClock(nil) }

// NewWithClock returns an empty store whose lease and expiry decisions read the time
// from clock (nil: time.Now). Tests use it to move time on.
func NewWithClock(clock func() time.Time) *Store {
	if clock == nil {
		clock = time.Now
	}
	return &Store{now: clock, records: make(map[id]*record)}
}

// Close makes every later call fail with idempotency.ErrClosed and drops the records.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.records = nil
	return nil
}

func (s *Store) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return idempotency.ErrClosed
	}
	return nil
}

// Claim implements idempotency.Store.
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := s.lock(ctx); err != nil {
		return idempotency.ClaimResult{}, err
	}
	defer s.mu.Unlock()
	now := s.now()
	k := id{req.Scope, req.Key}
	old, ok := s.records[k]
	takeover := false
	if ok {
		expired := !old.expiresAt.After(now)
		switch {
		case old.state == idempotency.StateInProgress && req.ID != "" && old.claimID == req.ID:
			return idempotency.ClaimResult{Claimed: true, Token: old.token, Now: now}, nil
		case old.state == idempotency.StateDone && expired:
			// replaced by a fresh claim
		case old.state == idempotency.StateInProgress && !old.leaseUntil.After(now) && req.MayTakeOver(now) &&
			(expired || old.fingerprint == req.Fingerprint):
			takeover = !expired // an expired one is replaced by a fresh claim
		default:
			// The response only for a replay.
			replay := old.state == idempotency.StateDone && old.fingerprint == req.Fingerprint
			return idempotency.ClaimResult{Existing: old.export(k, replay), Now: now}, nil
		}
	}
	s.token++
	created := now
	if takeover {
		created = old.createdAt
	}
	s.records[k] = &record{
		fingerprint: req.Fingerprint, route: req.Route, claimID: req.ID, state: idempotency.StateInProgress, token: s.token,
		createdAt: created, leaseUntil: now.Add(req.Lease), expiresAt: now.Add(req.TTL),
	}
	return idempotency.ClaimResult{Claimed: true, Token: s.token, TookOver: takeover, Now: now}, nil
}

// export returns the Record of r, the record of k, with its response when withResponse.
func (r *record) export(k id, withResponse bool) *idempotency.Record {
	rec := &idempotency.Record{Scope: k.scope, Key: k.key, Fingerprint: r.fingerprint, Route: r.route, State: r.state,
		Token: r.token, Abandoned: r.abandoned, CreatedAt: r.createdAt, LeaseUntil: r.leaseUntil, ExpiresAt: r.expiresAt}
	if withResponse && r.response != nil {
		rec.Response = decodeResponse(r.response)
	}
	return rec
}

// update runs fn, under the store's lock, on the in-progress record owned by token, or
// returns ErrRecordGone when the record is absent, and ErrLeaseLost when it has another
// token or is done (but done under token with again: then nil, and fn does not run).
func (s *Store) update(ctx context.Context, scope, key string, token int64, again bool, fn func(r *record)) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	r, ok := s.records[id{scope, key}]
	switch {
	case !ok:
		return idempotency.ErrRecordGone
	case r.token != token:
		return idempotency.ErrLeaseLost
	case r.state == idempotency.StateDone && again:
		return nil
	case r.state != idempotency.StateInProgress:
		return idempotency.ErrLeaseLost
	}
	fn(r)
	return nil
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error {
	return s.update(ctx, scope, key, token, false, func(r *record) {
		r.leaseUntil = s.now().Add(lease)
		if r.expiresAt.Before(r.leaseUntil) {
			r.expiresAt = r.leaseUntil
		}
	})
}

// Abandon implements idempotency.Store.
func (s *Store) Abandon(ctx context.Context, scope, key string, token int64) error {
	return s.update(ctx, scope, key, token, false, func(r *record) { r.abandoned = true })
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, c idempotency.Completion) error {
	// A completion sent again finds its record done: this store's writes are final when
	// they return, so there is nothing to write again.
	return s.update(ctx, c.Scope, c.Key, c.Token, true, func(r *record) {
		r.state = idempotency.StateDone
		r.abandoned = false
		r.response = encodeResponse(&c.Response)
		r.expiresAt = s.now().Add(c.TTL)
	})
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	return s.update(ctx, scope, key, token, false, func(*record) { delete(s.records, id{scope, key}) })
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	k := id{scope, key}
	r, ok := s.records[k]
	if !ok {
		return nil, idempotency.ErrNotFound
	}
	return r.export(k, true), nil
}

// Delete implements idempotency.Store.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	delete(s.records, id{scope, key})
	return nil
}

// DeleteExpired implements idempotency.Janitor.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	now := s.now()
	n := 0
	for k, r := range s.records {
		if n >= limit {
			break
		}
		if !r.expiresAt.After(now) && (r.state == idempotency.StateDone || !r.leaseUntil.After(now)) {
			delete(s.records, k)
			n++
		}
	}
	return n, nil
}

// List implements idempotency.Lister, in (scope, key) order.
func (s *Store) List(ctx context.Context, f idempotency.ListFilter) (idempotency.ListPage, error) {
	if err := s.lock(ctx); err != nil {
		return idempotency.ListPage{}, err
	}
	defer s.mu.Unlock()
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	var after *id
	if f.After != "" {
		scope, key, err := listcursor.Decode(f.After)
		if err != nil {
			return idempotency.ListPage{}, fmt.Errorf("memstore: %w", err)
		}
		after = &id{scope, key}
	}
	var ids []id
	for k, r := range s.records {
		if (f.Scope == "" || k.scope == f.Scope) && (f.State == "" || r.state == f.State) &&
			(f.Route == "" || r.route == f.Route) && less(after, k) {
			ids = append(ids, k)
		}
	}
	slices.SortFunc(ids, func(a, b id) int {
		if c := strings.Compare(a.scope, b.scope); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	var page idempotency.ListPage
	for i, k := range ids {
		if i == limit {
			last := ids[i-1]
			page.Next = listcursor.Encode(last.scope, last.key)
			break
		}
		page.Records = append(page.Records, *s.records[k].export(k, true))
	}
	return page, nil
}

// Immediate implements idempotency.Immediate: every call is a map operation under the
// store's mutex, so the middleware bounds none of them with a timeout.
func (s *Store) Immediate() {}

// Ping implements idempotency.Pinger.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	s.mu.Unlock()
	return nil
}

func less(after *id, k id) bool {
	if after == nil {
		return true
	}
	return k.scope > after.scope || (k.scope == after.scope && k.key > after.key)
}

// A response is encoded as: its status (a varint), a flags byte (flagOmitted,
// flagNilBody), the body's length (a uvarint), the body, and to the end the encoding of
// its header and trailer (package headercodec).
const (
	flagOmitted = 1 << iota // BodyOmitted
	flagNilBody             // Body is nil, not empty
)

// encodeResponse returns the encoding of resp, in one allocation: a copy of it, so that
// the caller may change resp afterwards.
func encodeResponse(resp *idempotency.Response) []byte {
	b := make([]byte, 0, 2*binary.MaxVarintLen64+1+len(resp.Body)+headercodec.Size(resp.Header, resp.Trailer))
	b = binary.AppendVarint(b, int64(resp.Status))
	var flags byte
	if resp.BodyOmitted {
		flags |= flagOmitted
	}
	if resp.Body == nil {
		flags |= flagNilBody
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(len(resp.Body)))
	b = append(b, resp.Body...)
	return headercodec.Append(b, resp.Header, resp.Trailer)
}

// errCorrupt says that a stored response does not decode, which cannot happen: the store
// decodes only what it encoded.
var errCorrupt = errors.New("memstore: corrupt stored response")

// decodeResponse returns the response that b encodes. Its body is a copy: the caller
// may change it.
func decodeResponse(b []byte) *idempotency.Response {
	status, k := binary.Varint(b)
	if k <= 0 || len(b) == k {
		panic(errCorrupt)
	}
	flags := b[k]
	b = b[k+1:]
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		panic(errCorrupt)
	}
	body, rest := b[k:k+int(n)], b[k+int(n):]
	header, trailer, err := headercodec.Decode(rest)
	if err != nil {
		panic(fmt.Errorf("%w: %w", errCorrupt, err))
	}
	if header == nil {
		header = http.Header{} // a stored response always has a header map
	}
	resp := &idempotency.Response{Status: int(status), Header: header, Trailer: trailer, BodyOmitted: flags&flagOmitted != 0}
	if flags&flagNilBody == 0 {
		resp.Body = slices.Clone(body) // not nil: body is a part of b
	}
	return resp
}
