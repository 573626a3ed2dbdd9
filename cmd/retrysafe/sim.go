package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/cmd/retrysafe/internal/sim"
)

const simHelp = `usage: retrysafe sim [--seed N] [--runs N] [--clients LIST] [--svg FILE]
                     [--scenario all|backoff|layers]

Simulates, in virtual time, what backoff and jitter buy, with retrysafe's own retry
package computing the waits; the same seed prints the same figures.

backoff: the AWS Architecture Blog's "Exponential Backoff and Jitter" (Brooker, 2015).
N clients each update one row under optimistic concurrency (read the version, write
with it; the write fails if another got in between, and the client backs off and starts
again); every message takes |Normal(10ms, 2ms)|; waits from base 5ms, capped at 2s.
Prints, for each N, each strategy's mean calls (writes: the work) and mean time until
every client succeeded: no backoff, exponential (no jitter), full, equal and
decorrelated jitter.

layers: a client calls A, A calls B, B calls C, each retrying 3 times; C fails with
probability p. Prints the calls reaching each service per logical request, without and
with a retry budget per layer (retry.Budget): one failure can become 27 calls at C.

flags:
  --scenario S     all, backoff or layers (default all)
  --seed N         seed of every random choice (default 1)
  --runs N         backoff: simulations averaged per point (default 100)
  --clients LIST   backoff: client counts, e.g. 10,20,50 or 10-100/10 (default 10-100/10)
  --strategies L   backoff: none,exponential,full,equal,decorrelated (default all)
  --base D         backoff: the base wait (default 5ms)
  --cap D          backoff: the largest wait (default 2s)
  --svg FILE       backoff: also draw calls and time against clients as an SVG chart
  --requests N     layers: logical requests per failure probability (default 10000)
  --failure LIST   layers: C's failure probabilities (default 0.1,0.5,0.9,1)
  --budget-ratio R layers: tokens a success earns back, retry.NewBudget's ratio
                   (default 0.1, gRPC's: retries are throttled once more than about
                   1 call in 11 fails)

examples:
  retrysafe sim
  retrysafe sim --svg backoff.svg
  retrysafe sim --scenario backoff --clients 10-200/10 --runs 20 --seed 7
  retrysafe sim --scenario layers --requests 100000
`

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const cmd = "retrysafe sim"
	var (
		cfg                                sim.Config
		lcfg                               sim.LayersConfig
		scenario, clients, strategies, svg string
		failures                           string
		seed                               uint64
	)
	fs := newFlagSet(cmd)
	fs.StringVar(&scenario, "scenario", "all", "")
	fs.Uint64Var(&seed, "seed", 1, "")
	fs.IntVar(&cfg.Runs, "runs", 100, "")
	fs.StringVar(&clients, "clients", "10-100/10", "")
	fs.StringVar(&strategies, "strategies", "", "")
	fs.DurationVar(&cfg.Base, "base", 5*time.Millisecond, "")
	fs.DurationVar(&cfg.Cap, "cap", 2*time.Second, "")
	fs.StringVar(&svg, "svg", "", "")
	fs.IntVar(&lcfg.Requests, "requests", 10000, "")
	fs.StringVar(&failures, "failure", "0.1,0.5,0.9,1", "")
	fs.Float64Var(&lcfg.BudgetRatio, "budget-ratio", 0.1, "")
	if ok, status := parse(fs, args, simHelp, []string{}, false, stdout, stderr); !ok {
		return status
	}
	backoff, layers := scenario == "all" || scenario == "backoff", scenario == "all" || scenario == "layers"
	if !backoff && !layers {
		return fail(stderr, cmd, fmt.Errorf("--scenario %q: want all, backoff or layers", scenario), exitUsage)
	}
	if svg != "" && !backoff {
		return fail(stderr, cmd, errors.New("--svg draws the backoff scenario: not with --scenario layers"), exitUsage)
	}
	var err error
	if cfg.Clients, err = simParseClients(clients); err != nil {
		return fail(stderr, cmd, fmt.Errorf("--clients: %w", err), exitUsage)
	}
	for _, name := range strings.FieldsFunc(strategies, func(r rune) bool { return r == ',' || r == ' ' }) {
		s, err := sim.ParseStrategy(name)
		if err != nil {
			return fail(stderr, cmd, fmt.Errorf("--strategies: %w", err), exitUsage)
		}
		cfg.Strategies = append(cfg.Strategies, s)
	}
	for _, f := range strings.FieldsFunc(failures, func(r rune) bool { return r == ',' || r == ' ' }) {
		p, err := strconv.ParseFloat(f, 64)
		if err != nil || !(p >= 0 && p <= 1) {
			return fail(stderr, cmd, fmt.Errorf("--failure: %q is not a probability from 0 to 1", f), exitUsage)
		}
		lcfg.Failure = append(lcfg.Failure, p)
	}
	switch {
	case len(lcfg.Failure) == 0:
		return fail(stderr, cmd, errors.New("--failure is empty"), exitUsage)
	case !(lcfg.BudgetRatio > 0 && lcfg.BudgetRatio <= 10):
		return fail(stderr, cmd, errors.New("--budget-ratio must be above 0 and at most 10"), exitUsage)
	case cfg.Runs < 1:
		return fail(stderr, cmd, errors.New("--runs must be positive"), exitUsage)
	case cfg.Base <= 0 || cfg.Cap < cfg.Base:
		return fail(stderr, cmd, errors.New("want 0 < --base ≤ --cap"), exitUsage)
	case lcfg.Requests < 1:
		return fail(stderr, cmd, errors.New("--requests must be positive"), exitUsage)
	}
	cfg.Seed, lcfg.Seed = seed, seed

	out := bufio.NewWriter(stdout)
	defer out.Flush()
	if backoff {
		res, err := sim.Run(ctx, cfg)
		if err != nil {
			return fail(stderr, cmd, err, simStatus(err))
		}
		c := res.Config
		fmt.Fprintf(out, "backoff: %d to %d clients updating one OCC row; base %s, cap %s, network |Normal(%s, %s)|; mean of %d runs, seed %d\n",
			c.Clients[0], c.Clients[len(c.Clients)-1], c.Base, c.Cap, c.Delay, c.DelayStdDev, c.Runs, c.Seed)
		fmt.Fprintln(out, "calls: writes per run (the work); ms: virtual time until every client succeeded")
		if err := res.WriteTable(out); err != nil {
			return fail(stderr, cmd, err, exitFail)
		}
		if svg != "" {
			if err := simWriteSVG(svg, res); err != nil {
				return fail(stderr, cmd, err, exitFail)
			}
			fmt.Fprintf(out, "chart: %s\n", svg)
		}
	}
	if layers {
		res, err := sim.RunLayers(ctx, lcfg)
		if err != nil {
			return fail(stderr, cmd, err, simStatus(err))
		}
		if backoff {
			fmt.Fprintln(out)
		}
		c := res.Config
		fmt.Fprintf(out, "layers: a client calls A, A calls B, B calls C; %d attempts per layer; C fails with probability p; %d requests per p, seed %d\n",
			c.Attempts, c.Requests, c.Seed)
		fmt.Fprintf(out, "calls per logical request; budget: retry.NewBudget(%g, %g) per layer\n", c.BudgetTokens, c.BudgetRatio)
		if err := res.WriteTable(out); err != nil {
			return fail(stderr, cmd, err, exitFail)
		}
	}
	if err := out.Flush(); err != nil {
		return fail(stderr, cmd, err, exitFail)
	}
	return exitOK
}

func simStatus(err error) int {
	if errors.Is(err, sim.ErrConfig) {
		return exitUsage
	}
	return exitFail
}

func simWriteSVG(name string, res *sim.Result) error {
	f, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("--svg: %w", err)
	}
	if err := res.WriteSVG(f); err != nil {
		f.Close()
		return fmt.Errorf("--svg: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--svg: %w", err)
	}
	return nil
}

// simParseClients parses a list of client counts: numbers and FROM-TO/STEP ranges,
// separated by commas.
func simParseClients(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		rng, stepStr, hasStep := strings.Cut(part, "/")
		from, to, isRange := strings.Cut(rng, "-")
		if !isRange {
			if hasStep {
				return nil, fmt.Errorf("%q: a step needs a range (FROM-TO/STEP)", part)
			}
			n, err := strconv.Atoi(part)
			if err != nil || n < 1 || n > 100000 {
				return nil, fmt.Errorf("%q: want a number of clients from 1 to 100000", part)
			}
			out = append(out, n)
			continue
		}
		a, err1 := strconv.Atoi(strings.TrimSpace(from))
		b, err2 := strconv.Atoi(strings.TrimSpace(to))
		step := 1
		var err3 error
		if hasStep {
			step, err3 = strconv.Atoi(strings.TrimSpace(stepStr))
		}
		if err1 != nil || err2 != nil || err3 != nil || a < 1 || b < a || b > 100000 || step < 1 {
			return nil, fmt.Errorf("%q: want FROM-TO/STEP with 1 ≤ FROM ≤ TO ≤ 100000 and STEP ≥ 1", part)
		}
		for n := a; n <= b; n += step {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no client counts")
	}
	if len(out) > 1000 {
		return nil, fmt.Errorf("%d client counts: at most 1000", len(out))
	}
	return out, nil
}
