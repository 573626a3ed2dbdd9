package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
	"github.com/retrysafe/retrysafe/retry"
)

// Do retries a function until it succeeds, fails for good, or the policy is spent.
func ExampleDo() {
	attempts := 0
	err := retry.Do(context.Background(), retry.Policy{Base: time.Millisecond}, func(ctx context.Context) error {
		attempts++
		if attempts < 3 {
			return errors.New("connection reset") // retryable: no class says otherwise
		}
		return nil
	})
	fmt.Println("attempts:", attempts, "err:", err)

	// A Permanent error stops the loop at once.
	attempts = 0
	err = retry.Do(context.Background(), retry.Policy{Base: time.Millisecond}, func(ctx context.Context) error {
		attempts++
		return retry.Permanent(errors.New("card declined"))
	})
	fmt.Println("attempts:", attempts, "err:", err)
	// Output:
	// attempts: 3 err: <nil>
	// attempts: 1 err: card declined
}

// DoValue with Classify: the 503 is retried (after the server's Retry-After, here 0
// seconds, plus jitter), and the value of the successful call is returned.
func ExampleDoValue() {
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if calls == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, `{"balance":42}`)
	}))
	defer srv.Close()

	body, err := retry.DoValue(context.Background(), retry.Policy{Base: time.Millisecond}, func(ctx context.Context) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/balance", nil)
		if err != nil {
			return "", retry.Permanent(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err := retry.Classify(resp, err); err != nil {
			if resp != nil {
				resp.Body.Close()
			}
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	})
	fmt.Println(body, err, "calls:", calls)
	// Output: {"balance":42} <nil> calls: 2
}

// A client whose POSTs carry an Idempotency-Key set by the Transport, talking to a server
// behind the idempotency middleware. The first attempt meets a 503 (the middleware
// releases the key: the work was not done); the retry, with the same key, executes.
func ExampleTransport() {
	var mu sync.Mutex
	var keys []string
	payments := 0
	mw, err := idempotency.New(idempotency.Config{Store: memstore.New()})
	if err != nil {
		panic(err)
	}
	defer mw.Shutdown(context.Background())
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		if len(keys) == 1 {
			http.Error(w, "warming up", http.StatusServiceUnavailable)
			return
		}
		payments++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, payments)
	})))
	defer srv.Close()

	client := &http.Client{Transport: &retry.Transport{
		AutoKey: true,
		Policy:  retry.Policy{Base: time.Millisecond},
		OnRetry: func(r *http.Request, a retry.Attempt) {
			fmt.Println("retrying after attempt", a.N, "because:", a.Err)
		},
	}}
	resp, err := client.Post(srv.URL+"/payments", "application/json", strings.NewReader(`{"amount":100}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("payments:", payments, "attempts:", len(keys), "same key:", keys[0] == keys[1] && keys[0] != "")
	// Output:
	// retrying after attempt 1 because: retry: platform failure: HTTP 503 Service Unavailable
	// 201 {"payment":1}
	// payments: 1 attempts: 2 same key: true
}

// Classify maps a response or a transport error to one class; errors.Is tells them apart.
func ExampleClassify() {
	for _, code := range []int{200, 401, 404, 409, 422, 429, 503} {
		resp := &http.Response{StatusCode: code, Header: http.Header{}}
		if code == 429 {
			resp.Header.Set("Retry-After", "30")
		}
		err := retry.Classify(resp, nil)
		var se *retry.StatusError
		switch {
		case err == nil:
			fmt.Println(code, "success")
		case errors.As(err, &se) && se.Delay > 0:
			fmt.Println(code, err, "| retryable:", retry.Retryable(err), "| after:", se.Delay)
		default:
			fmt.Println(code, err, "| retryable:", retry.Retryable(err), "| auth:", errors.Is(err, retry.ErrAuth))
		}
	}
	err := retry.Classify(nil, context.Canceled)
	fmt.Println(err, "| retryable:", retry.Retryable(err))
	// Output:
	// 200 success
	// 401 retry: not authorized: HTTP 401 Unauthorized | retryable: false | auth: true
	// 404 retry: not found: HTTP 404 Not Found | retryable: false | auth: false
	// 409 retry: invalid request: HTTP 409 Conflict | retryable: false | auth: false
	// 422 retry: invalid request: HTTP 422 Unprocessable Entity | retryable: false | auth: false
	// 429 retry: rate limited: HTTP 429 Too Many Requests | retryable: true | after: 30s
	// 503 retry: platform failure: HTTP 503 Service Unavailable | retryable: true | auth: false
	// retry: canceled: context canceled | retryable: false
}

// For a revoke, 404 means "already gone": a success, for Classify and for Transport.
func ExampleWithStatusClass() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NotFound(w, r) // revoked by an earlier attempt whose response was lost
	}))
	defer srv.Close()

	client := &http.Client{Transport: &retry.Transport{Policy: retry.Policy{Base: time.Millisecond}}}
	ctx := retry.WithStatusClass(context.Background(), http.StatusNotFound, nil)
	req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, srv.URL+"/grants/42", nil)
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	if err := retry.Classify(resp, nil); err != nil {
		fmt.Println("revoke failed:", err)
		return
	}
	fmt.Println("revoked (status", resp.StatusCode, "counts as success)")
	// Output: revoked (status 404 counts as success)
}

// A POST without an Idempotency-Key whose response may be lost: the status check asks
// the server instead of resending blindly.
func ExampleWithStatusCheck() {
	var mu sync.Mutex
	orders := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.Method {
		case http.MethodPost:
			orders["ref-7"] = true
			http.Error(w, "upstream timed out", http.StatusGatewayTimeout) // done, but the answer is a 504
		case http.MethodGet:
			if !orders["ref-7"] {
				http.NotFound(w, r)
				return
			}
			io.WriteString(w, `{"order":"ref-7","state":"placed"}`)
		}
	}))
	defer srv.Close()

	client := &http.Client{Transport: &retry.Transport{Policy: retry.Policy{Base: time.Millisecond}}}
	ctx := retry.WithStatusCheck(context.Background(), func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/orders/ref-7", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode == http.StatusNotFound {
			resp.Body.Close()
			return nil, nil // it did not happen: resending is safe
		}
		return resp, nil
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"ref":"ref-7"}`))
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body), "orders:", len(orders))
	// Output: 200 {"order":"ref-7","state":"placed"} orders: 1
}

// A client that sends keyed requests without retry.Transport: SendOnce keeps Go's
// http.Transport from resending them by itself, and the key still reaches the server.
func ExampleSendOnce() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "key %s", r.Header.Get("Idempotency-Key"))
	}))
	defer srv.Close()

	client := &http.Client{Transport: retry.SendOnce(&http.Transport{})}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
	req.Header.Set("Idempotency-Key", "pay-42")
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(string(body), resp.Request == req)
	// Output: key pay-42 true
}

// When Transport stops at an HTTP answer it returns it, with a nil error, whatever its
// status; StopReason says why it stopped there.
func ExampleStopReason() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/busy":
			http.Error(w, "overloaded", http.StatusServiceUnavailable) // every time
		case "/taken":
			http.Error(w, "name taken", http.StatusConflict)
		default:
			io.WriteString(w, "ok")
		}
	}))
	defer srv.Close()
	client := &http.Client{Transport: &retry.Transport{Policy: retry.Policy{MaxAttempts: 3, Base: time.Millisecond}}}

	for _, path := range []string{"/", "/taken", "/busy"} {
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			fmt.Println(err) // no answer at all
			continue
		}
		resp.Body.Close()
		stop := retry.StopReason(resp)
		var ex *retry.ExhaustedError
		switch {
		case stop == nil:
			fmt.Println(path, resp.StatusCode, "success")
		case errors.As(stop, &ex):
			fmt.Println(path, resp.StatusCode, "gave up after", ex.Attempts, "attempts:", errors.Is(stop, retry.ErrMaxAttempts))
		default:
			fmt.Println(path, resp.StatusCode, "final:", stop)
		}
	}
	// Output:
	// / 200 success
	// /taken 409 final: retry: invalid request: HTTP 409 Conflict
	// /busy 503 gave up after 3 attempts: true
}
