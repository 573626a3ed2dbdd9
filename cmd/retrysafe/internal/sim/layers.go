package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/retrysafe/retrysafe/retry"
)

// LayersConfig configures RunLayers. The zero value of each field means the default
// documented on it.
type LayersConfig struct {
	// Layers is how many callers retry, one above the other: with 3, a client calls A,
	// A calls B and B calls C, and the client, A and B each retry. Default 3.
	Layers int
	// Attempts is each layer's retry.Policy.MaxAttempts, the first attempt included.
	// Default 3.
	Attempts int
	// Failure are the probabilities that a call to the bottom service fails. Default
	// 0.1, 0.5, 0.9 and 1.
	Failure []float64
	// Requests is how many logical requests (calls by the client) are made for each
	// failure probability, one after the other. Default 10000.
	Requests int
	// BudgetTokens and BudgetRatio are the arguments of retry.NewBudget for the budget
	// each layer gets in the budgeted runs (one budget per layer, shared by all the
	// requests). Default 10 and 0.1, gRPC's.
	BudgetTokens, BudgetRatio float64
	// Seed seeds the failures and the jitter. The same LayersConfig gives the same
	// result.
	Seed uint64
}

func (cfg LayersConfig) withDefaults() (LayersConfig, error) {
	if cfg.Layers == 0 {
		cfg.Layers = 3
	}
	if cfg.Attempts == 0 {
		cfg.Attempts = 3
	}
	if len(cfg.Failure) == 0 {
		cfg.Failure = []float64{0.1, 0.5, 0.9, 1}
	}
	cfg.Failure = append([]float64(nil), cfg.Failure...)
	if cfg.Requests == 0 {
		cfg.Requests = 10000
	}
	if cfg.BudgetTokens == 0 {
		cfg.BudgetTokens = 10
	}
	if cfg.BudgetRatio == 0 {
		cfg.BudgetRatio = 0.1
	}
	switch {
	case cfg.Layers < 1 || cfg.Layers > 10:
		return cfg, fmt.Errorf("%w: %d layers: want 1 to 10", ErrConfig, cfg.Layers)
	case cfg.Attempts < 1 || cfg.Attempts > 10:
		return cfg, fmt.Errorf("%w: %d attempts: want 1 to 10", ErrConfig, cfg.Attempts)
	case cfg.Requests < 1 || cfg.Requests > 10_000_000:
		return cfg, fmt.Errorf("%w: %d requests: want 1 to 10000000", ErrConfig, cfg.Requests)
	case cfg.BudgetTokens < 0 || cfg.BudgetRatio < 0 || math.IsNaN(cfg.BudgetTokens) || math.IsNaN(cfg.BudgetRatio):
		return cfg, fmt.Errorf("%w: negative budget", ErrConfig)
	case math.Pow(float64(cfg.Attempts), float64(cfg.Layers))*float64(cfg.Requests) > 1e9:
		return cfg, fmt.Errorf("%w: up to %.0f calls: too many", ErrConfig, math.Pow(float64(cfg.Attempts), float64(cfg.Layers))*float64(cfg.Requests))
	}
	for _, p := range cfg.Failure {
		if !(p >= 0 && p <= 1) {
			return cfg, fmt.Errorf("%w: failure probability %v: want 0 to 1", ErrConfig, p)
		}
	}
	return cfg, nil
}

// LayerStats are the counts of one series of requests, per logical request.
type LayerStats struct {
	// Calls[i] is the calls that reached layer i's callee per logical request: Calls[0]
	// reached A, the last reached the bottom service.
	Calls []float64
	// Succeeded is the fraction of logical requests that succeeded.
	Succeeded float64
}

// Bottom is the calls per logical request that reached the bottom service: the
// amplification.
func (s LayerStats) Bottom() float64 { return s.Calls[len(s.Calls)-1] }

// Total is the calls per logical request at all the layers.
func (s LayerStats) Total() float64 {
	var t float64
	for _, c := range s.Calls {
		t += c
	}
	return t
}

// LayersRow is one failure probability's figures, without and with budgets.
type LayersRow struct {
	Failure          float64
	NoBudget, Budget LayerStats
}

// LayersResult is what RunLayers found.
type LayersResult struct {
	Config LayersConfig // with its defaults set
	Rows   []LayersRow
}

// errBottom is the bottom service's failure.
var errBottom = errors.New("sim: the bottom service failed")

// virtualClock is a retry.Clock whose waits pass at once, moving its time on.
type virtualClock struct{ now time.Time }

func (c *virtualClock) Now() time.Time { return c.now }

func (c *virtualClock) After(d time.Duration) (<-chan time.Time, func() bool) {
	c.now = c.now.Add(d)
	ch := make(chan time.Time, 1)
	ch <- c.now
	return ch, func() bool { return false }
}

// stack is one series: the layers' policies and counts.
type stack struct {
	fail     float64
	rng      *rand.Rand
	policies []retry.Policy
	calls    []int
}

func (s *stack) call(ctx context.Context, layer int) error {
	return retry.Do(ctx, s.policies[layer], func(ctx context.Context) error {
		s.calls[layer]++
		if layer == len(s.calls)-1 {
			if s.rng.Float64() < s.fail {
				return errBottom
			}
			return nil
		}
		return s.call(ctx, layer+1)
	})
}

// RunLayers runs cfg.Requests logical requests through the layers for each failure
// probability, once with no budget and once with a retry.Budget per layer.
func RunLayers(ctx context.Context, cfg LayersConfig) (*LayersResult, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	res := &LayersResult{Config: cfg}
	for i, p := range cfg.Failure {
		row := LayersRow{Failure: p}
		for _, budgeted := range []bool{false, true} {
			st, err := cfg.series(ctx, i, p, budgeted)
			if err != nil {
				return nil, err
			}
			if budgeted {
				row.Budget = st
			} else {
				row.NoBudget = st
			}
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

func (cfg LayersConfig) series(ctx context.Context, index int, p float64, budgeted bool) (LayerStats, error) {
	stream := uint64(index) << 1
	if budgeted {
		stream |= 1
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x1a7e4<<32|stream))
	clock := &virtualClock{now: time.Unix(0, 0)}
	s := &stack{fail: p, rng: rng, calls: make([]int, cfg.Layers)}
	for range cfg.Layers {
		pol := retry.Policy{
			MaxAttempts: cfg.Attempts,
			Base:        10 * time.Millisecond,
			Cap:         time.Second,
			Jitter:      retry.JitterFull,
			Retryable:   func(error) bool { return true }, // a failure below is a 5xx here
			Rand:        rng.Float64,
			Clock:       clock,
		}
		if budgeted {
			pol.Budget = retry.NewBudget(cfg.BudgetTokens, cfg.BudgetRatio)
		}
		s.policies = append(s.policies, pol)
	}
	ok := 0
	for r := range cfg.Requests {
		if r%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return LayerStats{}, fmt.Errorf("sim: %w", err)
			}
		}
		err := s.call(ctx, 0)
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, errBottom):
			return LayerStats{}, fmt.Errorf("sim: layered request: %w", err)
		}
	}
	st := LayerStats{Calls: make([]float64, cfg.Layers), Succeeded: float64(ok) / float64(cfg.Requests)}
	for i, c := range s.calls {
		st.Calls[i] = float64(c) / float64(cfg.Requests)
	}
	return st, nil
}

// layerName is the callee of layer i: A, B, C …
func layerName(i int) string { return string(rune('A' + i)) }

// WriteTable writes, for each failure probability, the calls per logical request that
// reached each service and the share of requests that succeeded, without and with
// budgets.
func (r *LayersResult) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	var names []string
	for i := range r.Config.Layers {
		names = append(names, layerName(i))
	}
	calls := "calls at " + strings.Join(names, "/")
	bottom := "calls at " + names[len(names)-1]
	fmt.Fprintf(tw, "p(fail)\tno budget: %s\t%s\tsucceeded\tbudget: %s\t%s\tsucceeded\t\n", calls, bottom, calls, bottom)
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%g\t%s\t%.2f\t%.1f%%\t%s\t%.2f\t%.1f%%\t\n", row.Failure,
			perLayer(row.NoBudget), row.NoBudget.Bottom(), 100*row.NoBudget.Succeeded,
			perLayer(row.Budget), row.Budget.Bottom(), 100*row.Budget.Succeeded)
	}
	return tw.Flush()
}

func perLayer(s LayerStats) string {
	parts := make([]string, len(s.Calls))
	for i, c := range s.Calls {
		parts[i] = fmt.Sprintf("%.2f", c)
	}
	return strings.Join(parts, " / ")
}
