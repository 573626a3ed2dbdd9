// Command benchreport turns the JSON lines bench/run.sh records (one load.Result per
// measured point, tagged kind, subject, clients and round; plus pgbench and ledger-row
// records) into the Markdown tables of bench/README.md.
//
//	cd bench && go run ./cmd/benchreport results.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/retrysafe/retrysafe/bench/load"
)

// record is a line of the results file: a load.Result, or one of run.sh's own records
// (pgbench: Throughput and Latency.MeanMS set; ledger rows: Rows set).
type record struct {
	load.Result
	Rows *int64 `json:"rows,omitempty"`
}

func (r *record) tag(k string) string { return r.Tags[k] }

func (r *record) clients() int {
	n, err := strconv.Atoi(r.tag("clients"))
	if err != nil {
		return r.Clients
	}
	return n
}

// subjectRank orders the subjects in the tables as bench/run.sh lists them.
func subjectRank(s string) int {
	order := []string{
		"unprotected", "payments-tx", "payments-mw", "payments-tx-nobatch",
		"gw-memory", "gw-sqlite", "gw-postgres", "gw-redis", "gw-sqlite-nobatch", "gw-postgres-nobatch",
		"express", "express-cluster2", "express-autocommit",
	}
	if i := slices.Index(order, s); i >= 0 {
		return i
	}
	return len(order)
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: benchreport results.jsonl")
		os.Exit(2)
	}
	recs, err := read(os.Args[1])
	if err == nil {
		err = report(os.Stdout, recs)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchreport: %v\n", err)
		os.Exit(1)
	}
}

func read(path string) ([]record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	defer f.Close()
	var recs []record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 1<<24)
	for line := 1; sc.Scan(); line++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		recs = append(recs, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	if len(recs) == 0 {
		return nil, errors.New("no records")
	}
	return recs, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func rng(xs []float64, format string) string {
	switch {
	case len(xs) == 0:
		return ""
	case len(xs) == 1:
		return fmt.Sprintf(format, xs[0])
	}
	return fmt.Sprintf(format+"–"+format, slices.Min(xs), slices.Max(xs))
}

// point is the rounds of one subject at one concurrency.
type point struct {
	tput, p50, p99, ratio []float64
	bad                   int64 // non-2xx responses and errors
	loads                 []float64
}

func report(w io.Writer, recs []record) error {
	var b strings.Builder
	matrix(&b, recs)
	storm(&b, recs)
	replay(&b, recs)
	pgbench(&b, recs)
	_, err := io.WriteString(w, b.String())
	return err
}

func matrix(b *strings.Builder, recs []record) {
	// points[clients][subject]; baseline[clients][round] = unprotected req/s.
	points := map[int]map[string]*point{}
	base := map[int]map[string]float64{}
	for i := range recs {
		r := &recs[i]
		if r.tag("kind") != "matrix" {
			continue
		}
		c := r.clients()
		if points[c] == nil {
			points[c], base[c] = map[string]*point{}, map[string]float64{}
		}
		if r.tag("subject") == "unprotected" {
			base[c][r.tag("round")] = r.Throughput
		}
	}
	for i := range recs {
		r := &recs[i]
		if r.tag("kind") != "matrix" {
			continue
		}
		c, s := r.clients(), r.tag("subject")
		p := points[c][s]
		if p == nil {
			p = &point{}
			points[c][s] = p
		}
		p.tput = append(p.tput, r.Throughput)
		p.p50 = append(p.p50, r.Latency.P50MS)
		p.p99 = append(p.p99, r.Latency.P99MS)
		if bt := base[c][r.tag("round")]; bt > 0 {
			p.ratio = append(p.ratio, r.Throughput/bt)
		}
		p.bad += r.Errors
		for k, n := range r.Status {
			if !strings.HasPrefix(k, "2") {
				p.bad += n
			}
		}
		if l, err := strconv.ParseFloat(r.tag("loadavg"), 64); err == nil {
			p.loads = append(p.loads, l)
		}
	}
	if len(points) == 0 {
		return
	}
	cs := make([]int, 0, len(points))
	for c := range points {
		cs = append(cs, c)
	}
	sort.Ints(cs)

	b.WriteString("### Throughput against the unprotected endpoint\n\n")
	b.WriteString("req/s: median of the rounds; ratio: median of the per-round ratios to `unprotected` (measured in the same round).\n\n")
	// table writes one row per subject and one column per client count, each cell
	// cell(p), or — where the subject was not measured at that count.
	table := func(cell func(p *point) string) {
		b.WriteString("| subject |")
		for _, c := range cs {
			fmt.Fprintf(b, " %d clients |", c)
		}
		b.WriteString("\n|---|")
		for range cs {
			b.WriteString("---:|")
		}
		b.WriteString("\n")
		for _, s := range sortedSubjects(points) {
			fmt.Fprintf(b, "| %s |", s)
			for _, c := range cs {
				if p := points[c][s]; p == nil {
					b.WriteString(" — |")
				} else {
					b.WriteString(" " + cell(p) + " |")
				}
			}
			b.WriteString("\n")
		}
	}
	table(func(p *point) string { return fmt.Sprintf("%.0f (%.2f)", median(p.tput), median(p.ratio)) })
	b.WriteString("\n### Latency (ms)\n\np50 / p99, medians of the rounds.\n\n")
	table(func(p *point) string { return fmt.Sprintf("%.2f / %.2f", median(p.p50), median(p.p99)) })
	b.WriteString("\n### Every point\n\n| clients | subject | req/s (rounds) | ratio (rounds) | p50 ms | p99 ms | non-2xx + errors | load avg |\n|---:|---|---|---|---|---|---:|---|\n")
	for _, c := range cs {
		for _, s := range sortedSubjects(points) {
			p := points[c][s]
			if p == nil {
				continue
			}
			fmt.Fprintf(b, "| %d | %s | %s | %s | %s | %s | %d | %s |\n", c, s, join(p.tput, "%.0f"), join(p.ratio, "%.2f"),
				join(p.p50, "%.2f"), join(p.p99, "%.2f"), p.bad, rng(p.loads, "%.1f"))
		}
	}
	b.WriteString("\n")

	// The targets, at 32 clients: gw-postgres ≥ 0.5× and payments-tx ≥ 0.8× unprotected,
	// and payments-tx, payments-mw and gw-postgres each ahead of both Express variants
	// on throughput and p99.
	p32 := points[32]
	if p32 == nil {
		return
	}
	b.WriteString("### Targets (32 clients)\n\n| target | measured | met |\n|---|---|---|\n")
	target := func(name, s string, min float64) {
		p := p32[s]
		if p == nil {
			return
		}
		r := median(p.ratio)
		fmt.Fprintf(b, "| %s ≥ %.2f× unprotected | %.2f× (%.0f vs %.0f req/s; rounds %s) | %s |\n", name, min, r,
			median(p.tput), median(p32["unprotected"].tput), join(p.ratio, "%.2f"), yesNo(r >= min))
	}
	target("gateway, PostgreSQL store", "gw-postgres", 0.5)
	target("payments, transaction mode", "payments-tx", 0.8)
	for _, ours := range []string{"payments-tx", "payments-mw", "gw-postgres"} {
		for _, peer := range []string{"express", "express-cluster2"} {
			po, pp := p32[ours], p32[peer]
			if po == nil || pp == nil {
				continue
			}
			to, tp := median(po.tput), median(pp.tput)
			qo, qp := median(po.p99), median(pp.p99)
			fmt.Fprintf(b, "| %s ahead of %s: throughput | %.0f vs %.0f req/s (%.2f×) | %s |\n", ours, peer, to, tp, to/tp, yesNo(to > tp))
			fmt.Fprintf(b, "| %s ahead of %s: p99 | %.2f vs %.2f ms | %s |\n", ours, peer, qo, qp, yesNo(qo < qp))
		}
	}
	b.WriteString("\n")

	// Against the Express baseline at every concurrency: ahead means ahead of both the
	// single process and the cluster.
	b.WriteString("### Against the Express baseline, every concurrency\n\n")
	b.WriteString("req/s and p99 (ms), medians of the rounds; ahead = better than both `express` and `express-cluster2`.\n\n")
	b.WriteString("| clients | subject | req/s | express / cluster2 req/s | ahead on req/s | p99 | express / cluster2 p99 | ahead on p99 |\n")
	b.WriteString("|---:|---|---:|---|---|---:|---|---|\n")
	for _, c := range cs {
		pe, pc := points[c]["express"], points[c]["express-cluster2"]
		if pe == nil || pc == nil {
			continue
		}
		for _, ours := range []string{"payments-tx", "payments-mw", "gw-postgres"} {
			po := points[c][ours]
			if po == nil {
				continue
			}
			to, te, tc := median(po.tput), median(pe.tput), median(pc.tput)
			qo, qe, qc := median(po.p99), median(pe.p99), median(pc.p99)
			fmt.Fprintf(b, "| %d | %s | %.0f | %.0f / %.0f | %s | %.2f | %.2f / %.2f | %s |\n", c, ours, to, te, tc,
				yesNo(to > te && to > tc), qo, qe, qc, yesNo(qo < qe && qo < qc))
		}
	}
	b.WriteString("\n")
}

func yesNo(ok bool) string {
	if ok {
		return "**yes**"
	}
	return "**no**"
}

func join(xs []float64, format string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(parts, ", ")
}

func sortedSubjects(points map[int]map[string]*point) []string {
	seen := map[string]bool{}
	for _, m := range points {
		for s := range m {
			seen[s] = true
		}
	}
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		ri, rj := subjectRank(out[i]), subjectRank(out[j])
		if ri != rj {
			return ri < rj
		}
		return out[i] < out[j]
	})
	return out
}

func storm(b *strings.Builder, recs []record) {
	rows := map[string]int64{}
	var runs []*record
	for i := range recs {
		r := &recs[i]
		switch r.tag("kind") {
		case "storm-rows":
			if r.Rows != nil {
				rows[r.tag("subject")] = *r.Rows
			}
		case "storm":
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		return
	}
	sort.SliceStable(runs, func(i, j int) bool { return subjectRank(runs[i].tag("subject")) < subjectRank(runs[j].tag("subject")) })
	b.WriteString("### Duplicate storm: 1,000 concurrent requests, one key\n\n")
	b.WriteString("Each client opened its connection first, then all sent at once. Executions: ledger rows made under the storm's user.\n\n")
	b.WriteString("| subject | executions | responses | first (2xx, not replayed) ms | 409 | 409 p50 / p99 ms | replayed | replayed p50 / p99 ms | other | errors | all p99 / max ms |\n")
	b.WriteString("|---|---:|---|---:|---:|---|---:|---|---|---:|---|\n")
	for _, r := range runs {
		s := r.tag("subject")
		ex := "?"
		if n, ok := rows[s]; ok {
			ex = strconv.FormatInt(n, 10)
		}
		var first []string
		var other []string
		for k, n := range r.Status {
			switch {
			case strings.HasPrefix(k, "2") && !strings.HasSuffix(k, "replayed"):
				first = append(first, fmt.Sprintf("%d× %.1f", n, r.ByStatus[k].MaxMS))
			case k == "409" || strings.HasSuffix(k, "replayed"):
			default:
				other = append(other, fmt.Sprintf("%s: %d", k, n))
			}
		}
		sort.Strings(first)
		sort.Strings(other)
		c409 := r.ByStatus["409"]
		var rep load.Summary
		var nrep int64
		for k, n := range r.Status {
			if strings.HasSuffix(k, "replayed") {
				rep, nrep = r.ByStatus[k], nrep+n
			}
		}
		fmt.Fprintf(b, "| %s | %s | %d | %s | %d | %s | %d | %s | %s | %d | %.1f / %.1f |\n", s, ex, r.Responses,
			strings.Join(first, ", "), r.Status["409"], pair(c409), nrep, pair(rep), strings.Join(other, ", "),
			r.Errors, r.Latency.P99MS, r.Latency.MaxMS)
	}
	b.WriteString("\n")
}

func pair(s load.Summary) string {
	if s.Count == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f / %.1f", s.P50MS, s.P99MS)
}

func replay(b *strings.Builder, recs []record) {
	type key struct {
		subject string
		clients int
	}
	first, rep := map[key]*record{}, map[key]*record{}
	for i := range recs {
		r := &recs[i]
		k := key{r.tag("subject"), r.clients()}
		switch r.tag("kind") {
		case "first":
			first[k] = r
		case "replay":
			rep[k] = r
		}
	}
	if len(rep) == 0 {
		return
	}
	keys := make([]key, 0, len(rep))
	for k := range rep {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].clients != keys[j].clients {
			return keys[i].clients < keys[j].clients
		}
		return subjectRank(keys[i].subject) < subjectRank(keys[j].subject)
	})
	b.WriteString("### Replay vs first execution\n\n")
	b.WriteString("Back to back per subject: new keys (first executions), then one completed key sent again and again (replays).\n\n")
	b.WriteString("| clients | subject | first: req/s | first: p50 / p99 ms | replay: req/s | replay: p50 / p99 ms | replay/first req/s | replayed share |\n")
	b.WriteString("|---:|---|---:|---|---:|---|---:|---:|\n")
	for _, k := range keys {
		r := rep[k]
		f := first[k]
		share := 0.0
		if r.Responses > 0 {
			share = float64(r.Replayed) / float64(r.Responses)
		}
		if f == nil {
			fmt.Fprintf(b, "| %d | %s | — | — | %.0f | %s | — | %.3f |\n", k.clients, k.subject, r.Throughput, pair(r.Latency), share)
			continue
		}
		fmt.Fprintf(b, "| %d | %s | %.0f | %s | %.0f | %s | %.2f× | %.3f |\n", k.clients, k.subject, f.Throughput, pair(f.Latency),
			r.Throughput, pair(r.Latency), r.Throughput/f.Throughput, share)
	}
	b.WriteString("\n")
}

func pgbench(b *strings.Builder, recs []record) {
	type key struct {
		script  string
		clients int
	}
	tps, lat, ratio := map[key][]float64{}, map[key][]float64{}, map[key][]float64{}
	insert := map[string]float64{} // clients/round → insert tps
	for i := range recs {
		r := &recs[i]
		if r.tag("kind") == "pgbench" && r.tag("subject") == "insert" {
			insert[r.tag("clients")+"/"+r.tag("round")] = r.Throughput
		}
	}
	var scripts []string
	var cs []int
	failed := map[key]int{}
	for i := range recs {
		r := &recs[i]
		if r.tag("kind") != "pgbench" {
			continue
		}
		k := key{r.tag("subject"), r.clients()}
		if !slices.Contains(scripts, k.script) {
			scripts = append(scripts, k.script)
		}
		if !slices.Contains(cs, k.clients) {
			cs = append(cs, k.clients)
		}
		if r.Throughput == 0 {
			failed[k]++
			continue
		}
		tps[k] = append(tps[k], r.Throughput)
		lat[k] = append(lat[k], r.Latency.MeanMS)
		if in := insert[r.tag("clients")+"/"+r.tag("round")]; in > 0 {
			ratio[k] = append(ratio[k], r.Throughput/in)
		}
	}
	if len(scripts) == 0 {
		return
	}
	order := []string{"insert", "claim", "txmode", "express-tx"}
	sort.Slice(scripts, func(i, j int) bool {
		ri, rj := slices.Index(order, scripts[i]), slices.Index(order, scripts[j])
		if ri != rj {
			return ri < rj
		}
		return scripts[i] < scripts[j]
	})
	sort.Ints(cs)
	b.WriteString("### PostgreSQL's own ceiling (pgbench)\n\n")
	b.WriteString("Transactions per second (one script execution = one payment's SQL; median of the rounds), the median ratio to `insert` " +
		"in the same round, mean latency in ms; -M prepared, no HTTP.\n\n| script |")
	for _, c := range cs {
		fmt.Fprintf(b, " %d clients |", c)
	}
	b.WriteString("\n|---|")
	for range cs {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, s := range scripts {
		fmt.Fprintf(b, "| %s |", s)
		for _, c := range cs {
			k := key{s, c}
			switch {
			case len(tps[k]) == 0 && failed[k] > 0:
				b.WriteString(" failed |")
			case len(tps[k]) == 0:
				b.WriteString(" — |")
			default:
				r := "—"
				if len(ratio[k]) > 0 {
					r = fmt.Sprintf("%.2f×", median(ratio[k]))
				}
				fmt.Fprintf(b, " %.0f (%s, %.2f ms) |", median(tps[k]), r, median(lat[k]))
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}
