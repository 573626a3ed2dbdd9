package endpointcheck_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/endpointcheck"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// A payments handler behind the idempotency middleware, over an in-memory store, passes
// every required case. Each execution answers a new id, so the battery can tell a replay
// from a second execution; the two credentials let it check that keys are scoped by
// caller.
func ExampleCheck() {
	store := memstore.New()
	defer store.Close()
	mw, err := idempotency.New(idempotency.Config{Store: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mw.Shutdown(context.Background()) // after the server below has stopped
	var mu sync.Mutex
	payments := 0
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		payments++
		id := payments
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, id)
	})))
	defer srv.Close()

	rep, err := endpointcheck.Check(context.Background(), endpointcheck.Config{
		URL:  srv.URL + "/payments",
		Body: []byte(`{"amount":100,"currency":"EUR"}`),
		Auth: []string{"Bearer test-alice", "Bearer test-bob"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range rep.Results {
		if r.ID == endpointcheck.CaseRetryAfter {
			// Pass when a concurrent duplicate arrived while the first request ran (and
			// got a 409), n/a when every duplicate came after it: that is timing.
			continue
		}
		fmt.Printf("%s: %s\n", r.Name, r.Verdict)
	}
	mu.Lock()
	fmt.Println("payments made:", payments) // one per key and credential
	mu.Unlock()
	fmt.Println("retries safe:", !rep.Failed())
	// Output:
	// missing key: pass
	// same key, same body, sequential: pass
	// replay marker: pass
	// same key, same body, 20 concurrent: pass
	// same key, other body: pass
	// same key, other route: pass
	// same key, two credentials: pass
	// malformed key: empty: pass
	// malformed key: 256 characters: pass
	// malformed key: control character: pass
	// problem+json errors: pass
	// payments made: 4
	// retries safe: true
}

// An endpoint that ignores Idempotency-Key executes every retry: the check says so.
func ExampleCheck_ignoredKeys() {
	var mu sync.Mutex
	executions := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		executions++
		id := executions
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	}))
	defer srv.Close()

	rep, err := endpointcheck.Check(context.Background(), endpointcheck.Config{URL: srv.URL + "/payments", Body: []byte(`{"amount":100}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, id := range []string{endpointcheck.CaseMissingKey, endpointcheck.CaseReplay, endpointcheck.CaseConcurrent} {
		r, _ := rep.Result(id)
		fmt.Printf("%s: %s: %s\n", r.Name, r.Verdict, r.Observed)
	}
	fmt.Println("retries safe:", !rep.Failed())
	// Output:
	// missing key: n/a: 201: keys optional (the request executed without a key, unprotected)
	// same key, same body, sequential: fail: 201 then 201, bodies differ: executed twice
	// same key, same body, 20 concurrent: fail: 20× 201 (20 different bodies): executed 20 times
	// retries safe: false
}
