package chaos

import (
	"cmp"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/harness/faultproxy"
	"github.com/retrysafe/retrysafe/harness/tcpproxy"
)

// UpstreamStats counts what the payments upstream received.
type UpstreamStats struct {
	Deliveries int64 // requests received
	Executions int64 // ... that committed a ledger row
	Absorbed   int64 // ... that found the payment already recorded (dedup mode)
	NotDone    int64 // ... answered 503: the ledger could not be written, and the row is known not to exist
	// Resolved counts ledger writes that failed and whose outcome the upstream learned
	// (by its execution number) before it answered.
	Resolved     int64
	SlowAnswers  int64 // answers delayed on purpose past the gateways' upstream timeout
	HeldAnswers  int64 // answers held back as a failover began (see upstream.holdAnswers)
	LargeAnswers int64 // answers with padding asked for
	KeyReused    int64 // deliveries whose key had recorded another ref or amount (dedup mode, answered 422): must be 0
}

// Report is one chaos run: what was done to the system, what the clients and the
// upstream saw, and the verdict.
type Report struct {
	Store           string // sqlite, postgres or redis
	Replicas        int
	Seed            uint64
	Lease           time.Duration
	UpstreamTimeout time.Duration
	Load            time.Duration // clients started payments for this long
	Drain           time.Duration // then the payments in flight took this long to end
	Elapsed         time.Duration // the whole run, setup and checks included
	Setup           []string      // lines describing the wiring

	Clients, SlowClients                  int
	Attempts, Resends, Replays, Conflicts int64 // counted below retry.Transport
	ServerErrors, TransportErrors         int64
	// LargePayments asked for a large answer; SlowLarge large answers were read slowly;
	// BodyCuts answers broke off while a client read them (SlowBodyCuts of slow readers).
	LargePayments, SlowLarge, BodyCuts, SlowBodyCuts int64

	ClientFaults   faultproxy.Stats // client ↔ gateway, summed over the proxies
	UpstreamFaults faultproxy.Stats // gateway ↔ upstream, summed over the proxies
	StoreLink      *tcpproxy.Stats  // gateway ↔ store; nil: no store proxy (NoStoreLink says why)
	NoStoreLink    string           // why there is no store proxy
	Partitions     []Partition      // of the store link, latency spikes included

	Kills, Restarts, FailedStarts, PGRestarts int
	PGDowntime                                time.Duration
	// Failovers are the store's failovers, with what the gateways logged around each.
	Failovers []FailoverImpact

	Outcomes        map[string]int64 // gateway outcomes, from the replicas' request logs
	GatewayWarnings int64
	UnexpectedExits []string // gateway exits the suite did not cause
	BadStops        []string // gateways that did not exit 0 on SIGTERM at the end

	Upstream UpstreamStats
	Dedup    bool // the upstream deduplicated on the key (a demonstration)

	// Attribution explains every execution beyond the first of a payment; Unallowed
	// holds, for the failure report, the description of up to a few of each cause that
	// is not allowed.
	Attribution Attribution
	Unallowed   []string
	// KeyEvidence holds, for the failure report, what the upstream and the gateways
	// logged of up to a few keys of each other failure (unfinished, stuck, store
	// disagrees, lost).
	KeyEvidence []string
	// LedgerDisagrees counts payments whose ledger rows and the upstream's execution
	// log disagree (a row the log does not know, or the reverse): must be 0.
	LedgerDisagrees int
	LedgerEvidence  []string

	Checks Checks
}

// OK reports whether the run passed: every check zero, every extra execution allowed
// (with a deduplicating upstream: no duplicate at all), the ledger and the execution log
// agree, no gateway exited on its own, the final graceful stops exited 0, and no key was
// reused.
func (r Report) OK() bool {
	dups := r.Attribution.Unallowed() == 0
	if r.Dedup {
		dups = r.Checks.Duplicates == 0
	}
	return r.Checks.OK() && dups && r.LedgerDisagrees == 0 && len(r.UnexpectedExits) == 0 && len(r.BadStops) == 0 &&
		r.Upstream.KeyReused == 0
}

// Verdict is the one-line summary of what failed ("" when OK).
func (r Report) Verdict() string {
	if r.OK() {
		return ""
	}
	c := r.Checks
	var parts []string
	add := func(name string, n int) {
		if n != 0 {
			parts = append(parts, fmt.Sprintf("%s %d", name, n))
		}
	}
	if r.Dedup {
		add("duplicates", c.Duplicates)
	} else {
		for _, cause := range Causes() {
			if !cause.Allowed() {
				add("extra executions by "+cause.String(), r.Attribution.ByCause[cause])
			}
		}
	}
	add("lost", c.Lost)
	add("phantoms", c.Phantoms)
	add("mismatched", c.Mismatched)
	add("stuck", c.Stuck)
	add("store disagrees", c.StoreDisagrees)
	add("unfinished", c.Unfinished)
	add("failed", c.Failed)
	add("ledger disagrees", r.LedgerDisagrees)
	add("unexpected exits", len(r.UnexpectedExits)+len(r.BadStops))
	add("key reused", int(r.Upstream.KeyReused))
	return strings.Join(parts, ", ")
}

func faultKinds(s faultproxy.Stats) string {
	var kinds []string
	for _, k := range faultproxy.Kinds() {
		if n := s.Count(k); n > 0 {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		}
	}
	if len(kinds) == 0 {
		return "none"
	}
	return strings.Join(kinds, ", ") + fmt.Sprintf("; %d on reused connections", s.OnReused)
}

// WriteTable prints the report.
func (r Report) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "chaos · %s store · %d gateway replica(s) · seed %d · load %s, drain %s, run %s\n",
		r.Store, r.Replicas, r.Seed, r.Load.Round(time.Millisecond), r.Drain.Round(time.Millisecond), r.Elapsed.Round(time.Second))
	for _, s := range r.Setup {
		fmt.Fprintf(w, "  %s\n", s)
	}
	var outcomes []string
	var requests int64
	names := make([]string, 0, len(r.Outcomes))
	for k := range r.Outcomes {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool {
		if r.Outcomes[names[i]] != r.Outcomes[names[j]] {
			return r.Outcomes[names[i]] > r.Outcomes[names[j]]
		}
		return names[i] < names[j]
	})
	for _, k := range names {
		outcomes = append(outcomes, fmt.Sprintf("%s %d", k, r.Outcomes[k]))
		requests += r.Outcomes[k]
	}
	c := r.Checks
	u := r.Upstream
	a := r.Attribution

	row := func(name string, v int64, note string) {
		fmt.Fprintf(w, "  %-22s %9d  %s\n", name, v, note)
	}
	fmt.Fprintln(w)
	row("logical payments", int64(c.Payments), fmt.Sprintf("by %d clients (%d read slowly): succeeded %d, failed %d, unfinished %d", r.Clients, r.SlowClients, c.Succeeded, c.Failed, c.Unfinished))
	row("HTTP attempts", r.Attempts, fmt.Sprintf("409s %d, 5xx %d, transport errors %d; payments re-sent by a client with the same key %d",
		r.Conflicts, r.ServerErrors, r.TransportErrors, r.Resends))
	row("replays", r.Replays, "answers with Idempotent-Replayed: true")
	row("large answers", r.LargePayments, fmt.Sprintf("payments asking for 0.3–1 MB of padding; read slowly %d; answers broken off while read %d (of slow readers %d)",
		r.SlowLarge, r.BodyCuts, r.SlowBodyCuts))
	fmt.Fprintln(w)
	row("client↔gateway faults", r.ClientFaults.Faults, faultKinds(r.ClientFaults))
	row("gateway↔upstream", r.UpstreamFaults.Faults, faultKinds(r.UpstreamFaults)+fmt.Sprintf("; slow answers %d (past --upstream-timeout %s)", u.SlowAnswers, r.UpstreamTimeout))
	if r.StoreLink == nil {
		row("gateway↔store", 0, "no store proxy: "+cmp.Or(r.NoStoreLink, "the store is a local file"))
	} else {
		kinds := map[string]int{}
		var down time.Duration
		for _, p := range r.Partitions {
			kinds[p.Kind]++
			if p.Kind != "latency" {
				down += p.End.Sub(p.Start)
			}
		}
		s := r.StoreLink
		row("gateway↔store", int64(len(r.Partitions)), fmt.Sprintf("cut %d, stall %d (%s partitioned in all), latency spikes %d; connections reset %d, refused %d, held by a stall %d",
			kinds["cut"], kinds["stall"], down.Round(100*time.Millisecond), kinds["latency"], s.Reset, s.Refused, s.Stalled))
		for _, p := range r.Partitions {
			fmt.Fprintf(w, "  %-22s %9s  %s\n", "", "", p)
		}
	}
	row("gateway kills", int64(r.Kills), fmt.Sprintf("SIGKILL at seeded random moments; restarts %d (failed starts, retried: %d)", r.Restarts, r.FailedStarts))
	pg := "none"
	if r.PGRestarts > 0 {
		pg = fmt.Sprintf("immediate stop (as a crash) and start, unreachable for %s", r.PGDowntime.Round(time.Millisecond))
	}
	row("PostgreSQL restarts", int64(r.PGRestarts), pg)
	if len(r.Failovers) > 0 || r.Outcomes["store-not-durable"] > 0 {
		row("store failovers", int64(len(r.Failovers)), fmt.Sprintf("the standby's replication link stalled, then the primary lost and the standby promoted in its place; the upstream held %d answers back as it began, so that their completions met the stall",
			r.Upstream.HeldAnswers))
		for _, f := range r.Failovers {
			fmt.Fprintf(w, "  %-22s %9s  %s\n", "", "", f.Failover)
			fmt.Fprintf(w, "  %-22s %9s  %s\n", "", "", f.Summary())
		}
		row("503 store-not-durable", r.Outcomes["store-not-durable"], notDurableNote(r.Failovers))
	}
	fmt.Fprintln(w)
	row("gateway requests", requests, strings.Join(outcomes, ", "))
	row("upstream deliveries", u.Deliveries, fmt.Sprintf("executions %d, found recorded %d, 503 not done %d, ledger outcomes learned after an error %d",
		u.Executions, u.Absorbed, u.NotDone, u.Resolved))
	row("ledger rows", int64(c.Rows), fmt.Sprintf("idempotency records left in the store: %d", c.Records))
	fmt.Fprintln(w)
	extra := "executions beyond the first of a payment"
	if r.Dedup {
		extra = "deliveries beyond the first of a payment, absorbed by the ledger's UNIQUE (user, key)"
	}
	row("extra executions", int64(len(a.Extras)), fmt.Sprintf("%s, over %d payments; by cause:", extra, a.Keys))
	for _, cause := range Causes() {
		note := causeNote(cause)
		if cause == CauseAnswerLost && len(a.ByReason) > 0 {
			var rs []string
			for k, v := range a.ByReason {
				rs = append(rs, fmt.Sprintf("%s %d", k, v))
			}
			sort.Strings(rs)
			note += " (" + strings.Join(rs, ", ") + ")"
		}
		mark := "allowed"
		switch {
		case !cause.Allowed() && r.Dedup:
			mark = "not allowed, absorbed by the ledger here"
		case !cause.Allowed():
			mark = "NOT ALLOWED"
		}
		row("  "+cause.String(), int64(a.ByCause[cause]), mark+": "+note)
	}
	fmt.Fprintln(w)
	row("duplicates", int64(c.Duplicates), "logical payments with more than one ledger row (judged by cause above)")
	row("lost", int64(c.Lost), "payments a client saw succeed without a ledger row")
	row("phantoms", int64(c.Phantoms), "ledger rows under a key no client used")
	row("mismatched", int64(c.Mismatched), "answers or rows that disagree (id, key, ref, amount)")
	row("stuck", int64(c.Stuck), fmt.Sprintf("keys in progress in the store after the lease (%s), nothing in flight", r.Lease))
	row("held, replica killed", int64(c.HeldLost), "allowed: answers a gateway held for a store it could not reach, lost with it when it was killed (the client got them)")
	row("store disagrees", int64(c.StoreDisagrees), "succeeded payments their key would not replay as answered")
	row("unfinished", int64(c.Unfinished), "payments without a final answer after the drain")
	row("failed", int64(c.Failed), "payments answered with a final 4xx")
	row("ledger disagrees", int64(r.LedgerDisagrees), "payments whose ledger rows and the upstream's execution log disagree")
	row("unexpected exits", int64(len(r.UnexpectedExits)+len(r.BadStops)), "gateways that died unasked, or did not exit 0 on SIGTERM")
	fmt.Fprintln(w)

	if r.OK() {
		fmt.Fprintf(w, "OK — %d payments; every extra execution in a documented window; nothing lost, invented or stuck (%s store, seed %d)\n", c.Payments, r.Store, r.Seed)
		return
	}
	fmt.Fprintf(w, "FAILED — %s (%s store, seed %d)\n", r.Verdict(), r.Store, r.Seed)
	for _, e := range r.Unallowed {
		fmt.Fprintf(w, "%s\n", e)
	}
	for _, e := range r.LedgerEvidence {
		fmt.Fprintf(w, "  ledger: %s\n", e)
	}
	for _, e := range c.Evidence {
		if !r.Dedup && strings.HasPrefix(e, "duplicate: ") {
			continue // judged by cause above
		}
		fmt.Fprintf(w, "  %s\n", e)
	}
	for _, e := range r.KeyEvidence {
		fmt.Fprintf(w, "%s\n", e)
	}
	for _, e := range r.UnexpectedExits {
		fmt.Fprintf(w, "  unexpected exit: %s\n", e)
	}
	for _, e := range r.BadStops {
		fmt.Fprintf(w, "  stop: %s\n", e)
	}
}

func causeNote(c Cause) string {
	switch c {
	case CauseKilled:
		return "the forwarding replica was SIGKILLed before it stored the answer; a retry took the key over after the lease"
	case CauseAnswerLost:
		return "the answer never fully reached the gateway (504/502/body broken off, key left to its lease), a retry forwarded again"
	case CauseResend:
		return "the gateway's HTTP transport sent one request twice (answer lost on a reused connection)"
	case CauseStore:
		return "the owner could not store its answer or lost its lease while the store was unreachable"
	case CauseSlowReader:
		return "the answer arrived whole, the client read it slowly, the gateway's upstream timeout cut it off"
	case CauseFailover:
		return "a failover of the store came between the executions: the promoted standby lacked a write the gateway took as acknowledged"
	case CauseUnexplained:
		return "none of the above"
	}
	return ""
}

// FailoverImpact is a failover of the store and what the gateways logged around it.
type FailoverImpact struct {
	Failover
	// LastExecuted is when the last request executed (its claim and its completion
	// acknowledged) before the primary was lost sent its completion, FirstExecuted when
	// the first one after did (see completedAt); zero when there is none. With the
	// standby's link stalled first, LastExecuted is about when the stall began, unless
	// writes were still acknowledged during it.
	LastExecuted, FirstExecuted time.Time
	// LastLine is the request line LastExecuted is of, and LastKey its key, for a report
	// that doubts the stall held writes back.
	LastLine GatewayLine
	LastKey  string
	// Between LastExecuted and FirstExecuted (to the end of the run when there was no
	// FirstExecuted): requests answered 503 store-not-durable, 503 store-error, and
	// answers held because the store did not acknowledge their completion (stored-later).
	NotDurable, StoreErrors, Held int
	// FirstNotDurable and LastNotDurable are the first and the last 503
	// store-not-durable line of the run; zero when there is none.
	FirstNotDurable, LastNotDurable time.Time
}

// failoverImpact reads, from the gateways' request lines (by key), what f did to the
// requests.
func failoverImpact(f Failover, lines map[string][]GatewayLine, execs []Execution) FailoverImpact {
	fi := FailoverImpact{Failover: f}
	execsOf := map[string][]Execution{}
	for _, e := range execs {
		execsOf[e.Key] = append(execsOf[e.Key], e)
	}
	type keyed struct {
		key string
		GatewayLine
	}
	var all []keyed
	for key, ls := range lines {
		for _, l := range ls {
			all = append(all, keyed{key, l})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Time.Before(all[j].Time) })
	for _, l := range all {
		if l.Outcome != "executed" {
			continue
		}
		switch at := completedAt(l.GatewayLine, execsOf[l.key]); {
		case at.Before(f.Lost):
			if at.After(fi.LastExecuted) {
				fi.LastExecuted, fi.LastLine, fi.LastKey = at, l.GatewayLine, l.key
			}
		case fi.FirstExecuted.IsZero() || at.Before(fi.FirstExecuted):
			fi.FirstExecuted = at
		}
	}
	for _, kl := range all {
		l := kl.GatewayLine
		if l.Outcome == "store-not-durable" {
			if fi.FirstNotDurable.IsZero() {
				fi.FirstNotDurable = l.Time
			}
			fi.LastNotDurable = l.Time
		}
		if l.Time.Before(fi.LastExecuted) || !fi.FirstExecuted.IsZero() && l.Time.After(fi.FirstExecuted) {
			continue
		}
		switch {
		case l.Outcome == "store-not-durable":
			fi.NotDurable++
		case l.Outcome == "store-error" && l.Status == 503:
			fi.StoreErrors++
		case l.Outcome == "stored-later":
			fi.Held++
		}
	}
	return fi
}

// completedAt is about when the request of l sent its completion to the store: when the
// upstream's answer was in, and not when the line was logged, after the answer went to
// the client — which a slow reader makes seconds later. The store acknowledged the
// completion a store call later, and the answer went to the client after. The upstream
// says when it answered: the latest execution of the key (execs) by l's replica within
// the request's span. Without one, the request's start plus its upstream call, which
// is too early for a request that first waited for a duplicate in progress.
func completedAt(l GatewayLine, execs []Execution) time.Time {
	start := l.Time.Add(-l.Latency)
	var answered time.Time
	for _, e := range execs {
		if e.Replica == l.Replica && !e.Arrived.Before(start.Add(-clockSlack)) && !e.Arrived.After(l.Time) && e.Answered.After(answered) {
			answered = e.Answered
		}
	}
	switch {
	case !answered.IsZero():
		return answered
	case l.Latency <= 0:
		return l.Time
	}
	return l.Time.Add(l.UpstreamLatency - l.Latency)
}

// HeldBack reports whether the failover held writes back from when its standby's link
// stalled: no request sent its completion between slack after the stall began and the
// primary's loss and had it acknowledged. One that did shows that the stall failed to
// keep the standby from acknowledging writes.
func (fi FailoverImpact) HeldBack(slack time.Duration) bool {
	return fi.LastExecuted.Before(fi.Start.Add(slack))
}

// Unwritable is how long the store took no write, as the gateways saw it: from the
// stall's start to when the first request executed after the primary's loss sent its
// completion; 0 when none was.
func (fi FailoverImpact) Unwritable() time.Duration {
	if fi.FirstExecuted.IsZero() {
		return 0
	}
	return fi.FirstExecuted.Sub(fi.Start)
}

// Summary is what the gateways saw of the failover, on one line.
func (fi FailoverImpact) Summary() string {
	last := "none"
	if !fi.LastExecuted.IsZero() {
		last = relative(fi.LastExecuted.Sub(fi.Start))
	}
	if fi.FirstExecuted.IsZero() {
		return fmt.Sprintf("gateways: no request executed after the primary's loss (the last before it: %s); since then 503 store-not-durable %d, 503 store-error %d, answers held %d",
			last, fi.NotDurable, fi.StoreErrors, fi.Held)
	}
	return fmt.Sprintf("gateways: store unwritable %s — the last request executed before the loss sent its completion at %s, the first after at %s; in between 503 store-not-durable %d, 503 store-error %d, answers held (stored-later) %d",
		fi.Unwritable().Round(time.Millisecond), last, relative(fi.FirstExecuted.Sub(fi.Start)), fi.NotDurable, fi.StoreErrors, fi.Held)
}

// notDurableNote says when the 503 store-not-durable answers came, relative to the
// first failover.
func notDurableNote(fs []FailoverImpact) string {
	const what = "keyed requests refused, not forwarded, while the store could not make writes durable"
	if len(fs) == 0 || fs[0].FirstNotDurable.IsZero() {
		return what
	}
	f := fs[0]
	return fmt.Sprintf("%s: the first %s, the last %s from the failover's start",
		what, relative(f.FirstNotDurable.Sub(f.Start)), relative(f.LastNotDurable.Sub(f.Start)))
}

// relative renders d, a time relative to an event, with its sign.
func relative(d time.Duration) string {
	d = d.Round(time.Millisecond)
	if d < 0 {
		return d.String()
	}
	return "+" + d.String()
}
