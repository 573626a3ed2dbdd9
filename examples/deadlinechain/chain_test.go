package deadlinechain_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/deadline"
	"github.com/retrysafe/retrysafe/retry"
)

// Each retry attempt carries the then-remaining budget, minus the reserve.
func TestEveryAttemptCarriesTheRemainingBudget(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []int
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, err := strconv.Atoi(r.Header.Get(deadline.DefaultHeader))
		if err != nil {
			t.Errorf("attempt without a budget: %v", err)
		}
		mu.Lock()
		seen = append(seen, ms)
		n := len(seen)
		mu.Unlock()
		if n < 3 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(server.Close)
	client := &http.Client{Transport: &retry.Transport{
		Policy: retry.Policy{MaxAttempts: 5, Base: 50 * time.Millisecond, Jitter: retry.JitterNone},
		Base:   deadline.Transport{Base: server.Client().Transport, Reserve: 200 * time.Millisecond},
	}}
	// 10s, so that the retries fit and the first attempt's lower bound leaves seconds
	// of slack for a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, server.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if resp.StatusCode != http.StatusOK || len(seen) != 3 {
		t.Fatalf("status %d after %d attempts, want 200 after 3", resp.StatusCode, len(seen))
	}
	if seen[0] > 9800 || seen[0] < 5000 {
		t.Errorf("first attempt's budget %d ms, want about 10000 − 200", seen[0])
	}
	// Waits of 50ms then 100ms (no jitter) separate the attempts.
	if d := seen[0] - seen[1]; d < 50 {
		t.Errorf("second attempt's budget %d ms, want at least 50 less than the first's %d", seen[1], seen[0])
	}
	if d := seen[1] - seen[2]; d < 100 {
		t.Errorf("third attempt's budget %d ms, want at least 100 less than the second's %d", seen[2], seen[1])
	}
}

// A budget below the reserve is not sent and not retried.
func TestSpentBudgetIsNotRetried(t *testing.T) {
	t.Parallel()
	var hits, retries atomic.Int64
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
	}))
	t.Cleanup(server.Close)
	client := &http.Client{Transport: &retry.Transport{
		Policy:  retry.Policy{MaxAttempts: 5, Base: time.Millisecond},
		OnRetry: func(*http.Request, retry.Attempt) { retries.Add(1) },
		Base:    deadline.Transport{Base: server.Client().Transport, Reserve: time.Second},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, server.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Do(req)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, deadline.ErrExhausted) {
		t.Errorf("err = %v, want one matching context.DeadlineExceeded and deadline.ErrExhausted", err)
	}
	if hits.Load() != 0 || retries.Load() != 0 {
		t.Errorf("%d requests reached the server, %d retries; want none", hits.Load(), retries.Load())
	}
}

// chain is a client and two servers: client → A → B. The client sends through
// retry.Transport over deadline.Transport; A, behind deadline.Middleware, calls B through
// deadline.Transport with its request's context and relays B's status and body (not
// its headers, as a hand-written handler does); B, behind deadline.Middleware, gives up
// when its budget runs out, the way giveUp says.
type chain struct {
	client       *http.Client
	a            *httptest.Server
	sentA, sentB atomic.Int64
	mu           sync.Mutex
	budgetsA     []string // the Request-Budget-Ms of each request to A
}

func newChain(t *testing.T, giveUp func(w http.ResponseWriter)) *chain {
	c := &chain{}
	quiet := deadline.Config{Logger: slog.New(slog.DiscardHandler)}
	b := httptest.NewServer(deadline.Middleware(quiet)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.sentB.Add(1)
		<-r.Context().Done() // B is slower than any budget
		giveUp(w)
	})))
	t.Cleanup(b.Close)
	toB := &http.Client{Transport: deadline.Transport{Base: b.Client().Transport, Reserve: 50 * time.Millisecond}}
	c.a = httptest.NewServer(deadline.Middleware(quiet)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.sentA.Add(1)
		c.mu.Lock()
		c.budgetsA = append(c.budgetsA, r.Header.Get(deadline.DefaultHeader))
		c.mu.Unlock()
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, b.URL, nil)
		if err != nil {
			t.Error(err)
			return
		}
		resp, err := toB.Do(req)
		if err != nil {
			http.Error(w, "calling B: "+err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})))
	t.Cleanup(c.a.Close)
	c.client = &http.Client{Transport: &retry.Transport{
		Policy: retry.Policy{Base: 5 * time.Millisecond},
		Base:   deadline.Transport{Base: c.a.Client().Transport, Reserve: 50 * time.Millisecond},
	}}
	return c
}

// An exhausted budget is final, across hops: when B's budget (the rest of A's, the rest
// of the client's) runs out, B's 504 says so, A's answer says so in turn, and the client
// does not resend, neither to A with the crumbs of its budget nor anywhere else.
func TestExhaustedBudgetIsFinalAcrossHops(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		giveUp func(w http.ResponseWriter)
	}{
		{"B returns without a word", func(http.ResponseWriter) {}},
		{"B answers 504 itself", func(w http.ResponseWriter) { http.Error(w, "gave up", http.StatusGatewayTimeout) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newChain(t, tc.giveUp)
			ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
			t.Cleanup(cancel)
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.a.URL, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := c.client.Do(req)
			if err != nil {
				t.Fatalf("err = %v, want B's 504 relayed", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get(deadline.ExhaustedHeader) != "?1" {
				t.Errorf("got %d, %s %q; want a 504 saying the budget is spent", resp.StatusCode,
					deadline.ExhaustedHeader, resp.Header.Get(deadline.ExhaustedHeader))
			}
			if !errors.Is(retry.StopReason(resp), retry.ErrCanceled) {
				t.Errorf("StopReason = %v, want retry.ErrCanceled", retry.StopReason(resp))
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if a, b := c.sentA.Load(), c.sentB.Load(); a != 1 || b != 1 {
				t.Errorf("%d requests reached A (budgets %q ms) and %d reached B, want 1 each", a, c.budgetsA, b)
			}
		})
	}
}

// A request whose budget header says it is spent is answered 504 at once, and a
// retry.Transport that sent it does not send it again.
func TestSpentBudgetAnswerIsNotResent(t *testing.T) {
	t.Parallel()
	var sent atomic.Int64
	server := httptest.NewServer(deadline.Middleware(deadline.Config{Logger: slog.New(slog.DiscardHandler)})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("the handler ran with a spent budget") })))
	t.Cleanup(server.Close)
	counting := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent.Add(1)
		return server.Client().Transport.RoundTrip(r)
	})
	client := &http.Client{Transport: &retry.Transport{Base: counting, Policy: retry.Policy{Base: time.Millisecond}}}
	req, err := http.NewRequest(http.MethodGet, server.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(deadline.DefaultHeader, "0") // forwarded from a caller whose time is up
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout || sent.Load() != 1 {
		t.Errorf("got %d after %d sends, want the 504 after 1", resp.StatusCode, sent.Load())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
