// Package memstore is an in-process idempotency.Store: the reference implementation of
// the store contract, and the store for tests and examples.
//
// Records live in byte slabs, indexed by a 64-bit hash of their scope and key, all
// guarded by one mutex, so every operation is atomic. Nothing the store holds per
// record has a pointer, so a store of many records gives the garbage collector a few
// hundred slabs to mark and nothing to scan (arena). Nothing survives the process: use
// it where losing every key on a restart is acceptable (tests, single-process tools),
// never in front of payments. Fencing tokens come from one counter per Store, so they
// are never reused, even after Delete or expiry. Inspect (idempotency.Inspector) says
// so as a warning, for `retrysafe doctor` and the gateway's start.
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
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
// A key's record is filed under a handle, in index under the hash of its scope and
// key, unless another key with the same hash held that entry when the record was first
// filed: then it is in spill, and stays there. A key is never in both. The hash is
// seeded per Store, so a collision is a matter of chance (about one in 2⁶⁴ per pair of
// keys) that no client can aim at; spill makes it harmless.
//
// The handle is the record's place in refs, which says where in the arena the record
// is. It stays the key's while the key is filed: a record written again (a completion,
// a compaction) changes its entry in refs, not the maps. With hundreds of thousands of
// keys the maps' memory is mostly out of the processor's caches, and each lookup costs
// misses; a completion, an extension or a release of a recent claim finds its handle in
// recent, by its token, and touches neither map.
type Store struct {
	now    func() time.Time
	base   time.Time // the clock's reading at New: records hold times as offsets from it
	seed   maphash.Seed
	hash   func(seed maphash.Seed, scope, key string) uint64 // hashID; a test's to force collisions
	mu     sync.Mutex
	index  map[uint64]handle
	spill  map[id]handle
	refs   []ref    // by handle: where its record is; noRef for a free handle
	free   []handle // handles to reuse
	recent [recentClaims]recentClaim
	arena  arena
	token  int64
	closed bool
	// soonest is at or before the expiry (an offset) of every record filed: every write
	// of an expiry lowers it to that expiry, and a sweep that went through every record
	// sets it to the soonest of those it left. Until then no record can be swept, and
	// DeleteExpired does not walk them all under the lock to find that out.
	soonest int64
}

// handle is a filed record's place in Store.refs.
type handle uint32

// noRef is the entry in refs of a free handle.
const noRef = ^ref(0)

// recentClaims is how many of the latest claims recent holds: far more than a process
// has requests in flight, so that a completion nearly always finds its claim there.
const recentClaims = 1024

// recentClaim is the handle and slot of the claim made with token: an entry of
// Store.recent, at token modulo its length. An entry is a hint: its record is checked
// to be the key's, under that token, before it is used.
type recentClaim struct {
	token int64
	hd    handle
	slot  slot
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
// from clock. Tests use it to move time on. Without one (nil) the store reads the
// process's monotonic clock, from its wall-clock reading at New: half the cost of
// time.Now, and a step of the wall clock moves no lease and no expiry.
func NewWithClock(clock func() time.Time) *Store {
	if clock == nil {
		base := time.Now()
		clock = func() time.Time { return base.Add(time.Since(base)) }
	}
	return &Store{now: clock, base: clock(), seed: maphash.MakeSeed(), hash: hashID,
		index: make(map[uint64]handle), spill: make(map[id]handle), soonest: math.MaxInt64}
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

// found is a key's record as find returns it: where it is filed, its handle, where it
// is in the arena, and its bytes.
type found struct {
	slot
	hd handle
	at ref
	r  record
}

// find returns the record of (scope, key), if there is one.
func (s *Store) find(scope, key string) (found, bool) {
	h := s.hash(s.seed, scope, key)
	hd, taken := s.index[h]
	if taken {
		at := s.refs[hd]
		if r := s.arena.get(at); r.is(scope, key) {
			return found{slot{h: h}, hd, at, r}, true
		}
	}
	if len(s.spill) > 0 {
		if hd, ok := s.spill[id{scope, key}]; ok {
			at := s.refs[hd]
			return found{slot{h: h, spill: true}, hd, at, s.arena.get(at)}, true
		}
	}
	return found{slot: slot{h: h, spill: taken}}, false
}

// findClaimed returns the record of (scope, key) if it is the claim made with token:
// from recent when that claim is there, else as find does. The record is checked to
// be the key's and to hold token, so a hint whose handle has since gone to another key,
// or to a later claim of the same key, is not used.
func (s *Store) findClaimed(scope, key string, token int64) (found, bool) {
	if e := &s.recent[uint64(token)%recentClaims]; e.token == token && e.token != 0 {
		if at := s.refs[e.hd]; at != noRef {
			if r := s.arena.get(at); r.token() == token && r.is(scope, key) {
				return found{e.slot, e.hd, at, r}, true
			}
		}
	}
	return s.find(scope, key)
}

// file files at, the record of (scope, key), under a new handle in sl, the slot find
// gave for the key under the same hold of the lock, and returns the handle.
func (s *Store) file(sl slot, scope, key string, at ref) handle {
	var hd handle
	if n := len(s.free); n > 0 {
		hd, s.free = s.free[n-1], s.free[:n-1]
		s.refs[hd] = at
	} else {
		hd = handle(len(s.refs))
		s.refs = append(s.refs, at)
	}
	if sl.spill {
		s.spill[id{scope, key}] = hd
	} else {
		s.index[sl.h] = hd
	}
	return hd
}

// refile files at as f's record, in place of f's: a record written again.
func (s *Store) refile(f found, at ref) { s.refs[f.hd] = at }

// unfile deletes f, the record of (scope, key), from its slot, frees its handle and
// frees its bytes.
func (s *Store) unfile(f found, scope, key string) {
	if f.spill {
		delete(s.spill, id{scope, key})
	} else {
		delete(s.index, f.h)
	}
	s.dropHandle(f.hd)
	s.arena.release(f.at)
}

// dropHandle frees hd.
func (s *Store) dropHandle(hd handle) {
	s.refs[hd] = noRef
	s.free = append(s.free, hd)
}

// compact compacts or drops the slabs this operation left mostly dead: it copies each
// one's filed records to the current slab, files them there, and drops the slab.
// Every operation that frees a record calls it before it lets the lock go.
func (s *Store) compact() {
	a := &s.arena
	for len(a.pending) > 0 {
		i := a.pending[len(a.pending)-1]
		a.pending = a.pending[:len(a.pending)-1]
		a.slabs[i].pending = false
		if a.current(i) {
			continue // never queued (check), and its room is still to be filled
		}
		buf := a.slabs[i].buf
		for off := 0; off < len(buf) && a.slabs[i].live > 0; {
			at := makeRef(i, off)
			r := a.get(at)
			off += lenSize + len(r)
			v := r.view()
			f, ok := s.find(string(v.scope), string(v.key))
			if !ok || f.at != at {
				continue // freed
			}
			moved, room := a.reserve(len(r), kindOf(r))
			a.seal(moved, append(room, r...))
			s.refile(f, moved)
			a.slabs[i].live -= lenSize + len(r)
		}
		a.drop(i)
	}
}

// Close makes every later call fail with idempotency.ErrClosed and drops the records.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.index, s.spill, s.refs, s.free, s.arena = nil, nil, nil, nil, arena{}
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
	f, ok := s.find(req.Scope, req.Key)
	old := f.r
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
	nf := fields{scope: req.Scope, key: req.Key, fingerprint: req.Fingerprint, route: req.Route, claimID: req.ID,
		token: s.token, created: t, lease: s.offset(now.Add(req.Lease)), expires: s.offset(now.Add(req.TTL))}
	if takeover {
		nf.created = old.created()
	}
	s.soonest = min(s.soonest, nf.expires)
	at, room := s.arena.reserve(recordSize(&nf), claimKind)
	s.arena.seal(at, appendRecord(room, &nf))
	hd := f.hd
	if ok {
		s.refile(f, at)
		s.arena.release(f.at)
	} else {
		hd = s.file(f.slot, req.Scope, req.Key, at)
	}
	s.recent[uint64(s.token)%recentClaims] = recentClaim{token: s.token, hd: hd, slot: f.slot}
	s.compact()
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
func (s *Store) update(ctx context.Context, scope, key string, token int64, again bool, fn func(f found)) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	f, ok := s.findClaimed(scope, key, token)
	switch {
	case !ok:
		return idempotency.ErrRecordGone
	case f.r.token() != token:
		return idempotency.ErrLeaseLost
	case f.r.done() && again:
		return nil
	case f.r.done():
		return idempotency.ErrLeaseLost
	}
	fn(f)
	s.compact()
	return nil
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error {
	return s.update(ctx, scope, key, token, false, func(f found) {
		until := s.offset(s.now().Add(lease))
		f.r.setLeaseUntil(until)
		if f.r.expires() < until {
			f.r.setExpires(until) // later than before: soonest still holds
		}
	})
}

// Abandon implements idempotency.Store.
func (s *Store) Abandon(ctx context.Context, scope, key string, token int64) error {
	return s.update(ctx, scope, key, token, false, func(f found) { f.r.setAbandoned() })
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, c idempotency.Completion) error {
	// A completion sent again finds its record done: this store's writes are final when
	// they return, so there is nothing to write again.
	return s.update(ctx, c.Scope, c.Key, c.Token, true, func(f found) {
		v := f.r.view()
		expires := s.offset(s.now().Add(c.TTL))
		s.soonest = min(s.soonest, expires)
		at, room := s.arena.reserve(f.r.completedSize(v, &c.Response), settledKind)
		s.arena.seal(at, f.r.appendCompleted(room, v, &c.Response, expires))
		s.refile(f, at)
		s.arena.release(f.at)
	})
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	return s.update(ctx, scope, key, token, false, func(f found) { s.unfile(f, scope, key) })
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	f, ok := s.find(scope, key)
	if !ok {
		return nil, idempotency.ErrNotFound
	}
	return s.export(f.r, f.r.view(), scope, key, true), nil
}

// Delete implements idempotency.Store.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if f, ok := s.find(scope, key); ok {
		s.unfile(f, scope, key)
		s.compact()
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
	if t < s.soonest {
		return 0, nil
	}
	defer s.compact()
	// left is the soonest expiry of the records the sweep leaves.
	left := int64(math.MaxInt64)
	gone := func(at ref) bool {
		r := s.arena.get(at)
		if r.expires() <= t && (r.done() || r.leaseUntil() <= t) {
			return true
		}
		left = min(left, r.expires())
		return false
	}
	n := 0
	for k, hd := range s.spill {
		if n >= limit {
			return n, nil
		}
		if at := s.refs[hd]; gone(at) {
			delete(s.spill, k)
			s.dropHandle(hd)
			s.arena.release(at)
			n++
		}
	}
	for h, hd := range s.index {
		if n >= limit {
			return n, nil
		}
		if at := s.refs[hd]; gone(at) {
			delete(s.index, h)
			s.dropHandle(hd)
			s.arena.release(at)
			n++
		}
	}
	s.soonest = left // every record was seen
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
	var matches []listed
	add := func(r record) {
		v := r.view()
		k := id{string(v.scope), string(v.key)}
		if (f.Scope == "" || k.scope == f.Scope) && (f.State == "" || r.state() == f.State) &&
			(f.Route == "" || string(v.route) == f.Route) && less(after, k) {
			matches = append(matches, listed{k, r, v})
		}
	}
	for _, hd := range s.index {
		add(s.arena.get(s.refs[hd]))
	}
	for _, hd := range s.spill {
		add(s.arena.get(s.refs[hd]))
	}
	slices.SortFunc(matches, func(a, b listed) int {
		if c := strings.Compare(a.scope, b.scope); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	var page idempotency.ListPage
	for i, l := range matches {
		if i == limit {
			last := matches[i-1]
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
