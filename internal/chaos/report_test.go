package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/faultproxy"
)

func TestWriteTable(t *testing.T) {
	t.Parallel()
	r := Report{Store: "postgres", Replicas: 2, Seed: 7, Lease: 2 * time.Second, Load: 40 * time.Second, Clients: 32,
		Attempts: 120, Faults: faultproxy.Stats{Resets: 3, ResponsesLost: 2, Faults: 5}, Kills: 4, Restarts: 4, PGRestarts: 1,
		Outcomes: map[string]int64{"executed": 100, "replayed": 20},
		Upstream: UpstreamStats{Deliveries: 103, Recorded: 100, Reforwards: 3, AfterAnswer: 3}, ReforwardKilled: 3,
		Checks: Checks{Payments: 100, Succeeded: 100, Rows: 100, Records: 100}}
	var b strings.Builder
	r.WriteTable(&b)
	out := b.String()
	for _, want := range []string{"postgres store", "seed 7", "logical payments", "HTTP attempts", "response-lost 2",
		"gateway kills", "PostgreSQL restarts", "executed 100", "duplicates", "lost", "phantoms", "stuck",
		"unfinished", "gateway re-forwards", "absorbed by the ledger's UNIQUE", "OK — exactly once"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}

	r.Checks.Duplicates, r.Checks.Evidence = 1, []string{"duplicate: payment u/r"}
	r.NaiveUpstream = true
	b.Reset()
	r.WriteTable(&b)
	if out := b.String(); !strings.Contains(out, "FAILED — duplicates 1") || !strings.Contains(out, "duplicate: payment u/r") ||
		!strings.Contains(out, "NOT idempotency-aware") || r.OK() {
		t.Errorf("a failed run:\n%s", out)
	}
}
