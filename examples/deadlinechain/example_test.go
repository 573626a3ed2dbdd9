package deadlinechain_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/retrysafe/retrysafe/deadline"
	"github.com/retrysafe/retrysafe/retry"
)

// retry.Transport on top, deadline.Transport below: each attempt carries the budget
// left when it is sent, no attempt is sent once the budget is spent, and an answer that
// says the budget ran out is not resent.
func Example() {
	var attempts, slowAttempts atomic.Int64
	var budgets [3]atomic.Int64
	server := httptest.NewServer(deadline.Middleware(deadline.Config{})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				slowAttempts.Add(1)
				<-r.Context().Done() // slower than any budget: give up at the deadline
				return
			}
			n := attempts.Add(1)
			if n <= 3 {
				ms, _ := strconv.ParseInt(r.Header.Get(deadline.DefaultHeader), 10, 64)
				budgets[n-1].Store(ms)
			}
			if n < 3 {
				w.WriteHeader(http.StatusServiceUnavailable) // fails twice, then succeeds
				return
			}
			w.WriteHeader(http.StatusNoContent)
		})))
	defer server.Close()

	client := &http.Client{Transport: &retry.Transport{
		Policy: retry.Policy{MaxAttempts: 3, Base: 20 * time.Millisecond, Jitter: retry.JitterNone},
		Base:   deadline.Transport{Base: server.Client().Transport, Reserve: 100 * time.Millisecond},
	}}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, server.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println("status:", resp.StatusCode, "after", attempts.Load(), "attempts")
	b0, b1, b2 := budgets[0].Load(), budgets[1].Load(), budgets[2].Load()
	fmt.Println("each attempt saw less budget:", b0 <= 9900 && b1 < b0 && b2 < b1)

	// 50ms left, 100ms reserved: nothing is sent, and nothing is retried.
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	req, _ = http.NewRequestWithContext(short, http.MethodGet, server.URL, nil)
	_, err = client.Do(req)
	fmt.Println("failed fast:", errors.Is(err, context.DeadlineExceeded), "attempts:", attempts.Load())

	// A handler that runs out of budget: the middleware answers 504, saying the budget is
	// spent, and the client does not resend. This request passes on a budget of 200 ms it
	// was handed (a request without a deadline is sent with the header it carries), so
	// the client waits for the answer however long the server takes to give it.
	req, _ = http.NewRequest(http.MethodGet, server.URL+"/slow", nil)
	req.Header.Set(deadline.DefaultHeader, "200")
	resp, err = client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println("status:", resp.StatusCode, deadline.ExhaustedHeader+":", resp.Header.Get(deadline.ExhaustedHeader),
		"final:", errors.Is(retry.StopReason(resp), retry.ErrCanceled), "attempts:", slowAttempts.Load())
	// Output:
	// status: 204 after 3 attempts
	// each attempt saw less budget: true
	// failed fast: true attempts: 3
	// status: 504 Request-Budget-Exhausted: ?1 final: true attempts: 1
}
