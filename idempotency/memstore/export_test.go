package memstore

import (
	"hash/maphash"
	"time"
)

// NewColliding returns a store on clock whose keys all have one hash, so that every
// record but one is in spill: the path that a real collision takes.
func NewColliding(clock func() time.Time) *Store {
	s := NewWithClock(clock)
	s.hash = func(maphash.Seed, string, string) uint64 { return 7 }
	return s
}
