// Package batch groups concurrent calls of one kind so that a store runs them as one
// statement or one transaction: group commit done by the application.
//
// A call that finds fewer than Group.InFlight batches running starts one with whatever
// is pending; calls that arrive while every slot is busy go together in the next batch.
// A batch never holds two calls with the same ID (the later runs alone, or waits for the
// next batch), and its calls are sorted by ID, so that stores taking row locks in that
// order cannot deadlock one batch against another.
//
// Gathering (Group.Gather). A batch's cost to the server is mostly fixed: a round trip,
// a statement's start, a commit and its flush. With one batch in flight, under a
// steady load, batches come one after another as fast as the server turns them round,
// and each takes what arrived while the one before it ran: at a few dozen concurrent
// requests that is a few calls, and every third batch or so holds one (the first call
// after a batch is taken finds no batch running and starts its own). So a leader may
// wait, up to Gather, until GatherTo calls are pending, but only while calls come from
// several callers at once (the latest batch held more than one, or more than two
// callers are counted, Group.Callers) and fast enough that
// two or more are due within Gather (a moving average of the time between calls). A
// lone caller, one after another, is never held: each of its batches holds one call.
// When the Group can count its callers (Group.Callers), it waits for half of them at
// most: with eight callers, sixteen calls never come, and every batch would otherwise
// wait the whole of Gather, twice per request where a request makes two kinds of call.
// On a server that the load keeps busy the wait pays for itself: the batches are
// larger and fewer, the server spends less per call, and it answers sooner.
package batch

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Call is what every batched call embeds: its caller's context, and a channel closed
// when the call's result is set.
type Call struct {
	ctx   context.Context
	id    string // Item.ID, computed once
	done  chan struct{}
	taken atomic.Bool // taken into a batch, or to run alone
}

// Ctx is the context the call was made with.
func (c *Call) Ctx() context.Context { return c.ctx }

// Taken reports whether the call was taken into a batch (or to run alone): its result
// will be set, and Done closed, even when its caller's context has ended.
func (c *Call) Taken() bool { return c.taken.Load() }

// Done is closed when the call's result is set.
func (c *Call) Done() <-chan struct{} { return c.done }

func (c *Call) call() *Call { return c }

// Item is a batched call: a struct embedding Call, with the call's parameters and
// fields for its result.
type Item interface {
	call() *Call
	// ID is the row (or resource) the call writes; a batch never holds two calls with
	// one ID, and holds its calls in ID order.
	ID() string
}

// Group batches calls of one kind. Set Run, and optionally Max and InFlight, before
// the first call; the zero value of the rest is ready.
type Group[C Item] struct {
	// Run does a batch's I/O and sets each call's result. Its calls are sorted by ID.
	Run func(calls []C)
	// Max is the most calls in one batch. Default 128.
	Max int
	// InFlight is the most batches running at once. Default 1.
	InFlight int
	// Alone, when set, runs a call whose ID is already in the batch being formed: at
	// once, in a goroutine of its own, outside any batch. Without it such a call waits
	// for a later batch, so that a thousand calls on one ID (a storm of retries of one
	// request) would run one batch after another.
	Alone func(c C)
	// Gather is the longest a leader waits for more calls before it runs its batch (see
	// the package doc); 0 or negative: a batch runs at once with what is pending.
	Gather time.Duration
	// GatherTo is the number of pending calls at which a gathering leader stops
	// waiting. Default 16.
	GatherTo int
	// Callers, when set, returns how many callers may make a call soon (for a store:
	// its requests between their claim and their completion). A gathering leader
	// then stops waiting once half of them are pending (at least 2, at most GatherTo):
	// with a few callers, GatherTo calls never come, and each batch would wait the
	// whole of Gather for them.
	Callers func() int

	mu       sync.Mutex
	pending  []C
	inFlight int

	// Gathering's view of the load, under mu.
	calls int           // calls made, up to 2: gap means something from 2 on
	last  time.Time     // when the latest call was made
	gap   time.Duration // moving average of the time between calls
	lastN int           // calls in the latest batch taken
	full  chan struct{} // a gathering leader's: closed when GatherTo calls are pending
}

// Do runs c in a batch (or alone, see Group.Alone) and returns when its result is set,
// or when ctx ends (then it returns ctx's error; if a batch had taken c (Call.Taken),
// its result is still set, and Call.Done closed then, for a caller that waits for it).
func (g *Group[C]) Do(ctx context.Context, c C) error {
	b := c.call()
	b.ctx, b.id, b.done = ctx, c.ID(), make(chan struct{})
	g.mu.Lock()
	g.pending = append(g.pending, c)
	if g.Gather > 0 {
		g.arrived()
	}
	lead := g.inFlight < max(g.InFlight, 1)
	if lead {
		g.inFlight++
	}
	g.mu.Unlock()
	if lead {
		g.lead()
	}
	select {
	case <-b.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Pending returns the number of calls waiting for a batch.
func (g *Group[C]) Pending() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.pending)
}

// lead runs one batch in a slot the caller holds, then, when calls are waiting, hands
// the slot to a goroutine that leads batch after batch (follow), or gives it back.
func (g *Group[C]) lead() {
	if g.runOne() {
		go g.follow()
	}
}

// follow leads batches in a slot it holds for as long as calls are waiting, then gives
// the slot back. One goroutine leads them all, rather than a new one for each batch:
// a batch's I/O (SQLite's, above all) runs deep in the stack, and a new goroutine's
// stack would grow, and be copied, again at every batch.
func (g *Group[C]) follow() {
	for g.runOne() {
	}
}

// runOne runs one batch in a slot the caller holds. When calls are waiting after it,
// it reports true and the caller keeps the slot; otherwise it gives the slot back.
func (g *Group[C]) runOne() bool {
	g.mu.Lock()
	if g.gathers() {
		full := make(chan struct{})
		g.full = full
		g.mu.Unlock()
		t := time.NewTimer(g.Gather)
		select {
		case <-full:
		case <-t.C:
		}
		t.Stop()
		g.mu.Lock()
		if g.full == full { // not closed by a call, nor another leader's since
			g.full = nil
		}
	}
	batch, dups := g.take()
	g.lastN = len(batch)
	g.mu.Unlock()
	for _, c := range dups {
		go func() {
			g.Alone(c)
			close(c.call().done)
		}()
	}
	if len(batch) > 0 {
		g.Run(batch)
		for _, c := range batch {
			close(c.call().done)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.pending) > 0 {
		return true
	}
	g.inFlight--
	return false
}

// arrived notes a call's arrival, just appended to pending, for gathering: the
// moving average of the time between calls, and the wake-up of a gathering leader
// whose batch is full. g.mu is held.
func (g *Group[C]) arrived() {
	now := time.Now()
	if g.calls > 0 {
		g.gap += (now.Sub(g.last) - g.gap) / 8
	}
	g.calls = min(g.calls+1, 2)
	g.last = now
	if g.full != nil && len(g.pending) >= g.gatherTo() {
		close(g.full)
		g.full = nil
	}
}

// gathers reports whether a leader about to take a batch waits for more calls first:
// when fewer than GatherTo are pending, calls come from several callers (several), and
// they come fast enough that two are due within Gather. One leader gathers at a time.
// g.mu is held.
func (g *Group[C]) gathers() bool {
	return g.Gather > 0 && g.full == nil && g.several() && g.calls == 2 &&
		2*g.gap <= g.Gather && len(g.pending) < g.gatherTo()
}

// several reports whether calls come from several callers: the latest batch held more
// than one call, or more than two callers are counted (Callers). The count keeps a
// leader gathering after a batch of one, which otherwise begets the next: the call that
// finds no batch running goes alone, the calls behind it go without waiting, and under a
// steady load of 32 requests the batches shrink to a few calls. Two callers are not
// enough: the other one is most often waiting on its upstream, and a claim would wait
// for its completion.
func (g *Group[C]) several() bool {
	return g.lastN > 1 || g.Callers != nil && g.Callers() > 2
}

func (g *Group[C]) gatherTo() int {
	to := g.GatherTo
	if to <= 0 {
		to = 16
	}
	if g.Callers != nil {
		to = min(to, max(2, g.Callers()/2))
	}
	return to
}

// take removes from pending up to Max calls with distinct IDs, sorted by ID, and,
// when Alone is set, the calls whose ID is among them (dups); it drops the calls whose
// context has ended. g.mu is held.
func (g *Group[C]) take() (batch, dups []C) {
	limit := g.Max
	if limit <= 0 {
		limit = 128
	}
	seen := make(map[string]bool)
	rest := g.pending[:0]
	for _, c := range g.pending {
		switch id := c.call().id; {
		case c.call().ctx.Err() != nil: // its caller has gone
		case seen[id] && g.Alone != nil:
			c.call().taken.Store(true)
			dups = append(dups, c)
		case len(batch) == limit || seen[id]:
			rest = append(rest, c)
		default:
			seen[id] = true
			c.call().taken.Store(true)
			batch = append(batch, c)
		}
	}
	clear(g.pending[len(rest):])
	g.pending = rest
	slices.SortFunc(batch, func(a, b C) int { return strings.Compare(a.call().id, b.call().id) })
	return batch, dups
}

// Context returns the context for a batch's I/O: it keeps the values of the first
// call's context, is cancelled by none of the calls' contexts, and has the latest of
// their deadlines, or none when one of them has none.
func Context[C Item](calls []C) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(calls[0].call().ctx)
	var latest time.Time
	for _, c := range calls {
		d, ok := c.call().ctx.Deadline()
		if !ok {
			return context.WithCancel(base)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(base, latest)
}

// RowID is an ID for the row (scope, key) that sorts as the pair does, bytewise.
func RowID(scope, key string) string {
	// The scope's length first would sort by length; a separator that cannot be
	// confused needs escaping. Encode each byte of the scope as two, 0x00 ending it.
	b := make([]byte, 0, 2*len(scope)+1+len(key))
	for i := range len(scope) {
		b = append(b, 1+scope[i]>>7, scope[i]&0x7f+1)
	}
	b = append(b, 0)
	return string(append(b, key...))
}
