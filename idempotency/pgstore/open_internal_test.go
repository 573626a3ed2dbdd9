package pgstore

import (
	"testing"
	"testing/synctest"
	"time"
)

// A request that never settles stops counting once its lease, as last claimed or
// renewed, has run out: the count cannot creep up over a process's life.
func TestOpenClaimsDropEndedLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var o openClaims
		o.claimed(1, time.Minute) // never settles
		o.claimed(2, time.Minute) // renewed, then never settles
		if n := o.count(); n != 2 {
			t.Fatalf("%d open, want 2", n)
		}
		time.Sleep(30 * time.Second)
		o.extended(2, time.Minute)
		o.extended(3, time.Minute) // never claimed here: not counted
		time.Sleep(31 * time.Second)
		o.claimed(4, time.Minute)
		if n := o.count(); n != 2 {
			t.Errorf("%d open once the first lease ran out, want 2 (the renewed one and the new one)", n)
		}
		time.Sleep(61 * time.Second)
		o.claimed(5, time.Minute)
		o.settled(5)
		if n := o.count(); n != 0 {
			t.Errorf("%d open once every lease ran out, want 0", n)
		}
		end := o.begin()
		if n := o.count(); n != 1 {
			t.Errorf("%d open during a claim, want 1", n)
		}
		end()
		if n := o.count(); n != 0 {
			t.Errorf("%d open after the claim, want 0", n)
		}
	})
}
