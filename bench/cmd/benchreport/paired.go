package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// bareProxy is the subject every other is paired with.
const bareProxy = "bareproxy"

// pairTargets are the targets of the paired phase's figures, by subject: the gateway's
// own CPU per new key against the bare proxy's per proxied request.
var pairTargets = map[string]float64{"gw-memory": 1.15}

// pairRound is one round of a pair: the subject's and the bare proxy's own CPU per
// request in the same window, at the rate they were paced to.
type pairRound struct {
	round     int
	cpu, bare float64
	rate      float64
}

// paired writes the figures of the pair phase: each proxy loaded at the same time as
// bareproxy, at one rate, so that both share every window of the machine's state. The
// figure is the median of the rounds' ratios (each ratio made in one window), with the
// ratio of their sums and the rounds beside it; a round in which either fell behind the
// rate is left out and named.
func paired(b *strings.Builder, recs []record) {
	type half struct{ cpu, tput, rate float64 }
	halves := map[string]map[int]map[string]half{} // pair → round → subject → half
	for i := range recs {
		r := &recs[i]
		if r.tag("kind") != "pair" || r.us == nil {
			continue
		}
		cpu, ok := r.us["proxy"]
		if !ok {
			continue
		}
		round, err := strconv.Atoi(r.tag("round"))
		if err != nil {
			continue
		}
		p := r.tag("pair")
		if halves[p] == nil {
			halves[p] = map[int]map[string]half{}
		}
		if halves[p][round] == nil {
			halves[p][round] = map[string]half{}
		}
		halves[p][round][r.subject()] = half{cpu, r.Throughput, r.Rate}
	}
	if len(halves) == 0 {
		return
	}
	var names []string
	for p := range halves {
		names = append(names, p)
	}
	slices.Sort(names)
	fmt.Fprintf(b, "### Each proxy and the bare proxy at the same time\n\n")
	b.WriteString("Each proxy and bareproxy loaded at once, each by its own clients at the same rate: a ratio is made " +
		"in one window, which both shared. The figure is the median of the rounds' ratios, with the ratio of the " +
		"rounds' sums beside it; a target is met when both meet it. A round in which either fell behind the rate is left out.\n\n")
	b.WriteString("| subject | own CPU per request ÷ bareproxy's, same windows | by round | target | met |\n|---|---|---|---|---|\n")
	var behind []string
	for _, p := range names {
		var rounds []pairRound
		for round, hs := range halves[p] {
			s, okS := hs[p]
			bare, okB := hs[bareProxy]
			if !okS || !okB || s.cpu <= 0 || bare.cpu <= 0 {
				continue
			}
			if s.rate > 0 && (s.tput < behindShare*s.rate || bare.tput < behindShare*bare.rate) {
				behind = append(behind, fmt.Sprintf("%s r%d (%.0f and %.0f requests a second)", p, round, s.tput, bare.tput))
				continue
			}
			rounds = append(rounds, pairRound{round, s.cpu, bare.cpu, s.rate})
		}
		if len(rounds) == 0 {
			continue
		}
		slices.SortFunc(rounds, func(a, c pairRound) int { return a.round - c.round })
		var by []string
		var rs []float64
		var sumS, sumB float64
		for _, r := range rounds {
			rs = append(rs, r.cpu/r.bare)
			by = append(by, fmt.Sprintf("%.2f", r.cpu/r.bare))
			sumS += r.cpu
			sumB += r.bare
		}
		m, sum := median(rs), sumS/sumB
		t, met := "—", ""
		if target, ok := pairTargets[p]; ok {
			t, met = fmt.Sprintf("≤ %.2f×", target), yesNo(m <= target && sum <= target)
		}
		fmt.Fprintf(b, "| %s | %.2f× (summed %.2f×; %d rounds at %.0f requests a second) | %s | %s | %s |\n",
			p, m, sum, len(rounds), rounds[0].rate, strings.Join(by, ", "), t, met)
	}
	if len(behind) > 0 {
		fmt.Fprintf(b, "\nFell behind the rate, so left out: %s.\n", strings.Join(behind, ", "))
	}
	b.WriteString("\n")
}
