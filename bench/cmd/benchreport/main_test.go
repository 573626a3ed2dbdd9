package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestReport(t *testing.T) {
	t.Parallel()
	lines := `{"tags":{"kind":"matrix","subject":"unprotected","clients":"32","round":"1","loadavg":"3.5"},"throughput":1000,"latency":{"p50_ms":1,"p99_ms":2},"status":{"201":5000}}
{"tags":{"kind":"matrix","subject":"payments-tx","clients":"32","round":"1"},"throughput":900,"latency":{"p50_ms":1,"p99_ms":2},"status":{"201":4000,"500":3},"errors":1}
{"tags":{"kind":"matrix","subject":"gw-postgres","clients":"32","round":"1"},"throughput":400,"latency":{"p50_ms":3,"p99_ms":9},"status":{"201":2000}}
{"tags":{"kind":"matrix","subject":"express","clients":"32","round":"1"},"throughput":500,"latency":{"p50_ms":3,"p99_ms":5},"status":{"201":2000}}
{"tags":{"kind":"matrix","subject":"express-cluster2","clients":"32","round":"1"},"throughput":450,"latency":{"p50_ms":3,"p99_ms":5},"status":{"201":2000}}
{"tags":{"kind":"storm","subject":"payments-tx","clients":"1000"},"responses":1000,"status":{"201":1,"201 replayed":900,"409":99},"by_status":{"201":{"count":1,"max_ms":50}}}
{"tags":{"kind":"storm-rows","subject":"payments-tx"},"rows":1}
{"tags":{"kind":"first","subject":"payments-tx","clients":"1"},"throughput":100}
{"tags":{"kind":"replay","subject":"payments-tx","clients":"1"},"throughput":300,"responses":10,"replayed":10}
{"tags":{"kind":"replay","subject":"gw-redis","clients":"1"},"throughput":300}
{"tags":{"kind":"pgbench","subject":"insert","clients":"32","round":"1"},"throughput":2000,"latency":{"mean_ms":1}}
{"tags":{"kind":"pgbench","subject":"txmode","clients":"32","round":"1"},"throughput":500,"latency":{"mean_ms":4}}
{"tags":{"kind":"pgbench","subject":"claim","clients":"32","round":"1"},"throughput":0}
{"tags":{"kind":"unknown"}}
{}
`
	recs := readLines(t, lines)
	var b strings.Builder
	if err := report(&b, recs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| payments-tx | 900 (0.90) |",
		"| gw-postgres ≥ 0.60× direct | 0.40×",
		"| payments-tx ≥ 0.60× direct | 0.90×",
		"| 3 | gw-postgres req/s ÷ direct's | 0.40× (400 against 1000; rounds 0.40) | ≥ 0.60× | **no** |",
		"| 32 | payments-tx | 900 | 500 / 450 | **yes** |",
		"| payments-tx | 1 | 1000 | 1× 50.0 | 99 | — | 900 |",
		"| 1 | payments-tx | 100 |",
		"| txmode | 500 (0.25×, 4.00 ms) |",
		"| claim | failed |",
		"| 32 | payments-tx | 900 | 0.90 | 1.00 | 2.00 |  | 4 |",
		"| direct | 1000 (1.00) |", // "unprotected" is read as direct
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"not json\n", ""} {
		p := filepath.Join(t.TempDir(), "bad.jsonl")
		if err := os.WriteFile(p, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := read(p); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestCPU checks the CPU columns: per response, the shared servers less the last idle
// rate before the window, the totals, the ratios to direct and nginx, the body sizes,
// the replays and the goal figures built from them.
func TestCPU(t *testing.T) {
	t.Parallel()
	// Round 1 at 32 clients: idle PostgreSQL at 0.1 CPU-s per second; every window is 2 s
	// and 1,000 responses, so 0.2 s of PostgreSQL's figure is background.
	lines := `{"tags":{"kind":"idle","at":"matrix"},"cpu_window_s":1,"cpu":{"postgres":{"seconds":0.1}}}
{"tags":{"kind":"matrix","subject":"direct","body":"0","clients":"32","round":"1"},"throughput":500,"responses":1000,"latency":{"p50_ms":1,"p99_ms":4},"cpu_window_s":2,"cpu":{"app":{"seconds":0.1},"postgres":{"seconds":0.4},"pgcluster":{"seconds":0.3},"loadgen":{"seconds":0.05}}}
{"tags":{"kind":"matrix","subject":"nginx","body":"0","clients":"32","round":"1"},"throughput":400,"responses":1000,"latency":{"p50_ms":1,"p99_ms":6},"cpu_window_s":2,"cpu":{"proxy":{"seconds":0.02},"app":{"seconds":0.1},"postgres":{"seconds":0.4}}}
{"tags":{"kind":"matrix","subject":"gw-memory","body":"0","clients":"32","round":"1"},"throughput":200,"responses":1000,"latency":{"p50_ms":3,"p99_ms":8},"cpu_window_s":2,"cpu":{"proxy":{"seconds":0.06},"app":{"seconds":0.1},"postgres":{"seconds":0.4},"pgcluster":{"seconds":0.35}}}
{"tags":{"kind":"matrix","subject":"bareproxy-keyed","body":"0","clients":"32","round":"1"},"throughput":250,"responses":1000,"latency":{"p50_ms":1,"p99_ms":6},"cpu_window_s":2,"cpu":{"proxy":{"seconds":0.055},"app":{"seconds":0.1},"postgres":{"seconds":0.4}}}
{"tags":{"kind":"matrix","subject":"gw-postgres","body":"0","clients":"32","round":"1"},"throughput":100,"responses":1000,"latency":{"p50_ms":3,"p99_ms":12},"cpu_window_s":2,"cpu":{"proxy":{"seconds":0.08},"app":{"seconds":0.1},"postgres":{"seconds":0.9},"pgcluster":{"seconds":0.5},"loadgen":{"seconds":0.07}}}
{"tags":{"kind":"matrix","subject":"gw-redis","body":"0","clients":"32","round":"1"},"throughput":100,"responses":1000,"latency":{"p50_ms":3,"p99_ms":12},"cpu_window_s":2,"cpu":{"proxy":{"seconds":0.08},"app":{"seconds":0.1},"postgres":{"seconds":0.1},"redis":{"seconds":0.03}}}
{"tags":{"kind":"matrix","subject":"bareproxy","body":"0","clients":"32","round":"1"},"throughput":300,"responses":1000,"latency":{"p50_ms":1,"p99_ms":6},"cpu_window_s":2,"cpu":{"proxy":{"seconds":0.05},"app":{"seconds":0.1},"postgres":{"seconds":0.4}}}
{"tags":{"kind":"matrix","subject":"gw-sqlite","body":"0","clients":"32","round":"1"},"throughput":150,"responses":1000,"latency":{"p50_ms":3,"p99_ms":8},"cpu_window_s":2,"cpu":{"proxy":{"seconds":0.12},"app":{"seconds":0.1},"postgres":{"seconds":0.4}}}
{"tags":{"kind":"idle","at":"bodies"},"cpu_window_s":1,"cpu":{"postgres":{"seconds":0}}}
{"tags":{"kind":"bodies","subject":"direct","body":"65536","clients":"32","round":"1"},"throughput":250,"responses":500,"latency":{"p50_ms":2,"p99_ms":5},"cpu_window_s":2,"cpu":{"app":{"seconds":0.1},"postgres":{"seconds":0.1}}}
{"tags":{"kind":"bodies","subject":"nginx","body":"65536","clients":"32","round":"1"},"throughput":200,"responses":500,"latency":{"p50_ms":2,"p99_ms":5},"cpu_window_s":2,"cpu":{"proxy":{"seconds":0.05},"app":{"seconds":0.1},"postgres":{"seconds":0.1}}}
{"tags":{"kind":"bodies","subject":"gw-memory","body":"65536","clients":"32","round":"1"},"throughput":100,"responses":500,"latency":{"p50_ms":2,"p99_ms":10},"cpu_window_s":2,"cpu":{"proxy":{"seconds":0.1},"app":{"seconds":0.1},"postgres":{"seconds":0.1}}}
{"tags":{"kind":"first","subject":"gw-memory","body":"0","clients":"32","round":"1"},"throughput":200,"responses":400,"cpu_window_s":2,"cpu":{"proxy":{"seconds":0.024},"app":{"seconds":0.04}}}
{"tags":{"kind":"replay","subject":"gw-memory","body":"0","clients":"32","round":"1"},"throughput":1000,"responses":2000,"replayed":2000,"cpu_window_s":2,"cpu":{"proxy":{"seconds":0.02},"app":{"seconds":0}}}
{"tags":{"kind":"pgbench","subject":"insert","clients":"32","round":"1"},"throughput":2000,"responses":8000,"latency":{"mean_ms":1},"cpu_window_s":4,"cpu":{"postgres":{"seconds":0.8}}}
{"tags":{"kind":"pgbench","subject":"claim","clients":"32","round":"1"},"throughput":1500,"responses":6000,"latency":{"mean_ms":1},"cpu_window_s":4,"cpu":{"postgres":{"seconds":1.2}}}
`
	recs := readLines(t, lines)
	// direct: app 100 µs; postgres (0.4 − 0.1×2) s / 1000 = 200 µs; total 300.
	if us := recs[1].us; us["app"] != 100 || us["postgres"] != 200 || us["loadgen"] != 50 {
		t.Errorf("direct's µs per response: %v", us)
	}
	// gw-redis: PostgreSQL's window below its idle rate counts 0, never negative.
	if us := recs[6].us; us["postgres"] != 0 || us["redis"] != 30 {
		t.Errorf("gw-redis's µs per response: %v", us)
	}
	var b strings.Builder
	if err := report(&b, recs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		// clients, subject, req/s, × direct, × nginx, p50, p99, p99 × direct, proxy, app, postgres, redis, total, loadgen
		"| 32 | direct | 500 | 1.00× | 1.25× | 1.00 | 4.00 | 1.00× | — | 100 | 200 | — | 300 | 300 | 50 |",
		"| 32 | nginx | 400 | 0.80× | 1.00× | 1.00 | 6.00 | 1.50× | 20 | 100 | 200 | — | 320 | — | — |",
		"| 32 | gw-memory | 200 | 0.40× | 0.50× | 3.00 | 8.00 | 2.00× | 60 | 100 | 200 | — | 360 | 350 | — |",
		"| 32 | gw-redis | 100 | 0.20× | 0.25× | 3.00 | 12.00 | 3.00× | 80 | 100 | 0 | 30 | 210 | — | — |",
		"| default | 32 | gw-memory | 200 |",
		"| 64 KiB | 32 | gw-memory | 100 | 0.40× | 0.50× | 2.00 | 10.00 | 2.00× | 200 | 200 | 200 | — | 600 | — | — |",
		// goal 1: gw-postgres 700 µs of PostgreSQL against direct's 200
		"| 1 | PostgreSQL CPU per new key (the run's backends), gw-postgres (claim + completion, batching on), beyond the upstream's INSERT ÷ the INSERT's | 2.50× (700 − 200 = 500 µs against 200 µs) |",
		"| 1 | PostgreSQL CPU per new key (the whole cluster, background work included), gw-postgres (claim + completion, batching on), beyond the upstream's INSERT ÷ the INSERT's | 0.67× (500 − 300 = 200 µs against 300 µs) | ≤ 0.80× | **yes** |",
		"| 1 | pgbench (no batching): PostgreSQL CPU per `claim` transaction ÷ per `insert` | 2.00× (200 against 100 µs) |",
		// goal 2: 60 µs against nginx's 20; the replay 10 µs
		"| 2 | gw-memory's own CPU per proxied new-key request ÷ nginx's | 3.00× (60 against 20 µs) |",
		"| 2 | gw-memory's own CPU per replay ÷ nginx's per proxied request | 0.50× (10 against 20 µs) |",
		"| 4 | gw-memory p99 ÷ direct's | 2.00× (8.0 against 4.0 ms) |",
		// SQLite 120 µs against the memory store's 60; the memory store against bareproxy's 50
		"| SQLite | gw-sqlite's own CPU per new key ÷ gw-memory's | 2.00× (120 against 60 µs) | ≤ 1.50× | **no** |",
		"| floor | gw-memory's own CPU per new key ÷ bareproxy's per proxied request | 1.20× (60 against 50 µs) | ≤ 1.15× | **no** |",
		"| floor | gw-memory's own CPU per replay ÷ bareproxy's per proxied request | 0.20× (10 against 50 µs) | ≤ 0.60× | **yes** |",
		// the contract written plainly: 55 µs against the bare proxy's 50 and the gateway's 60
		"| floor | bareproxy-keyed's own CPU per new key (the contract written plainly) ÷ bareproxy's | 1.10× (55 against 50 µs) | — |",
		"| floor | gw-memory's own CPU per new key ÷ bareproxy-keyed's | 1.09× (60 against 55 µs) | — |",
		// the store's PostgreSQL CPU with the upstream's INSERT as it costs behind the gateway
		"| 1 | PostgreSQL CPU per new key (the whole cluster), gw-postgres less gw-memory (the upstream's INSERT behind the same gateway) ÷ direct's INSERT | 0.50× (500 − 350 = 150 µs against 300 µs) | — |",
		// direct: 300 + 50 µs; gw-memory: 360 + nothing measured of loadgen, so no figure
		"| 3 | gw-memory req/s ÷ direct's | 0.40× (200 against 500; rounds 0.40) | — |",
		"| 3 | gw-postgres req/s ÷ direct's | 0.20× (100 against 500; rounds 0.20); CPU per request: 0.37× (950 against 350 µs, load generator included) | ≥ 0.60× | **no** |",
		"| 32 clients | 0.40× | 0.30× | 0.20× | — | 3.00× | 3.00× | 2.50× | 1.20× | 2.00× | 2.50× |",
		"| 64 KiB, 32 clients | 0.40× | — | — | — | — | 2.00× | — | — | — | — |",
		"| 32 | gw-memory | 200 | 0.0 / 0.0 | 1000 | 0.0 / 0.0 | 5.00× | 1.000 | 60 / 100 / — | 10 / 0 / — |",
		"| insert | 2000 (1.00×, 1.00 ms, 100 µs) |",
		"| postgres | 2 | 50.0 | 0.0–100.0 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}

	var sum strings.Builder
	summary(&sum, recs)
	for _, want := range []string{"### Goal figures (32 clients)", "### Cost per request, 32 clients", "| gw-memory | 200 | 0.40× |"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, sum.String())
		}
	}
	if strings.Contains(sum.String(), "Every point") || strings.Count(sum.String(), "\n") > 60 {
		t.Errorf("summary is more than a screen:\n%s", sum.String())
	}
}

// TestPooledRuns checks that several results files are pooled as one run with their
// rounds kept apart: each ratio is taken against direct in its own file's round, and the
// medians are over the rounds of both.
func TestPooledRuns(t *testing.T) {
	t.Parallel()
	run := func(direct, gw float64, bareCPU, gwCPU float64) string {
		return fmt.Sprintf(`{"tags":{"kind":"matrix","subject":"direct","body":"0","clients":"32","round":"1"},"throughput":%g,"responses":1000,"latency":{"p50_ms":1,"p99_ms":4},"cpu_window_s":2,"cpu":{"app":{"seconds":0.1}}}
{"tags":{"kind":"matrix","subject":"bareproxy","body":"0","clients":"32","round":"1"},"throughput":%g,"responses":1000,"latency":{"p50_ms":1,"p99_ms":6},"cpu_window_s":2,"cpu":{"proxy":{"seconds":%g},"app":{"seconds":0.1}}}
{"tags":{"kind":"matrix","subject":"gw-memory","body":"0","clients":"32","round":"1"},"throughput":%g,"responses":1000,"latency":{"p50_ms":3,"p99_ms":8},"cpu_window_s":2,"cpu":{"proxy":{"seconds":%g},"app":{"seconds":0.1}}}
`, direct, direct, bareCPU, gw, gwCPU)
	}
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	if err := os.WriteFile(a, []byte(run(1000, 500, 0.10, 0.11)), 0o600); err != nil {
		t.Fatal(err)
	}
	// The second run also measured gw-sqlite: against the memory store of both runs'
	// rounds, its one round would make a figure of rounds that do not match.
	onlyB := `{"tags":{"kind":"matrix","subject":"gw-sqlite","body":"0","clients":"32","round":"1"},"throughput":1000,"responses":1000,"latency":{"p50_ms":3,"p99_ms":8},"cpu_window_s":2,"cpu":{"proxy":{"seconds":0.5}}}
`
	if err := os.WriteFile(b, []byte(run(2000, 1600, 0.20, 0.26)+onlyB), 0o600); err != nil {
		t.Fatal(err)
	}
	recs, dropped, err := readAll([]string{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"matrix gw-sqlite c=32"}; !slices.Equal(dropped, want) {
		t.Errorf("left out %q, want %q", dropped, want)
	}
	var sb strings.Builder
	summary(&sb, recs)
	out := sb.String()
	for _, want := range []string{
		// 500 of 1000 in the first run's round, 1600 of 2000 in the second's.
		"| 3 | gw-memory req/s ÷ direct's | 0.65× (1050 against 1500; rounds 0.50, 0.80)",
		// CPU: the medians of both rounds, 185 µs against 150.
		"| floor | gw-memory's own CPU per new key ÷ bareproxy's per proxied request | 1.23× (185 against 150 µs)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("pooled summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "| SQLite |") || strings.Contains(out, "| gw-sqlite |") {
		t.Errorf("pooled summary has gw-sqlite, which one run lacks:\n%s", out)
	}
	if _, _, err := readAll([]string{a, filepath.Join(dir, "missing.jsonl")}); err == nil {
		t.Error("a missing file among several: no error")
	}
}

// TestSummedRounds checks that a CPU target is met only when the ratio of the rounds'
// sums meets it too: one round in which background work fell moves the sums, not the
// medians.
func TestSummedRounds(t *testing.T) {
	t.Parallel()
	var lines strings.Builder
	// µs per request: responses 1000, so seconds × 1e6 ÷ 1000.
	for i, r := range []struct{ bare, gw, direct, gwpg float64 }{
		{0.100, 0.100, 0.20, 0.34},
		{0.100, 0.110, 0.20, 0.35},
		{0.100, 0.200, 0.20, 0.70}, // a round with a checkpoint in the gateways' windows
	} {
		round := i + 1
		fmt.Fprintf(&lines, `{"tags":{"kind":"matrix","subject":"direct","body":"0","clients":"32","round":"%d"},"throughput":1000,"responses":1000,"latency":{"p50_ms":1,"p99_ms":4},"cpu_window_s":2,"cpu":{"pgcluster":{"seconds":%g}}}
{"tags":{"kind":"matrix","subject":"bareproxy","body":"0","clients":"32","round":"%d"},"throughput":900,"responses":1000,"latency":{"p50_ms":1,"p99_ms":6},"cpu_window_s":2,"cpu":{"proxy":{"seconds":%g}}}
{"tags":{"kind":"matrix","subject":"gw-memory","body":"0","clients":"32","round":"%d"},"throughput":800,"responses":1000,"latency":{"p50_ms":3,"p99_ms":8},"cpu_window_s":2,"cpu":{"proxy":{"seconds":%g}}}
{"tags":{"kind":"matrix","subject":"gw-postgres","body":"0","clients":"32","round":"%d"},"throughput":500,"responses":1000,"latency":{"p50_ms":3,"p99_ms":8},"cpu_window_s":2,"cpu":{"pgcluster":{"seconds":%g}}}
`, round, r.direct, round, r.bare, round, r.gw, round, r.gwpg)
	}
	summaryHas(t, summaryOf(t, lines.String()),
		// Medians 110 against 100 µs: 1.10×; sums 410 against 300: 1.37×.
		"| floor | gw-memory's own CPU per new key ÷ bareproxy's per proxied request | 1.10× (110 against 100 µs); summed over the 3 rounds 1.37× | ≤ 1.15× | **no** |",
		// Medians 350 − 200 against 200: 0.75×; sums (1390 − 600) ÷ 600: 1.32×.
		"beyond the upstream's INSERT ÷ the INSERT's | 0.75× (350 − 200 = 150 µs against 200 µs); summed over the 3 rounds 1.32× | ≤ 0.80× | **no** |",
	)
}

// summaryOf is the summary of the results.jsonl lines given.
func summaryOf(t *testing.T, lines string) string {
	t.Helper()
	var sb strings.Builder
	summary(&sb, readLines(t, lines))
	return sb.String()
}

// readLines is the records of the results.jsonl lines given, as read reads a file.
func readLines(t *testing.T, lines string) []record {
	t.Helper()
	path := filepath.Join(t.TempDir(), "r.jsonl")
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	recs, err := read(path)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// summaryHas fails t for each of wants that out does not contain.
func summaryHas(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}

// The store's batch size is read from the transaction IDs the cluster handed out in
// each window: direct's INSERT takes one per request; gw-postgres's requests take
// that one and their share of a claim batch's and a completion batch's.
func TestBatchSize(t *testing.T) {
	t.Parallel()
	var lines strings.Builder
	// 1000 responses in a 2 s window after a 0.5 s warm-up, whose xids are counted
	// with it. direct: 1,250 to 1,275 xids; gw-postgres: 1,562.5 to 1,625 (medians
	// 1.01 and 1.27 over the window: 0.26 per new key beyond the INSERT, two batches of
	// about 7.7 new keys each).
	for i, x := range []struct{ direct, gw float64 }{{1250, 1562.5}, {1262.5, 1587.5}, {1275, 1625}} {
		round := i + 1
		fmt.Fprintf(&lines, `{"tags":{"kind":"matrix","subject":"direct","body":"0","clients":"32","round":"%d"},"throughput":1000,"responses":1000,"warmup_s":0.5,"elapsed_s":2,"latency":{"p50_ms":1,"p99_ms":4},"cpu_window_s":2,"cpu":{"pgcluster":{"seconds":0.2}},"pg_background":{"checkpoints":0,"xids":%g}}
{"tags":{"kind":"matrix","subject":"gw-postgres","body":"0","clients":"32","round":"%d"},"throughput":500,"responses":1000,"warmup_s":0.5,"elapsed_s":2,"latency":{"p50_ms":3,"p99_ms":8},"cpu_window_s":2,"cpu":{"pgcluster":{"seconds":0.35}},"pg_background":{"checkpoints":0,"xids":%g}}
`, round, x.direct, round, x.gw)
	}
	// A run on a shared cluster counts nothing: no figure, rather than a wrong one.
	lines.WriteString(`{"tags":{"kind":"matrix","subject":"direct","body":"0","clients":"128","round":"1"},"throughput":1000,"responses":1000,"latency":{"p50_ms":1,"p99_ms":4},"cpu_window_s":2,"cpu":{"pgcluster":{"seconds":0.2}}}
{"tags":{"kind":"matrix","subject":"gw-postgres","body":"0","clients":"128","round":"1"},"throughput":500,"responses":1000,"latency":{"p50_ms":3,"p99_ms":8},"cpu_window_s":2,"cpu":{"pgcluster":{"seconds":0.35}}}
`)
	out := summaryOf(t, lines.String())
	summaryHas(t, out,
		"summed over the 3 rounds 0.75×; 1.27 writing transactions per request against direct's 1.01: 7.7 new keys per batch |",
		"new keys per batch |",
	)
	// The growth table: 7.7 at 32 clients, nothing counted at 128.
	seen := 0
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "| 32 clients |"):
			seen++
			if !strings.HasSuffix(l, "| 7.7 |") {
				t.Errorf("32 clients' line does not end in the batch size: %s", l)
			}
		case strings.HasPrefix(l, "| 128 clients |"):
			seen++
			if !strings.HasSuffix(l, "| — |") {
				t.Errorf("128 clients' line has a batch size it did not count: %s", l)
			}
		}
	}
	if seen != 2 {
		t.Errorf("the growth table has %d of the lines of 32 and 128 clients, want 2:\n%s", seen, out)
	}
}

// The paced phase's figures: every subject at one rate, the floor and the store's
// PostgreSQL share compared there, a subject that fell behind the rate left out.
func TestPaced(t *testing.T) {
	t.Parallel()
	var lines strings.Builder
	for i, r := range []struct{ bare, gw, sqlite, direct, gwpg float64 }{
		{0.100, 0.110, 0.150, 0.20, 0.34},
		{0.100, 0.112, 0.160, 0.20, 0.35},
		{0.100, 0.114, 0.170, 0.20, 0.36},
	} {
		round := i + 1
		for _, x := range []struct {
			subject string
			tput    float64
			cpu     string
		}{
			{"direct", 1000, fmt.Sprintf(`"pgcluster":{"seconds":%g}`, r.direct)},
			{"bareproxy", 995, fmt.Sprintf(`"proxy":{"seconds":%g}`, r.bare)},
			{"gw-memory", 1001, fmt.Sprintf(`"proxy":{"seconds":%g}`, r.gw)},
			{"gw-sqlite", 940, fmt.Sprintf(`"proxy":{"seconds":%g}`, r.sqlite)}, // behind the rate
			{"gw-postgres", 999, fmt.Sprintf(`"pgcluster":{"seconds":%g}`, r.gwpg)},
		} {
			fmt.Fprintf(&lines, `{"tags":{"kind":"paced","subject":"%s","body":"0","clients":"32","round":"%d"},"rate":1000,"throughput":%g,"responses":1000,"latency":{"p50_ms":1,"p99_ms":4},"cpu_window_s":1,"cpu":{%s}}`+"\n",
				x.subject, round, x.tput, x.cpu)
		}
	}
	out := summaryOf(t, lines.String())
	summaryHas(t, out,
		"### The goal figures at one load: 32 clients paced to 1000 requests a second",
		// Medians 112 against 100 µs; sums 336 against 300.
		"| floor | gw-memory's own CPU per new key ÷ bareproxy's per proxied request | 1.12× (112 against 100 µs); summed over the 3 rounds 1.12× | ≤ 1.15× | **yes** |",
		// Medians 350 − 200 against 200.
		"gw-postgres, beyond the upstream's INSERT ÷ the INSERT's | 0.75× (350 − 200 = 150 µs against 200 µs); summed over the 3 rounds 0.75× | ≤ 0.80× | **yes** |",
		"Fell behind the rate, so left out: gw-sqlite (940 requests a second).",
	)
	if strings.Contains(out, "gw-sqlite's own CPU per new key ÷ gw-memory's") {
		t.Errorf("a subject behind the rate is compared:\n%s", out)
	}
	// The closed loop's goal table is not made from paced windows.
	if strings.Contains(out, "### Goal figures") {
		t.Errorf("paced windows made the closed loop's goal table:\n%s", out)
	}
}

// The pair phase's figures: the two subjects of each pair in the same windows, the
// ratio made per round, a round in which either fell behind the rate left out, and a
// partner other than the bare proxy.
func TestPaired(t *testing.T) {
	t.Parallel()
	var lines strings.Builder
	for i, r := range []struct {
		bare, gw, keyed, gw2, sqlite float64
		gwTput                       float64
	}{
		{0.200, 0.220, 0.210, 0.200, 0.280, 800},
		{0.250, 0.280, 0.260, 0.200, 0.300, 798},
		{0.200, 0.300, 0.220, 0.200, 0.290, 700}, // the gateway behind the rate: left out
		{0.220, 0.242, 0.230, 0.200, 0.320, 801},
	} {
		round := i + 1
		for _, x := range []struct {
			pair, subject string
			tput, cpu     float64
		}{
			{"gw-memory:bareproxy", "gw-memory", r.gwTput, r.gw},
			{"gw-memory:bareproxy", "bareproxy", 800, r.bare},
			{"bareproxy-keyed:bareproxy", "bareproxy-keyed", 800, r.keyed},
			{"bareproxy-keyed:bareproxy", "bareproxy", 800, r.bare},
			{"gw-sqlite:gw-memory", "gw-sqlite", 800, r.sqlite},
			{"gw-sqlite:gw-memory", "gw-memory", 800, r.gw2},
		} {
			fmt.Fprintf(&lines, `{"tags":{"kind":"pair","pair":"%s","subject":"%s","body":"0","clients":"32","round":"%d"},"rate":800,"throughput":%g,"responses":1000,"latency":{"p50_ms":1,"p99_ms":4},"cpu_window_s":1,"cpu":{"proxy":{"seconds":%g}}}`+"\n",
				x.pair, x.subject, round, x.tput, x.cpu)
		}
	}
	out := summaryOf(t, lines.String())
	summaryHas(t, out,
		"### Two subjects at the same time",
		// Rounds 1.10, 1.12, 1.10 (the third, 1.50, left out): median 1.10; sums 742
		// against 670. Every round's ratio, the third's with them: median 1.11.
		"| gw-memory ÷ bareproxy | 1.10× (summed 1.11×; 3 rounds at 800 requests a second; every round: 1.11× over 4) | 1.10, 1.12, 1.10 | ≤ 1.15× | **yes** |",
		"| bareproxy-keyed ÷ bareproxy | 1.05× (summed 1.06×; 4 rounds at 800 requests a second) | 1.05, 1.04, 1.10, 1.05 | — |  |",
		// Rounds 1.40, 1.50, 1.45, 1.60: median 1.475; sums 1190 against 800, 1.4875.
		"| gw-sqlite ÷ gw-memory | 1.48× (summed 1.49×; 4 rounds at 800 requests a second) | 1.40, 1.50, 1.45, 1.60 | ≤ 1.50× | **yes** |",
		"Fell behind the rate, so left out: gw-memory and bareproxy r3 (700 and 800 requests a second).",
	)
}
