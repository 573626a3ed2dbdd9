package gcfloor

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		live, floor uint64
		base, want  int
	}{
		{live: 8 * mib, floor: 32 * mib, base: 100, want: 400},
		{live: 2 * mib, floor: 32 * mib, base: 100, want: 800}, // 4 MiB × 800% = 32 MiB
		{live: 6 * mib, floor: 32 * mib, base: 100, want: 533},
		{live: 32 * mib, floor: 32 * mib, base: 100, want: 100},
		{live: 100 * mib, floor: 32 * mib, base: 100, want: 100},
		{live: 100 * mib, floor: 32 * mib, base: 200, want: 200},
		{live: 8 * mib, floor: 32 * mib, base: 800, want: 800},
		{live: 0, floor: 32 * mib, base: 100, want: 100}, // no cycle yet
		{live: 1024, floor: 32 * mib, base: 100, want: 800},
		{live: 4 * mib, floor: 1 << 40, base: 100, want: MaxPercent},
		{live: 3 * mib, floor: 0, base: 100, want: 100},
	} {
		if got := Percent(tc.live, tc.floor, tc.base); got != tc.want {
			t.Errorf("Percent(%d, %d, %d) = %d, want %d", tc.live, tc.floor, tc.base, got, tc.want)
		}
	}
}

// gcPercent reads the collector's percentage.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

// TestFloorTunesAfterEveryCycle checks that the percentage follows the live heap cycle
// after cycle (a test binary's live heap is far under 1 GiB), and that Stop puts GOGC's
// back.
func TestFloorTunesAfterEveryCycle(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	debug.SetGCPercent(150)
	runtime.GC() // a live heap measured

	tuned := make(chan int, 64)
	f := &Floor{Bytes: 1 << 30, tuned: func(p int) {
		select {
		case tuned <- p:
		default:
		}
	}}
	f.Start()
	first := <-tuned // Start tunes at once
	if first <= 150 {
		t.Fatalf("at start: percent %d, want above the base 150 for a heap under the floor", first)
	}
	// Each cycle's cleanup tunes again and re-arms: three more tunings. A sentinel may
	// outlive a cycle (a stack slot scanned conservatively keeps it), so cycles run
	// until its cleanup has.
	for i := range 3 {
		p := cycleUntil(tuned)
		if p <= 150 {
			t.Fatalf("tuning %d: percent %d, want above the base", i+1, p)
		}
		if got := gcPercent(); got <= 150 {
			t.Fatalf("tuning %d: the collector's percent is %d, want the tuned one, above the base", i+1, got)
		}
	}
	f.Stop()
	if got := gcPercent(); got != 150 {
		t.Fatalf("after Stop: percent %d, want the base 150", got)
	}
	// A cycle after Stop changes nothing.
	runtime.GC()
	runtime.GC()
	if got := gcPercent(); got != 150 {
		t.Fatalf("cycles after Stop: percent %d, want the base 150", got)
	}
}

// cycleUntil runs collections until a tuning is reported, and returns it.
func cycleUntil(tuned <-chan int) int {
	for {
		runtime.GC()
		select {
		case p := <-tuned:
			return p
		default:
			runtime.Gosched()
		}
	}
}

// TestFloorLeavesGOGCOff checks that a collector turned off stays off.
func TestFloorLeavesGOGCOff(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	f := &Floor{Bytes: 1 << 30}
	f.Start()
	runtime.GC()
	if got := gcPercent(); got != -1 {
		t.Fatalf("percent %d, want -1 (off)", got)
	}
	f.Stop()
	if got := gcPercent(); got != -1 {
		t.Fatalf("after Stop: percent %d, want -1 (off)", got)
	}
}
