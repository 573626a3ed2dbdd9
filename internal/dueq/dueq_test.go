package dueq

import (
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fired records when each item's call came, on the bubble's clock.
type fired struct {
	t0 time.Time
	mu sync.Mutex
	at map[string][]time.Duration
}

func (f *fired) fire(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.at[name] = append(f.at[name], time.Since(f.t0))
}

func TestQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fired{t0: time.Now(), at: map[string][]time.Duration{}}
		var q Queue[string]
		q.Init(2*time.Second, f.fire)
		at := func(d time.Duration) {
			time.Sleep(d - time.Since(f.t0))
			synctest.Wait()
		}
		var a, b, c, d, e Item[string]
		q.Push(&a, "a") // due at 2, removed at 1.5
		at(time.Second)
		q.Push(&b, "b") // due at 3: the timer, armed for a, must be armed again for b
		at(1500 * time.Millisecond)
		if !q.Remove(&a) {
			t.Error("Remove of a queued item: false")
		}
		if q.Remove(&a) {
			t.Error("second Remove: true")
		}
		q.Push(&c, "c") // due at 3.5
		at(4 * time.Second)
		if q.Remove(&b) || q.Remove(&c) {
			t.Error("Remove after the call: true")
		}
		q.Push(&b, "b") // pushed again: due at 6
		at(20 * time.Second)
		q.Push(&d, "d") // the queue ran empty at 6: the timer must be armed again
		q.Push(&e, "e") // removed at once
		if !q.Remove(&e) {
			t.Error("Remove of the tail: false")
		}
		at(30 * time.Second)
		if q.Remove(&d) {
			t.Error("Remove after the call: true")
		}
		sec := func(x float64) []time.Duration { return []time.Duration{time.Duration(x * float64(time.Second))} }
		want := map[string][]time.Duration{
			"b": append(sec(3), sec(6)...),
			"c": sec(3.5),
			"d": sec(22),
		}
		for _, name := range []string{"a", "b", "c", "d", "e"} {
			if got := f.at[name]; !slices.Equal(got, want[name]) {
				t.Errorf("%s fired at %v, want %v", name, got, want[name])
			}
		}
		if q.head != nil || q.tail != nil {
			t.Errorf("queue not empty: head %p, tail %p", q.head, q.tail)
		}
	})
}

// Many goroutines push and remove at once, most removing before the due time and some
// not: every item that was not removed fires once, none that was removed does.
func TestQueueConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		fires := map[int]int{}
		var q Queue[int]
		q.Init(time.Second, func(i int) {
			mu.Lock()
			fires[i]++
			mu.Unlock()
		})
		const workers, each = 8, 200
		items := make([]Item[int], workers*each)
		removed := make([]bool, len(items))
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for j := range each {
					i := w*each + j
					q.Push(&items[i], i)
					time.Sleep(time.Duration(j%7) * 200 * time.Millisecond)
					if j%5 != 0 {
						removed[i] = q.Remove(&items[i])
					}
				}
			})
		}
		wg.Wait()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		for i := range items {
			want := 1
			if removed[i] {
				want = 0
			}
			if fires[i] != want {
				t.Fatalf("item %d (removed: %v) fired %d times", i, removed[i], fires[i])
			}
		}
	})
}
