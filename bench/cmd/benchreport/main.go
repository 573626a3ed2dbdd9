// Command benchreport turns the JSON lines bench/run.sh records (one load.Result per
// measured point, tagged kind, subject, body, clients and round, with the CPU of each
// process involved; plus idle, pgbench and ledger-row records) into the Markdown
// tables of bench/README.md: the goal figures, the cost per request (throughput,
// latency and CPU per process) at every concurrency and answer size, the storm, the
// replays and pgbench's ceilings. With -summary, only the goal figures and the cost
// at 32 clients: what fits on one screen.
//
//	cd bench && go run ./cmd/benchreport [-summary] results.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
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
// (pgbench: Throughput, Responses (transactions), Latency.MeanMS and CPU set; ledger
// rows: Rows set; idle: CPU and CPUWindowS of the shared servers with nothing sent).
type record struct {
	load.Result
	Rows *int64 `json:"rows,omitempty"`
	// PGBackground is what the PostgreSQL cluster of the run's own counted during the
	// window (run.sh's pgbg): checkpoints, autovacuums, autoanalyzes, full-page images,
	// and xids, the transaction IDs it handed out, one per writing transaction.
	PGBackground map[string]float64 `json:"pg_background,omitempty"`

	// us is the CPU per response of each process, in µs, the shared servers' less
	// their idle rate (see prepare).
	us map[string]float64
}

func (r *record) tag(k string) string { return r.Tags[k] }

// subject is the record's subject under today's name.
func (r *record) subject() string {
	s := r.tag("subject")
	if a, ok := subjectAliases[s]; ok {
		return a
	}
	return s
}

func (r *record) clients() int {
	n, err := strconv.Atoi(r.tag("clients"))
	if err != nil {
		return r.Clients
	}
	return n
}

// subjectOrder is the order of the subjects in the tables, as bench/run.sh lists them.
var subjectOrder = []string{
	"direct", "nginx", "bareproxy", "bareproxy-keyed", "payments-tx", "payments-mw", "payments-tx-nobatch",
	"gw-memory", "gw-sqlite", "gw-postgres", "gw-redis", "gw-sqlite-nobatch", "gw-postgres-nobatch",
	"gw-memory-base", "gw-sqlite-base", "gw-postgres-base",
	"express", "express-cluster2", "express-autocommit",
}

func subjectRank(s string) int {
	if i := slices.Index(subjectOrder, s); i >= 0 {
		return i
	}
	return len(subjectOrder)
}

func sortSubjects(ss []string) {
	sort.Slice(ss, func(i, j int) bool {
		ri, rj := subjectRank(ss[i]), subjectRank(ss[j])
		if ri != rj {
			return ri < rj
		}
		return ss[i] < ss[j]
	})
}

func main() {
	fs := flag.NewFlagSet("benchreport", flag.ContinueOnError)
	short := fs.Bool("summary", false, "only the goal figures and the cost at 32 clients")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if fs.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: benchreport [-summary] results.jsonl [more.jsonl ...]\n\n"+
			"Several files are pooled as one run: the rounds of each are kept apart (file n's\n"+
			"round r is round n.r), so every ratio is still taken within a round, and each\n"+
			"median is over the rounds of all the files. What some file did not measure (a\n"+
			"phase, subject, concurrency and body size) is left out, and named on standard\n"+
			"error.")
		os.Exit(2)
	}
	recs, dropped, err := readAll(fs.Args())
	if len(dropped) > 0 {
		fmt.Fprintf(os.Stderr, "benchreport: left out, not in every file: %s\n", strings.Join(dropped, "; "))
	}
	if err == nil {
		if *short {
			var b strings.Builder
			summary(&b, recs)
			_, err = io.WriteString(os.Stdout, b.String())
		} else {
			err = report(os.Stdout, recs)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchreport: %v\n", err)
		os.Exit(1)
	}
}

// readAll reads the records of paths, pooled as one run: with more than one file, each
// record's round becomes "n.r" (n the file's place, from 1), so that the rounds of two
// runs, both numbered from 1, stay apart. A record's idle rate is taken within its own
// file (prepare runs per file). Only what every file measured is pooled: a record whose
// measurement some file lacks is left out (and named in dropped), so
// that no figure sets the medians of some runs' rounds against those of others.
func readAll(paths []string) (recs []record, dropped []string, err error) {
	if len(paths) == 1 {
		recs, err := read(paths[0])
		return recs, nil, err
	}
	files := make([][]record, len(paths))
	in := map[string]int{} // how many files hold each measurement
	for i, path := range paths {
		if files[i], err = read(path); err != nil {
			return nil, nil, err
		}
		seen := map[string]bool{}
		for j := range files[i] {
			seen[measurement(&files[i][j])] = true
		}
		for m := range seen {
			in[m]++
		}
	}
	for m, n := range in {
		if n < len(paths) && m != "" {
			dropped = append(dropped, m)
		}
	}
	sort.Strings(dropped)
	for i, file := range files {
		for _, r := range file {
			if m := measurement(&r); m != "" && in[m] < len(paths) {
				continue
			}
			if round, ok := r.Tags["round"]; ok {
				r.Tags["round"] = strconv.Itoa(i+1) + "." + round
			}
			recs = append(recs, r)
		}
	}
	return recs, dropped, nil
}

// measurement names what a record measures, apart from its round: phase, subject,
// concurrency and, in the phase of body sizes, the body's size; "" for the idle records,
// which every round has.
func measurement(r *record) string {
	kind := r.tag("kind")
	switch {
	case kind == "idle":
		return ""
	case r.tag("body") != "" && r.body() > 0:
		return fmt.Sprintf("%s %s c=%s body=%d", kind, r.subject(), r.tag("clients"), r.body())
	}
	return kind + " " + r.subject() + " c=" + r.tag("clients")
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
	prepare(recs)
	return recs, nil
}

// prepare sets every record's CPU per response. The shared servers (PostgreSQL,
// Redis) also serve other work on the machine: their figure is the window's CPU less
// the idle rate of the last idle record before it (run.sh measures one at the start
// of every round), never below zero. Other processes are the run's own and are
// taken as measured.
func prepare(recs []record) {
	rate := map[string]float64{} // CPU seconds per second, by process
	for i := range recs {
		r := &recs[i]
		if r.tag("kind") == "idle" {
			if r.CPUWindowS > 0 {
				for name, c := range r.CPU {
					rate[name] = c.Seconds / r.CPUWindowS
				}
			}
			continue
		}
		if len(r.CPU) == 0 || r.Responses <= 0 {
			continue
		}
		r.us = make(map[string]float64, len(r.CPU))
		for name, c := range r.CPU {
			sec := c.Seconds - rate[name]*r.CPUWindowS
			if sec < 0 {
				sec = 0
			}
			r.us[name] = sec * 1e6 / float64(r.Responses)
		}
	}
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

func report(w io.Writer, recs []record) error {
	var b strings.Builder
	ps := collect(recs, "matrix", "bodies", "replay", "first", "paced")
	pg := collectPgbench(recs)
	goals(&b, ps, pg)
	paced(&b, ps)
	paired(&b, recs)
	costTables(&b, ps)
	matrix(&b, ps)
	storm(&b, recs)
	replay(&b, ps)
	pgbench(&b, pg)
	idleRates(&b, recs)
	_, err := io.WriteString(w, b.String())
	return err
}

// matrix writes the throughput and latency tables of the matrix, every point of it,
// the README's targets and the comparison with the Express baseline.
func matrix(b *strings.Builder, ps points) {
	cs := ps.clients("matrix", 0)
	if len(cs) == 0 {
		return
	}
	var subjects []string
	for _, c := range cs {
		for _, s := range ps.subjects("matrix", 0, c) {
			if !slices.Contains(subjects, s) {
				subjects = append(subjects, s)
			}
		}
	}
	sortSubjects(subjects)
	get := func(c int, s string) *point { return ps.get("matrix", 0, c, s) }

	b.WriteString("### Throughput against direct\n\n")
	b.WriteString("req/s: median of the rounds; ratio: median of the per-round ratios to `direct` (measured in the same round).\n\n")
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
		for _, s := range subjects {
			fmt.Fprintf(b, "| %s |", s)
			for _, c := range cs {
				if p := get(c, s); p == nil {
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
	b.WriteString("\n### Every point\n\n| clients | subject | req/s (rounds) | ratio (rounds) | p50 ms | p99 ms | total CPU µs (rounds) | non-2xx + errors | load avg |\n|---:|---|---|---|---|---|---|---:|---|\n")
	for _, c := range cs {
		for _, s := range ps.subjects("matrix", 0, c) {
			p := get(c, s)
			fmt.Fprintf(b, "| %d | %s | %s | %s | %s | %s | %s | %d | %s |\n", c, s, join(p.tput, "%.0f"), join(p.ratio, "%.2f"),
				join(p.p50, "%.2f"), join(p.p99, "%.2f"), join(p.cpu[totalCPU], "%.0f"), p.bad, rng(p.loads, "%.1f"))
		}
	}
	b.WriteString("\n")

	// The targets, at 32 clients: the throughput floors (throughputFloor),
	// and payments-tx, payments-mw and gw-postgres each ahead of both Express variants
	// on throughput and p99.
	if get(goalClients, baseline) == nil {
		return
	}
	fmt.Fprintf(b, "### Targets (%d clients)\n\n| target | measured | met |\n|---|---|---|\n", goalClients)
	for _, s := range []string{"gw-postgres", "gw-sqlite", "payments-tx"} {
		p := get(goalClients, s)
		floor, _ := throughputFloor(s)
		if p == nil || len(p.ratio) == 0 {
			continue
		}
		r := median(p.ratio)
		fmt.Fprintf(b, "| %s ≥ %.2f× direct | %.2f× (%.0f vs %.0f req/s; rounds %s) | %s |\n", s, floor, r,
			median(p.tput), median(get(goalClients, baseline).tput), join(p.ratio, "%.2f"), yesNo(r >= floor))
	}
	for _, ours := range []string{"payments-tx", "payments-mw", "gw-postgres"} {
		for _, peer := range []string{"express", "express-cluster2"} {
			po, pp := get(goalClients, ours), get(goalClients, peer)
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
	var rows []string
	for _, c := range cs {
		pe, pc := get(c, "express"), get(c, "express-cluster2")
		if pe == nil || pc == nil {
			continue
		}
		for _, ours := range []string{"payments-tx", "payments-mw", "gw-postgres"} {
			po := get(c, ours)
			if po == nil {
				continue
			}
			to, te, tc := median(po.tput), median(pe.tput), median(pc.tput)
			qo, qe, qc := median(po.p99), median(pe.p99), median(pc.p99)
			rows = append(rows, fmt.Sprintf("| %d | %s | %.0f | %.0f / %.0f | %s | %.2f | %.2f / %.2f | %s |\n", c, ours, to, te, tc,
				yesNo(to > te && to > tc), qo, qe, qc, yesNo(qo < qe && qo < qc)))
		}
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("### Against the Express baseline, every concurrency\n\n")
	b.WriteString("req/s and p99 (ms), medians of the rounds; ahead = better than both `express` and `express-cluster2`.\n\n")
	b.WriteString("| clients | subject | req/s | express / cluster2 req/s | ahead on req/s | p99 | express / cluster2 p99 | ahead on p99 |\n")
	b.WriteString("|---:|---|---:|---|---|---:|---|---|\n")
	b.WriteString(strings.Join(rows, ""))
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

func storm(b *strings.Builder, recs []record) {
	rows := map[string]int64{}
	var runs []*record
	for i := range recs {
		r := &recs[i]
		switch r.tag("kind") {
		case "storm-rows":
			if r.Rows != nil {
				rows[r.subject()] = *r.Rows
			}
		case "storm":
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		return
	}
	sort.SliceStable(runs, func(i, j int) bool { return subjectRank(runs[i].subject()) < subjectRank(runs[j].subject()) })
	b.WriteString("### Duplicate storm: 1,000 concurrent requests, one key\n\n")
	b.WriteString("Each client opened its connection first, then all sent at once. Executions: ledger rows made under the storm's user.\n\n")
	b.WriteString("| subject | executions | responses | first (2xx, not replayed) ms | 409 | 409 p50 / p99 ms | replayed | replayed p50 / p99 ms | other | errors | all p99 / max ms |\n")
	b.WriteString("|---|---:|---|---:|---:|---|---:|---|---|---:|---|\n")
	for _, r := range runs {
		s := r.subject()
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

// replay writes replay against first execution, back to back per subject, with the
// CPU per response of each.
func replay(b *strings.Builder, ps points) {
	var keys []pkey
	for k := range ps {
		if k.kind == "replay" {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].clients != keys[j].clients {
			return keys[i].clients < keys[j].clients
		}
		return subjectRank(keys[i].subject) < subjectRank(keys[j].subject)
	})
	b.WriteString("### Replay vs first execution\n\n")
	b.WriteString("Back to back per subject: new keys (first executions), then one completed key sent again and again (replays). " +
		"CPU: µs per response of the subject's own process (the gateway, or the payments or Express server), of the upstream " +
		"behind a gateway, and of PostgreSQL (less its idle rate).\n\n")
	b.WriteString("| clients | subject | first: req/s | first: p50 / p99 ms | replay: req/s | replay: p50 / p99 ms | replay/first req/s | replayed share | first: own / upstream / postgres µs | replay: own / upstream / postgres µs |\n")
	b.WriteString("|---:|---|---:|---|---:|---|---:|---:|---|---|\n")
	// own is the subject's own process: the gateway's proxy, else the app server.
	cpu := func(p *point, gateway bool) string {
		if gateway {
			return p.cpuCell("proxy") + " / " + p.cpuCell("app") + " / " + p.cpuCell("postgres")
		}
		return p.cpuCell("app") + " / — / " + p.cpuCell("postgres")
	}
	for _, k := range keys {
		r := ps[k]
		gw := strings.HasPrefix(k.subject, "gw-")
		share := 0.0
		if r.responses > 0 {
			share = float64(r.replayed) / float64(r.responses)
		}
		f := ps.get("first", k.body, k.clients, k.subject)
		if f == nil {
			fmt.Fprintf(b, "| %d | %s | — | — | %.0f | %s | — | %.3f | — | %s |\n", k.clients, k.subject, median(r.tput),
				pairs(r.p50, r.p99), share, cpu(r, gw))
			continue
		}
		fmt.Fprintf(b, "| %d | %s | %.0f | %s | %.0f | %s | %.2f× | %.3f | %s | %s |\n", k.clients, k.subject, median(f.tput),
			pairs(f.p50, f.p99), median(r.tput), pairs(r.p50, r.p99), median(r.tput)/median(f.tput), share, cpu(f, gw), cpu(r, gw))
	}
	b.WriteString("\n")
}

func pairs(p50, p99 []float64) string {
	if len(p50) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f / %.1f", median(p50), median(p99))
}

// pgKey is one pgbench script at one concurrency.
type pgKey struct {
	script  string
	clients int
}

// pgPoint is the rounds of one pgKey; failed counts the rounds pgbench failed.
type pgPoint struct {
	tps, lat, ratio, us []float64
	failed              int
}

// collectPgbench gathers the pgbench records: transactions per second, mean latency,
// the ratio to insert in the same round and PostgreSQL's CPU per transaction (less
// its idle rate).
func collectPgbench(recs []record) map[pgKey]*pgPoint {
	insert := map[string]float64{} // clients/round → insert tps
	for i := range recs {
		r := &recs[i]
		if r.tag("kind") == "pgbench" && r.tag("subject") == "insert" {
			insert[r.tag("clients")+"/"+r.tag("round")] = r.Throughput
		}
	}
	out := map[pgKey]*pgPoint{}
	for i := range recs {
		r := &recs[i]
		if r.tag("kind") != "pgbench" {
			continue
		}
		k := pgKey{r.tag("subject"), r.clients()}
		p := out[k]
		if p == nil {
			p = &pgPoint{}
			out[k] = p
		}
		if r.Throughput == 0 {
			p.failed++
			continue
		}
		p.tps = append(p.tps, r.Throughput)
		p.lat = append(p.lat, r.Latency.MeanMS)
		if in := insert[r.tag("clients")+"/"+r.tag("round")]; in > 0 {
			p.ratio = append(p.ratio, r.Throughput/in)
		}
		if us, ok := r.us["postgres"]; ok {
			p.us = append(p.us, us)
		}
	}
	return out
}

func pgbench(b *strings.Builder, pg map[pgKey]*pgPoint) {
	if len(pg) == 0 {
		return
	}
	var scripts []string
	var cs []int
	for k := range pg {
		if !slices.Contains(scripts, k.script) {
			scripts = append(scripts, k.script)
		}
		if !slices.Contains(cs, k.clients) {
			cs = append(cs, k.clients)
		}
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
		"in the same round, mean latency in ms, and PostgreSQL's CPU per transaction in µs (pgbench's backends over the " +
		"middle of its run, per second, divided by the transactions per second); -M prepared, no HTTP.\n\n| script |")
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
			p := pg[pgKey{s, c}]
			switch {
			case p == nil:
				b.WriteString(" — |")
			case len(p.tps) == 0 && p.failed > 0:
				b.WriteString(" failed |")
			case len(p.tps) == 0:
				b.WriteString(" — |")
			default:
				r, us := "—", ""
				if len(p.ratio) > 0 {
					r = fmt.Sprintf("%.2f×", median(p.ratio))
				}
				if len(p.us) > 0 {
					us = fmt.Sprintf(", %.0f µs", median(p.us))
				}
				fmt.Fprintf(b, " %.0f (%s, %.2f ms%s) |", median(p.tps), r, median(p.lat), us)
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

// idleRates writes the shared servers' background CPU, measured with nothing of the
// run sending, that the CPU figures above have been given less of.
func idleRates(b *strings.Builder, recs []record) {
	rates := map[string][]float64{}
	for i := range recs {
		r := &recs[i]
		if r.tag("kind") != "idle" || r.CPUWindowS <= 0 {
			continue
		}
		for name, c := range r.CPU {
			rates[name] = append(rates[name], c.Seconds/r.CPUWindowS*1000)
		}
	}
	if len(rates) == 0 {
		return
	}
	names := make([]string, 0, len(rates))
	for n := range rates {
		names = append(names, n)
	}
	sort.Strings(names)
	b.WriteString("### Background CPU of the shared servers\n\n")
	b.WriteString("ms of CPU per second with nothing of this run sending, measured at the start of every round " +
		"(other work on the machine uses the same servers); each window's figure above is less the last rate measured before it.\n\n")
	b.WriteString("| server | samples | median | min–max |\n|---|---:|---:|---|\n")
	for _, n := range names {
		fmt.Fprintf(b, "| %s | %d | %.1f | %s |\n", n, len(rates[n]), median(rates[n]), rng(rates[n], "%.1f"))
	}
	b.WriteString("\n")
}
