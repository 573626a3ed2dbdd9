package gateway

import (
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// TestSeriesMadeOnce: however many requests ask for a label value at once, its series
// is made once, and every one of them gets that one.
func TestSeriesMadeOnce(t *testing.T) {
	t.Parallel()
	var made [8]atomic.Int32
	s := series[*int]{make: func(v string) *int {
		i, err := strconv.Atoi(v)
		if err != nil {
			t.Errorf("made for %q", v)
			return nil
		}
		made[i].Add(1)
		// Yield while the series is made, so that the other callers asking for it
		// meanwhile reach the cache's lock before it is added.
		for range 50 {
			runtime.Gosched()
		}
		return new(int)
	}}
	const callers = 16
	got := make([][len(made)]*int, callers)
	var start, wg sync.WaitGroup
	start.Add(1)
	for c := range callers {
		wg.Go(func() {
			start.Wait()
			for k := range len(made) * 4 {
				i := (k + c) % len(made)
				p := s.of(strconv.Itoa(i))
				if got[c][i] == nil {
					got[c][i] = p
				} else if got[c][i] != p {
					t.Errorf("caller %d: value %d gave two different series", c, i)
				}
			}
		})
	}
	start.Done()
	wg.Wait()
	for i := range made {
		if n := made[i].Load(); n != 1 {
			t.Errorf("value %d: made %d times, want 1", i, n)
		}
		for c := 1; c < callers; c++ {
			if got[c][i] != got[0][i] {
				t.Errorf("value %d: callers 0 and %d got different series", i, c)
			}
		}
	}
}
