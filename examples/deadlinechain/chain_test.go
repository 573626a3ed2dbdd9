package deadlinechain_test

import (
	"context"
	"errors"
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
