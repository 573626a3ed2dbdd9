package memstore

import (
	"encoding/binary"
	"unsafe"
)

// arena holds the store's records in large byte slabs, and the store's maps hold each
// record's place in them (a ref), an integer. Nothing the store keeps per record then
// holds a pointer: a garbage collection marks the slabs, a few hundred objects, and
// neither scans the maps nor marks a million records one by one. That work would grow
// with the records held and fall on every request the process serves, since every
// collection its allocations start repeats it.
//
// A record is appended to the current slab of its kind, after an 8-byte length. Its
// bytes never move while it is filed, except when its slab is compacted
// (Store.compact), which files it again under its new ref. A record written again (a
// completion) is a new record, and the old one is freed: its bytes stay where they
// are, counted as dead. A slab other than a current one whose live bytes fall under
// half its length is compacted: its live records are copied to the current slabs of
// their kinds and the slab is dropped, so the slabs hold at most about twice the live
// records' bytes, plus the current slabs. A record too large to share a slab (over
// bigRecord) gets a slab of its own, dropped when it is freed.
//
// The two kinds of record are those of keys in progress and those of settled keys, in
// slabs of their own. A key is claimed, then settled within its request, so nearly all
// of a claims slab is dead by the time the next takes its place: it is compacted then
// (its few claims still in progress copied), and its buffer taken by a later claims
// slab. The settled records are packed with no dead claims between them. Were the two
// kinds to share slabs, each settled key's dead claim would hold about a third of its
// bytes until the key expired: that much more new memory per key, which the process
// must fault in and the collector's heap goal counts twice.
type arena struct {
	slabs   []slab
	free    []uint32      // numbers of dropped slabs, for reuse
	pending []uint32      // slabs to compact or drop at the end of the operation
	cur     [kinds]uint32 // the slab records of each kind are appended to; valid when hasCur
	hasCur  [kinds]bool
	spare   [][]byte // buffers of dropped slabs of slabSize, for new slabs: at most maxSpare
}

// kind is a record's kind, by how long it lives: see arena.
type kind int

const (
	settledKind kind = iota // done: kept until it expires or is deleted
	claimKind               // in progress: most are written again as done within a request
	kinds
)

// kindOf returns r's kind.
func kindOf(r record) kind {
	if r[offState] == stateInProgress {
		return claimKind
	}
	return settledKind
}

// maxSpare is how many dropped slabs' buffers the arena keeps for new slabs: enough
// for the claims slab, compacted and dropped each time another takes its place, to
// hand its buffer on to the next.
const maxSpare = 1

type slab struct {
	buf     []byte // records, each after its length; cap: slabSize, or one big record's size
	live    int    // bytes of the filed records, their lengths included
	pending bool   // in arena.pending
}

// ref is where a record is: its slab's number in the high 32 bits, the offset of its
// length in the low.
type ref uint64

const (
	slabSize  = 256 << 10
	bigRecord = slabSize / 4
	lenSize   = 8
)

func makeRef(slab uint32, off int) ref { return ref(uint64(slab)<<32 | uint64(uint32(off))) }
func (r ref) slab() uint32             { return uint32(r >> 32) }
func (r ref) off() int                 { return int(uint32(r)) }

// get returns the record at r: a part of its slab, which the store's writes under the
// same hold of its lock change in place.
func (a *arena) get(r ref) record {
	buf := a.slabs[r.slab()].buf
	off := r.off()
	n := int(binary.LittleEndian.Uint64(buf[off:]))
	return record(buf[off+lenSize : off+lenSize+n : off+lenSize+n])
}

// reserve returns the ref of a new record of at most n bytes and the room to append
// it to: an empty slice of capacity n in its slab. seal files what was appended; no
// other reserve may come between the two.
func (a *arena) reserve(n int, k kind) (ref, []byte) {
	var i uint32
	switch {
	case n > bigRecord:
		i = a.newSlab(lenSize + n)
	case !a.hasCur[k] || cap(a.slabs[a.cur[k]].buf)-len(a.slabs[a.cur[k]].buf) < lenSize+n:
		old, had := a.cur[k], a.hasCur[k]
		a.cur[k], a.hasCur[k] = a.newSlab(slabSize), true
		if had {
			a.check(old) // no longer current: it may be mostly dead already
		}
		i = a.cur[k]
	default:
		i = a.cur[k]
	}
	buf := a.slabs[i].buf
	off := len(buf)
	return makeRef(i, off), buf[off+lenSize : off+lenSize : off+lenSize+n]
}

// seal files b, the record appended to what reserve gave for r, in r's slab.
func (a *arena) seal(r ref, b []byte) {
	s := &a.slabs[r.slab()]
	off := r.off()
	room := s.buf[off+lenSize : off+lenSize+1]
	if len(b) == 0 || unsafe.SliceData(b) != unsafe.SliceData(room) {
		panic("memstore: a record outgrew the room reserved for it")
	}
	binary.LittleEndian.PutUint64(s.buf[off:off+lenSize], uint64(len(b)))
	s.buf = s.buf[:off+lenSize+len(b)]
	s.live += lenSize + len(b)
}

// release counts the record at r as dead; its slab is compacted or dropped at the end
// of the operation when it is mostly dead.
func (a *arena) release(r ref) {
	i := r.slab()
	s := &a.slabs[i]
	s.live -= lenSize + int(binary.LittleEndian.Uint64(s.buf[r.off():]))
	a.check(i)
}

// check queues slab i for compaction when it is not a current slab and less than
// half of it is live.
func (a *arena) check(i uint32) {
	s := &a.slabs[i]
	if s.pending || a.current(i) || s.live*2 >= len(s.buf) {
		return
	}
	s.pending = true
	a.pending = append(a.pending, i)
}

// current reports whether slab i is the current slab of a kind.
func (a *arena) current(i uint32) bool {
	for k := range kinds {
		if a.hasCur[k] && a.cur[k] == i {
			return true
		}
	}
	return false
}

// newSlab returns the number of a new, empty slab of capacity size.
func (a *arena) newSlab(size int) uint32 {
	var buf []byte
	if n := len(a.spare); n > 0 && size == slabSize {
		buf, a.spare = a.spare[n-1], a.spare[:n-1]
	} else {
		buf = make([]byte, 0, size)
	}
	if n := len(a.free); n > 0 {
		i := a.free[n-1]
		a.free = a.free[:n-1]
		a.slabs[i] = slab{buf: buf}
		return i
	}
	a.slabs = append(a.slabs, slab{buf: buf})
	return uint32(len(a.slabs) - 1)
}

// drop frees slab i, none of whose records is filed any more.
func (a *arena) drop(i uint32) {
	// Nothing outside the store's lock holds a record's bytes (what it returns is
	// copied), so the buffer can take new records.
	if buf := a.slabs[i].buf; cap(buf) == slabSize && len(a.spare) < maxSpare {
		a.spare = append(a.spare, buf[:0])
	}
	a.slabs[i] = slab{}
	a.free = append(a.free, i)
}

// bytes returns the capacity of the slabs held and of the spare buffers, for tests.
func (a *arena) bytes() int {
	n := 0
	for _, s := range a.slabs {
		n += cap(s.buf)
	}
	for _, b := range a.spare {
		n += cap(b)
	}
	return n
}
