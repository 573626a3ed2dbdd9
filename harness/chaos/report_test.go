package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/faultproxy"
	"github.com/retrysafe/retrysafe/harness/tcpproxy"
)

func TestWriteTable(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	r := Report{Store: "postgres", Replicas: 2, Seed: 7, Lease: 2 * time.Second, UpstreamTimeout: 2500 * time.Millisecond,
		Load: 40 * time.Second, Clients: 32, SlowClients: 3, Attempts: 120,
		ClientFaults:   faultproxy.Stats{Resets: 3, ResponsesLost: 2, Faults: 5},
		UpstreamFaults: faultproxy.Stats{ResponseResets: 4, Faults: 4, OnReused: 3},
		StoreLink:      &tcpproxy.Stats{Reset: 9},
		Partitions:     []Partition{{Kind: "stall", Start: at, End: at.Add(4 * time.Second)}},
		Kills:          4, Restarts: 4, PGRestarts: 1,
		Failovers: []FailoverImpact{{Failover: Failover{Kind: "redis", Start: at, Lost: at.Add(4 * time.Second), Promoted: at.Add(6 * time.Second), End: at.Add(7 * time.Second)},
			LastExecuted: at, FirstExecuted: at.Add(7500 * time.Millisecond), NotDurable: 30, StoreErrors: 12, Held: 3,
			FirstNotDurable: at.Add(2 * time.Second), LastNotDurable: at.Add(3500 * time.Millisecond)}},
		Outcomes: map[string]int64{"executed": 100, "replayed": 20, "store-not-durable": 30},
		Upstream: UpstreamStats{Deliveries: 103, Executions: 103},
		Attribution: Attribution{Executions: 103, Keys: 3, ByCause: map[Cause]int{CauseKilled: 2, CauseAnswerLost: 1},
			ByReason: map[string]int{"read-timeout": 1}, Extras: make([]Extra, 3)},
		Checks: Checks{Payments: 100, Succeeded: 100, Rows: 103, Records: 100, Duplicates: 3}}
	var b strings.Builder
	r.WriteTable(&b)
	out := b.String()
	for _, want := range []string{"postgres store", "seed 7", "logical payments", "HTTP attempts", "response-lost 2",
		"response-reset 4; 3 on reused connections", "stall 12:00:00.000", "cut 0, stall 1", "gateway kills",
		"PostgreSQL restarts", "executed 100", "extra executions", "store failovers", "+4s master SIGKILLed",
		"store unwritable 7.5s", "503 store-not-durable         30", "the first +2s, the last +3.5s", "store failover", "replica killed", "(read-timeout 1)", "NOT ALLOWED",
		"duplicates", "lost", "phantoms", "stuck", "unfinished", "OK — 100 payments"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	if !r.OK() || r.Verdict() != "" {
		t.Errorf("allowed extras only: OK %v, verdict %q", r.OK(), r.Verdict())
	}

	r.Attribution.ByCause[CauseResend] = 2
	r.Unallowed = []string{"  transport resend: key k1 (user u, ref r)"}
	r.Checks.Lost, r.Checks.Evidence = 1, []string{"lost: payment u/r"}
	b.Reset()
	r.WriteTable(&b)
	if out := b.String(); !strings.Contains(out, "FAILED — extra executions by transport resend 2, lost 1") ||
		!strings.Contains(out, "transport resend: key k1") || !strings.Contains(out, "lost: payment u/r") || r.OK() {
		t.Errorf("a failed run:\n%s", out)
	}

	// With a deduplicating upstream, a duplicate fails the run whatever its cause.
	d := Report{Dedup: true, Checks: Checks{Duplicates: 1}, Attribution: Attribution{ByCause: map[Cause]int{}}}
	if d.OK() || d.Verdict() != "duplicates 1" {
		t.Errorf("dedup with a duplicate: OK %v, verdict %q", d.OK(), d.Verdict())
	}
	b.Reset()
	(Report{Store: "sqlite", Attribution: Attribution{ByCause: map[Cause]int{}}}).WriteTable(&b)
	if !strings.Contains(b.String(), "no store proxy: the store is a local file") {
		t.Errorf("sqlite:\n%s", b.String())
	}
}
