package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// Event is one line of a schedule's trace: a virtual instant (from the schedule's
// start), who did it, and what.
type Event struct {
	At   time.Duration
	Who  string
	What string
}

func (e Event) String() string { return fmt.Sprintf("%12s  %-10s %s", fmtD(e.At), e.Who, e.What) }

// world is one schedule: its random streams, its trace, the store every replica
// shares, and the facts the invariants are checked against.
type world struct {
	seed  uint64
	plan  Plan
	start time.Time
	store *memstore.Store // the real store, on the simulation's clock

	quiet    bool           // no lost replies (the conformance suite's world)
	inflight sync.WaitGroup // messages in the network between a process and the store
	mu       sync.Mutex
	streams  map[string]*rand.Rand
	events   []Event
	facts    facts
	// ambushes are the network's ambushes of late takeover claims so far.
	ambushes []*ambush
	// calm: the clients are done and the end of the fault windows is decided; the
	// network lays no more ambushes.
	calm bool
}

// stream returns the random stream called name, made from the seed and the name. Every
// decision is drawn from the stream of the thing that makes it (one client, one replica's
// calls for one key, the upstream for one key), so that decisions do not depend on how
// the goroutines of one virtual instant interleave. w.mu is held.
func (w *world) stream(name string) *rand.Rand {
	r, ok := w.streams[name]
	if !ok {
		h := fnv.New64a()
		h.Write([]byte(name))
		r = rand.New(rand.NewPCG(w.seed, h.Sum64()))
		w.streams[name] = r
	}
	return r
}

// draw runs f with the stream called name.
func (w *world) draw(name string, f func(r *rand.Rand)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(w.stream(name))
}

// now is the virtual time since the schedule started.
func (w *world) now() time.Duration { return time.Since(w.start) }

func (w *world) event(who, format string, args ...any) {
	e := Event{At: w.now(), Who: who, What: fmt.Sprintf(format, args...)}
	w.mu.Lock()
	w.events = append(w.events, e)
	w.mu.Unlock()
}

// trace returns the events in a stable order: by instant, then by who and what, so
// that goroutines that ran at one virtual instant in another order give the same trace.
func (w *world) trace() []Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	ev := slices.Clone(w.events)
	slices.SortStableFunc(ev, func(a, b Event) int {
		return cmp.Or(cmp.Compare(a.At, b.At), strings.Compare(a.Who, b.Who), strings.Compare(a.What, b.What))
	})
	return ev
}

// sleep waits d of virtual time, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// outage returns the outage that holds at now for replica slot (-1: the janitor,
// which sees only outages of every replica), if any.
func (w *world) outage(slot int, now time.Duration) (Outage, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, o := range w.plan.Outages {
		if now >= o.Start && now < o.End && (o.Replica < 0 || o.Replica == slot) {
			return o, true
		}
	}
	return Outage{}, false
}

// ambush is the network's adversary against a takeover claim it holds long: the claim
// is held until another claim of its key is granted (a legitimate owner starting the
// request), then an outage of every replica begins just after that owner has its grant
// (3 to 20 ms: its upstream runs, its answer is not yet stored), lasts one to two and a
// half leases, and the claim arrives just after it ends (0.1 to 5 ms). The owner could
// neither renew its lease nor store its answer through the outage, and no owner was cut
// off alone: the claim reaches the store after that owner's lease ran out, on knowledge
// from before it took over, which the claim's TakeoverBy bound must refuse. An ambush
// no grant fires lets its claim arrive when it was drawn to.
type ambush struct {
	key         string
	at, deliver time.Duration // when the claim was sent; when it arrives unfired
	// drawn when laid: the outage's start after the grant, its length, and the claim's
	// arrival after it
	delay, length, after time.Duration
	fired                bool
	arrive               time.Duration
	fire                 chan struct{} // closed when it fires
}

// until is when the ambush's claim arrives.
func (a *ambush) until() time.Duration {
	if a.fired {
		return a.arrive
	}
	return a.deliver
}

// layAmbush lays, with the plan's Ambush share, an ambush for the takeover claim of key
// sent at now on the stream called stream and drawn to arrive at deliver; nil if none.
// One ambush is pending at a time (ambushes laid at one instant all are, whatever order
// their goroutines run in). It draws from a stream of its own, so that the other draws
// are what they are without it.
func (w *world) layAmbush(stream, key string, now, deliver time.Duration) *ambush {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.calm || w.plan.Ambush == 0 || slices.ContainsFunc(w.ambushes, func(a *ambush) bool { return a.at < now && now < a.until() }) {
		return nil
	}
	r := w.stream("ambush/" + stream)
	if !chance(r, w.plan.Ambush) {
		return nil
	}
	lease := w.plan.Lease
	a := &ambush{key: key, at: now, deliver: deliver, fire: make(chan struct{})}
	a.delay, a.length, a.after = dur(r, 3*time.Millisecond, 20*time.Millisecond), dur(r, lease, 5*lease/2), dur(r, 100*time.Microsecond, 5*time.Millisecond)
	w.ambushes = append(w.ambushes, a)
	return a
}

// fireAmbushes fires the ambushes of key laid before now whose claims are still held,
// as the store grants a claim of key at now: each begins its outage. The outage joins
// the plan's, judged as they are. w.mu is held.
func (w *world) fireAmbushes(key string, now time.Duration) {
	for _, a := range w.ambushes {
		if a.fired || a.key != key || a.at >= now || now >= a.deliver {
			continue
		}
		o := Outage{Start: now + a.delay, Replica: -1, RunTime: true}
		o.End = o.Start + a.length
		if w.calm || o.End > w.plan.Horizon-6*w.plan.Lease { // the clients have time to finish after it
			continue
		}
		a.fired, a.arrive = true, o.End+a.after
		close(a.fire)
		w.plan.Outages = append(w.plan.Outages, o)
		// In a stable order, whatever order the ambushes of one instant fired in: the
		// judge names the first outage that explains an execution.
		i := slices.IndexFunc(w.plan.Outages, func(o Outage) bool { return o.RunTime })
		slices.SortStableFunc(w.plan.Outages[i:], func(a, b Outage) int { return cmp.Or(cmp.Compare(a.Start, b.Start), cmp.Compare(a.End, b.End)) })
	}
}

// hold holds a's claim until it arrives: when drawn, or just after the outage of the
// ambush fired.
func (w *world) hold(a *ambush, there time.Duration) {
	t := time.NewTimer(there)
	select {
	case <-t.C:
	case <-a.fire:
	}
	t.Stop()
	w.mu.Lock()
	fired, arrive := a.fired, a.arrive
	w.mu.Unlock()
	if fired {
		time.Sleep(arrive - w.now())
	}
}

func (w *world) slowBy(slot int, now time.Duration) time.Duration {
	var d time.Duration
	for _, s := range w.plan.Slow {
		if now >= s.Start && now < s.End && (s.Replica < 0 || s.Replica == slot) {
			d = max(d, s.Extra)
		}
	}
	return d
}

// Errors of the simulated network between a replica and the store.
var (
	errStoreDown  = errors.New("sim: store unreachable")
	errReplyLost  = errors.New("sim: store reply lost (the call may have been applied)")
	errDisconnect = errors.New("sim: process killed: store connection closed")
)

// handle is one process's connection to the shared store: the real memstore behind a
// simulated network. A call travels to the store (a drawn delay, plus the slow spells),
// is refused or hangs in an outage, is applied, and its reply travels back (a drawn
// delay; or it is lost, the call applied). A killed process's handle is cut: every call
// in flight loses its reply, and no later call reaches the store. It honours the
// idempotency.Store contract as the store behind a network does: a call that fails may
// have been applied.
type handle struct {
	w    *world
	name string // the process's
	slot int
	mu   sync.Mutex
	cut  bool
	// failed is when a call of this process first failed for want of the store (as the
	// middleware's health counts failures); zero: never.
	failed time.Duration
}

// noteFailure records a failed call, for the first one.
func (h *handle) noteFailure(err error) {
	if err == nil || errors.Is(err, idempotency.ErrLeaseLost) || errors.Is(err, idempotency.ErrNotFound) || errors.Is(err, context.Canceled) {
		return
	}
	h.mu.Lock()
	if h.failed == 0 {
		h.failed = h.w.now()
	}
	h.mu.Unlock()
}

// failedBy reports whether a call of this process failed before at.
func (h *handle) failedBy(at time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failed != 0 && h.failed <= at
}

var (
	_ idempotency.Store   = (*handle)(nil)
	_ idempotency.Janitor = (*handle)(nil)
	_ idempotency.Pinger  = (*handle)(nil)
)

func (h *handle) disconnect() {
	h.mu.Lock()
	h.cut = true
	h.mu.Unlock()
}

func (h *handle) isCut() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cut
}

// call sends op for key through the network, applying it with apply at the store. A
// message once sent arrives, however late, whether or not its caller still waits: a
// caller that gives up (its context ends) learns nothing of whether it was applied. In
// a stall a message is black-holed, or held and delivered when the stall ends. apply
// returns the call's result, the trace line of what it did ("" for none), and its error.
func call[T any](ctx context.Context, h *handle, op, key string, apply func() (T, string, error)) (T, error) {
	return callNoting(ctx, h, op, key, nil, apply)
}

// callNoting is call, which also tells sent how long the message will take to reach the
// store by its own delay (the fault of this one message, apart from the windows).
func callNoting[T any](ctx context.Context, h *handle, op, key string, sent func(own time.Duration), apply func() (T, string, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	w := h.w
	var there, back, heal time.Duration
	var lost, held, longLate bool
	stream := h.name + "/" + op + "/" + key
	if id, ok := ctx.Value(attemptKey{}).(string); ok {
		// The calls of one request have a stream of their own: the waiters of a key,
		// woken at one instant, claim it at that instant in any order.
		stream += "/" + id
	}
	w.draw(stream, func(r *rand.Rand) {
		there, back = dur(r, 50*time.Microsecond, 3*time.Millisecond), dur(r, 50*time.Microsecond, 3*time.Millisecond)
		heal = dur(r, 50*time.Microsecond, 3*time.Millisecond)
		late := w.plan.Late
		if op == "takeover" {
			late = w.plan.LateTakeover
		}
		switch x := r.Float64(); {
		case x < late:
			there += dur(r, w.plan.Lease/3, 2*w.plan.Lease) // held somewhere, delivered long after
			longLate = true
		case x < w.plan.Late+0.03:
			there += dur(r, 0, w.plan.Lease/3) // a late message
		}
		lost = chance(r, 0.04) && !w.quiet
		held = chance(r, 0.5)
	})
	if h.isCut() {
		_ = sleep(ctx, there) // a connection refused takes its round trip
		return zero, errDisconnect
	}
	if sent != nil {
		sent(there)
	}
	now := w.now()
	there += w.slowBy(h.slot, now)
	var a *ambush
	if op == "takeover" && longLate {
		a = w.layAmbush(stream, key, now, now+there)
	}
	type answer struct {
		v   T
		err error
	}
	reply := make(chan answer, 1)
	w.inflight.Add(1)
	go func() {
		defer w.inflight.Done()
		if a != nil {
			w.hold(a, there)
		} else {
			time.Sleep(there)
		}
		if h.isCut() {
			reply <- answer{zero, errDisconnect}
			return
		}
		if o, down := w.outage(h.slot, w.now()); down {
			switch {
			case !o.Stall:
				reply <- answer{zero, errStoreDown}
				return
			case !held:
				return // black-holed: no reply; the caller's timeout ends the call
			}
			// Held by the partition, as TCP holds a segment it retransmits: delivered
			// when the partition heals, whether or not the caller still waits.
			time.Sleep(o.End - w.now() + heal)
			if h.isCut() {
				reply <- answer{zero, errDisconnect}
				return
			}
		}
		v, what, err := apply()
		if what != "" {
			w.event("store", "%s: %s", h.name, what)
		}
		time.Sleep(back)
		switch _, down := w.outage(h.slot, w.now()); {
		case h.isCut():
			v, err = zero, errDisconnect
		case down:
			v, err = zero, errStoreDown
		case lost:
			w.event("store", "%s: reply to %s %s lost", h.name, op, key)
			v, err = zero, errReplyLost
		}
		reply <- answer{v, err}
	}()
	select {
	case a := <-reply:
		h.noteFailure(a.err)
		return a.v, a.err
	case <-ctx.Done():
		h.noteFailure(ctx.Err())
		return zero, ctx.Err()
	}
}

func sk(scope, key string) string { return scope + "/" + key }

// Claim implements idempotency.Store.
func (h *handle) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	op := "claim"
	if !req.NoTakeover {
		op = "takeover" // its own stream: a claim that may take over is the one whose delay matters
	}
	return call(ctx, h, op, sk(req.Scope, req.Key), func() (idempotency.ClaimResult, string, error) {
		res, err := h.w.store.Claim(h.callerContext(), req)
		if err != nil {
			return res, "claim " + sk(req.Scope, req.Key) + ": " + err.Error(), err
		}
		h.w.noteClaim(h.name, req, res)
		take := ""
		if !req.NoTakeover {
			take = " (may take over)"
		}
		if res.Claimed {
			how := "claimed"
			if res.TookOver {
				how = "took over"
			}
			return res, fmt.Sprintf("claim %s%s: %s, token %d", sk(req.Scope, req.Key), take, how, res.Token), nil
		}
		x := res.Existing
		if !req.NoTakeover && !req.MayTakeOver(res.Now) {
			h.w.mu.Lock()
			h.w.facts.lateTakeovers++
			h.w.mu.Unlock()
			take = fmt.Sprintf(" (may take over until %s: arrived %s late)", fmtD(req.TakeoverBy.Sub(h.w.start)), fmtD(res.Now.Sub(req.TakeoverBy)))
		}
		return res, fmt.Sprintf("claim %s%s: refused, %s token %d lease %s", sk(req.Scope, req.Key), take, x.State, x.Token,
			fmtD(x.LeaseUntil.Sub(res.Now))), nil
	})
}

// update is call for the methods that answer only an error.
func (h *handle) update(ctx context.Context, op, key string, apply func() (string, error)) error {
	_, err := call(ctx, h, op, key, func() (struct{}, string, error) {
		what, err := apply()
		return struct{}{}, what, err
	})
	return err
}

// Extend implements idempotency.Store.
func (h *handle) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error {
	sent := func(own time.Duration) { h.w.noteRenewal(token, own) }
	_, err := callNoting(ctx, h, "extend", sk(scope, key), sent, func() (struct{}, string, error) {
		err := h.w.store.Extend(h.callerContext(), scope, key, token, lease)
		return struct{}{}, fmt.Sprintf("extend %s token %d: %v", sk(scope, key), token, errText(err)), err
	})
	return err
}

// Abandon implements idempotency.Store.
func (h *handle) Abandon(ctx context.Context, scope, key string, token int64) error {
	return h.update(ctx, "abandon", sk(scope, key), func() (string, error) {
		err := h.w.store.Abandon(h.callerContext(), scope, key, token)
		return fmt.Sprintf("abandon %s token %d: %v", sk(scope, key), token, errText(err)), err
	})
}

// Complete implements idempotency.Store.
func (h *handle) Complete(ctx context.Context, c idempotency.Completion) error {
	return h.update(ctx, "complete", sk(c.Scope, c.Key), func() (string, error) {
		err := h.w.store.Complete(h.callerContext(), c)
		if err == nil {
			h.w.noteComplete(c)
		}
		return fmt.Sprintf("complete %s token %d status %d: %v", sk(c.Scope, c.Key), c.Token, c.Response.Status, errText(err)), err
	})
}

// Release implements idempotency.Store.
func (h *handle) Release(ctx context.Context, scope, key string, token int64) error {
	return h.update(ctx, "release", sk(scope, key), func() (string, error) {
		err := h.w.store.Release(h.callerContext(), scope, key, token)
		if err == nil {
			h.w.noteRelease(token)
		}
		return fmt.Sprintf("release %s token %d: %v", sk(scope, key), token, errText(err)), err
	})
}

// Get implements idempotency.Store.
func (h *handle) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	return call(ctx, h, "get", sk(scope, key), func() (*idempotency.Record, string, error) {
		rec, err := h.w.store.Get(h.callerContext(), scope, key)
		return rec, "", err
	})
}

// Delete implements idempotency.Store.
func (h *handle) Delete(ctx context.Context, scope, key string) error {
	return h.update(ctx, "delete", sk(scope, key), func() (string, error) {
		return "delete " + sk(scope, key), h.w.store.Delete(h.callerContext(), scope, key)
	})
}

// DeleteExpired implements idempotency.Janitor.
func (h *handle) DeleteExpired(ctx context.Context, limit int) (int, error) {
	return call(ctx, h, "janitor", "", func() (int, string, error) {
		before := h.w.records()
		n, err := h.w.store.DeleteExpired(h.callerContext(), limit)
		after := h.w.records()
		for _, k := range slices.Sorted(maps.Keys(before)) { // in a stable order: each gets a pseudo-token
			if _, ok := after[k]; !ok {
				h.w.noteDeleted(before[k])
			}
		}
		if n == 0 && err == nil {
			return 0, "", nil
		}
		return n, fmt.Sprintf("janitor deleted %d expired records", n), err
	})
}

// Ping implements idempotency.Pinger.
func (h *handle) Ping(ctx context.Context) error {
	return h.update(ctx, "ping", "", func() (string, error) { return "", h.w.store.Ping(h.callerContext()) })
}

// callerContext is the context of the store calls the handle applies: it carries the
// calling replica's clock (CallerNow), skewed by the plan. The memory store decides by
// its own clock and never reads it; it is there so that a store that decided by its
// caller's clock (as stores did when callers sent instants) can be simulated with the
// replicas' skews: such a store reads it through the CallerNow method.
func (h *handle) callerContext() context.Context {
	var skew time.Duration
	if h.slot >= 0 && h.slot < len(h.w.plan.Replicas) {
		skew = h.w.plan.Replicas[h.slot].Skew
	}
	return callerClock{Context: context.Background(), skew: skew}
}

type callerClock struct {
	context.Context
	skew time.Duration
}

// CallerNow is the calling replica's clock.
func (c callerClock) CallerNow() time.Time { return time.Now().Add(c.skew) }

// records returns every record of the store, by scope and key.
func (w *world) records() map[string]idempotency.Record {
	recs := map[string]idempotency.Record{}
	f := idempotency.ListFilter{Limit: 1000}
	for {
		page, err := w.store.List(context.Background(), f)
		if err != nil {
			return recs
		}
		for _, r := range page.Records {
			recs[sk(r.Scope, r.Key)] = r
		}
		if page.Next == "" {
			return recs
		}
		f.After = page.Next
	}
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// logHandler puts a replica's log lines in the trace.
type logHandler struct {
	w     *world
	who   string
	min   slog.Level
	attrs []slog.Attr
}

func (l *logHandler) Enabled(_ context.Context, lv slog.Level) bool { return lv >= l.min }

func (l *logHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "log %s: %s", r.Level, r.Message)
	for _, a := range l.attrs {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.w.event(l.who, "%s", b.String())
	return nil
}

func (l *logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &logHandler{w: l.w, who: l.who, min: l.min, attrs: append(slices.Clone(l.attrs), as...)}
}

func (l *logHandler) WithGroup(string) slog.Handler { return l }

// newQuietHandle returns a handle over a new memory store on clock, in a world with no
// fault window and no lost reply: every call is delayed as drawn (in real time, outside
// a bubble) and answered, so that the conformance suite checks what the handle passes
// through, concurrency included, and the store behind it.
func newQuietHandle(clock func() time.Time) *handle {
	w := &world{start: time.Now(), streams: map[string]*rand.Rand{}, quiet: true}
	w.facts = facts{claims: map[int64]*claimFact{}, procs: map[string]*replica{}}
	w.store = memstore.NewWithClock(clock)
	return &handle{w: w, name: "conformance", slot: -1}
}
