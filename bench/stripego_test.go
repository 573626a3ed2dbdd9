package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	stripe "github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/customer"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// TestStripeGoSharedKey: concurrent calls of Stripe's own Go client that share one
// idempotency key, through the gateway with the wait conflict policy, all succeed with
// the one customer the upstream created once. The client retries a 409 only twice, with
// a short backoff, so under the default policy duplicates of a slow request fail; with
// wait they get the answer. The upstream (a stand-in for an API that never
// deduplicates) takes three seconds and counts its executions; the store is PostgreSQL.
func TestStripeGoSharedKey(t *testing.T) {
	var executions atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := executions.Add(1)
		time.Sleep(3 * time.Second) // the API's own work on the request: longer than the client's two 409 retries
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cus_%d","object":"customer","email":"ada@example.com"}`, n)
	}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)

	schema := testenv.Schema(t, "stripego")
	store, err := pgstore.New(pgstore.Config{Pool: testenv.PostgresPool(t, 0), Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{Upstream: upURL, Logger: slog.New(slog.DiscardHandler),
		Idempotency: idempotency.Config{Store: store, Conflict: idempotency.ConflictWait}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
	front := httptest.NewServer(gw)
	t.Cleanup(front.Close)

	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:           stripe.String(front.URL),
		HTTPClient:    &http.Client{Timeout: 30 * time.Second},
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	client := customer.Client{B: backend, Key: "sk_test_retrysafe"}
	key := testenv.Name("stripego")
	const calls = 20
	ids := make([]string, calls)
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			p := &stripe.CustomerParams{Email: stripe.String("ada@example.com")}
			p.SetIdempotencyKey(key)
			c, err := client.New(p)
			errs[i] = err
			if err == nil {
				ids[i] = c.ID
			}
		})
	}
	wg.Wait()
	for i := range calls {
		if errs[i] != nil {
			t.Errorf("call %d: %v", i, errs[i])
		} else if ids[i] != "cus_1" {
			t.Errorf("call %d: customer %q, want cus_1", i, ids[i])
		}
	}
	if n := executions.Load(); n != 1 {
		t.Errorf("the upstream executed %d times, want 1", n)
	}
}
