// Package memstore is an in-process idempotency.Store: the reference implementation of
// the store contract, and the store for tests and examples.
//
// Records live in a map guarded by one mutex, so every operation is atomic. Nothing
// survives the process: use it where losing every key on a restart is acceptable (tests,
// single-process tools), never in front of payments. Fencing tokens come from one
// counter per Store, so they are never reused, even after Delete or expiry.
package memstore

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/listcursor"
)

type id struct{ scope, key string }

// Store is an in-memory idempotency.Store. The zero value is not usable; call New.
type Store struct {
	now     func() time.Time
	mu      sync.Mutex
	records map[id]*idempotency.Record
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
	return &Store{now: clock, records: make(map[id]*idempotency.Record)}
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
		expired := !old.ExpiresAt.After(now)
		switch {
		case old.State == idempotency.StateDone && expired:
			// replaced by a fresh claim
		case old.State == idempotency.StateInProgress && !old.LeaseUntil.After(now) && req.MayTakeOver(now) &&
			(expired || old.Fingerprint == req.Fingerprint):
			takeover = !expired // an expired one is replaced by a fresh claim
		default:
			return idempotency.ClaimResult{Existing: lean(old, req.Fingerprint), Now: now}, nil
		}
	}
	s.token++
	created := now
	if takeover {
		created = old.CreatedAt
	}
	s.records[k] = &idempotency.Record{
		Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint,
		State: idempotency.StateInProgress, Token: s.token,
		CreatedAt: created, LeaseUntil: now.Add(req.Lease), ExpiresAt: now.Add(req.TTL),
	}
	return idempotency.ClaimResult{Claimed: true, Token: s.token, TookOver: takeover, Now: now}, nil
}

// lean is the record as a lost claim returns it: the response only for a replay.
func lean(r *idempotency.Record, fingerprint string) *idempotency.Record {
	c := *r
	c.Response = nil
	if r.State == idempotency.StateDone && r.Fingerprint == fingerprint {
		c.Response = cloneResponse(r.Response)
	}
	return &c
}

// update runs fn, under the store's lock, on the in-progress record owned by token, or
// returns ErrLeaseLost when the record is absent, done, or has another token.
func (s *Store) update(ctx context.Context, scope, key string, token int64, fn func(r *idempotency.Record)) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	r, ok := s.records[id{scope, key}]
	if !ok || r.State != idempotency.StateInProgress || r.Token != token {
		return idempotency.ErrLeaseLost
	}
	fn(r)
	return nil
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error {
	return s.update(ctx, scope, key, token, func(r *idempotency.Record) {
		r.LeaseUntil = s.now().Add(lease)
		if r.ExpiresAt.Before(r.LeaseUntil) {
			r.ExpiresAt = r.LeaseUntil
		}
	})
}

// Abandon implements idempotency.Store.
func (s *Store) Abandon(ctx context.Context, scope, key string, token int64) error {
	return s.update(ctx, scope, key, token, func(r *idempotency.Record) { r.Abandoned = true })
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, c idempotency.Completion) error {
	return s.update(ctx, c.Scope, c.Key, c.Token, func(r *idempotency.Record) {
		r.State = idempotency.StateDone
		r.Abandoned = false
		r.Response = cloneResponse(&c.Response)
		r.ExpiresAt = s.now().Add(c.TTL)
	})
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	return s.update(ctx, scope, key, token, func(*idempotency.Record) { delete(s.records, id{scope, key}) })
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	r, ok := s.records[id{scope, key}]
	if !ok {
		return nil, idempotency.ErrNotFound
	}
	return clone(r), nil
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
		if !r.ExpiresAt.After(now) && (r.State == idempotency.StateDone || !r.LeaseUntil.After(now)) {
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
		if (f.Scope == "" || k.scope == f.Scope) && (f.State == "" || r.State == f.State) && less(after, k) {
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
		page.Records = append(page.Records, *clone(s.records[k]))
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

func clone(r *idempotency.Record) *idempotency.Record {
	c := *r
	c.Response = cloneResponse(r.Response)
	return &c
}

func cloneResponse(r *idempotency.Response) *idempotency.Response {
	if r == nil {
		return nil
	}
	c := *r
	c.Header = r.Header.Clone()
	if c.Header == nil {
		c.Header = http.Header{}
	}
	c.Trailer = r.Trailer.Clone()
	c.Body = slices.Clone(r.Body)
	return &c
}
