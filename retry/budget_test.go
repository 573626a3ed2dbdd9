package retry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// allowed reports whether b allows a retry now.
func allowed(b *Budget) bool {
	ok, _ := b.allow()
	return ok
}

func TestBudget(t *testing.T) {
	t.Parallel()
	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		b := NewBudget(0, -1)
		if b.Tokens() != DefaultBudgetTokens || b.ratio != DefaultBudgetRatio {
			t.Errorf("NewBudget(0, -1) = %v tokens, ratio %v; want %v and %v", b.Tokens(), b.ratio, DefaultBudgetTokens, DefaultBudgetRatio)
		}
	})
	t.Run("all failing stops retries after max/2 failures", func(t *testing.T) {
		t.Parallel()
		for _, max := range []float64{10, 4, 100} {
			b := NewBudget(max, 0.1)
			failures := 0
			for allowed(b) {
				b.failure()
				failures++
				if failures > 1000 {
					t.Fatal("never stops")
				}
			}
			if failures != int(max/2) {
				t.Errorf("max %v: retries stop after %d failures, want %v", max, failures, max/2)
			}
		}
	})
	t.Run("successes earn retries back", func(t *testing.T) {
		t.Parallel()
		b := NewBudget(10, 0.5)
		for range 30 {
			b.failure()
		}
		if b.Tokens() != 0 || allowed(b) {
			t.Fatalf("tokens %v after 30 failures", b.Tokens())
		}
		for range 10 {
			b.success()
		}
		if allowed(b) {
			t.Errorf("5 tokens (half): retries must still wait")
		}
		b.success()
		if !allowed(b) {
			t.Errorf("5.5 tokens: a retry is earned back")
		}
		for range 100 {
			b.success()
		}
		if b.Tokens() != 10 {
			t.Errorf("tokens %v, want capped at 10", b.Tokens())
		}
	})
	t.Run("nil budget allows everything", func(t *testing.T) {
		t.Parallel()
		var b *Budget
		b.failure()
		b.success()
		if !allowed(b) || b.Tokens() != 0 {
			t.Error("a nil budget limits")
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		t.Parallel()
		b := NewBudget(10, 0.1)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 500 {
					b.failure()
					b.success()
					b.allow()
				}
			})
		}
		wg.Wait()
		if tk := b.Tokens(); tk < 0 || tk > 10 {
			t.Errorf("tokens %v out of [0, 10]", tk)
		}
	})
}

// faultyServer answers 503 to about rate of its requests, drawn from a PCG generator
// started at state, and 200 to the others; it counts both.
type faultyServer struct {
	*httptest.Server
	mu       sync.Mutex
	rng      *rand.Rand
	requests int
	faults   int
}

func newFaultyServer(t *testing.T, state uint64, rate float64) *faultyServer {
	s := &faultyServer{rng: rand.New(rand.NewPCG(state, 0xfa17))}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests++
		fail := s.rng.Float64() < rate
		if fail {
			s.faults++
		}
		s.mu.Unlock()
		if fail {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// A client whose calls mostly succeed keeps its retries: with a quarter of the requests
// failing, the calls of a default Transport fail only when one call meets five faults in
// a row, as they would without any budget. Each run's faults come from a generator with
// a fixed state, so they are the same every time; ten states cover more than one
// pattern of faults.
func TestTransportBudgetToleratesFaults(t *testing.T) {
	t.Parallel()
	for state := range uint64(10) {
		t.Run(fmt.Sprint("faults ", state), func(t *testing.T) {
			t.Parallel()
			srv := newFaultyServer(t, state, 0.25)
			var refusals atomic.Int64
			// The default Transport, with a fake clock so its waits take no time.
			tr := &Transport{Base: newBase(t), Policy: Policy{Clock: newFakeClock()},
				OnBudgetExhausted: func(*http.Request) { refusals.Add(1) }}
			failed, retried := 0, 0
			for range 40 {
				resp, err := tr.RoundTrip(newRequest(t, context.Background(), http.MethodGet, srv.URL, ""))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if StopReason(resp) != nil {
					failed++
					if errors.Is(StopReason(resp), ErrBudget) {
						t.Errorf("a call stopped by the budget: %v", StopReason(resp))
					}
				}
			}
			srv.mu.Lock()
			requests, faults := srv.requests, srv.faults
			srv.mu.Unlock()
			retried = requests - 40
			t.Logf("%d requests, %d faults, %d retries, %d of 40 calls failed", requests, faults, retried, failed)
			if failed > 1 || faults < 5 || retried < faults-failed*5 {
				t.Errorf("%d of 40 calls failed and %d retried for %d faults: want at most 1, and every fault retried", failed, retried, faults)
			}
			if refusals.Load() != 0 {
				t.Errorf("the budget refused retries %d times", refusals.Load())
			}
		})
	}
}

// The default budgets are per host: a host that is down spends its own, not the
// retries of the others.
func TestTransportBudgetPerHost(t *testing.T) {
	t.Parallel()
	down := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	flaky := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n%2 == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	tr := &Transport{Base: newBase(t), Policy: testPolicy(newFakeClock())}
	get := func(url string) *http.Response {
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), http.MethodGet, url, ""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for range 5 {
		get(down.URL)
	}
	if resp := get(down.URL); !errors.Is(StopReason(resp), ErrBudget) {
		t.Fatalf("the host that is down: %v, want its budget spent", StopReason(resp))
	}
	for i := range 5 {
		if resp := get(flaky.URL + "/x"); resp.StatusCode != http.StatusOK {
			t.Fatalf("call %d to another host: %v, want it retried to success", i, StopReason(resp))
		}
	}
	// Other paths on the same host share its budget; the host name's case does not matter.
	if resp := get(strings.Replace(down.URL, "http://", "HTTP://", 1) + "/other"); !errors.Is(StopReason(resp), ErrBudget) {
		t.Errorf("another path of the host that is down: %v, want its budget", StopReason(resp))
	}
}

// A budget that starts refusing retries is reported once, to the Logger and to
// OnBudgetExhausted, until it allows a retry again; Refused counts every refusal.
func TestTransportBudgetExhaustionIsReported(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	var mu sync.Mutex
	var logs bytes.Buffer
	var reported []string
	b := NewBudget(4, 1) // retries while more than 2 tokens remain
	p := testPolicy(newFakeClock())
	p.MaxAttempts = 10
	tr := &Transport{Base: newBase(t), Policy: p, Budget: b,
		Logger:            slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil)),
		OnBudgetExhausted: func(r *http.Request) { reported = append(reported, r.URL.Path) }}
	get := func(path string) {
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), http.MethodGet, srv.URL+path, ""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	get("/a") // 4 → 3 tokens: retried; 3 → 2: refused, reported
	get("/b") // refused
	get("/c") // refused
	failing.Store(false)
	for range 4 {
		get("/ok") // back to 4 tokens
	}
	failing.Store(true)
	get("/d") // 4 → 3: retried, the refusals are over; 3 → 2: refused, reported
	if want := []string{"/a", "/d"}; fmt.Sprint(reported) != fmt.Sprint(want) {
		t.Errorf("OnBudgetExhausted saw %v, want %v", reported, want)
	}
	if b.Refused() != 4 {
		t.Errorf("Refused = %d, want 4", b.Refused())
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), `level=WARN msg="retry: retry budget exhausted`); n != 2 {
		t.Errorf("%d records of the budget starting to refuse, want 2:\n%s", n, logs.String())
	}
}

// The error of a call the budget stopped after an attempt that timed out reads as one
// sentence: the right plural, and each cause once.
func TestTransportBudgetStopMessage(t *testing.T) {
	t.Parallel()
	srv := newScript(t, func(n int, w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	client := &http.Client{Transport: &Transport{Base: newBase(t), Policy: testPolicy(newFakeClock()),
		Budget: NewBudget(2, 1), AttemptTimeout: 50 * time.Millisecond}}
	_, err := client.Get(srv.URL)
	want := `Get "` + srv.URL + `": retry: retry budget exhausted after 1 attempt: retry: platform failure: retry: attempt timed out`
	if err == nil || err.Error() != want {
		t.Errorf("err = %q\nwant  %q", err, want)
	}
	for _, target := range []error{ErrBudget, ErrPlatform, ErrAttemptTimeout} {
		if !errors.Is(err, target) {
			t.Errorf("err does not match %v", target)
		}
	}
}
