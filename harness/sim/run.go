package sim

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// Result is what one schedule did and what the invariants found.
type Result struct {
	Seed  uint64
	Plan  Plan
	Trace []Event
	// Violations are the broken invariants, each with the key and the cause.
	Violations []string
	// Windows are the extra executions that happened in a documented window, each with
	// its cause.
	Windows []string
	// Kinds are the causes of the extra executions, one short name each
	// (answer-lost, owner-killed, …; took-over-live-owner and the like for violations).
	Kinds []string
	// Counts: the upstream's executions, the final answers clients saw, the operations
	// that got none by the horizon, and the executions beyond one per key.
	Executions, Finals, Unfinished, Extra int
	// LateTakeovers counts the takeover claims that reached the store after their
	// TakeoverBy bound: the schedule exercised the bound.
	LateTakeovers int
	// Ambushes counts the ambushes of late takeover claims that fired (see ambush).
	Ambushes int
	// Inputs counts the final answers of the operations sending inputs that slip around
	// the key rules, by what they got: the schedule exercised them.
	Inputs map[string]int
}

// Failed reports whether an invariant broke.
func (r *Result) Failed() bool { return len(r.Violations) > 0 }

// Report is the result, readable: the plan, the trace, the windows and the violations.
func (r *Result) Report() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d\n%s", r.Seed, r.Plan)
	b.WriteString("--- trace (virtual time since the start, who, what)\n")
	for _, e := range r.Trace {
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "--- %d executions, %d final answers, %d operations unfinished, %d extra executions\n",
		r.Executions, r.Finals, r.Unfinished, r.Extra)
	for _, s := range r.Windows {
		fmt.Fprintf(&b, "documented window: %s\n", s)
	}
	for _, s := range r.Violations {
		fmt.Fprintf(&b, "VIOLATION: %s\n", s)
	}
	return b.String()
}

// Run runs the schedule of seed against the real middleware, gateway and memory store,
// and checks the invariants once it has quiesced. It must run inside a testing/synctest
// bubble: every delay is virtual time.
func Run(seed uint64) *Result {
	w := &world{seed: seed, start: time.Now(), streams: map[string]*rand.Rand{}}
	w.facts = facts{claims: map[int64]*claimFact{}, procs: map[string]*replica{}}
	w.draw("plan", func(r *rand.Rand) { w.plan = newPlan(r) })
	w.draw("plan/inputs", func(r *rand.Rand) { addInputs(r, &w.plan) })
	w.draw("plan/restarts", func(r *rand.Rand) { addRestarts(r, &w.plan) })
	w.draw("plan/wire", func(r *rand.Rand) { addWire(r, &w.plan) })
	// The store decides by its own clock, the simulation's.
	w.store = memstore.NewWithClock(time.Now)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	slots := make([]*slot, len(w.plan.Replicas))
	var managers sync.WaitGroup
	for i := range slots {
		slots[i] = &slot{cur: w.newReplica(i, 1)}
		managers.Add(1)
		go func() {
			defer managers.Done()
			w.runSlotCrashes(ctx, i, slots[i])
		}()
	}
	jctx, stopJanitor := context.WithCancel(context.Background())
	janitorDone := make(chan struct{})
	go func() {
		defer close(janitorDone)
		// The janitor is held back after an outage by a middleware of its own process,
		// whose probe watches the janitor's own link, as the gateway's is by its
		// middleware.
		jh := &handle{w: w, name: "janitor", slot: -1}
		logger := slog.New(&logHandler{w: w, who: "janitor", min: slog.LevelInfo})
		jm, err := idempotency.New(idempotency.Config{Store: jh, Lease: w.plan.Lease, TTL: w.plan.TTL,
			StoreTimeout: w.plan.StoreTimeout, Logger: logger})
		if err != nil {
			panic(err) // the plan's settings are valid by construction
		}
		idempotency.RunJanitor(jctx, jh, idempotency.JanitorConfig{Interval: w.plan.Janitor, Logger: logger, Middleware: jm})
		_ = jm.Shutdown(context.Background())
	}()

	var clients sync.WaitGroup
	for i := range w.plan.Ops {
		for nth := range max(1, w.plan.Ops[i].Clients) {
			clients.Add(1)
			go w.client(ctx, &w.plan.Ops[i], nth, slots, &clients)
		}
	}
	clients.Wait()
	stop()
	managers.Wait()
	// The faults end before the processes stop, so that a live process's Shutdown
	// stores what it holds (a Shutdown that runs out of time is not simulated).
	var calm time.Duration
	w.mu.Lock()
	w.calm = true // no outage begins after this
	for _, o := range w.plan.Outages {
		calm = max(calm, o.End)
	}
	w.mu.Unlock()
	for _, s := range w.plan.Slow {
		calm = max(calm, s.End)
	}
	time.Sleep(calm - w.now())
	// Quiesce: every request served, then every process stopped. A live process stores
	// what it holds (the store answers again by now); a killed one stores nothing.
	w.mu.Lock()
	procs := append([]*replica(nil), w.facts.order...)
	w.mu.Unlock()
	for _, rep := range procs {
		rep.running.Wait()
	}
	for _, rep := range procs {
		if rep.isDead() {
			dead, cancel := context.WithCancel(context.Background())
			cancel()
			_ = rep.stop(dead)
			continue
		}
		sctx, cancel := context.WithTimeout(context.Background(), 3*w.plan.Lease)
		if err := rep.stop(sctx); err != nil {
			w.event(rep.name, "shutdown: %v", err)
			w.mu.Lock()
			w.facts.unstored = append(w.facts.unstored, fmt.Sprintf("%s: %v", rep.name, err))
			w.mu.Unlock()
		}
		cancel()
		w.event(rep.name, "process stopped")
	}
	stopJanitor()
	<-janitorDone
	w.inflight.Wait() // the last messages still in the network arrive
	// Every owner is gone: once a lease has passed, no record may be in progress.
	time.Sleep(w.plan.Lease + w.plan.Lease/2)

	res := &Result{Seed: seed, Plan: w.plan}
	w.check(res)
	res.Trace = w.trace()
	return res
}

// runSlotCrashes kills the processes of slot i at the plan's instants, and starts a new
// one after each down time.
func (w *world) runSlotCrashes(ctx context.Context, i int, s *slot) {
	for n, c := range w.plan.Replicas[i].Crashes {
		if sleep(ctx, c.At-w.now()) != nil {
			return
		}
		s.mu.Lock()
		rep := s.cur
		s.cur = nil
		s.mu.Unlock()
		rep.crash()
		if sleep(ctx, c.Down) != nil {
			return
		}
		rep = w.newReplica(i, n+2)
		s.mu.Lock()
		s.cur = rep
		s.mu.Unlock()
	}
}
