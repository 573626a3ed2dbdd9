package chaos

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/internal/faultproxy"
)

// UpstreamStats counts what the payments upstream received.
type UpstreamStats struct {
	Deliveries int64 // requests received
	Recorded   int64 // ... that inserted a ledger row
	DBErrors   int64 // ... answered 503: the ledger could not be written, or the commit's outcome is unknown

	// Reforwards are deliveries of a key whose payment the upstream had already
	// recorded: what the gateway alone could not prevent. The ledger's UNIQUE (user, key)
	// found the payment and answered it again; an upstream that is not idempotency-aware
	// would have recorded each as a second payment. By what the upstream had seen of the
	// key when the delivery arrived:
	Reforwards  int64
	AfterAnswer int64 // its previous delivery had been answered 201: the gateway never stored (or lost) that answer
	AfterError  int64 // its previous delivery had been answered 503 after a commit whose outcome was unknown
	Concurrent  int64 // another delivery of the key was being served at the same time

	KeysRedelivered int64 // keys delivered more than once for any reason (a 503 that released the key included)
	KeyReused       int64 // deliveries whose key had recorded another ref or amount (answered 422): must be 0
}

// Report is one chaos run: what was done to the system, what the clients and the
// upstream saw, and the verdict.
type Report struct {
	Store    string // sqlite, postgres or redis
	Replicas int
	Seed     uint64
	Lease    time.Duration
	Load     time.Duration // clients started payments for this long
	Drain    time.Duration // then the payments in flight took this long to end
	Elapsed  time.Duration // the whole run, setup and checks included
	Setup    []string      // lines describing the wiring

	Clients                                   int
	Attempts, Resends, Replays, Conflicts     int64 // counted below retry.Transport
	ServerErrors, TransportErrors             int64
	Faults                                    faultproxy.Stats // summed over the proxies
	Kills, Restarts, FailedStarts, PGRestarts int
	PGDowntime                                time.Duration

	Outcomes        map[string]int64 // gateway outcomes, from the replicas' request logs
	GatewayWarnings int64
	UnexpectedExits []string // gateway exits the suite did not cause
	BadStops        []string // gateways that did not exit 0 on SIGTERM at the end

	Upstream      UpstreamStats
	NaiveUpstream bool // the upstream did not dedupe (a demonstration)
	// The re-forwards of Upstream.AfterAnswer by why the gateway that got that 201 never
	// stored it, from the gateways' request logs and the kill times: its process was
	// killed first (no request line for it, a kill in between), its completion failed
	// (store-error), its lease was lost (lease-lost), or none of these (with evidence).
	ReforwardKilled, ReforwardStoreError, ReforwardLeaseLost, ReforwardOther int64
	ReforwardEvidence                                                        []string

	Checks Checks
}

// OK reports whether the run passed: every check zero, no gateway exited on its own, the
// final graceful stops exited 0, and no key was reused.
func (r Report) OK() bool {
	return r.Checks.OK() && len(r.UnexpectedExits) == 0 && len(r.BadStops) == 0 && r.Upstream.KeyReused == 0
}

// WriteTable prints the report.
func (r Report) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "chaos · %s store · %d gateway replica(s) · seed %d · load %s, drain %s, run %s\n",
		r.Store, r.Replicas, r.Seed, r.Load.Round(time.Millisecond), r.Drain.Round(time.Millisecond), r.Elapsed.Round(time.Second))
	for _, s := range r.Setup {
		fmt.Fprintf(w, "  %s\n", s)
	}
	var kinds []string
	for _, k := range faultproxy.Kinds() {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, r.Faults.Count(k)))
	}
	var outcomes []string
	var requests int64
	names := make([]string, 0, len(r.Outcomes))
	for k := range r.Outcomes {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return r.Outcomes[names[i]] > r.Outcomes[names[j]] })
	for _, k := range names {
		outcomes = append(outcomes, fmt.Sprintf("%s %d", k, r.Outcomes[k]))
		requests += r.Outcomes[k]
	}
	c := r.Checks
	u := r.Upstream

	row := func(name string, v int64, note string) {
		fmt.Fprintf(w, "  %-20s %9d  %s\n", name, v, note)
	}
	fmt.Fprintln(w)
	row("logical payments", int64(c.Payments), fmt.Sprintf("by %d clients: succeeded %d, failed %d, unfinished %d", r.Clients, c.Succeeded, c.Failed, c.Unfinished))
	row("HTTP attempts", r.Attempts, fmt.Sprintf("409s %d, 5xx %d, transport errors %d; payments re-sent by a client with the same key %d",
		r.Conflicts, r.ServerErrors, r.TransportErrors, r.Resends))
	row("replays", r.Replays, "answers with Idempotent-Replayed: true")
	row("faults injected", r.Faults.Faults, strings.Join(kinds, ", "))
	row("gateway kills", int64(r.Kills), fmt.Sprintf("SIGKILL at seeded random moments; restarts %d (failed starts, retried: %d)", r.Restarts, r.FailedStarts))
	pg := "none"
	if r.PGRestarts > 0 {
		pg = fmt.Sprintf("immediate stop (as a crash) and start, unreachable for %s", r.PGDowntime.Round(time.Millisecond))
	}
	row("PostgreSQL restarts", int64(r.PGRestarts), pg)
	row("gateway requests", requests, strings.Join(outcomes, ", "))
	row("upstream deliveries", u.Deliveries, fmt.Sprintf("inserts confirmed %d, 503s (ledger unavailable or commit unknown) %d, keys delivered more than once %d", u.Recorded, u.DBErrors, u.KeysRedelivered))
	row("ledger rows", int64(c.Rows), fmt.Sprintf("idempotency records left in the store: %d", c.Records))
	fmt.Fprintln(w)
	row("duplicates", int64(c.Duplicates), "logical payments with more than one ledger row")
	row("lost", int64(c.Lost), "payments a client saw succeed without a ledger row")
	row("phantoms", int64(c.Phantoms), "ledger rows under a key no client used")
	row("mismatched", int64(c.Mismatched), "answers or rows that disagree (id, key, ref, amount)")
	row("stuck", int64(c.Stuck), fmt.Sprintf("keys in progress in the store after the lease (%s), nothing in flight", r.Lease))
	row("store disagrees", int64(c.StoreDisagrees), "succeeded payments their key would not replay as answered")
	row("unfinished", int64(c.Unfinished), "payments without a final answer after the drain")
	row("failed", int64(c.Failed), "payments answered with a final 4xx")
	row("unexpected exits", int64(len(r.UnexpectedExits)+len(r.BadStops)), "gateways that died unasked, or did not exit 0 on SIGTERM")
	fmt.Fprintln(w)
	absorbed := "absorbed by the ledger's UNIQUE (user, key): answered with the recorded payment"
	if r.NaiveUpstream {
		absorbed = "the upstream is NOT idempotency-aware here: each one recorded a second payment"
	}
	row("gateway re-forwards", u.Reforwards, "deliveries of a key the upstream had already recorded: what the gateway alone could not prevent")
	row("", u.AfterAnswer, "... after a 201 the gateway never stored: the key stayed in progress, a retry took it over after the lease")
	row("", r.ReforwardKilled, "    ... its replica was SIGKILLed before it stored the completion")
	row("", r.ReforwardStoreError, "    ... its completion failed: the store was unavailable (outcome store-error)")
	row("", r.ReforwardLeaseLost, "    ... its lease ran out while renewals failed, and a retry took the key over (outcome lease-lost)")
	row("", r.ReforwardOther, "    ... none of these")
	for _, e := range r.ReforwardEvidence {
		fmt.Fprintf(w, "  %-20s %9s        %s\n", "", "", e)
	}
	row("", u.AfterError, "... after the upstream's own 503 (its commit's outcome unknown; it had committed)")
	row("", u.Concurrent, "... while another delivery of the key was being served")
	row("", u.Reforwards, "... "+absorbed)
	fmt.Fprintln(w)

	if r.OK() {
		fmt.Fprintf(w, "OK — exactly once: %d payments, each succeeded one recorded once, nothing stuck (%s store, seed %d)\n", c.Payments, r.Store, r.Seed)
	} else {
		fmt.Fprintf(w, "FAILED — duplicates %d, lost %d, phantoms %d, mismatched %d, stuck %d, store disagrees %d, unfinished %d, failed %d, unexpected exits %d, key reused %d (%s store, seed %d)\n",
			c.Duplicates, c.Lost, c.Phantoms, c.Mismatched, c.Stuck, c.StoreDisagrees, c.Unfinished, c.Failed,
			len(r.UnexpectedExits)+len(r.BadStops), u.KeyReused, r.Store, r.Seed)
		for _, e := range c.Evidence {
			fmt.Fprintf(w, "  %s\n", e)
		}
		for _, e := range r.UnexpectedExits {
			fmt.Fprintf(w, "  unexpected exit: %s\n", e)
		}
		for _, e := range r.BadStops {
			fmt.Fprintf(w, "  stop: %s\n", e)
		}
	}
}
