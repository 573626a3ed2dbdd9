package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/testenv"
)

// TestE2EGCFloor: the gateway raises the garbage collector's percentage (exported as
// go_gc_gogc_percent) once a collection has measured its small live heap, so that the
// heap grows by 32 MiB between collections instead of by as much as is live; with GOGC
// set it leaves the collector as GOGC says. Both gateways get the same traffic, until
// each has collected at least twice.
func TestE2EGCFloor(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	for _, c := range []struct {
		env    string
		floor  string
		raised bool
	}{
		{env: "GOGC=", floor: "32MiB", raised: true},
		{env: "GOGC=100", floor: "GOGC", raised: false},
	} {
		t.Run(c.env, func(t *testing.T) {
			t.Parallel()
			gw := startGateway(t, []string{c.env}, "--store", sqliteDSN(t), "--upstream", up.URL)
			var start map[string]any
			gw.awaitLog("the start-up line", 10*time.Second, func(line string) bool {
				return json.Unmarshal([]byte(line), &start) == nil && start["msg"] == "retrysafe gateway listening"
			})
			if start["gc_floor"] != c.floor {
				t.Errorf("gc_floor %v at start, want %q", start["gc_floor"], c.floor)
			}
			// 256 KiB bodies, in the request and stored with the answer: a collection
			// every few requests at first.
			body := fmt.Sprintf(`{"pad":%q}`, strings.Repeat("p", 256<<10))
			ctx := context.Background()
			for i := 0; ; i++ {
				if r := post(ctx, gw.addr, "/orders", testenv.Name("gc"), body); r.err != nil || r.status != http.StatusCreated {
					t.Fatalf("request %d: %v", i, r)
				}
				if i%5 != 4 {
					continue
				}
				cycles, _ := metricValue(t, gw, "go_gc_duration_seconds_count")
				percent, ok := metricValue(t, gw, "go_gc_gogc_percent")
				if !ok {
					t.Fatal("/metrics has no go_gc_gogc_percent")
				}
				if c.raised && percent > 100 && cycles >= 2 {
					return
				}
				if !c.raised && cycles >= 2 {
					if percent != 100 {
						t.Fatalf("GOGC=100: go_gc_gogc_percent %v after %v collections", percent, cycles)
					}
					return
				}
				if i >= 2000 {
					t.Fatalf("after %d requests: go_gc_gogc_percent %v, %v collections", i+1, percent, cycles)
				}
			}
		})
	}
}
