// Package memstore is an in-process idempotency.Store: the reference implementation of
// the store contract, and the store for tests and examples.
//
// Records live in a map guarded by one mutex, so every operation is atomic. Each
// record is one byte slice without pointers, indexed by a 64-bit hash of its scope and
// key, so that a store of many records gives the garbage collector one mark per
// record and nothing to scan (record). Nothing survives the process: use it where
// losing every key on a restart is acceptable (tests, single-process tools), never in
// front of payments. Fencing tokens come from one counter per Store, so they are never
// reused, even after Delete or expiry. Inspect (idempotency.Inspector) says so as a
// warning, for `retrysafe doctor` and the gateway's start.
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/listcursor"
)

type id struct{ scope, key string }

// Store is an in-memory idempotency.Store. The zero value is not usable; call New.
//
// A record is in index under the hash of its scope and key, unless another key with
// the same hash held that entry when the record was first filed: then it is in spill,
// and stays there. A key is never in both. The hash is seeded per Store, so a
// collision is a matter of chance (about one in 2⁶⁴ per pair of keys) that no client
// can aim at; spill makes it harmless.
type Store struct {
	now    func() time.Time
	base   time.Time // the clock's reading at New: records hold times as offsets from it
	seed   maphash.Seed
	hash   func(seed maphash.Seed, scope, key string) uint64 // hashID; a test's to force collisions
	mu     sync.Mutex
	index  map[uint64]record
	spill  map[id]record
	token  int64
	closed bool
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
	return &Store{now: clock, base: clock(), seed: maphash.MakeSeed(), hash: hashID,
		index: make(map[uint64]record), spill: make(map[id]record)}
}

// hashID hashes a scope and a key: the key's hash, and the scope's turned by half a
// word, so that the pairs (a, b) and (b, a) differ.
func hashID(seed maphash.Seed, scope, key string) uint64 {
	return maphash.String(seed, key) ^ bits.RotateLeft64(maphash.String(seed, scope), 32)
}

// offset returns t as a record holds it: its offset from the base time. Both readings
// of the process clock carry the monotonic clock, so a step of the wall clock moves no
// lease or expiry.
func (s *Store) offset(t time.Time) int64 { return int64(t.Sub(s.base)) }

// at returns the time that the offset off stands for.
func (s *Store) at(off int64) time.Time { return s.base.Add(time.Duration(off)) }

// slot is where a key's record is filed, or is to be: under its hash in index, or in
// spill when another key's record holds that entry.
type slot struct {
	h     uint64
	spill bool
}

// find returns the record of (scope, key), if there is one, and its slot.
func (s *Store) find(scope, key string) (slot, record, bool) {
	h := s.hash(s.seed, scope, key)
	r, taken := s.index[h]
	if taken && r.is(scope, key) {
		return slot{h: h}, r, true
	}
	if len(s.spill) > 0 {
		if r, ok := s.spill[id{scope, key}]; ok {
			return slot{h: h, spill: true}, r, true
		}
	}
	return slot{h: h, spill: taken}, nil, false
}

// set files r, the record of (scope, key), in sl, the slot find gave for the key
// under the same hold of the lock.
func (s *Store) set(sl slot, scope, key string, r record) {
	if sl.spill {
		s.spill[id{scope, key}] = r
	} else {
		s.index[sl.h] = r
	}
}

// unset deletes the record of (scope, key) from sl, its slot.
func (s *Store) unset(sl slot, scope, key string) {
	if sl.spill {
		delete(s.spill, id{scope, key})
	} else {
		delete(s.index, sl.h)
	}
}

// Close makes every later call fail with idempotency.ErrClosed and drops the records.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.index, s.spill = nil, nil
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
	t := s.offset(now)
	sl, old, ok := s.find(req.Scope, req.Key)
	takeover := false
	if ok {
		v := old.view()
		expired := old.expires() <= t
		switch {
		case !old.done() && req.ID != "" && string(v.claimID) == req.ID:
			return idempotency.ClaimResult{Claimed: true, Token: old.token(), Now: now}, nil
		case old.done() && expired:
			// replaced by a fresh claim
		case !old.done() && old.leaseUntil() <= t && req.MayTakeOver(now) &&
			(expired || string(v.fingerprint) == req.Fingerprint):
			takeover = !expired // an expired one is replaced by a fresh claim
		default:
			// The response only for a replay.
			replay := old.done() && string(v.fingerprint) == req.Fingerprint
			rec := s.export(old, v, req.Scope, req.Key, replay)
			rec.Fingerprint = text(v.fingerprint, req.Fingerprint)
			rec.Route = text(v.route, req.Route)
			return idempotency.ClaimResult{Existing: rec, Now: now}, nil
		}
	}
	s.token++
	f := fields{scope: req.Scope, key: req.Key, fingerprint: req.Fingerprint, route: req.Route, claimID: req.ID,
		token: s.token, created: t, lease: s.offset(now.Add(req.Lease)), expires: s.offset(now.Add(req.TTL))}
	if takeover {
		f.created = old.created()
	}
	s.set(sl, req.Scope, req.Key, newRecord(&f))
	return idempotency.ClaimResult{Claimed: true, Token: s.token, TookOver: takeover, Now: now}, nil
}

// export returns the Record of r, the record of (scope, key), whose strings are v, with
// its response when withResponse.
func (s *Store) export(r record, v view, scope, key string, withResponse bool) *idempotency.Record {
	rec := &idempotency.Record{Scope: scope, Key: key, Fingerprint: string(v.fingerprint), Route: string(v.route),
		State: r.state(), Token: r.token(), Abandoned: r.abandoned(), CreatedAt: s.at(r.created()),
		LeaseUntil: s.at(r.leaseUntil()), ExpiresAt: s.at(r.expires())}
	if withResponse {
		rec.Response = r.response(v)
	}
	return rec
}

// update runs fn, under the store's lock, on the in-progress record owned by token, or
// returns ErrRecordGone when the record is absent, and ErrLeaseLost when it has another
// token or is done (but done under token with again: then nil, and fn does not run).
func (s *Store) update(ctx context.Context, scope, key string, token int64, again bool, fn func(sl slot, r record)) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	sl, r, ok := s.find(scope, key)
	switch {
	case !ok:
		return idempotency.ErrRecordGone
	case r.token() != token:
		return idempotency.ErrLeaseLost
	case r.done() && again:
		return nil
	case r.done():
		return idempotency.ErrLeaseLost
	}
	fn(sl, r)
	return nil
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error {
	return s.update(ctx, scope, key, token, false, func(_ slot, r record) {
		until := s.offset(s.now().Add(lease))
		r.setLeaseUntil(until)
		if r.expires() < until {
			r.setExpires(until)
		}
	})
}

// Abandon implements idempotency.Store.
func (s *Store) Abandon(ctx context.Context, scope, key string, token int64) error {
	return s.update(ctx, scope, key, token, false, func(_ slot, r record) { r.setAbandoned() })
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, c idempotency.Completion) error {
	// A completion sent again finds its record done: this store's writes are final when
	// they return, so there is nothing to write again.
	return s.update(ctx, c.Scope, c.Key, c.Token, true, func(sl slot, r record) {
		s.set(sl, c.Scope, c.Key, r.completed(&c.Response, s.offset(s.now().Add(c.TTL))))
	})
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	return s.update(ctx, scope, key, token, false, func(sl slot, _ record) { s.unset(sl, scope, key) })
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	_, r, ok := s.find(scope, key)
	if !ok {
		return nil, idempotency.ErrNotFound
	}
	return s.export(r, r.view(), scope, key, true), nil
}

// Delete implements idempotency.Store.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if sl, _, ok := s.find(scope, key); ok {
		s.unset(sl, scope, key)
	}
	return nil
}

// DeleteExpired implements idempotency.Janitor.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	t := s.offset(s.now())
	gone := func(r record) bool { return r.expires() <= t && (r.done() || r.leaseUntil() <= t) }
	n := 0
	for k, r := range s.spill {
		if n >= limit {
			return n, nil
		}
		if gone(r) {
			delete(s.spill, k)
			n++
		}
	}
	for h, r := range s.index {
		if n >= limit {
			break
		}
		if gone(r) {
			delete(s.index, h)
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
	type listed struct {
		id
		r record
		v view
	}
	var found []listed
	add := func(r record) {
		v := r.view()
		k := id{string(v.scope), string(v.key)}
		if (f.Scope == "" || k.scope == f.Scope) && (f.State == "" || r.state() == f.State) &&
			(f.Route == "" || string(v.route) == f.Route) && less(after, k) {
			found = append(found, listed{k, r, v})
		}
	}
	for _, r := range s.index {
		add(r)
	}
	for _, r := range s.spill {
		add(r)
	}
	slices.SortFunc(found, func(a, b listed) int {
		if c := strings.Compare(a.scope, b.scope); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	var page idempotency.ListPage
	for i, l := range found {
		if i == limit {
			last := found[i-1]
			page.Next = listcursor.Encode(last.scope, last.key)
			break
		}
		page.Records = append(page.Records, *s.export(l.r, l.v, l.scope, l.key, true))
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
