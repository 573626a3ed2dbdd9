package sim

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Plan is everything a schedule decides before it starts, drawn from the seed: the
// middleware's settings, the replicas and when they crash, the store's outages and slow
// spells, and the clients' operations. What happens during the run (each message's
// delay, each lost reply, each upstream answer) is drawn as it happens, from streams of
// the same seed.
type Plan struct {
	Lease, TTL, StoreTimeout, UpstreamTimeout time.Duration
	Janitor                                   time.Duration // the janitor's interval
	Replicas                                  []ReplicaPlan
	Outages                                   []Outage
	Slow                                      []Slow
	Ops                                       []Op
	// Horizon is when clients stop retrying; every fault window ends before it.
	Horizon time.Duration
	// Storm: a few keys, each sent by several clients at once, through store stalls
	// that hold messages, with more messages delivered late: the schedules where a
	// claim decided on old knowledge reaches the store after the key changed hands.
	Storm bool
	// Late is the share of store messages delivered long (a third of a lease to two
	// leases) after they were sent, and LateTakeover that of the claims that may take a
	// key over: the message whose lateness the TakeoverBy bound is for, made late more
	// often in storms so that the search meets it.
	Late, LateTakeover float64
	// Ambush is the share of the takeover claims drawn long late that the network
	// ambushes, in storms (see ambush): it holds the claim until another claim of its
	// key is granted, begins an outage of every replica just after, and delivers the
	// claim just after the outage ends.
	Ambush float64
}

// ReplicaPlan is one replica slot: what it runs and when its process is killed.
type ReplicaPlan struct {
	// Gateway: the replica is a retrysafe gateway (gateway.New) forwarding through an
	// in-memory transport; otherwise idempotency.New's Handler around a handler that
	// calls the upstream.
	Gateway bool
	// Wire: the gateway forwards through a real http.Transport, over in-memory pipes to
	// an upstream that speaks HTTP/1.1 on them (wire.go), keep-alive connections reused.
	Wire bool
	Wait bool // Conflict: wait instead of reject
	// Skew is how far the replica's clock is from the simulation's (the store's). The
	// middleware takes every instant it compares from the store, so nothing the replica
	// does reads it; a store that decided by its caller's clock would (see callerClock).
	Skew    time.Duration
	Crashes []Crash
}

// Crash kills a replica's process at At; a new process takes the slot Down later.
type Crash struct{ At, Down time.Duration }

// Outage is a window in which store calls fail: of every replica (Replica < 0) or of
// one replica only (a partition between that replica and the store). Stall: calls hang
// until their caller's timeout; otherwise they fail at once.
type Outage struct {
	Start, End time.Duration
	Replica    int
	Stall      bool
	// RunTime: begun during the run by the network's ambush of a late takeover claim,
	// not drawn with the plan; judged as any other outage.
	RunTime bool
}

// Slow is a window in which store calls take Extra longer, for every replica or one.
type Slow struct {
	Start, End, Extra time.Duration
	Replica           int
}

// Op is one logical operation of a client: one key, sent until it gets a final answer.
type Op struct {
	ID             int
	Scope, Key     string
	Amount         int // the body; an op reusing another's key with another amount expects 422
	Start          time.Duration
	AttemptTimeout time.Duration
	Clients        int  // how many clients send it at once, each retrying on its own
	Hedge          bool // sends a concurrent duplicate with its first attempt
	SlowReader     bool // reads every answer slowly

	// The inputs that slip around the key rules (a minority of operations, drawn by
	// addInputs; the zero values are an ordinary POST /payments):
	//
	// Method is the request's method, "" for POST: "post" is a keyed method in another
	// case, which many upstream frameworks run as POST, so replicas must refuse it (400,
	// invalid-method) rather than pass it through unkeyed.
	Method string
	// Path is the request's path as sent, "" for /payments: twins send one body under
	// one key, one to /payments/x%2Fy and one to /payments/x/y, which the upstream
	// routes apart, so the second must get a 422, never the first's answer.
	Path string
	// Twin is the ID of the operation sending the same body under the same key to the
	// other spelling of Path (the body names the lower of the two IDs); 0: none.
	Twin int
	// Connection is the request's Connection header, naming a header the upstream must
	// receive (the key, the scope's header, the content type): a gateway must refuse it
	// (400, hop-by-hop), since a proxy strips the headers Connection lists. Sent to
	// gateway replicas only: a middleware replica is the upstream's own process, with no
	// hop to strip anything.
	Connection string
}

// method is the op's request method.
func (op *Op) method() string { return cmp.Or(op.Method, http.MethodPost) }

// path is the op's request path as sent.
func (op *Op) path() string { return cmp.Or(op.Path, "/payments") }

// bodyOp is the operation the op's body names: its twin's when the twin's ID is lower.
func (op *Op) bodyOp() int {
	if op.Twin != 0 && op.Twin < op.ID {
		return op.Twin
	}
	return op.ID
}

// refused reports whether every replica the op may reach must refuse it without a
// claim: a keyed method in another case, or a Connection header naming a protected
// header (sent to gateways only).
func (op *Op) refused() bool { return op.method() != http.MethodPost || op.Connection != "" }

func dur(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)))
}

func chance(r *rand.Rand, p float64) bool { return r.Float64() < p }

// newPlan draws a plan from r.
func newPlan(r *rand.Rand) Plan {
	var p Plan
	p.Lease = []time.Duration{2 * time.Second, 3 * time.Second, 6 * time.Second}[r.IntN(3)]
	p.StoreTimeout = p.Lease / 6
	// Not a multiple of the heartbeat's period (a third of the lease, or a second): the
	// renewal due at the instant an upstream call times out would run before or after
	// it, as the goroutines of one instant happen to go.
	p.UpstreamTimeout = dur(r, 3*p.Lease/4, 3*p.Lease/2)
	p.TTL = p.Lease * time.Duration(4+r.IntN(8))
	p.Janitor = dur(r, p.Lease/2, 2*p.Lease)
	p.Storm = chance(r, 0.25)
	p.Late, p.LateTakeover = 0.01, 0.01
	if p.Storm {
		p.Late, p.LateTakeover, p.Ambush = 0.10, 0.5, 0.7
	}
	faults := 4 * p.Lease // fault windows start before this
	p.Horizon = faults + 10*p.Lease

	nrep := 2 + r.IntN(2)
	for i := range nrep {
		rp := ReplicaPlan{Gateway: chance(r, 0.5), Wait: chance(r, 0.3), Skew: dur(r, -p.Lease, p.Lease)}
		if i > 0 || chance(r, 0.5) { // slot 0 crashes less, so that some schedules have a steady replica
			at := time.Duration(0)
			for range r.IntN(3) {
				at += dur(r, p.Lease/4, 2*p.Lease)
				if at >= faults {
					break
				}
				down := dur(r, p.Lease/5, 2*p.Lease)
				rp.Crashes = append(rp.Crashes, Crash{At: at, Down: down})
				at += down
			}
		}
		p.Replicas = append(p.Replicas, rp)
	}
	for range r.IntN(3) {
		start := dur(r, 0, faults)
		o := Outage{Start: start, End: start + dur(r, p.Lease/10, 5*p.Lease/2), Replica: -1, Stall: chance(r, 0.5)}
		if chance(r, 0.35) {
			o.Replica = r.IntN(nrep)
		}
		p.Outages = append(p.Outages, o)
	}
	for range r.IntN(2) {
		start := dur(r, 0, faults)
		s := Slow{Start: start, End: start + dur(r, p.Lease/4, 2*p.Lease), Extra: dur(r, p.Lease/20, 3*p.Lease/4), Replica: -1}
		if chance(r, 0.35) {
			s.Replica = r.IntN(nrep)
		}
		p.Slow = append(p.Slow, s)
	}
	scopes := []string{"alice", "bob"}
	nops := 3 + r.IntN(6)
	if p.Storm {
		nops = 2 + r.IntN(2)
	}
	for i := range nops {
		op := Op{
			ID:             i + 1,
			Scope:          scopes[r.IntN(len(scopes))],
			Key:            fmt.Sprintf("k%d", 1+r.IntN(3)), // few keys: scopes and reuses collide
			Amount:         100 * (1 + r.IntN(3)),
			Start:          dur(r, 0, 2*p.Lease),
			AttemptTimeout: dur(r, p.Lease/4, 3*p.Lease),
			Clients:        1,
			Hedge:          chance(r, 0.25),
			SlowReader:     chance(r, 0.15),
		}
		if chance(r, 0.15) {
			op.Clients = 2
		}
		if p.Storm {
			op.Clients = 2 + r.IntN(3)
		}
		p.Ops = append(p.Ops, op)
	}
	if p.Storm {
		// Outages aimed at requests in flight: each begins shortly after an operation's
		// first attempt, while its owner may still be running or storing its answer.
		for range 1 + r.IntN(3) {
			start := p.Ops[r.IntN(len(p.Ops))].Start + dur(r, 0, 300*time.Millisecond)
			p.Outages = append(p.Outages, Outage{Start: start, End: start + dur(r, p.Lease, 5*p.Lease/2), Replica: -1, Stall: chance(r, 0.4)})
		}
	}
	return p
}

// addRestarts adds to p, for some outages of every replica, a crash of one replica
// during the outage whose new process starts just after it: a process that saw nothing
// of the outage beside an owner that could not renew through it. It draws from a
// stream of its own, so that the rest of the plan is what newPlan drew without them.
func addRestarts(r *rand.Rand, p *Plan) {
	for _, o := range p.Outages {
		if o.Replica >= 0 || !chance(r, 0.6) {
			continue
		}
		i := r.IntN(len(p.Replicas))
		c := Crash{At: o.Start + dur(r, 0, o.End-o.Start)}
		c.Down = o.End + dur(r, 0, p.Lease/10) - c.At
		rp := &p.Replicas[i]
		if slices.ContainsFunc(rp.Crashes, func(x Crash) bool { return x.At < c.At+c.Down+p.Lease/10 && c.At < x.At+x.Down+p.Lease/10 }) {
			continue // the slot is down then, or just back
		}
		rp.Crashes = append(rp.Crashes, c)
		slices.SortFunc(rp.Crashes, func(a, b Crash) int { return cmp.Compare(a.At, b.At) })
	}
}

// addInputs adds to p, in two plans of five, one or two operations sending an input
// that slipped around the key rules: a lower-case keyed method, twins whose paths differ
// only in a percent-encoded slash, a Connection header naming a protected header (when
// the plan has a gateway replica). It draws from a stream of its own, so that the rest of
// the plan is what newPlan drew without them.
func addInputs(r *rand.Rand, p *Plan) {
	if !chance(r, 0.4) {
		return
	}
	gateways := slices.ContainsFunc(p.Replicas, func(rp ReplicaPlan) bool { return rp.Gateway })
	scopes := []string{"alice", "bob"}
	for range 1 + r.IntN(2) {
		op := Op{
			ID:             len(p.Ops) + 1,
			Scope:          scopes[r.IntN(len(scopes))],
			Key:            fmt.Sprintf("k%d", 1+r.IntN(3)), // the keys of the other operations
			Amount:         100 * (1 + r.IntN(3)),
			Start:          dur(r, 0, 2*p.Lease),
			AttemptTimeout: dur(r, p.Lease/4, 3*p.Lease),
			Clients:        1,
			Hedge:          chance(r, 0.4), // a duplicate sent at once, as an impatient client's retry
		}
		switch x := r.IntN(3); {
		case x == 0:
			op.Method = []string{"post", "Post", "pOST"}[r.IntN(3)]
		case x == 1 && gateways:
			op.Connection = []string{"Idempotency-Key", "idempotency-key", "keep-alive, Idempotency-Key", scopeHeader, "Content-Type"}[r.IntN(5)]
		default:
			paths := []string{"/payments/x%2Fy", "/payments/x/y"}
			if chance(r, 0.5) {
				paths[0], paths[1] = paths[1], paths[0]
			}
			twin := op
			op.Path, op.Twin = paths[0], op.ID+1
			twin.ID, twin.Path, twin.Twin = op.ID+1, paths[1], op.ID
			twin.Start += dur(r, 0, p.Lease)
			twin.AttemptTimeout = dur(r, p.Lease/4, 3*p.Lease)
			twin.Hedge = chance(r, 0.25)
			p.Ops = append(p.Ops, op, twin)
			continue
		}
		p.Ops = append(p.Ops, op)
	}
}

// addWire gives some gateway replicas a real http.Transport, from a stream of its own
// (the rest of the plan is drawn as without it).
func addWire(r *rand.Rand, p *Plan) {
	for i := range p.Replicas {
		if p.Replicas[i].Gateway && chance(r, 0.5) {
			p.Replicas[i].Wire = true
		}
	}
}

// String is the plan, readable, as the trace's header.
func (p Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "lease %s, ttl %s, store timeout %s, upstream timeout %s, janitor every %s, clients stop at %s, late messages %.0f%% (takeover claims %.0f%%)",
		p.Lease, p.TTL, p.StoreTimeout, p.UpstreamTimeout, p.Janitor.Round(time.Millisecond), p.Horizon, 100*p.Late, 100*p.LateTakeover)
	if p.Ambush > 0 {
		fmt.Fprintf(&b, ", %.0f%% of late takeover claims ambushed", 100*p.Ambush)
	}
	if p.Storm {
		b.WriteString(", storm")
	}
	b.WriteString("\n")
	for i, rp := range p.Replicas {
		kind := "middleware"
		if rp.Gateway {
			kind = "gateway"
		}
		if rp.Wire {
			kind += " (http.Transport)"
		}
		if rp.Wait {
			kind += " (conflict: wait)"
		}
		fmt.Fprintf(&b, "replica r%d: %s, clock %+.6fs off", i, kind, rp.Skew.Seconds())
		for _, c := range rp.Crashes {
			fmt.Fprintf(&b, "; killed at %s, back %s later", fmtD(c.At), fmtD(c.Down))
		}
		b.WriteString("\n")
	}
	for _, o := range p.Outages {
		who, how := "every replica", "cut"
		if o.Replica >= 0 {
			who = fmt.Sprintf("r%d alone", o.Replica)
		}
		if o.Stall {
			how = "stall"
		}
		if o.RunTime {
			who += ", at run time"
		}
		fmt.Fprintf(&b, "store outage (%s, %s) %s–%s\n", how, who, fmtD(o.Start), fmtD(o.End))
	}
	for _, s := range p.Slow {
		who := "every replica"
		if s.Replica >= 0 {
			who = fmt.Sprintf("r%d alone", s.Replica)
		}
		fmt.Fprintf(&b, "store slow by %s (%s) %s–%s\n", fmtD(s.Extra), who, fmtD(s.Start), fmtD(s.End))
	}
	for _, op := range p.Ops {
		fmt.Fprintf(&b, "op o%d: scope %s key %s amount %d, from %s, attempt timeout %s", op.ID, op.Scope, op.Key, op.Amount, fmtD(op.Start), fmtD(op.AttemptTimeout))
		if op.Clients > 1 {
			fmt.Fprintf(&b, ", %d clients", op.Clients)
		}
		if op.Hedge {
			b.WriteString(", hedged")
		}
		if op.SlowReader {
			b.WriteString(", slow reader")
		}
		if op.Method != "" || op.Path != "" {
			fmt.Fprintf(&b, ", sent as %s %s", op.method(), op.path())
		}
		if op.Twin != 0 {
			fmt.Fprintf(&b, ", twin of o%d (one body, one key)", op.Twin)
		}
		if op.Connection != "" {
			fmt.Fprintf(&b, ", Connection: %s (to gateways)", op.Connection)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// fmtD prints a virtual instant or duration to the microsecond.
func fmtD(d time.Duration) string { return d.Round(time.Microsecond).String() }
