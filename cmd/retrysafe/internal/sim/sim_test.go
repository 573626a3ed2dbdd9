package sim

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0)) }

func runSim(t *testing.T, cfg Config) *Result {
	t.Helper()
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return r
}

func table(t *testing.T, r *Result) string {
	t.Helper()
	var b bytes.Buffer
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestDeterministic(t *testing.T) {
	t.Parallel()
	cfg := Config{Clients: []int{10, 30}, Runs: 10, Seed: 42}
	a := runSim(t, cfg)
	cfg.Workers = 1 // the order the points are computed in does not matter
	b := runSim(t, cfg)
	if !reflect.DeepEqual(a.Points, b.Points) || table(t, a) != table(t, b) {
		t.Errorf("same seed, different tables:\n%s\n%s", table(t, a), table(t, b))
	}
	cfg.Seed = 43
	if c := runSim(t, cfg); reflect.DeepEqual(a.Points, c.Points) {
		t.Error("another seed gave the same points")
	}
}

// TestBlogConclusions checks, loosely, what the AWS study reports at 100 clients.
func TestBlogConclusions(t *testing.T) {
	t.Parallel()
	r := runSim(t, Config{Clients: []int{100}, Runs: 10, Seed: 1})
	p := func(s Strategy) Point {
		pt, ok := r.Point(100, s)
		if !ok {
			t.Fatalf("no point for %v", s)
		}
		return pt
	}
	none, exp, full, equal, decorr := p(NoBackoff), p(Exponential), p(FullJitter), p(EqualJitter), p(DecorrelatedJitter)
	t.Logf("\n%s", table(t, r))
	if !(full.Calls < 0.6*exp.Calls && equal.Calls < 0.6*exp.Calls) {
		t.Errorf("full (%.0f) and equal (%.0f) jitter should do far less work than exponential (%.0f)", full.Calls, equal.Calls, exp.Calls)
	}
	for _, o := range []Point{exp, full, equal, decorr} {
		if none.Calls <= o.Calls {
			t.Errorf("no backoff (%.0f calls) should do the most work, %v does %.0f", none.Calls, o.Strategy, o.Calls)
		}
	}
	if full.Time*2 > exp.Time {
		t.Errorf("full jitter (%s) should complete far sooner than exponential (%s)", full.Time, exp.Time)
	}
	if equal.Time <= full.Time {
		t.Errorf("equal jitter (%s) should take longer than full jitter (%s)", equal.Time, full.Time)
	}
}

func TestOCCInvariants(t *testing.T) {
	t.Parallel()
	cfg, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range Strategies() {
		r := runSim(t, Config{Clients: []int{1}, Runs: 5, Strategies: []Strategy{s}})
		p := r.Points[0]
		// One client never conflicts: one write, after a read and a write round trip.
		if p.Calls != 1 || p.Time < 30*time.Millisecond || p.Time > 50*time.Millisecond {
			t.Errorf("%v, one client: %.1f calls in %s, want 1 in about 40ms", s, p.Calls, p.Time)
		}
		for _, n := range []int{2, 25} {
			for run := range 3 {
				w, end := cfg.occ(n, s, newRand(uint64(run)))
				if w < n || end <= 0 {
					t.Errorf("%v, %d clients: %d writes ending at %s", s, n, w, end)
				}
			}
		}
	}
}

func TestLayersAmplification(t *testing.T) {
	t.Parallel()
	cfg := LayersConfig{Failure: []float64{0, 0.5, 1}, Requests: 1000, Seed: 7}
	r, err := RunLayers(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", b.String())
	zero, half, all := r.Rows[0], r.Rows[1], r.Rows[2]
	// p = 1: every layer tries 3 times, 3×3×3 calls reach C.
	if got := all.NoBudget.Calls; !reflect.DeepEqual(got, []float64{3, 9, 27}) || all.NoBudget.Succeeded != 0 {
		t.Errorf("p=1, no budget: calls %v succeeded %v, want [3 9 27] and 0", got, all.NoBudget.Succeeded)
	}
	if got := all.Budget.Bottom(); got > 2 {
		t.Errorf("p=1, budgets: %.2f calls at C per request, want far fewer than 27", got)
	}
	for _, st := range []LayerStats{zero.NoBudget, zero.Budget} {
		if !reflect.DeepEqual(st.Calls, []float64{1, 1, 1}) || st.Succeeded != 1 {
			t.Errorf("p=0: %+v, want one call per layer and every request succeeding", st)
		}
	}
	// p = 0.5 without budget: C sees 1+p+p² calls per call from B (1.75); B fails with
	// p³, so A calls B 1+q+q² times (q = 1/8), and so on: about 2.0 in all.
	q := 0.125
	want := 1.75 * (1 + q + q*q) * (1 + q*q*q + math.Pow(q, 6))
	if got := half.NoBudget.Bottom(); math.Abs(got-want) > 0.1 {
		t.Errorf("p=0.5, no budget: %.3f calls at C, want about %.3f", got, want)
	}
	again, err := RunLayers(context.Background(), cfg)
	if err != nil || !reflect.DeepEqual(r, again) {
		t.Errorf("same seed, different layered results (%v)", err)
	}
}

func TestSVG(t *testing.T) {
	t.Parallel()
	r := runSim(t, Config{Clients: []int{10, 20, 30}, Runs: 3, Seed: 1})
	var b bytes.Buffer
	if err := r.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b.Bytes()))
	counts := map[string]int{}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
		}
	}
	if counts["svg"] != 1 || counts["polyline"] != 2*len(Strategies()) {
		t.Errorf("elements %v: want one svg and %d polylines", counts, 2*len(Strategies()))
	}
	for _, want := range []string{"no backoff", "full jitter", "decorrelated jitter", "clients", "milliseconds (log scale)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{
		{Clients: []int{0}}, {Runs: -1}, {Base: time.Second, Cap: time.Millisecond}, {Delay: -1},
		{Strategies: []Strategy{Strategy(9)}},
	} {
		if _, err := Run(context.Background(), cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("Run(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
	for _, cfg := range []LayersConfig{
		{Layers: -1}, {Attempts: 11}, {Requests: -5}, {Failure: []float64{1.5}}, {Failure: []float64{math.NaN()}},
		{BudgetRatio: -1}, {Layers: 10, Attempts: 10},
	} {
		if _, err := RunLayers(context.Background(), cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("RunLayers(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
	if _, err := ParseStrategy("fastest"); !errors.Is(err, ErrConfig) {
		t.Errorf("ParseStrategy: %v", err)
	}
	for _, s := range Strategies() {
		if got, err := ParseStrategy(s.String()); err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %v, %v", s, got, err)
		}
	}
}

func TestCanceled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, Config{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v, want context.Canceled", err)
	}
	if _, err := RunLayers(ctx, LayersConfig{}); !errors.Is(err, context.Canceled) {
		t.Errorf("RunLayers: %v, want context.Canceled", err)
	}
}
