package faultproxy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/retrysafe/retrysafe/harness/faultproxy"
)

// A proxy that loses every response: the server executes the request, the client only
// gets an error — the case a retry without an Idempotency-Key turns into a duplicate.
func Example() {
	var executed atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		executed.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	p, err := faultproxy.Start(context.Background(), faultproxy.Config{
		Target:       srv.Listener.Addr().String(),
		Seed:         1,
		ResponseLost: 1,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Post(p.URL()+"/payments", "application/json", strings.NewReader(`{"amount": 1250}`))
	if err == nil {
		resp.Body.Close()
	}
	st := p.Stats()
	fmt.Printf("client got an error: %v\n", err != nil)
	fmt.Printf("server executed: %d\n", executed.Load())
	fmt.Printf("responses lost: %d of %d faults\n", st.ResponsesLost, st.Faults)
	// Output:
	// client got an error: true
	// server executed: 1
	// responses lost: 1 of 1 faults
}
