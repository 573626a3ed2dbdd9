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
// A record is appended to the current slab, after an 8-byte length. Its bytes never
// move while it is filed, except when its slab is compacted (Store.compact), which
// files it again under its new ref. A record written again (a completion) is a new
// record, and the old one is freed: its bytes stay where they are, counted as dead.
// A slab other than the current one whose live bytes fall under half its length is
// compacted: its live records are copied to the current slab and the slab is dropped,
// so the slabs hold at most about twice the live records' bytes, plus the current
// slab. A record too large to share a slab (over bigRecord) gets a slab of its own,
// dropped when it is freed.
type arena struct {
	slabs   []slab
	free    []uint32 // numbers of dropped slabs, for reuse
	pending []uint32 // slabs to compact or drop at the end of the operation
	cur     uint32   // the slab records are appended to; valid when hasCur
	hasCur  bool
}

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
func (a *arena) reserve(n int) (ref, []byte) {
	var i uint32
	switch {
	case n > bigRecord:
		i = a.newSlab(lenSize + n)
	case !a.hasCur || cap(a.slabs[a.cur].buf)-len(a.slabs[a.cur].buf) < lenSize+n:
		if a.hasCur {
			a.check(a.cur) // no longer current: it may be mostly dead already
		}
		a.cur, a.hasCur = a.newSlab(slabSize), true
		i = a.cur
	default:
		i = a.cur
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

// check queues slab i for compaction when it is not the current slab and less than
// half of it is live.
func (a *arena) check(i uint32) {
	s := &a.slabs[i]
	if s.pending || (a.hasCur && i == a.cur) || s.live*2 >= len(s.buf) {
		return
	}
	s.pending = true
	a.pending = append(a.pending, i)
}

// newSlab returns the number of a new, empty slab of capacity size.
func (a *arena) newSlab(size int) uint32 {
	buf := make([]byte, 0, size)
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
	a.slabs[i] = slab{}
	a.free = append(a.free, i)
}

// bytes returns the capacity of the slabs held, for tests.
func (a *arena) bytes() int {
	n := 0
	for _, s := range a.slabs {
		n += cap(s.buf)
	}
	return n
}
