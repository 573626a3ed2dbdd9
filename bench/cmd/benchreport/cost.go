package main

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// The processes whose CPU bench/run.sh measures, as loadgen names them: the subject's
// proxy (nginx, bareproxy, the gateway), the app server (the upstream behind a proxy,
// or the subject itself), PostgreSQL (the run's own backends: those of its role), the
// Redis server, the whole PostgreSQL cluster (pgcluster: its background writers and
// other work on it too) and the load generator. total is proxy + app + postgres +
// redis: what serving the request cost, the load generator left out.
var cpuProcs = []string{"proxy", "app", "postgres", "redis"}

const totalCPU = "total"

// baseline is the subject every ratio is taken against: the upstream alone.
const baseline = "direct"

// subjectAliases maps the names of older results to today's.
var subjectAliases = map[string]string{"unprotected": baseline}

// pkey is one measured point: a subject at a concurrency and body size, in one phase.
type pkey struct {
	kind    string
	body    int
	clients int
	subject string
}

// rkey is one round of a phase at a concurrency and body size: what the ratios of
// that round are taken within.
type rkey struct {
	kind    string
	body    int
	clients int
	round   string
}

// point is the rounds of one pkey.
type point struct {
	tput, p50, p99           []float64
	ratio, vsNginx, p99Ratio []float64 // per round: req/s ÷ direct's, ÷ nginx's; p99 ÷ direct's
	cpu                      map[string][]float64
	bad                      int64 // non-2xx responses and errors
	responses, replayed      int64
	loads                    []float64
	writes                   []float64 // per round: writing transactions per response (PGBackground's xids)
	rates                    []float64 // per round: the rate the run was paced at (load.Result.Rate), if it was
}

// points is every point of the load phases, with their rounds' baselines.
type points map[pkey]*point

func (r *record) body() int {
	n, _ := strconv.Atoi(r.tag("body"))
	return n
}

func (r *record) pkey() pkey {
	return pkey{r.tag("kind"), r.body(), r.clients(), r.subject()}
}

func (r *record) rkey() rkey {
	return rkey{r.tag("kind"), r.body(), r.clients(), r.tag("round")}
}

// collect gathers the records of the given kinds into points.
func collect(recs []record, kinds ...string) points {
	type base struct{ tput, p99 float64 }
	direct, nginx := map[rkey]base{}, map[rkey]float64{}
	for i := range recs {
		r := &recs[i]
		if !slices.Contains(kinds, r.tag("kind")) {
			continue
		}
		switch r.subject() {
		case baseline:
			direct[r.rkey()] = base{r.Throughput, r.Latency.P99MS}
		case "nginx":
			nginx[r.rkey()] = r.Throughput
		}
	}
	ps := points{}
	for i := range recs {
		r := &recs[i]
		if !slices.Contains(kinds, r.tag("kind")) {
			continue
		}
		k := r.pkey()
		p := ps[k]
		if p == nil {
			p = &point{cpu: map[string][]float64{}}
			ps[k] = p
		}
		p.tput = append(p.tput, r.Throughput)
		p.p50 = append(p.p50, r.Latency.P50MS)
		p.p99 = append(p.p99, r.Latency.P99MS)
		if b := direct[r.rkey()]; b.tput > 0 {
			p.ratio = append(p.ratio, r.Throughput/b.tput)
			if b.p99 > 0 {
				p.p99Ratio = append(p.p99Ratio, r.Latency.P99MS/b.p99)
			}
		}
		if n := nginx[r.rkey()]; n > 0 {
			p.vsNginx = append(p.vsNginx, r.Throughput/n)
		}
		if len(r.us) > 0 {
			total := 0.0
			for name, us := range r.us {
				p.cpu[name] = append(p.cpu[name], us)
				if slices.Contains(cpuProcs, name) {
					total += us
				}
			}
			p.cpu[totalCPU] = append(p.cpu[totalCPU], total)
		}
		if x, ok := r.PGBackground["xids"]; ok && r.Responses > 0 && r.ElapsedS > 0 {
			// The count spans the load generator's warm-up too, whose responses are not
			// counted: it is taken at the measured phase's rate.
			p.writes = append(p.writes, x/float64(r.Responses)*r.ElapsedS/(r.ElapsedS+r.WarmupS))
		}
		if r.Rate > 0 {
			p.rates = append(p.rates, r.Rate)
		}
		p.responses += r.Responses
		p.replayed += r.Replayed
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
	return ps
}

// get is the point of kind, body, clients and subject, or nil.
func (ps points) get(kind string, body, clients int, subject string) *point {
	return ps[pkey{kind, body, clients, subject}]
}

// clients is the concurrencies measured in kind at body.
func (ps points) clients(kind string, body int) []int {
	var cs []int
	for k := range ps {
		if k.kind == kind && k.body == body && !slices.Contains(cs, k.clients) {
			cs = append(cs, k.clients)
		}
	}
	sort.Ints(cs)
	return cs
}

// bodies is the body sizes measured in kind.
func (ps points) bodies(kind string) []int {
	var bs []int
	for k := range ps {
		if k.kind == kind && !slices.Contains(bs, k.body) {
			bs = append(bs, k.body)
		}
	}
	sort.Ints(bs)
	return bs
}

// subjects is the subjects measured in kind at body and clients, in the run's order.
func (ps points) subjects(kind string, body, clients int) []string {
	var ss []string
	for k := range ps {
		if k.kind == kind && k.body == body && k.clients == clients {
			ss = append(ss, k.subject)
		}
	}
	sortSubjects(ss)
	return ss
}

// cpuMedian is the median over the rounds of a process's µs per request, and whether
// it was measured.
func (p *point) cpuMedian(name string) (float64, bool) {
	xs := p.cpu[name]
	if len(xs) == 0 {
		return 0, false
	}
	return median(xs), true
}

func (p *point) cpuCell(name string) string {
	if v, ok := p.cpuMedian(name); ok {
		return fmt.Sprintf("%.0f", v)
	}
	return "—"
}

func ratioCell(xs []float64) string {
	if len(xs) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", median(xs))
}

// costHeader and costRow are the columns of every cost table: throughput, its ratios,
// latency and the CPU per request of each process.
const costHeader = "req/s | × direct | × nginx | p50 ms | p99 ms | p99 × direct | proxy µs | app µs | postgres µs | redis µs | total µs | pg cluster µs | loadgen µs |"

// costCols is the number of columns of costHeader.
const costCols = 13

func costRow(p *point) string {
	return fmt.Sprintf("%.0f | %s | %s | %.2f | %.2f | %s | %s | %s | %s | %s | %s | %s | %s |", median(p.tput), ratioCell(p.ratio),
		ratioCell(p.vsNginx), median(p.p50), median(p.p99), ratioCell(p.p99Ratio), p.cpuCell("proxy"), p.cpuCell("app"),
		p.cpuCell("postgres"), p.cpuCell("redis"), p.cpuCell(totalCPU), p.cpuCell("pgcluster"), p.cpuCell("loadgen"))
}

const costNote = "Medians of the rounds; ratios taken per round against `direct` (and `nginx`) in the same round, then their median. " +
	"CPU: µs of processor time (user + system, from /proc) per response, per process tree: proxy = nginx (master and workers), " +
	"bareproxy or the gateway; app = the payments server (the upstream behind a proxy); postgres = the run's own backends " +
	"(its database role's: other work on the shared cluster is not in it); redis = the server, less its idle rate measured " +
	"at the start of the round; total = proxy + app + postgres + redis; pg cluster = the whole PostgreSQL cluster (its WAL " +
	"writer and checkpointer too) less its idle rate: a cross-check, noisy while other work uses the cluster. " +
	"— = not involved or not measured.\n\n"

// costTables writes the matrix's cost table, every concurrency, and the body sizes'.
func costTables(b *strings.Builder, ps points) {
	cs := ps.clients("matrix", 0)
	if len(cs) > 0 {
		b.WriteString("### Cost per request, every concurrency\n\n" + costNote)
		b.WriteString("| clients | subject | " + costHeader + "\n|---:|---|" + strings.Repeat("---:|", costCols) + "\n")
		for _, c := range cs {
			for _, s := range ps.subjects("matrix", 0, c) {
				fmt.Fprintf(b, "| %d | %s | %s\n", c, s, costRow(ps.get("matrix", 0, c, s)))
			}
		}
		b.WriteString("\n")
	}
	bodies := ps.bodies("bodies")
	if len(bodies) == 0 {
		return
	}
	b.WriteString("### Cost per request against the answer's size\n\n")
	b.WriteString("The upstream pads its JSON answer (`--pad`) to the size; every proxy and gateway is in front of it. " +
		"The default answer (~120 bytes) is the matrix's, at the same concurrency. " + costNote)
	b.WriteString("| answer | clients | subject | " + costHeader + "\n|---|---:|---|" + strings.Repeat("---:|", costCols) + "\n")
	clientsOf := map[int]bool{}
	for k := range ps {
		if k.kind == "bodies" {
			clientsOf[k.clients] = true
		}
	}
	for _, c := range sortedKeys(clientsOf) {
		for _, s := range ps.subjects("matrix", 0, c) {
			if ps.get("bodies", bodies[0], c, s) != nil {
				fmt.Fprintf(b, "| default | %d | %s | %s\n", c, s, costRow(ps.get("matrix", 0, c, s)))
			}
		}
		for _, body := range bodies {
			for _, s := range ps.subjects("bodies", body, c) {
				fmt.Fprintf(b, "| %s | %d | %s | %s\n", size(body), c, s, costRow(ps.get("bodies", body, c, s)))
			}
		}
	}
	b.WriteString("\n")
}

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// size writes a byte count as 1 KiB, 64 KiB or N B.
func size(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}
