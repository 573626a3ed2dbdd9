package demo

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/retrysafe/retrysafe/harness/faultproxy"
)

// writeTable prints the final report.
func writeTable(out io.Writer, cfg Config, r Result) {
	var kinds []string
	for _, k := range faultproxy.Kinds() {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, r.Faults.Count(k)))
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, v int, note string) {
		fmt.Fprintf(tw, "  %s\t%d\t  %s\n", name, v, note)
	}
	fmt.Fprintln(tw)
	row("logical payments", r.LogicalPayments, fmt.Sprintf("succeeded %d, failed %d, unfinished %d", r.Succeeded, r.Failed, r.Unfinished))
	row("HTTP attempts", r.HTTPAttempts, fmt.Sprintf("sent again by a client, same key: %d", r.Resends))
	row("replays", r.Replays, "Idempotent-Replayed: true")
	row("409s", r.Conflicts, "key in flight, retried")
	row("faults injected", int(r.Faults.Faults), strings.Join(kinds, ", "))
	row("payments recorded", r.PaymentsRecorded, "ledger rows")
	row("duplicates", r.Duplicates, "payments recorded more than once")
	row("lost", r.Lost, "payments a client saw succeed, not recorded")
	row("mismatched", r.Mismatched, "responses naming another payment than the ledger's")
	row("phantoms", r.Phantoms, "ledger rows no client asked for")
	_ = tw.Flush()

	mode := "gateway with Idempotency-Key (SQLite)"
	if cfg.Unprotected {
		mode = "UNPROTECTED: no idempotency layer"
	}
	if r.OK() {
		fmt.Fprintf(out, "\nOK — %s: every payment a client saw succeed is recorded exactly once (%s, seed %d)\n", mode, r.Elapsed.Round(10e6), r.Seed)
	} else {
		fmt.Fprintf(out, "\nFAILED — %s: duplicates %d, lost %d, mismatched %d, phantoms %d (%s, seed %d)\n",
			mode, r.Duplicates, r.Lost, r.Mismatched, r.Phantoms, r.Elapsed.Round(10e6), r.Seed)
	}
}
