package sqlitestore

import (
	"hash/maphash"
	"sync/atomic"
)

// seenSlots is how many keys a Store remembers having met: 512 KiB per Store.
const seenSlots = 1 << 16

// seenKeys remembers, approximately, which (scope, key) pairs a Store's claims have met:
// a direct-mapped table of 64-bit hashes, where a key displaces whichever key shares its
// slot. It answers "met recently" or "not known"; a wrong "met" (two pairs with one
// hash) costs that claim one read. Its memory is fixed whatever the keys. It is a hint
// for where a claim reads first, never a decision: see Store.Claim.
type seenKeys struct {
	seed  maphash.Seed
	slots []atomic.Uint64
}

func newSeenKeys() *seenKeys {
	return &seenKeys{seed: maphash.MakeSeed(), slots: make([]atomic.Uint64, seenSlots)}
}

// hash is the pair's hash, never 0 (the empty slot).
func (k *seenKeys) hash(scope, key string) uint64 {
	var h maphash.Hash
	h.SetSeed(k.seed)
	_, _ = h.WriteString(scope)
	_ = h.WriteByte(0)
	_, _ = h.WriteString(key)
	return max(h.Sum64(), 1)
}

// met reports whether the pair was added and has not been displaced since.
func (k *seenKeys) met(scope, key string) bool {
	h := k.hash(scope, key)
	return k.slots[h%seenSlots].Load() == h
}

// add remembers the pair.
func (k *seenKeys) add(scope, key string) {
	h := k.hash(scope, key)
	k.slots[h%seenSlots].Store(h)
}
