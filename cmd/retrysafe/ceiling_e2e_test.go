package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/bytesize"
	"github.com/retrysafe/retrysafe/storedsn"
)

// echoUpstream answers every request with its own body, and /big with 3 MiB sent in two
// halves, the second once the test opens gate. It counts the executions of each key.
type echoUpstream struct {
	*httptest.Server
	gate chan struct{}
	open func() // opens gate
	mu   sync.Mutex
	runs map[string]int
}

func newEchoUpstream(t *testing.T) *echoUpstream {
	u := &echoUpstream{gate: make(chan struct{}), runs: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.runs[r.Header.Get("Idempotency-Key")]++
		u.mu.Unlock()
		if r.URL.Path == "/big" {
			half := strings.Repeat("b", 3<<19)
			w.Header().Set("Content-Length", strconv.Itoa(2*len(half)))
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, half)
			http.NewResponseController(w).Flush()
			<-u.gate
			_, _ = io.WriteString(w, half)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	}))
	open := sync.OnceFunc(func() { close(u.gate) })
	u.open = open
	t.Cleanup(func() {
		open()
		u.Close()
	})
	return u
}

func (u *echoUpstream) of(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[key]
}

// metricValue reads an unlabelled metric from the gateway's /metrics; ok is false when
// it is not there.
func metricValue(t *testing.T, gw *proc, name string) (float64, bool) {
	t.Helper()
	_, metrics := adminGet(t, gw.admin+"/metrics", "")
	for line := range strings.SplitSeq(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f, true
		}
	}
	return 0, false
}

// bodyMemory reads the gateway's body_memory_bytes gauge from its /metrics.
func bodyMemory(t *testing.T, gw *proc) float64 {
	t.Helper()
	v, ok := metricValue(t, gw, "retrysafe_gateway_body_memory_bytes")
	if !ok {
		t.Fatal("/metrics has no retrysafe_gateway_body_memory_bytes")
	}
	return v
}

// TestE2EAnswersUnderTheCeiling: the answers coming in from the upstream count against
// --max-body-memory with the requests' bodies. An answer larger than the ceiling is
// finished and arrives whole while new keyed requests get 503 with Retry-After and never
// reach the upstream; a burst of 1 MiB requests echoed by the upstream gets only 201s
// with their own bodies and 503s, and no key is executed twice; afterwards the gateway
// holds no body bytes.
func TestE2EAnswersUnderTheCeiling(t *testing.T) {
	t.Parallel()
	up := newEchoUpstream(t)
	gw := startGateway(t, nil, "--store", sqliteDSN(t), "--upstream", up.URL, "--max-body", "1MiB",
		"--max-body-memory", "2MiB", "--max-response", "4MiB")
	ctx := context.Background()
	var start map[string]any
	gw.awaitLog("the start-up line", 10*time.Second, func(line string) bool {
		return json.Unmarshal([]byte(line), &start) == nil && start["msg"] == "retrysafe gateway listening"
	})
	if limit, want := start["memory_limit"], bytesize.Format(2<<20+2<<20/4+64<<20); limit != want && limit != "GOMEMLIMIT" {
		t.Errorf("memory_limit %v at start, want 1.25 × 2MiB + 64MiB, %s", limit, want)
	}

	t.Run("an answer past the ceiling", func(t *testing.T) {
		big := testenv.Name("big")
		answer := make(chan reply, 1)
		go func() { answer <- post(ctx, gw.addr, "/big", big, "{}") }()
		waitFor(t, "the big answer's first half in the gateway", 20*time.Second, func() bool { return bodyMemory(t, gw) >= 2<<20 })
		refused := testenv.Name("refused")
		r := post(ctx, gw.addr, "/echo", refused, strings.Repeat("r", 100<<10))
		if r.status != http.StatusServiceUnavailable || r.problem() != idempotency.ProblemOverloaded || r.header.Get("Retry-After") == "" {
			t.Errorf("a new request past the ceiling: %v, want 503 overloaded with Retry-After", r)
		}
		if n := up.of(refused); n != 0 {
			t.Errorf("a refused request reached the upstream %d times", n)
		}
		up.open()
		if r := <-answer; r.err != nil || r.status != http.StatusCreated || r.body != strings.Repeat("b", 3<<20) {
			t.Fatalf("the answer past the ceiling: %d, %d bytes, %v; want 201 and 3 MiB", r.status, len(r.body), r.err)
		}
		if r := post(ctx, gw.addr, "/echo", refused, "again"); r.status != http.StatusCreated || up.of(refused) != 1 {
			t.Errorf("the refused request, retried once the answer is sent: %v, %d executions", r, up.of(refused))
		}
	})

	t.Run("a burst of echoes", func(t *testing.T) {
		const clients = 12
		keys := make([]string, clients)
		replies := make([]reply, clients)
		bodies := make([]string, clients)
		var wg sync.WaitGroup
		for i := range clients {
			keys[i] = testenv.Name(fmt.Sprintf("echo%d", i))
			bodies[i] = keys[i] + strings.Repeat("e", 1<<20-len(keys[i]))
			wg.Go(func() { replies[i] = post(ctx, gw.addr, "/echo", keys[i], bodies[i]) })
		}
		wg.Wait()
		ok := 0
		for i, r := range replies {
			switch {
			case r.err == nil && r.status == http.StatusCreated && r.body == bodies[i]:
				ok++
				if n := up.of(keys[i]); n != 1 {
					t.Errorf("%s answered 201 after %d executions", keys[i], n)
				}
			case r.err == nil && r.status == http.StatusServiceUnavailable && r.problem() == idempotency.ProblemOverloaded:
				if n := up.of(keys[i]); n != 0 {
					t.Errorf("%s refused after %d executions", keys[i], n)
				}
			default:
				t.Errorf("%s: %d, %d bytes, %v; want 201 with its own body, or 503 overloaded", keys[i], r.status, len(r.body), r.err)
			}
		}
		if ok == 0 {
			t.Error("no request of the burst got through")
		}
	})

	waitFor(t, "the gateway's body memory back to zero", 10*time.Second, func() bool { return bodyMemory(t, gw) == 0 })
}

// TestMemoryLimit: the soft memory limit the gateway sets itself is 1.25 × the ceiling
// on bodies in memory + 64MiB, from the ceiling a file leaves to its default too; none
// when GOMEMLIMIT is set, or with the memory store.
func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	up, _ := gateway.ParseUpstream("http://127.0.0.1:1")
	withCeiling := func(n int64) gateway.Config {
		return gateway.Config{Upstream: up, Idempotency: idempotency.Config{MaxBodyMemory: n}}
	}
	for _, c := range []struct {
		name    string
		fromEnv bool
		kind    string
		cfg     gateway.Config
		limit   int64
		what    string
	}{
		{"flags", false, storedsn.KindSQLite, withCeiling(2 << 20), 2<<20 + 512<<10 + 64<<20, "68096KiB"},
		{"the default ceiling (a file without max_body_memory)", false, storedsn.KindPostgres, withCeiling(0), 384 << 20, "384MiB"},
		{"GOMEMLIMIT set", true, storedsn.KindSQLite, withCeiling(2 << 20), 0, "GOMEMLIMIT"},
		{"memory store", false, storedsn.KindMemory, withCeiling(2 << 20), 0, "none (memory store)"},
	} {
		if limit, what := memoryLimit(c.fromEnv, c.kind, c.cfg); limit != c.limit || what != c.what {
			t.Errorf("%s: %d %q, want %d %q", c.name, limit, what, c.limit, c.what)
		}
	}
}
