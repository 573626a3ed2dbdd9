package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// A payments endpoint behind the middleware: the retry of a request whose response was
// lost gets the stored response, and the payment is made once.
func Example() {
	payments := 0
	mw, err := idempotency.New(idempotency.Config{Store: memstore.New()})
	if err != nil {
		panic(err)
	}
	defer mw.Shutdown(context.Background()) // after the server stops: stores what the store could not take yet
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		payments++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, payments)
	}))

	for range 2 { // the first response was "lost"; the client retries with the same key
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("payments made:", payments)
	// Output:
	// 201 {"payment":1} replayed: false
	// 201 {"payment":1} replayed: true
	// payments made: 1
}

// The same key with another body is a client bug: 422.
func Example_mismatch() {
	mw, _ := idempotency.New(idempotency.Config{Store: memstore.New()})
	defer mw.Shutdown(context.Background())
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	for _, body := range []string{`{"amount":100}`, `{"amount":999}`} {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", "k-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("Content-Type") == "application/problem+json")
	}
	// Output:
	// 201 false
	// 422 true
}

// A handler that finds it did no work (here: an upstream said no before anything
// happened) releases the key, so the client's retry executes again.
func ExampleClaim_Release() {
	attempts := 0
	mw, _ := idempotency.New(idempotency.Config{Store: memstore.New()})
	defer mw.Shutdown(context.Background())
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts++
		if attempts == 1 {
			c, _ := idempotency.ClaimFromContext(r.Context())
			c.Release()
			http.Error(w, "upstream unavailable", http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/orders", nil)
		r.Header.Set("Idempotency-Key", "k-2")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code)
	}
	// Output:
	// 502
	// 201
}

// Sweep deletes expired records in batches; RunJanitor does it on a timer.
func ExampleSweep() {
	now := time.Now()
	store := memstore.NewWithClock(func() time.Time { return now })
	ctx := context.Background()
	for i := range 3 {
		_, _ = store.Claim(ctx, idempotency.ClaimRequest{Key: fmt.Sprint(i), Fingerprint: "fp",
			Lease: time.Second, TTL: time.Minute})
	}
	now = now.Add(time.Hour) // an hour later, all three have expired
	n, err := idempotency.Sweep(ctx, store, 2)
	fmt.Println(n, err)
	// Output: 3 <nil>
}

func ExampleParseKey() {
	for _, v := range []string{`abc-123`, `"abc-123"`, ``, "a b"} {
		k, err := idempotency.ParseKey(v)
		fmt.Printf("%q %v\n", k, err != nil)
	}
	// Output:
	// "abc-123" false
	// "abc-123" false
	// "" true
	// "" true
}
