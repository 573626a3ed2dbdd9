package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// pairTargets are the targets of the pair phase's figures, by pair (SUBJECT:PARTNER):
// the gateway's own CPU per new key against the bare proxy's per proxied request, and
// on SQLite against on the memory store.
var pairTargets = map[string]float64{"gw-memory:bareproxy": 1.15, "gw-sqlite:gw-memory": 1.5}

// pairRound is one round of a pair: the subject's and its partner's own CPU per
// request in the same window, at the rate both were paced to.
type pairRound struct {
	round            int
	subject, partner float64
	rate             float64
}

// paired writes the figures of the pair phase: the two subjects of each pair loaded at
// the same time, at one rate, so that both share every window of the machine's state.
// The figure is the subject's own CPU per request ÷ its partner's: the median of the
// rounds' ratios (each made in one window), with the ratio of their sums and the rounds
// beside it; a round in which either fell behind the rate is left out and named. Where a
// round was left out, the median of every round's ratio is given too: a round is left out
// because the two were not paced alike, and the figure with it shows that leaving it out
// does not flatter the subject.
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
	b.WriteString("### Two subjects at the same time\n\n")
	b.WriteString("The two subjects of each pair loaded at once, each by its own clients at the same rate: a ratio is made " +
		"in one window, which both shared. The figure is the first's own CPU per request ÷ the second's: the median of " +
		"the rounds' ratios, with the ratio of the rounds' sums beside it; a target is met when both meet it. A round in " +
		"which either fell behind the rate is left out; the median of every round, those left out with the rest, is given " +
		"beside the figure where any was.\n\n")
	b.WriteString("| pair | own CPU per request, same windows | by round | target | met |\n|---|---|---|---|---|\n")
	var behind []string
	for _, p := range names {
		subject, partner, _ := strings.Cut(p, ":")
		var rounds []pairRound
		var every []float64 // each round's ratio, those left out included
		for round, hs := range halves[p] {
			s, okS := hs[subject]
			q, okQ := hs[partner]
			if !okS || !okQ || s.cpu <= 0 || q.cpu <= 0 {
				continue
			}
			every = append(every, s.cpu/q.cpu)
			if s.rate > 0 && (s.tput < behindShare*s.rate || q.tput < behindShare*q.rate) {
				behind = append(behind, fmt.Sprintf("%s and %s r%d (%.0f and %.0f requests a second)", subject, partner, round, s.tput, q.tput))
				continue
			}
			rounds = append(rounds, pairRound{round, s.cpu, q.cpu, s.rate})
		}
		if len(rounds) == 0 {
			continue
		}
		slices.SortFunc(rounds, func(a, c pairRound) int { return a.round - c.round })
		var by []string
		var rs []float64
		var sumS, sumQ float64
		for _, r := range rounds {
			rs = append(rs, r.subject/r.partner)
			by = append(by, fmt.Sprintf("%.2f", r.subject/r.partner))
			sumS += r.subject
			sumQ += r.partner
		}
		m, sum := median(rs), sumS/sumQ
		t, met := "—", ""
		if target, ok := pairTargets[p]; ok {
			t, met = fmt.Sprintf("≤ %.2f×", target), yesNo(m <= target && sum <= target)
		}
		all := ""
		if len(every) > len(rounds) {
			all = fmt.Sprintf("; every round: %.2f× over %d", median(every), len(every))
		}
		fmt.Fprintf(b, "| %s ÷ %s | %.2f× (summed %.2f×; %d rounds at %.0f requests a second%s) | %s | %s | %s |\n",
			subject, partner, m, sum, len(rounds), rounds[0].rate, all, strings.Join(by, ", "), t, met)
	}
	if len(behind) > 0 {
		fmt.Fprintf(b, "\nFell behind the rate, so left out: %s.\n", strings.Join(behind, ", "))
	}
	b.WriteString("\n")
}
