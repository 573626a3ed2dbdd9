package deadlinechain_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/retrysafe/retrysafe/deadline"
	"github.com/retrysafe/retrysafe/harness/memnet"
	"github.com/retrysafe/retrysafe/retry"
)

// Each retry attempt carries the then-remaining budget, minus the reserve. The client and
// the server run in a synctest bubble, over in-memory connections: the budgets are exact
// virtual milliseconds, the waits between attempts are all the time that passes, and a
// busy machine changes nothing.
func TestEveryAttemptCarriesTheRemainingBudget(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var seen []string
		server := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen = append(seen, r.Header.Get(deadline.DefaultHeader))
			n := len(seen)
			mu.Unlock()
			if n < 3 {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			w.WriteHeader(http.StatusOK)
		}))
		client := &http.Client{Transport: &retry.Transport{
			Policy: retry.Policy{MaxAttempts: 5, Base: 50 * time.Millisecond, Jitter: retry.JitterNone},
			Base:   deadline.Transport{Base: server, Reserve: 200 * time.Millisecond},
		}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://server.test/", nil)
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
		// 10 000 ms less the 200 ms reserve, then less the waits of 50 ms and 100 ms
		// (no jitter) before the second and the third attempt.
		want := []string{"9800", "9750", "9650"}
		if resp.StatusCode != http.StatusOK || !slices.Equal(seen, want) {
			t.Fatalf("status %d after attempts with budgets %q ms, want 200 after %q", resp.StatusCode, seen, want)
		}
	})
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
//
// Make it inside a synctest bubble: the hops talk over in-memory connections, so every
// deadline on the way runs on the bubble's virtual clock, and a budget runs out only when
// all three sides are idle, never because a busy machine kept one of them from running.
type chain struct {
	client       *http.Client
	sentA, sentB atomic.Int64
	mu           sync.Mutex
	budgetsA     []string // the Request-Budget-Ms of each request to A
}

// The URLs of the two servers. Each server is reached through a transport of its own,
// which dials it whatever the host, so the names only make requests readable.
const (
	urlA = "http://a.test/"
	urlB = "http://b.test/"
)

func newChain(t *testing.T, giveUp func(w http.ResponseWriter)) *chain {
	c := &chain{}
	quiet := deadline.Config{Logger: slog.New(slog.DiscardHandler)}
	b := serve(t, deadline.Middleware(quiet)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.sentB.Add(1)
		<-r.Context().Done() // B is slower than any budget
		giveUp(w)
	})))
	toB := &http.Client{Transport: deadline.Transport{Base: b, Reserve: 50 * time.Millisecond}}
	a := serve(t, deadline.Middleware(quiet)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.sentA.Add(1)
		c.mu.Lock()
		c.budgetsA = append(c.budgetsA, r.Header.Get(deadline.DefaultHeader))
		c.mu.Unlock()
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, urlB, nil)
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
	c.client = &http.Client{Transport: &retry.Transport{
		Policy: retry.Policy{Base: 5 * time.Millisecond},
		Base:   deadline.Transport{Base: a, Reserve: 50 * time.Millisecond},
	}}
	return c
}

// serve runs h on an in-memory network until the test ends, and returns the transport
// that reaches it. Call it inside a synctest bubble.
func serve(t *testing.T, h http.Handler) *http.Transport {
	l := memnet.New()
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	tr := &http.Transport{DialContext: l.DialContext}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		_ = srv.Close() // the bubble ends only when the server's goroutines have
	})
	return tr
}

// An exhausted budget is final, across hops: when B's budget (the rest of A's, the rest
// of the client's) runs out, B's 504 says so, A's answer says so in turn, and the client
// does not resend, neither to A with the crumbs of its budget nor anywhere else. The
// budgets run on the bubble's clock, so each hop sees exactly the budget its caller had
// left, less the reserve, and B's answer reaches the client while the client's 100 ms
// of reserves are still left, however slowly the machine runs the hops.
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
			synctest.Test(t, func(t *testing.T) {
				c := newChain(t, tc.giveUp)
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, urlA, nil)
				if err != nil {
					t.Fatal(err)
				}
				resp, err := c.client.Do(req)
				if err != nil {
					t.Fatalf("err = %v, want B's 504 relayed", err)
				}
				resp.Body.Close()
				// B's budget is the client's 600 ms less two reserves of 50 ms; nothing
				// else takes any of the bubble's time.
				if took := time.Since(start); took != 500*time.Millisecond {
					t.Errorf("the answer came after %v, want when B's budget ran out, 500ms", took)
				}
				if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get(deadline.ExhaustedHeader) != "?1" {
					t.Errorf("got %d, %s %q; want a 504 saying the budget is spent", resp.StatusCode,
						deadline.ExhaustedHeader, resp.Header.Get(deadline.ExhaustedHeader))
				}
				if !errors.Is(retry.StopReason(resp), retry.ErrCanceled) {
					t.Errorf("StopReason = %v, want retry.ErrCanceled", retry.StopReason(resp))
				}
				c.mu.Lock()
				defer c.mu.Unlock()
				if a, b := c.sentA.Load(), c.sentB.Load(); a != 1 || b != 1 || c.budgetsA[0] != "550" {
					t.Errorf("%d requests reached A (budgets %q ms) and %d reached B, want 1 each, A's with 550", a, c.budgetsA, b)
				}
			})
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
