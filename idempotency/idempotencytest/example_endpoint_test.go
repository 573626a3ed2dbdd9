package idempotencytest_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"

	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
)

// An endpoint that ignores Idempotency-Key executes every retry: the check says so.
func Example() {
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

	rep, err := idempotencytest.CheckEndpoint(context.Background(), idempotencytest.EndpointConfig{URL: srv.URL + "/payments", Body: []byte(`{"amount":100}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, id := range []string{idempotencytest.CaseMissingKey, idempotencytest.CaseReplay, idempotencytest.CaseConcurrent} {
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
