package sim

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
)

// claimFact is one claim the store granted, and what became of it.
type claimFact struct {
	Token       int64
	Proc        *replica
	Scope, Key  string
	At          time.Duration
	TookOver    bool
	Completed   bool
	CompletedAt time.Duration
	Released    bool
	// Deletes: not a claim but the janitor's deletion of the record of token Deletes.
	Deletes int64
	// Renewals are the owner's lease renewals sent to the store: when, and how late
	// each message was by its own delay.
	Renewals []renewal
}

type renewal struct{ At, Own time.Duration }

// facts are what the schedule did, as the store, the upstream and the clients saw it.
type facts struct {
	claims     map[int64]*claimFact
	execs      []*execution
	seen       []*seen
	procs      map[string]*replica
	order      []*replica // every process, in the order they started
	janitor    *replica   // the janitor, as the pseudo-process of its deletions
	unfinished int
	// unstored are the live processes whose Shutdown, with the store reachable again,
	// could not store the answers they held.
	unstored []string
	// stripped are the requests that reached the upstream without a header every client
	// request has (the key, the scope's header, the content type).
	stripped []string
	// lateTakeovers counts the takeover claims that reached the store after their
	// TakeoverBy bound (refused by it).
	lateTakeovers int
}

func (w *world) noteClaim(proc string, req idempotency.ClaimRequest, res idempotency.ClaimResult) {
	if !res.Claimed {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.facts.claims[res.Token] != nil {
		return // a claim sent again with its ID, granted its own record: nothing new
	}
	w.facts.claims[res.Token] = &claimFact{Token: res.Token, Proc: w.facts.procs[proc], Scope: req.Scope, Key: req.Key,
		At: time.Since(w.start), TookOver: res.TookOver}
	w.fireAmbushes(sk(req.Scope, req.Key), time.Since(w.start))
}

func (w *world) noteComplete(c idempotency.Completion) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// A completion sent again under its token confirms the record and changes nothing
	// of it (its expiry runs from the first).
	if f := w.facts.claims[c.Token]; f != nil && !f.Completed {
		f.Completed, f.CompletedAt = true, time.Since(w.start)
	}
}

func (w *world) noteRenewal(token int64, own time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if f := w.facts.claims[token]; f != nil {
		f.Renewals = append(f.Renewals, renewal{At: time.Since(w.start), Own: own})
	}
}

// noteDeleted records the janitor's deletion of rec as a pseudo-claim (a negative
// token), so that what became of a key can be followed past it.
func (w *world) noteDeleted(rec idempotency.Record) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.facts.janitor == nil {
		w.facts.janitor = &replica{w: w, slot: -1, name: "janitor", started: -time.Hour, h: &handle{w: w, name: "janitor", slot: -1}}
	}
	tok := -int64(len(w.facts.claims) + 1)
	w.facts.claims[tok] = &claimFact{Token: tok, Proc: w.facts.janitor, Scope: rec.Scope, Key: rec.Key, At: time.Since(w.start), Deletes: rec.Token}
}

func (w *world) noteRelease(token int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if f := w.facts.claims[token]; f != nil {
		f.Released = true
	}
}

// check checks the invariants on the quiesced schedule.
func (w *world) check(res *Result) {
	w.mu.Lock()
	defer w.mu.Unlock()
	end := time.Since(w.start)
	f := &w.facts
	res.Inputs = map[string]int{}
	res.Executions, res.Finals, res.Unfinished, res.LateTakeovers = len(f.execs), len(f.seen), f.unfinished, f.lateTakeovers
	for _, a := range w.ambushes {
		if a.fired {
			res.Ambushes++
		}
	}

	// At most one execution per (scope, key), but in the documented windows: each
	// execution after the first is explained by what happened to the one before it.
	allowed := map[int]string{} // execution → why a later one of its key was allowed
	byKey := map[string][]*execution{}
	var keys []string
	for _, x := range f.execs {
		k := sk(x.Scope, x.Key)
		if byKey[k] == nil {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], x)
	}
	for _, k := range keys {
		xs := byKey[k]
		for i := 1; i < len(xs); i++ {
			res.Extra++
			why, kind, ok := w.explain(xs[i-1], xs[i])
			msg := fmt.Sprintf("%s executed again (#%d after #%d): %s", k, xs[i].N, xs[i-1].N, why)
			res.Kinds = append(res.Kinds, kind)
			if ok {
				allowed[xs[i-1].N] = why
				res.Windows = append(res.Windows, msg)
			} else {
				res.Violations = append(res.Violations, "one execution per key: "+msg)
			}
		}
	}

	// Refused inputs reach no upstream: a keyed method in another case, and (through a
	// gateway) a Connection header naming a protected header, are answered 400 by the
	// replica; one forwarded would run unkeyed, or lose its key on the way.
	byID := map[int]*Op{}
	for i := range w.plan.Ops {
		byID[w.plan.Ops[i].ID] = &w.plan.Ops[i]
	}
	for _, x := range f.execs {
		switch op := byID[x.Op]; {
		case x.Method != http.MethodPost:
			res.Violations = append(res.Violations, fmt.Sprintf("refused inputs: exec #%d (o%d, %s %s, key %s) reached the upstream from %s, which runs it as POST: a keyed method in another case must be refused, not forwarded",
				x.N, x.Op, x.Method, x.Path, sk(x.Scope, x.Key), x.Proc.name))
		case op != nil && op.Connection != "":
			res.Violations = append(res.Violations, fmt.Sprintf("refused inputs: exec #%d (o%d, key %s) reached the upstream from %s with Connection: %s, which names a header the upstream must receive",
				x.N, x.Op, sk(x.Scope, x.Key), x.Proc.name, op.Connection))
		}
	}
	for _, s := range f.stripped {
		res.Violations = append(res.Violations, "protected headers reach the upstream: "+s)
	}

	// Every final answer is the request's own, and what the store replays for its key.
	ops := map[string][]*Op{}
	for i := range w.plan.Ops {
		op := &w.plan.Ops[i]
		ops[sk(op.Scope, op.Key)] = append(ops[sk(op.Scope, op.Key)], op)
	}
	for _, s := range f.seen {
		op := s.Op
		k := sk(op.Scope, op.Key)
		switch {
		case op.Method != "":
			res.Inputs["lower-case method: "+strconv.Itoa(s.Status)]++
		case op.Connection != "":
			res.Inputs["Connection names a protected header: "+strconv.Itoa(s.Status)]++
		case op.Twin != 0 && s.Receipt != nil:
			res.Inputs["path twin: the upstream's answer"]++
		case op.Twin != 0:
			res.Inputs["path twin: "+strconv.Itoa(s.Status)]++
		}
		if op.refused() {
			want := idempotency.ProblemInvalidMethod
			if op.Method == "" {
				want = gateway.ProblemHopByHop
			}
			if s.Status != http.StatusBadRequest || s.Problem != want {
				res.Violations = append(res.Violations, fmt.Sprintf("refused inputs: %s o%d (%s %s, Connection %q) got %d (%s), not the 400 %s",
					s.Attempt, op.ID, op.method(), op.path(), op.Connection, s.Status, trunc(s.Body), want))
			}
			continue
		}
		if s.Receipt == nil {
			// Another op with the key sends another body (or the same one to another
			// path): whichever claims first runs. A refused op claims nothing.
			reused := slices.ContainsFunc(ops[k], func(o *Op) bool { return o.ID != op.ID && !o.refused() })
			byRefused := slices.IndexFunc(ops[k], func(o *Op) bool { return o.ID != op.ID && o.refused() })
			switch {
			case s.Status == http.StatusUnprocessableEntity && !reused && byRefused >= 0:
				res.Violations = append(res.Violations, fmt.Sprintf("refused inputs: %s o%d got 422 for its key, which only o%d used with another body: a request a replica must refuse claimed it",
					s.Attempt, op.ID, ops[k][byRefused].ID))
			case s.Status != http.StatusUnprocessableEntity || !reused:
				res.Violations = append(res.Violations, fmt.Sprintf("final answers: %s o%d got %d (%s), not an answer of the upstream", s.Attempt, op.ID, s.Status, trunc(s.Body)))
			}
			continue
		}
		rc := s.Receipt
		if rc.Scope != op.Scope || rc.Key != op.Key || rc.Op != op.bodyOp() || rc.Amount != op.Amount || rc.Path != op.path() {
			res.Violations = append(res.Violations, fmt.Sprintf("no foreign replay: %s (scope %s key %s amount %d path %s) got the answer of exec #%d (scope %s key %s amount %d path %s)",
				s.Attempt, op.Scope, op.Key, op.Amount, op.path(), rc.Exec, rc.Scope, rc.Key, rc.Amount, rc.Path))
			continue
		}
		x := f.execs[rc.Exec-1]
		c := f.claims[x.Token]
		rec, err := w.store.Get(context.Background(), op.Scope, op.Key)
		switch {
		case err == nil && rec.State == idempotency.StateDone && rec.Token == x.Token:
			if rec.Response == nil || rec.Response.Status != s.Status || !bytes.Equal(rec.Response.Body, s.Body) {
				res.Violations = append(res.Violations, fmt.Sprintf("final answers: %s got %d %s, the store replays another answer under the same token %d", s.Attempt, s.Status, trunc(s.Body), x.Token))
			}
		case c != nil && c.Completed && c.CompletedAt+w.plan.TTL <= end:
			// stored, then expired
		case allowed[x.N] != "":
			res.Windows = append(res.Windows, fmt.Sprintf("%s kept the answer of exec #%d, which a later execution replaced: %s", s.Attempt, x.N, allowed[x.N]))
		case x.Proc.isDead() && (c == nil || !c.Completed):
			res.Windows = append(res.Windows, fmt.Sprintf("%s kept the answer of exec #%d, never stored: its owner %s was killed first", s.Attempt, x.N, x.Proc.name))
		default:
			why, ok := w.takenOver(x, c)
			if ok {
				res.Windows = append(res.Windows, fmt.Sprintf("%s kept the answer of exec #%d, whose record was taken over or deleted since: %s", s.Attempt, x.N, why))
				break
			}
			state := "no record"
			if err == nil {
				state = fmt.Sprintf("%s under token %d", rec.State, rec.Token)
			}
			if why != "" {
				why = ": " + why
			}
			res.Violations = append(res.Violations, fmt.Sprintf("final answers: %s got the answer of exec #%d (token %d) as final, and the store holds %s for %s%s", s.Attempt, x.N, x.Token, state, k, why))
		}
	}

	// A live process stores what it holds once the store answers again.
	for _, u := range f.unstored {
		res.Violations = append(res.Violations, "held answers stored: "+u)
	}

	// No record stuck in progress once every owner is gone and its lease has passed.
	now := time.Now()
	for _, k := range slices.Sorted(maps.Keys(ops)) {
		os := ops[k]
		rec, err := w.store.Get(context.Background(), os[0].Scope, os[0].Key)
		if err == nil && rec.State == idempotency.StateInProgress && rec.LeaseUntil.After(now) {
			res.Violations = append(res.Violations, fmt.Sprintf("no stuck record: %s in progress under token %d, its lease still %s ahead with every owner gone", k, rec.Token, fmtD(rec.LeaseUntil.Sub(now))))
		}
	}
}

// takenOver says why the key of x (claimed as c) passed to a later claim or was deleted,
// and whether that is a documented window; "" when it did not pass on. w.mu is held.
func (w *world) takenOver(x *execution, c *claimFact) (string, bool) {
	if c == nil {
		return "", false
	}
	next := w.lastClaim(x.Scope, x.Key, c.At)
	if next == nil {
		return "", false
	}
	why, _, ok := w.explain(x, next)
	return why, ok
}

// explain says why cur could execute after prev, the execution before it of the same
// key, under which kind of cause, and whether that is one of the documented windows.
// What is judged is the claim that first displaced prev's (the first claim of the key
// the store granted after it, or the janitor's deletion of its record): claims between
// it and cur's executed nothing. w.mu is held.
func (w *world) explain(prev, cur *execution) (why, kind string, ok bool) {
	f := &w.facts
	cp, cc := f.claims[prev.Token], f.claims[cur.Token]
	switch {
	case prev.Token == 0 || cur.Token == 0:
		return fmt.Sprintf("an execution under no claim at all (tokens %d, %d): the request was passed through unkeyed", prev.Token, cur.Token), "unclaimed", false
	case prev.Token == cur.Token:
		return fmt.Sprintf("both under one claim (token %d): forwarded twice", cur.Token), "forwarded-twice", false
	case cp == nil || cc == nil:
		return fmt.Sprintf("an execution under no claim the store granted (tokens %d, %d)", prev.Token, cur.Token), "no-claim", false
	}
	d := w.displacing(cp)
	if d == nil {
		d = cc
	}
	taker := fmt.Sprintf("%s's claim (token %d, %s at %s)", tokenName(cur), d.Token, d.Proc.name, fmtD(d.At))
	switch {
	case d.Deletes != 0:
		taker = fmt.Sprintf("the janitor's deletion of the record at %s (before %s's claim)", fmtD(d.At), tokenName(cur))
	case d != cc:
		taker = fmt.Sprintf("the claim of token %d (%s at %s, before %s's)", d.Token, d.Proc.name, fmtD(d.At), tokenName(cur))
	}
	switch {
	case cp.Completed && cp.CompletedAt <= d.At:
		if d.At >= cp.CompletedAt+w.plan.TTL {
			return fmt.Sprintf("#%d's record expired (stored at %s, TTL %s) before %s", prev.N, fmtD(cp.CompletedAt), w.plan.TTL, taker), "expired", true
		}
		return fmt.Sprintf("#%d's answer was stored at %s (under token %d), before it expired came %s", prev.N, fmtD(cp.CompletedAt), prev.Token, taker), "ran-after-stored", false
	case cp.Released:
		return fmt.Sprintf("#%d's key was released after the upstream executed it", prev.N), "released-after-execution", false
	case prev.AnswerLost != "" && prev.AnswerLostAt <= d.At: // a loss the takeover caused explains nothing
		return fmt.Sprintf("the upstream's answer to #%d never reached its owner %s (%s): the key was left to its lease", prev.N, prev.Proc.name, prev.AnswerLost), "answer-lost", true
	}
	if prev.Proc.isDead() {
		prev.Proc.mu.Lock()
		died := prev.Proc.diedAt
		prev.Proc.mu.Unlock()
		if died <= d.At {
			return fmt.Sprintf("#%d's owner %s was killed at %s, before its answer was stored", prev.N, prev.Proc.name, fmtD(died)), "owner-killed", true
		}
	}
	// A renewal sent in an outage of its owner's link would have failed on time too: its
	// lateness explains nothing.
	for _, rn := range cp.Renewals {
		if rn.At >= d.At-w.plan.Lease && rn.At < d.At && rn.Own >= w.plan.StoreTimeout && !w.cutOff(prev.Proc.slot, rn.At) {
			return fmt.Sprintf("#%d's owner %s renewed its lease at %s over its own link, which delivered the renewal %s late, while %s reached the store", prev.N, prev.Proc.name, fmtD(rn.At), fmtD(rn.Own), d.Proc.name), "owner-link-late-alone", true
		}
	}
	// A live owner renews at least every second while it can: a lease that ran out by
	// d.At had its renewals fail in the lease before (give or take a slow spell).
	from := max(cp.At, d.At-w.plan.Lease-w.plan.Lease/2)
	for _, o := range w.plan.Outages {
		if o.Replica == prev.Proc.slot && o.Start < d.At && o.End > from {
			return fmt.Sprintf("#%d's owner %s was cut off from the store alone (%s–%s) while %s reached it", prev.N, prev.Proc.name, fmtD(o.Start), fmtD(o.End), d.Proc.name), "owner-cut-off-alone", true
		}
	}
	for _, s := range w.plan.Slow {
		if s.Replica == prev.Proc.slot && s.Start < d.At && s.End > from {
			return fmt.Sprintf("#%d's owner %s alone had a slow link to the store (%s–%s) while %s reached it", prev.N, prev.Proc.name, fmtD(s.Start), fmtD(s.End), d.Proc.name), "owner-slow-alone", true
		}
	}
	// A process holds takeovers back for a lease from its start, as after an outage it
	// saw: one that started less than a lease before its claim, after an outage that kept
	// the owner from renewing, took the key over from a live owner.
	for _, o := range w.plan.Outages {
		if o.Replica < 0 && o.Start < d.At && o.End > from && d.Proc.started >= d.At-w.plan.Lease && !d.Proc.h.failedBy(d.At) {
			return fmt.Sprintf("%s came from process %s, started at %s, after an outage (%s–%s) it never saw, before the owner %s could renew", taker, d.Proc.name, fmtD(d.Proc.started), fmtD(o.Start), fmtD(o.End), prev.Proc.name), "started-after-outage", false
		}
	}
	// An outage of every replica that outlasts a record's TTL while its request runs: a
	// janitor not held back after an outage as takeovers are would delete the expired
	// record before its owner renews or stores. The janitor is held back
	// (JanitorConfig.Middleware), so this is a violation, named by its cause.
	for _, o := range w.plan.Outages {
		if d.Deletes != 0 && o.Replica < 0 && o.Start < d.At && o.End > from {
			return fmt.Sprintf("#%d's record expired during an outage of every replica (%s–%s) that its owner %s could not renew through, and the janitor deleted it at %s, before the owner stored", prev.N, fmtD(o.Start), fmtD(o.End), prev.Proc.name, fmtD(d.At)), "outage-outlasted-ttl", false
		}
	}
	switch {
	case d.Deletes != 0:
		return fmt.Sprintf("the janitor deleted #%d's record (token %d) at %s, expired, while its owner %s, alive and never cut off alone, ran or held its answer", prev.N, prev.Token, fmtD(d.At), prev.Proc.name), "deleted-running-record", false
	case d.TookOver:
		return fmt.Sprintf("%s took over the lease of #%d's owner %s, alive and never cut off alone", taker, prev.N, prev.Proc.name), "took-over-live-owner", false
	}
	return fmt.Sprintf("%s replaced #%d's record (token %d) while its owner %s ran", taker, prev.N, prev.Token, prev.Proc.name), "replaced-running-record", false
}

// cutOff reports whether an outage of slot's link to the store (its own, or every
// replica's) holds at at. w.mu is held.
func (w *world) cutOff(slot int, at time.Duration) bool {
	return slices.ContainsFunc(w.plan.Outages, func(o Outage) bool {
		return at >= o.Start && at < o.End && (o.Replica < 0 || o.Replica == slot)
	})
}

// displacing returns the first claim of c's key the store granted after c, or the
// janitor's first deletion of its record after c, whichever came first; nil if none.
// w.mu is held.
func (w *world) displacing(c *claimFact) *claimFact {
	var first *claimFact
	for _, o := range w.facts.claims {
		if o != c && o.Scope == c.Scope && o.Key == c.Key && o.At > c.At && (first == nil || o.At < first.At) {
			first = o
		}
	}
	return first
}

// tokenName names an execution in explain's sentences, or the claim standing for one
// (N zero: a claim whose owner executed nothing).
func tokenName(x *execution) string {
	if x.N == 0 {
		return fmt.Sprintf("token %d", x.Token)
	}
	return fmt.Sprintf("#%d", x.N)
}

// lastClaim returns the last claim of (scope, key) the store granted after instant at,
// as an execution-shaped value for explain, or nil. w.mu is held.
func (w *world) lastClaim(scope, key string, at time.Duration) *execution {
	var last *claimFact
	for _, c := range w.facts.claims {
		if c.Scope == scope && c.Key == key && c.At > at && (last == nil || c.At > last.At) {
			last = c
		}
	}
	if last == nil || last.Proc == nil {
		return nil
	}
	return &execution{Scope: scope, Key: key, Token: last.Token, Proc: last.Proc}
}

func trunc(b []byte) string {
	if len(b) > 120 {
		return string(b[:120]) + "…"
	}
	return string(b)
}
