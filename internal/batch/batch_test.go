package batch_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/internal/batch"
)

type item struct {
	batch.Call
	id     string
	result string
}

func (i *item) ID() string { return i.id }

// recorder is a Run that records its batches and answers each call with its ID
// upper-cased; block, when not nil, holds every batch until it is closed.
type recorder struct {
	mu      sync.Mutex
	batches [][]string
	block   chan struct{}
	running int
	most    int
}

func (r *recorder) run(calls []*item) {
	r.mu.Lock()
	ids := make([]string, len(calls))
	for i, c := range calls {
		ids[i] = c.id
	}
	r.batches = append(r.batches, ids)
	r.running++
	r.most = max(r.most, r.running)
	r.mu.Unlock()
	if r.block != nil {
		<-r.block
	}
	for _, c := range calls {
		c.result = strings.ToUpper(c.id)
	}
	r.mu.Lock()
	r.running--
	r.mu.Unlock()
}

func TestLoneCallRunsAtOnce(t *testing.T) {
	var r recorder
	g := &batch.Group[*item]{Run: r.run}
	c := &item{id: "a"}
	if err := g.Do(t.Context(), c); err != nil || c.result != "A" {
		t.Fatalf("Do = %v, result %q", err, c.result)
	}
	if len(r.batches) != 1 {
		t.Errorf("batches %v", r.batches)
	}
}

// While the slots are busy, calls gather; they run together next, sorted, with no ID
// twice in one batch, and each gets its own result.
func TestCallsGatherWhileBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := recorder{block: make(chan struct{})}
		g := &batch.Group[*item]{Run: r.run, InFlight: 1, Max: 4}
		var wg sync.WaitGroup
		first := &item{id: "first"}
		wg.Go(func() { _ = g.Do(t.Context(), first) })
		settled(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.batches) == 1 })

		ids := []string{"e", "d", "c", "b", "a", "c"} // 6 calls: "c" twice, Max 4
		calls := make([]*item, len(ids))
		for i, id := range ids {
			calls[i] = &item{id: id}
			wg.Go(func() {
				if err := g.Do(t.Context(), calls[i]); err != nil {
					t.Error(err)
				}
			})
		}
		settled(t, func() bool { return g.Pending() == len(ids) })
		close(r.block)
		wg.Wait()
		for _, c := range append(calls, first) {
			if c.result != strings.ToUpper(c.id) {
				t.Errorf("call %q: result %q", c.id, c.result)
			}
		}
		if r.most != 1 {
			t.Errorf("%d batches ran at once, InFlight is 1", r.most)
		}
		all := map[string]int{}
		for _, b := range r.batches[1:] {
			if len(b) > 4 || !slices.IsSorted(b) || len(slices.Compact(slices.Clone(b))) != len(b) {
				t.Errorf("batch %v: want at most 4 distinct IDs, sorted", b)
			}
			for _, id := range b {
				all[id]++
			}
		}
		// 4 + 2, or 4 + 1 + 1 when both "c"s arrived after the first four: the second "c"
		// never shares a batch with the first.
		if n := len(r.batches) - 1; n < 2 || n > 3 || all["c"] != 2 || len(all) != 5 {
			t.Errorf("batches %v: want the 6 waiting calls in 2 or 3 batches", r.batches)
		}
	})
}

// A call whose context ends while it waits returns the context's error and is not run.
func TestCancelledWhileWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := recorder{block: make(chan struct{})}
		g := &batch.Group[*item]{Run: r.run, InFlight: 1}
		var wg sync.WaitGroup
		wg.Go(func() { _ = g.Do(t.Context(), &item{id: "first"}) })
		settled(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.batches) == 1 })
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() { errc <- g.Do(ctx, &item{id: "gone"}) }()
		settled(t, func() bool { return g.Pending() == 1 })
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("Do = %v, want context.Canceled", err)
		}
		close(r.block)
		wg.Wait()
		last := &item{id: "last"}
		if err := g.Do(t.Context(), last); err != nil || last.result != "LAST" {
			t.Fatalf("a call after: %v, %q", err, last.result)
		}
		for _, b := range r.batches {
			if slices.Contains(b, "gone") {
				t.Errorf("the cancelled call ran: %v", r.batches)
			}
		}
	})
}

// A caller whose context ends while a batch that another goroutine leads runs its call
// gets the context's error at once; the call was taken (Taken), and Done says when its
// result is set, so that the caller may still learn it. A call dropped before a batch
// took it is not taken.
func TestCancelledWhileRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := recorder{block: make(chan struct{})}
		g := &batch.Group[*item]{Run: r.run, InFlight: 1}
		var wg sync.WaitGroup
		wg.Go(func() { _ = g.Do(t.Context(), &item{id: "first"}) }) // leads, and is held
		settled(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.batches) == 1 })
		ctx, cancel := context.WithCancel(t.Context())
		c := &item{id: "a"}
		errc := make(chan error, 1)
		go func() { errc <- g.Do(ctx, c) }()
		settled(t, func() bool { return g.Pending() == 1 })
		// The first batch ends; the next, a's, is led by another goroutine and held.
		r.block <- struct{}{}
		settled(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.batches) == 2 })
		dropped := &item{id: "dropped"}
		waiting, cancelWaiting := context.WithCancel(t.Context())
		go func() { _ = g.Do(waiting, dropped) }()
		settled(t, func() bool { return g.Pending() == 1 })
		cancelWaiting()
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) || !c.Taken() {
			t.Fatalf("Do = %v, taken %v; want context.Canceled, taken", err, c.Taken())
		}
		select {
		case <-c.Done():
			t.Fatal("Done before the batch finished")
		default:
		}
		close(r.block)
		<-c.Done()
		if c.result != "A" {
			t.Errorf("result %q after Done", c.result)
		}
		wg.Wait()
		synctest.Wait()
		if dropped.Taken() {
			t.Error("a call whose caller left before a batch took it is taken")
		}
	})
}

// The batches that follow a caller's own run one after another in one goroutine, for as
// long as calls keep waiting: a goroutine's stack, grown by a batch's I/O, serves the
// next batch instead of growing again in a new one.
func TestOneGoroutineLeadsTheBatchesThatFollow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		block := make(chan struct{})
		var mu sync.Mutex
		var leaders []string // the goroutine that ran each batch, by its stack's first line
		run := func(calls []*item) {
			buf := make([]byte, 64)
			line, _, _ := strings.Cut(string(buf[:runtime.Stack(buf, false)]), "[")
			mu.Lock()
			leaders = append(leaders, line)
			mu.Unlock()
			<-block
		}
		g := &batch.Group[*item]{Run: run, InFlight: 1}
		batches := func() int { mu.Lock(); defer mu.Unlock(); return len(leaders) }
		var wg sync.WaitGroup
		wg.Go(func() { _ = g.Do(t.Context(), &item{id: "0"}) }) // its caller leads
		settled(t, func() bool { return batches() == 1 })
		for i := 1; i < 4; i++ {
			// Each call arrives while the batch before it runs.
			wg.Go(func() { _ = g.Do(t.Context(), &item{id: fmt.Sprint(i)}) })
			settled(t, func() bool { return g.Pending() == 1 })
			block <- struct{}{}
			settled(t, func() bool { return batches() == i+1 })
		}
		close(block)
		wg.Wait()
		synctest.Wait()
		if len(leaders) != 4 || leaders[1] == leaders[0] || leaders[2] != leaders[1] || leaders[3] != leaders[1] {
			t.Fatalf("batches led by %q: want the caller's, then one goroutine for the rest", leaders)
		}
	})
}

// Many callers at once: everyone gets an answer, never more than InFlight batches run.
func TestManyCallers(t *testing.T) {
	var r recorder
	g := &batch.Group[*item]{Run: r.run, InFlight: 2}
	var wg sync.WaitGroup
	for i := range 500 {
		wg.Go(func() {
			c := &item{id: fmt.Sprint(i % 50)}
			if err := g.Do(t.Context(), c); err != nil || c.result != c.id {
				t.Errorf("call %d: %v, %q", i, err, c.result)
			}
		})
	}
	wg.Wait()
	if r.most > 2 {
		t.Errorf("%d batches at once, InFlight is 2", r.most)
	}
}

// A batch's context keeps the first call's values, ignores the calls' cancellation
// and has the latest of their deadlines.
func TestContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		soon, cancel1 := context.WithTimeout(context.WithValue(t.Context(), key{}, "v"), time.Minute)
		defer cancel1()
		later, cancel2 := context.WithTimeout(t.Context(), time.Hour)
		defer cancel2()

		r := recorder{block: make(chan struct{})}
		checked := make(chan struct{})
		g := &batch.Group[*item]{InFlight: 1, Run: func(calls []*item) {
			if len(calls) == 2 {
				ctx, cancel := batch.Context(calls)
				defer cancel()
				if ctx.Value(key{}) != "v" {
					t.Error("the batch's context lost the first call's values")
				}
				if d, ok := ctx.Deadline(); !ok || time.Until(d) < 59*time.Minute {
					t.Errorf("deadline %v %v, want the latest (in an hour)", d, ok)
				}
				cancel1()
				if ctx.Err() != nil {
					t.Error("a call's cancellation ended the batch's context")
				}
				close(checked)
			}
			r.run(calls)
		}}
		var wg sync.WaitGroup
		wg.Go(func() { _ = g.Do(t.Context(), &item{id: "first"}) })
		settled(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.batches) == 1 })
		wg.Go(func() { _ = g.Do(soon, &item{id: "a"}) })
		settled(t, func() bool { return g.Pending() == 1 })
		wg.Go(func() { _ = g.Do(later, &item{id: "b"}) })
		settled(t, func() bool { return g.Pending() == 2 })
		close(r.block)
		wg.Wait()
		select {
		case <-checked:
		default:
			t.Errorf("a and b did not run as one batch: %v", r.batches)
		}
	})
}

func TestRowIDOrder(t *testing.T) {
	pairs := [][2]string{{"", ""}, {"", "a"}, {"a", ""}, {"a", "b"}, {"ab", ""}, {"a\x00", "z"}, {"\xff", ""}, {"\x80", "x"}, {"b", "\x00"}}
	slices.SortFunc(pairs, func(x, y [2]string) int {
		if c := strings.Compare(x[0], y[0]); c != 0 {
			return c
		}
		return strings.Compare(x[1], y[1])
	})
	for i := 1; i < len(pairs); i++ {
		if a, b := batch.RowID(pairs[i-1][0], pairs[i-1][1]), batch.RowID(pairs[i][0], pairs[i][1]); a >= b {
			t.Errorf("RowID%q >= RowID%q", pairs[i-1], pairs[i])
		}
	}
}

// settled lets every goroutine of the test's bubble run until it blocks (a call waiting
// for its batch, a batch held by the recorder), then requires cond: what the goroutines
// were to do by then is done, with no time allowed for it.
func settled(t *testing.T, cond func() bool) {
	t.Helper()
	synctest.Wait()
	if !cond() {
		t.Fatal("condition not met once every goroutine was blocked")
	}
}

// With Alone set, calls on an ID already in the batch being formed run alone at once,
// instead of one batch after another.
func TestAloneRunsDuplicates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := recorder{block: make(chan struct{})}
		var alone atomic.Int64
		g := &batch.Group[*item]{Run: r.run, InFlight: 1, Alone: func(c *item) {
			alone.Add(1)
			c.result = "alone " + c.id
		}}
		var wg sync.WaitGroup
		wg.Go(func() { _ = g.Do(t.Context(), &item{id: "first"}) })
		settled(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.batches) == 1 })
		calls := make([]*item, 50)
		for i := range calls {
			calls[i] = &item{id: "k"}
			wg.Go(func() { _ = g.Do(t.Context(), calls[i]) })
		}
		settled(t, func() bool { return g.Pending() == len(calls) })
		close(r.block)
		wg.Wait()
		if alone.Load() != 49 || len(r.batches) != 2 {
			t.Errorf("%d alone, batches %v; want 49 alone and the first \"k\" in one batch", alone.Load(), r.batches)
		}
		inBatch := 0
		for _, c := range calls {
			switch c.result {
			case "K":
				inBatch++
			case "alone k":
			default:
				t.Errorf("result %q", c.result)
			}
		}
		if inBatch != 1 {
			t.Errorf("%d calls answered by the batch, want 1", inBatch)
		}
	})
}

// gated is a Run that records its batches and holds each until a value is sent on
// gate (one per batch); without gate, batches run at once.
type gated struct {
	mu      sync.Mutex
	batches [][]string
	at      []time.Time // when each batch ran
	gate    chan struct{}
}

func (r *gated) run(calls []*item) {
	ids := make([]string, len(calls))
	for i, c := range calls {
		ids[i] = c.id
		c.result = strings.ToUpper(c.id)
	}
	r.mu.Lock()
	r.batches = append(r.batches, ids)
	r.at = append(r.at, time.Now())
	r.mu.Unlock()
	if r.gate != nil {
		<-r.gate
	}
}

func (r *gated) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.batches)
}

// underLoad returns a gathering Group (Gather 2ms, GatherTo 4, and callers as its
// Callers) on a gated Run, whose latest batch held two calls, as under a load of
// several callers: a lone call ran, two arrived meanwhile and ran together next.
func underLoad(t *testing.T, callers func() int) (*batch.Group[*item], *gated, *sync.WaitGroup) {
	t.Helper()
	r := &gated{gate: make(chan struct{})}
	g := &batch.Group[*item]{Run: r.run, InFlight: 1, Gather: 2 * time.Millisecond, GatherTo: 4, Callers: callers}
	wg := &sync.WaitGroup{}
	wg.Go(func() { _ = g.Do(t.Context(), &item{id: "a"}) })
	settled(t, func() bool { return r.count() == 1 })
	wg.Go(func() { _ = g.Do(t.Context(), &item{id: "b"}) })
	wg.Go(func() { _ = g.Do(t.Context(), &item{id: "c"}) })
	settled(t, func() bool { return g.Pending() == 2 })
	r.gate <- struct{}{}
	// With more than two callers counted, the leader of b and c gathers after the lone
	// batch: it waits out Gather for the GatherTo calls that do not come.
	time.Sleep(g.Gather)
	settled(t, func() bool { return r.count() == 2 })
	r.gate <- struct{}{}
	wg.Wait()
	return g, r, wg
}

// Under a load of several callers, a leader that finds fewer than GatherTo calls
// waits for more, and runs as soon as there are GatherTo, before Gather has passed.
func TestGatherFillsTheBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g, r, wg := underLoad(t, nil)
		start := time.Now()
		wg.Go(func() { _ = g.Do(t.Context(), &item{id: "d"}) })
		wg.Go(func() { _ = g.Do(t.Context(), &item{id: "e"}) })
		wg.Go(func() { _ = g.Do(t.Context(), &item{id: "f"}) })
		settled(t, func() bool { return r.count() == 2 && g.Pending() == 3 })
		wg.Go(func() { _ = g.Do(t.Context(), &item{id: "g"}) })
		settled(t, func() bool { return r.count() == 3 })
		if waited := time.Since(start); waited != 0 {
			t.Errorf("the full batch ran after %v, want at once", waited)
		}
		r.gate <- struct{}{}
		wg.Wait()
		if got := r.batches[2]; !slices.Equal(got, []string{"d", "e", "f", "g"}) {
			t.Errorf("batches %v: want [d e f g] third", r.batches)
		}
	})
}

// A gathering leader waits no longer than Gather; and once a batch has held one call
// (the load is gone), the next call runs at once.
func TestGatherWaitsAtMostGather(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g, r, wg := underLoad(t, nil)
		start := time.Now()
		wg.Go(func() { _ = g.Do(t.Context(), &item{id: "d"}) })
		settled(t, func() bool { return r.count() == 2 })
		time.Sleep(time.Second)
		settled(t, func() bool { return r.count() == 3 })
		if waited := r.at[2].Sub(start); waited != g.Gather {
			t.Errorf("a lone call under load ran after %v, want %v", waited, g.Gather)
		}
		r.gate <- struct{}{}
		wg.Wait()
		start = time.Now()
		wg.Go(func() { _ = g.Do(t.Context(), &item{id: "e"}) })
		settled(t, func() bool { return r.count() == 4 })
		if waited := time.Since(start); waited != 0 {
			t.Errorf("the call after a batch of one ran after %v, want at once", waited)
		}
		r.gate <- struct{}{}
		wg.Wait()
	})
}

// One caller's calls, one after another, never wait: each batch holds one call.
func TestGatherNeverHoldsALoneCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &gated{}
		g := &batch.Group[*item]{Run: r.run, InFlight: 1, Gather: 2 * time.Millisecond}
		start := time.Now()
		for i := range 50 {
			if err := g.Do(t.Context(), &item{id: fmt.Sprint(i)}); err != nil {
				t.Fatal(err)
			}
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("50 calls one after another took %v, want no wait", waited)
		}
	})
}

// Calls that come slower than two within Gather are not waited for, even from
// several callers.
func TestGatherSkipsSlowCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g, r, wg := underLoad(t, nil)
		time.Sleep(10 * time.Millisecond) // the average time between calls: 1.25 ms
		start := time.Now()
		wg.Go(func() { _ = g.Do(t.Context(), &item{id: "d"}) })
		settled(t, func() bool { return r.count() == 3 })
		if waited := time.Since(start); waited != 0 {
			t.Errorf("a call after a pause ran after %v, want at once", waited)
		}
		r.gate <- struct{}{}
		wg.Wait()
	})
}

// With Callers set, a gathering leader waits for half the callers, at least two and
// at most GatherTo: with few callers it does not wait for calls that cannot come.
func TestGatherWaitsForHalfTheCallers(t *testing.T) {
	for _, tc := range []struct {
		callers int
		wait    bool // whether a batch of two waits for more
	}{
		{callers: 0, wait: false},  // at least two
		{callers: 5, wait: false},  // half of 5: 2
		{callers: 6, wait: true},   // half: 3
		{callers: 100, wait: true}, // at most GatherTo (4)
	} {
		t.Run(fmt.Sprint(tc.callers), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g, r, wg := underLoad(t, func() int { return tc.callers })
				start := time.Now()
				wg.Go(func() { _ = g.Do(t.Context(), &item{id: "d"}) })
				wg.Go(func() { _ = g.Do(t.Context(), &item{id: "e"}) })
				time.Sleep(time.Second)
				settled(t, func() bool { return r.count() == 3 })
				want := time.Duration(0)
				if tc.wait {
					want = g.Gather
				}
				if waited := r.at[2].Sub(start); waited != want {
					t.Errorf("with %d callers a batch of two ran after %v, want %v", tc.callers, waited, want)
				}
				r.gate <- struct{}{}
				wg.Wait()
				if got := r.batches[2]; !slices.Equal(got, []string{"d", "e"}) {
					t.Errorf("batches %v: want [d e] third", r.batches)
				}
			})
		})
	}
}

// A batch of one call does not stop the next leader from gathering while more than two
// callers are counted: otherwise the call that found no batch running, gone alone, makes
// the calls behind it go without waiting, and so on. Two callers, or none counted, do
// not keep it gathering.
func TestGatherAfterALoneBatch(t *testing.T) {
	for _, tc := range []struct {
		callers func() int
		wait    bool
	}{
		{nil, false},
		{func() int { return 2 }, false},
		{func() int { return 3 }, true},
		{func() int { return 32 }, true},
	} {
		n := -1
		if tc.callers != nil {
			n = tc.callers()
		}
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &gated{gate: make(chan struct{})}
				g := &batch.Group[*item]{Run: r.run, InFlight: 1, Gather: 2 * time.Millisecond, GatherTo: 4, Callers: tc.callers}
				var wg sync.WaitGroup
				wg.Go(func() { _ = g.Do(t.Context(), &item{id: "a"}) })
				settled(t, func() bool { return r.count() == 1 })
				wg.Go(func() { _ = g.Do(t.Context(), &item{id: "b"}) })
				settled(t, func() bool { return g.Pending() == 1 })
				start := time.Now()
				r.gate <- struct{}{} // the lone batch ends; b's leader decides
				time.Sleep(time.Second)
				settled(t, func() bool { return r.count() == 2 })
				want := time.Duration(0)
				if tc.wait {
					want = g.Gather
				}
				if waited := r.at[1].Sub(start); waited != want {
					t.Errorf("after a lone batch, with %d callers, the next ran after %v, want %v", n, waited, want)
				}
				r.gate <- struct{}{}
				wg.Wait()
			})
		})
	}
}
