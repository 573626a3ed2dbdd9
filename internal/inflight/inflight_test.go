package inflight_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/internal/inflight"
)

// A request that never settles stops counting once its lease, as last claimed or
// renewed, has run out: the count cannot creep up over a process's life.
func TestEndedLeasesStopCounting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var o inflight.Claims
		o.Claimed(1, time.Minute) // never settles
		o.Claimed(2, time.Minute) // renewed, then never settles
		if n := o.Count(); n != 2 {
			t.Fatalf("%d open, want 2", n)
		}
		time.Sleep(30 * time.Second)
		o.Extended(2, time.Minute)
		o.Extended(3, time.Minute) // never claimed here: not counted
		time.Sleep(31 * time.Second)
		o.Claimed(4, time.Minute)
		if n := o.Count(); n != 2 {
			t.Errorf("%d open once the first lease ran out, want 2 (the renewed one and the new one)", n)
		}
		time.Sleep(61 * time.Second)
		o.Claimed(5, time.Minute)
		o.Settled(5)
		if n := o.Count(); n != 0 {
			t.Errorf("%d open once every lease ran out, want 0", n)
		}
		end := o.Begin()
		if n := o.Count(); n != 1 {
			t.Errorf("%d open during a claim, want 1", n)
		}
		end()
		if n := o.Count(); n != 0 {
			t.Errorf("%d open after the claim, want 0", n)
		}
	})
}
