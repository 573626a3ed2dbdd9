package sim

import (
	"flag"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
)

var (
	seedFlag  = flag.Int64("seed", -1, "run only this seed and print its trace")
	seedsFlag = flag.Int("seeds", 0, "how many seeds TestSim explores (default 2000, 20000 with RETRYSAFE_LONG=1)")
	firstFlag = flag.Uint64("seed-from", 1, "the first seed TestSim explores")
)

// ciSeeds is how many seeds TestSim explores by default: what fits in about a minute
// under the race detector on a loaded 2-core machine.
const (
	ciSeeds   = 2000
	longSeeds = 20000
)

// regressionSeeds are seeds past the CI's range that the long mode found failing with a
// fix re-broken: a process that presumes the store healthy when it starts
// (testdata/defects/11-start-presumes-healthy.diff: 4624, 4700, 5305, 5452), and a
// janitor not held back after an outage (12-janitor-not-held.diff: 9077). The CI explores
// them beside its own, so that it sees those defects too. They hold their meaning only
// while plans are drawn as they are now; after a change to how plans are drawn, take them
// again from the long mode's failing seeds with each fix re-broken.
func regressionSeeds() []uint64 { return []uint64{4624, 4700, 5305, 5452, 9077} }

func runSeed(t *testing.T, seed uint64) *Result {
	var res *Result
	synctest.Test(t, func(t *testing.T) { res = Run(seed) })
	return res
}

// TestSim explores seeds and fails with the trace of every schedule that broke an
// invariant; -seed N runs one schedule and prints its trace whatever its verdict.
func TestSim(t *testing.T) {
	if *seedFlag >= 0 {
		res := runSeed(t, uint64(*seedFlag))
		t.Log("\n" + res.Report())
		if res.Failed() {
			t.Fatalf("seed %d broke %d invariants", *seedFlag, len(res.Violations))
		}
		return
	}
	n := *seedsFlag
	if n == 0 {
		n = ciSeeds
		if os.Getenv("RETRYSAFE_LONG") == "1" {
			n = longSeeds
		}
	}
	seeds := make([]uint64, 0, n)
	for i := range uint64(n) {
		seeds = append(seeds, *firstFlag+i)
	}
	if *seedsFlag == 0 {
		for _, s := range regressionSeeds() {
			if s < *firstFlag || s >= *firstFlag+uint64(n) {
				seeds = append(seeds, s)
			}
		}
	}
	start := time.Now()
	var mu sync.Mutex
	var failed []uint64
	execs, windows, finals, unfinished, late, ambushes := 0, 0, 0, 0, 0, 0
	kinds, inputs := map[string]int{}, map[string]int{}
	t.Run("seeds", func(t *testing.T) {
		for _, seed := range seeds {
			t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
				t.Parallel()
				res := runSeed(t, seed)
				mu.Lock()
				execs, windows, finals, unfinished = execs+res.Executions, windows+len(res.Windows), finals+res.Finals, unfinished+res.Unfinished
				late, ambushes = late+res.LateTakeovers, ambushes+res.Ambushes
				for _, k := range res.Kinds {
					kinds[k]++
				}
				for k, n := range res.Inputs {
					inputs[k] += n
				}
				mu.Unlock()
				if res.Failed() {
					mu.Lock()
					failed = append(failed, seed)
					mu.Unlock()
					t.Errorf("seed %d: %s\nreproduce: go test ./harness/sim -run 'TestSim$' -seed %d -v\n%s",
						seed, strings.Join(res.Violations, "\n"), seed, res.Report())
				}
			})
		}
	})
	slices.Sort(failed)
	t.Logf("%d seeds in %s: %d executions, %d extra in documented windows, %d final answers, %d operations unfinished, %d takeover claims refused as late (%d ambushed); causes of extra executions: %v; final answers to inputs that slip around the key rules: %v; failing seeds: %v",
		len(seeds), time.Since(start).Round(time.Millisecond), execs, windows, finals, unfinished, late, ambushes, kinds, inputs, failed)
}

// TestDeterministic runs seeds twice: the same seed must give the same trace. Beside
// the first 40, two storms whose late takeover claims the network ambushes (an outage
// and its delivery decided as the run goes).
func TestDeterministic(t *testing.T) {
	var seeds []uint64
	for s := range uint64(40) {
		seeds = append(seeds, s)
	}
	ambushed := 0
	for _, seed := range append(seeds, 102, 167) {
		a, b := runSeed(t, seed), runSeed(t, seed)
		ambushed += a.Ambushes
		ra, rb := a.Report(), b.Report()
		if ra != rb {
			la, lb := strings.Split(ra, "\n"), strings.Split(rb, "\n")
			for i := range min(len(la), len(lb)) {
				if la[i] != lb[i] {
					t.Fatalf("seed %d: the traces differ at line %d:\n  %s\n  %s", seed, i+1, la[i], lb[i])
				}
			}
			t.Fatalf("seed %d: the traces differ in length (%d and %d lines)", seed, len(la), len(lb))
		}
		if len(a.Trace) < 20 {
			t.Fatalf("seed %d: a trace of %d events: the schedule did nothing", seed, len(a.Trace))
		}
	}
	if ambushed == 0 {
		t.Errorf("no schedule had an ambush fire: choose seeds whose plans have one")
	}
}

// TestHandleConformance runs the store conformance suite against the simulated
// network in front of the memory store, with message delays and without lost replies
// or outages (the suite expects every call answered): the store the simulation runs
// against honours the idempotency.Store contract.
func TestHandleConformance(t *testing.T) {
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T, clock func() time.Time) idempotency.Store {
			return newQuietHandle(clock)
		},
	})
}
