package main

import (
	"fmt"
	"strings"
)

// goalClients is the concurrency the goals are stated at.
const goalClients = 32

// throughputFloor returns the floor of subject's throughput (req/s ÷ direct's at 32
// clients) that the performance goals set, and whether they set one: the gateway on
// PostgreSQL ≥ 0.6×, on SQLite ≥ 0.7×, transaction mode ≥ 0.6×.
func throughputFloor(subject string) (float64, bool) {
	switch subject {
	case "gw-postgres", "payments-tx":
		return 0.6, true
	case "gw-sqlite":
		return 0.7, true
	}
	return 0, false
}

// stores are the gateway subjects, one per store, in the run's order.
var stores = []string{"gw-memory", "gw-sqlite", "gw-postgres", "gw-redis"}

// goals writes the goal figures: what the store costs PostgreSQL per new key against
// the upstream's own INSERT, the gateway's own CPU against nginx's, throughput and
// p99 against direct, and how they grow with the concurrency and the answer's size.
func goals(b *strings.Builder, ps points, pg map[pgKey]*pgPoint) {
	m := func(s string) *point { return ps.get("matrix", 0, goalClients, s) }
	d := m(baseline)
	if d == nil {
		return
	}
	fmt.Fprintf(b, "### Goal figures (%d clients)\n\n", goalClients)
	b.WriteString("CPU figures are ratios of the rounds' medians of µs per response (PostgreSQL: the run's own backends), " +
		"with the same ratio of their sums over the rounds beside them; a CPU target is met when both meet it; " +
		"throughput and p99 ratios are medians of per-round ratios. Beside each throughput ratio, the ratio of CPU per request " +
		"(direct's over the subject's, everything the request costs the machine, the load generator included): what the " +
		"throughput ratio would be if the processors were the run's alone. A target is given only where bench/README.md states one.\n\n")
	b.WriteString("| goal | figure | measured | target | met |\n|---|---|---|---|---|\n")
	row := func(goal, figure, measured, target, met string) {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", goal, figure, measured, target, met)
	}

	// 1. PostgreSQL's CPU for a new key: the run's own backends, and the whole cluster
	// (its background writers and autovacuum too; on a cluster of the run's own, OWN_PG,
	// nothing else), against the upstream's own per request. The target is the whole
	// cluster's, for gw-postgres.
	for _, col := range []struct{ name, label string }{
		{"postgres", "the run's backends"},
		{"pgcluster", "the whole cluster, background work included"},
	} {
		for _, s := range []string{"gw-postgres", "payments-mw", "payments-tx"} {
			p := m(s)
			measured, met, ok := storeShare(p, d, col.name, 0.80)
			if !ok {
				continue
			}
			what := "claim + completion, batching on"
			if s == "payments-tx" {
				what = "claim, then the insert and the completion in one transaction"
			}
			target, verdict := "—", ""
			if s == "gw-postgres" && col.name == "pgcluster" {
				target, verdict = "≤ 0.80×", yesNo(met)
				measured += batchClause(p, d)
			}
			row("1", fmt.Sprintf("PostgreSQL CPU per new key (%s), %s (%s), beyond the upstream's INSERT ÷ the INSERT's", col.label, s, what),
				measured, target, verdict)
		}
	}
	// The same figure with the upstream's INSERT as it costs behind a gateway: the whole
	// cluster under gw-postgres less under gw-memory, the same gateway in front of the
	// same upstream with its store elsewhere, so that only the store differs. The
	// upstream's INSERT can cost the cluster more behind a gateway than from the load
	// generator directly; the figure against direct counts that in the store's cost, this
	// one does not.
	if p, q := m("gw-postgres"), m("gw-memory"); p != nil && q != nil {
		v, vok := p.cpuMedian("pgcluster")
		qv, qok := q.cpuMedian("pgcluster")
		dv, _ := d.cpuMedian("pgcluster")
		if vok && qok && dv > 0 {
			row("1", "PostgreSQL CPU per new key (the whole cluster), gw-postgres less gw-memory (the upstream's INSERT behind the same gateway) ÷ direct's INSERT",
				fmt.Sprintf("%.2f× (%.0f − %.0f = %.0f µs against %.0f µs)", (v-qv)/dv, v, qv, v-qv, dv), "—", "")
		}
	}
	if in, ok := pg[pgKey{"insert", goalClients}]; ok {
		for _, s := range []string{"claim", "txmode"} {
			if q, ok := pg[pgKey{s, goalClients}]; ok && len(in.us) > 0 && len(q.us) > 0 {
				vi, vq := median(in.us), median(q.us)
				row("1", fmt.Sprintf("pgbench (no batching): PostgreSQL CPU per `%s` transaction ÷ per `insert`", s),
					fmt.Sprintf("%.2f× (%.0f against %.0f µs)", vq/vi, vq, vi), "—", "")
			}
		}
	}

	// 2. The gateway's own CPU against nginx's.
	if n := m("nginx"); n != nil {
		if nv, ok := n.cpuMedian("proxy"); ok && nv > 0 {
			for _, s := range []string{"bareproxy", "gw-memory"} {
				if p := m(s); p != nil {
					if v, ok := p.cpuMedian("proxy"); ok {
						row("2", fmt.Sprintf("%s's own CPU per proxied new-key request ÷ nginx's", s),
							fmt.Sprintf("%.2f× (%.0f against %.0f µs)", v/nv, v, nv), "—", "")
					}
				}
			}
			for _, s := range stores {
				if p := ps.get("replay", 0, goalClients, s); p != nil {
					if v, ok := p.cpuMedian("proxy"); ok {
						row("2", fmt.Sprintf("%s's own CPU per replay ÷ nginx's per proxied request", s),
							fmt.Sprintf("%.2f× (%.0f against %.0f µs)", v/nv, v, nv), "—", "")
					}
				}
			}
		}
	}

	// The embedded default: the gateway's own CPU per new key on SQLite against the
	// memory store's, ≤ 1.5×.
	// cpuRow sets p's own CPU per request against q's; a target of 0 is none.
	cpuRow := func(goal, figure string, p, q *point, target float64) {
		measured, met, ok := ownCPU(p, q, target)
		switch {
		case !ok:
		case target == 0:
			row(goal, figure, measured, "—", "")
		default:
			row(goal, figure, measured, fmt.Sprintf("≤ %.2f×", target), yesNo(met))
		}
	}
	cpuRow("SQLite", "gw-sqlite's own CPU per new key ÷ gw-memory's", m("gw-sqlite"), m("gw-memory"), 1.5)
	// At net/http's floor: the gateway on the memory store against a bare
	// httputil.ReverseProxy, per new key (≤ 1.15×) and per replay, answered from the
	// store, against a proxied request (≤ 0.6×).
	cpuRow("floor", "gw-memory's own CPU per new key ÷ bareproxy's per proxied request", m("gw-memory"), m("bareproxy"), 1.15)
	cpuRow("floor", "gw-memory's own CPU per replay ÷ bareproxy's per proxied request", ps.get("replay", 0, goalClients, "gw-memory"),
		m("bareproxy"), 0.6)
	// The contract's own work written plainly (bareproxy --keyed), against the bare proxy
	// and against the gateway: how much of the gateway's cost the contract itself needs.
	cpuRow("floor", "bareproxy-keyed's own CPU per new key (the contract written plainly) ÷ bareproxy's", m("bareproxy-keyed"), m("bareproxy"), 0)
	cpuRow("floor", "gw-memory's own CPU per new key ÷ bareproxy-keyed's", m("gw-memory"), m("bareproxy-keyed"), 0)

	// 3. Throughput against direct.
	for _, s := range []string{"gw-postgres", "gw-sqlite", "gw-memory", "gw-redis", "payments-tx", "payments-mw"} {
		p := m(s)
		if p == nil || len(p.ratio) == 0 {
			continue
		}
		r := median(p.ratio)
		t, met := "—", ""
		if min, ok := throughputFloor(s); ok {
			t, met = fmt.Sprintf("≥ %.2f×", min), yesNo(r >= min)
		}
		row("3", s+" req/s ÷ direct's", fmt.Sprintf("%.2f× (%.0f against %.0f; rounds %s)%s", r, median(p.tput), median(d.tput),
			join(p.ratio, "%.2f"), costRatio(p, d)), t, met)
	}

	// 4. p99 against direct, every store.
	for _, s := range append(append([]string{"bareproxy", "nginx"}, stores...), "payments-tx", "payments-mw") {
		p := m(s)
		if p == nil || len(p.p99Ratio) == 0 {
			continue
		}
		row("4", s+" p99 ÷ direct's", fmt.Sprintf("%.2f× (%.1f against %.1f ms)", median(p.p99Ratio), median(p.p99), median(d.p99)), "—", "")
	}
	b.WriteString("\n")
	growth(b, ps)
}

// growth writes goal 5: the main ratios at every concurrency and answer size.
func growth(b *strings.Builder, ps points) {
	type col struct {
		name string
		cell func(get func(string) *point) string
	}
	reqRatio := func(s string) col {
		return col{s + " req/s ×", func(get func(string) *point) string {
			if p := get(s); p != nil {
				return ratioCell(p.ratio)
			}
			return "—"
		}}
	}
	p99Ratio := func(s string) col {
		return col{s + " p99 ×", func(get func(string) *point) string {
			if p := get(s); p != nil {
				return ratioCell(p.p99Ratio)
			}
			return "—"
		}}
	}
	cols := []col{reqRatio("gw-memory"), reqRatio("gw-sqlite"), reqRatio("gw-postgres"), reqRatio("payments-tx"),
		p99Ratio("gw-postgres"),
		{"gw-memory CPU ÷ nginx's", func(get func(string) *point) string {
			return cpuRatio(get("gw-memory"), "proxy", get("nginx"), "proxy", 0)
		}},
		{"bareproxy CPU ÷ nginx's", func(get func(string) *point) string {
			return cpuRatio(get("bareproxy"), "proxy", get("nginx"), "proxy", 0)
		}},
		{"gw-memory CPU ÷ bareproxy's", func(get func(string) *point) string {
			return cpuRatio(get("gw-memory"), "proxy", get("bareproxy"), "proxy", 0)
		}},
		{"gw-sqlite CPU ÷ gw-memory's", func(get func(string) *point) string {
			return cpuRatio(get("gw-sqlite"), "proxy", get("gw-memory"), "proxy", 0)
		}},
		{"gw-postgres store PG CPU ÷ INSERT's", func(get func(string) *point) string {
			return cpuRatio(get("gw-postgres"), "postgres", get(baseline), "postgres", 1)
		}},
		{"gw-postgres new keys per batch", func(get func(string) *point) string {
			if n, ok := batchSize(get("gw-postgres"), get(baseline)); ok {
				return fmt.Sprintf("%.1f", n)
			}
			return "—"
		}},
	}
	type line struct {
		label string
		get   func(string) *point
	}
	var lines []line
	for _, c := range ps.clients("matrix", 0) {
		lines = append(lines, line{fmt.Sprintf("%d clients", c), func(s string) *point { return ps.get("matrix", 0, c, s) }})
	}
	for _, body := range ps.bodies("bodies") {
		for _, c := range ps.clients("bodies", body) {
			lines = append(lines, line{fmt.Sprintf("%s, %d clients", size(body), c), func(s string) *point { return ps.get("bodies", body, c, s) }})
		}
	}
	if len(lines) == 0 {
		return
	}
	b.WriteString("### How the cost grows (goal 5)\n\n× = ratio to `direct` in the same rounds; CPU ratios of the gateway's or bare proxy's " +
		"own process to nginx's, the bare proxy's and the memory store's, and of the PostgreSQL CPU the gateway's store adds (beyond the upstream's INSERT) to the INSERT's.\n\n| load |")
	for _, c := range cols {
		b.WriteString(" " + c.name + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", len(cols)) + "\n")
	for _, l := range lines {
		b.WriteString("| " + l.label + " |")
		for _, c := range cols {
			b.WriteString(" " + c.cell(l.get) + " |")
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

// ownCPU sets p's own CPU per request (the proxy's process) against q's, as a goal's
// cell: the ratio of the rounds' medians with that of their sums beside it, and whether
// both are at most target. ok is false when either was not measured.
func ownCPU(p, q *point, target float64) (measured string, met, ok bool) {
	if p == nil || q == nil {
		return "", false, false
	}
	v, vok := p.cpuMedian("proxy")
	qv, qok := q.cpuMedian("proxy")
	if !vok || !qok || qv <= 0 {
		return "", false, false
	}
	clause, sr, sok := summed(p, "proxy", q, "proxy", 0)
	return fmt.Sprintf("%.2f× (%.0f against %.0f µs)%s", v/qv, v, qv, clause), v/qv <= target && (!sok || sr <= target), true
}

// storeShare is the PostgreSQL CPU per request of process col that p adds beyond d
// (direct: the upstream's INSERT alone), against d's, as a goal's cell: the ratio of
// the rounds' medians with that of their sums beside it, and whether both are at most
// target. ok is false when either was not measured.
func storeShare(p, d *point, col string, target float64) (measured string, met, ok bool) {
	if p == nil || d == nil {
		return "", false, false
	}
	v, vok := p.cpuMedian(col)
	dv, dok := d.cpuMedian(col)
	if !vok || !dok || dv <= 0 {
		return "", false, false
	}
	r := (v - dv) / dv
	clause, sr, sok := summed(p, col, d, col, 1)
	return fmt.Sprintf("%.2f× (%.0f − %.0f = %.0f µs against %.0f µs)%s", r, v, dv, v-dv, dv, clause),
		r <= target && (!sok || sr <= target), true
}

// batchSize is how many new keys a batch of gw-postgres's store held on average (p
// gw-postgres's point, d direct's in the same rounds), from the writing transactions
// the cluster counted per response: the upstream's INSERT is one in both, and each new
// key's claim and completion go in a batch of their kind, one transaction each. The
// medians over the rounds are taken; ok is false when the windows did not count them
// (a run on a shared cluster) or the figure is not above direct's.
func batchSize(p, d *point) (float64, bool) {
	if p == nil || d == nil || len(p.writes) == 0 || len(d.writes) == 0 {
		return 0, false
	}
	store := median(p.writes) - median(d.writes)
	if store <= 0 {
		return 0, false
	}
	return 2 / store, true
}

// batchClause is batchSize as a clause for the goal's cell: the store's cost per new
// key falls as its batches grow, which the load's rate sets.
func batchClause(p, d *point) string {
	n, ok := batchSize(p, d)
	if !ok {
		return ""
	}
	return fmt.Sprintf("; %.2f writing transactions per request against direct's %.2f: %.1f new keys per batch",
		median(p.writes), median(d.writes), n)
}

// summed is cpuRatio's figure taken on the sums of the µs per request over the rounds
// instead of their medians, as a clause for a goal's cell, and the figure itself; ok is
// false (and the clause empty) for a single round or when p and q differ in rounds. A
// median leaves out the rounds in which background work (a checkpoint, autovacuum)
// fell, whatever they cost; the sums count every round whole, so that a target is met
// only when both are.
func summed(p *point, a string, q *point, bname string, minus float64) (clause string, ratio float64, ok bool) {
	xs, ys := p.cpu[a], q.cpu[bname]
	if len(xs) < 2 || len(xs) != len(ys) {
		return "", 0, false
	}
	var v, w float64
	for i := range xs {
		v, w = v+xs[i], w+ys[i]
	}
	if w <= 0 {
		return "", 0, false
	}
	ratio = (v - minus*w) / w
	return fmt.Sprintf("; summed over the %d rounds %.2f×", len(xs), ratio), ratio, true
}

// cpuRatio is (p's CPU of process a − minus × q's of b) ÷ q's of b, as a cell: with
// minus 0, p's CPU against q's; with minus 1, what p adds beyond q, against q.
func cpuRatio(p *point, a string, q *point, bname string, minus float64) string {
	if p == nil || q == nil {
		return "—"
	}
	v, ok1 := p.cpuMedian(a)
	w, ok2 := q.cpuMedian(bname)
	if !ok1 || !ok2 || w <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", (v-minus*w)/w)
}

// summary is the one-screen digest run.sh prints at the end: the goal figures and the
// cost table at the goals' concurrency.
func summary(b *strings.Builder, recs []record) {
	ps := collect(recs, "matrix", "bodies", "replay", "first", "paced")
	goals(b, ps, collectPgbench(recs))
	paced(b, ps)
	paired(b, recs)
	if len(ps.subjects("matrix", 0, goalClients)) == 0 {
		return
	}
	fmt.Fprintf(b, "### Cost per request, %d clients\n\n", goalClients)
	b.WriteString("| subject | " + costHeader + "\n|---|" + strings.Repeat("---:|", costCols) + "\n")
	for _, s := range ps.subjects("matrix", 0, goalClients) {
		fmt.Fprintf(b, "| %s | %s\n", s, costRow(ps.get("matrix", 0, goalClients, s)))
	}
	b.WriteString("\n")
}

// costRatio is, as a clause, direct's CPU per request over p's, the load generator's
// included: the throughput ratio the two would have if the machine's processors were
// all theirs. It moves far less than throughput between rounds on a shared machine.
func costRatio(p, d *point) string {
	var sum [2]float64
	for i, q := range []*point{p, d} {
		t, ok1 := q.cpuMedian(totalCPU)
		l, ok2 := q.cpuMedian("loadgen")
		if !ok1 || !ok2 {
			return ""
		}
		sum[i] = t + l
	}
	if sum[0] <= 0 {
		return ""
	}
	return fmt.Sprintf("; CPU per request: %.2f× (%.0f against %.0f µs, load generator included)", sum[1]/sum[0], sum[0], sum[1])
}
