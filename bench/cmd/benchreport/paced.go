package main

import (
	"fmt"
	"strings"
)

// behindShare is how far below the paced rate a subject's throughput may fall and
// still count as having served it: below, it was not given the same load as the others,
// and its figures are not compared.
const behindShare = 0.97

// paced writes the goal figures of the paced phase: every subject served one request
// rate at the goals' concurrency, so that their CPU per request is compared at one load
// (the matrix's closed loop gives whichever is faster in a window more requests per
// wake-up, and so less CPU per request). A subject whose throughput fell short of the
// rate is named, and no figure of it is given.
func paced(b *strings.Builder, ps points) {
	get := func(s string) *point { return ps.get("paced", 0, goalClients, s) }
	var rate float64
	for _, s := range ps.subjects("paced", 0, goalClients) {
		if p := get(s); p != nil && len(p.rates) > 0 {
			rate = median(p.rates)
			break
		}
	}
	if rate <= 0 {
		return
	}
	fmt.Fprintf(b, "### The goal figures at one load: %d clients paced to %.0f requests a second\n\n", goalClients, rate)
	b.WriteString("Every subject served the same rate, in rotating order in each round; CPU figures as in the goal table above " +
		"(ratios of the rounds' medians, the sums' beside them; a target is met when both meet it).\n\n")
	var behind []string
	served := func(s string) *point {
		p := get(s)
		if p == nil {
			return nil
		}
		if median(p.tput) < behindShare*rate {
			behind = append(behind, fmt.Sprintf("%s (%.0f requests a second)", s, median(p.tput)))
			return nil
		}
		return p
	}
	subjects := map[string]*point{}
	for _, s := range ps.subjects("paced", 0, goalClients) {
		if p := served(s); p != nil {
			subjects[s] = p
		}
	}
	b.WriteString("| goal | figure | measured | target | met |\n|---|---|---|---|---|\n")
	rows := 0
	row := func(goal, figure, measured string, target float64, met bool) {
		t, m := "—", ""
		if target > 0 {
			t, m = fmt.Sprintf("≤ %.2f×", target), yesNo(met)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", goal, figure, measured, t, m)
		rows++
	}
	// The store's PostgreSQL CPU per new key beyond the upstream's INSERT, both at the
	// rate: the whole cluster, background work included.
	p, d := subjects["gw-postgres"], subjects[baseline]
	if measured, met, ok := storeShare(p, d, "pgcluster", 0.80); ok {
		row("1", "PostgreSQL CPU per new key (the whole cluster), gw-postgres, beyond the upstream's INSERT ÷ the INSERT's",
			measured+batchClause(p, d), 0.80, met)
	}
	own := func(goal, figure, a, q string, target float64) {
		if measured, met, ok := ownCPU(subjects[a], subjects[q], target); ok {
			row(goal, figure, measured, target, met)
		}
	}
	own("SQLite", "gw-sqlite's own CPU per new key ÷ gw-memory's", "gw-sqlite", "gw-memory", 1.5)
	own("floor", "gw-memory's own CPU per new key ÷ bareproxy's per proxied request", "gw-memory", "bareproxy", 1.15)
	own("floor", "bareproxy-keyed's own CPU per new key (the contract written plainly) ÷ bareproxy's", "bareproxy-keyed", "bareproxy", 0)
	own("floor", "gw-memory's own CPU per new key ÷ bareproxy-keyed's", "gw-memory", "bareproxy-keyed", 0)
	own("floor", "caddy's own CPU per proxied request ÷ bareproxy's", "caddy", "bareproxy", 0)
	for _, s := range []string{"gw-memory", "gw-sqlite", "gw-postgres"} {
		own("A/B", s+"'s own CPU per new key ÷ the base build's", s, s+"-base", 0)
	}
	if rows == 0 {
		b.WriteString("| — | nothing to compare | | | |\n")
	}
	if len(behind) > 0 {
		fmt.Fprintf(b, "\nFell behind the rate, so left out: %s.\n", strings.Join(behind, ", "))
	}
	b.WriteString("\n| subject | " + costHeader + "\n|---|" + strings.Repeat("---:|", costCols) + "\n")
	for _, s := range ps.subjects("paced", 0, goalClients) {
		fmt.Fprintf(b, "| %s | %s\n", s, costRow(get(s)))
	}
	b.WriteString("\n")
}
