// Package gcfloor keeps Go's garbage collector from running often while the live heap
// is small.
//
// With GOGC=100 the collector runs each time the heap has grown by as much as was live
// after the last cycle (and at 4 MiB at the least). A proxy's live heap is small, a few
// MiB of buffers and connections, while it allocates tens of KiB per request: at a few
// thousand requests a second it collects twenty times a second, and each cycle's fixed
// work (scanning every goroutine's stack, the globals, sweeping) costs it several
// percent of its CPU. A Floor lets the heap grow by about Floor.Bytes between two
// cycles: after every cycle it sets the collector's percentage (runtime/debug
// SetGCPercent) to whatever puts the next cycle Floor.Bytes above the live heap, or to
// the base percentage when that is later. Once the live heap is Floor.Bytes or more it
// changes nothing; below, the process holds up to Floor.Bytes more memory than it would
// otherwise. It learns that a cycle ended from the cleanup (runtime.AddCleanup) of an
// object it drops after each: the runtime may keep such an object a cycle longer (a
// stack slot scanned conservatively), and the percentage then waits a cycle.
// A soft memory limit (GOMEMLIMIT, runtime/debug.SetMemoryLimit) still wins: the
// collector runs sooner when the heap nears it.
package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// MaxPercent is the highest percentage a Floor sets.
const MaxPercent = 10_000

// minHeap is the runtime's smallest heap goal at GOGC=100: it scales with the
// percentage, like the goal itself (4 MiB × GOGC/100).
const minHeap = 4 << 20

// liveMetric is the heap that the last cycle found live.
const liveMetric = "/gc/heap/live:bytes"

// Percent is the collector's percentage that lets a heap of live bytes grow by about
// floor before the next cycle, and by no less than base percent of it. The runtime's
// goal is the larger of live × (1 + percent/100) and 4 MiB × percent/100, so the
// percentage is floor's share of the live heap or of 4 MiB, whichever is larger: the
// goal is then live + floor, or about floor while less than 4 MiB is live. Before a
// cycle has measured the live heap (live is 0) it is base.
func Percent(live, floor uint64, base int) int {
	if live == 0 {
		return base
	}
	return max(base, int(min(floor*100/max(live, minHeap), MaxPercent)))
}

// Floor keeps the heap's growth between two cycles at least Bytes (see the package
// doc). Start it once; Stop puts the base percentage back.
type Floor struct {
	Bytes uint64

	mu      sync.Mutex
	base    int
	stopped bool
	sample  []metrics.Sample
	tuned   func(percent int) // tests: called with every percentage set
}

// sentinel is allocated and dropped after every cycle: its cleanup runs once the next
// cycle has found it unreachable. It holds a pointer so that it is never part of a tiny
// allocation, whose cleanups may be delayed by its neighbours.
type sentinel struct {
	_ *byte
	_ [16]byte
}

// Start records the percentage in force (GOGC's, 100 by default) as the base and
// tunes the collector after every cycle from now on.
func (f *Floor) Start() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.base = debug.SetGCPercent(100)
	debug.SetGCPercent(f.base)
	if f.base < 0 {
		// GOGC=off: the collector runs only at the memory limit; leave it so.
		f.stopped = true
		return
	}
	f.sample = []metrics.Sample{{Name: liveMetric}}
	f.tune()
}

// Stop ends the tuning and sets the base percentage back.
func (f *Floor) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.stopped = true
	debug.SetGCPercent(f.base)
}

// afterCycle runs on the runtime's cleanup goroutine, after a cycle.
func (f *Floor) afterCycle() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.stopped {
		f.tune()
	}
}

// tune sets the percentage from the live heap the last cycle measured, and arms the
// sentinel that calls it again after the next one. f.mu is held.
func (f *Floor) tune() {
	metrics.Read(f.sample)
	var live uint64
	if v := f.sample[0].Value; v.Kind() == metrics.KindUint64 {
		live = v.Uint64()
	}
	p := Percent(live, f.Bytes, f.base)
	debug.SetGCPercent(p)
	if f.tuned != nil {
		f.tuned(p)
	}
	runtime.AddCleanup(&sentinel{}, (*Floor).afterCycle, f)
}
