package gateway_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// The gateway in front of an API that knows nothing of idempotency keys: the retry of a
// POST is answered from the store, and the API sees the payment once.
func Example() {
	var payments atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := payments.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "payment %d\n", n)
	}))
	defer api.Close()

	upstream, _ := url.Parse(api.URL)
	gw, err := gateway.New(gateway.Config{
		Upstream: upstream,
		Logger:   slog.New(slog.DiscardHandler),
		Idempotency: idempotency.Config{
			Store: memstore.New(),
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer gw.Shutdown(context.Background()) // after the server below has closed
	front := httptest.NewServer(gw)
	defer front.Close()

	for range 2 { // the first attempt, then its retry
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/payments", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", "order-42")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Printf("%d replayed=%q %s", res.StatusCode, res.Header.Get("Idempotent-Replayed"), body)
	}
	fmt.Println("payments made:", payments.Load())
	// Output:
	// 201 replayed="" payment 1
	// 201 replayed="true" payment 1
	// payments made: 1
}

// Run serves the proxy and the admin endpoints until its context ends, then shuts down
// gracefully.
func ExampleGateway_Run() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer api.Close()
	upstream, _ := url.Parse(api.URL)
	gw, err := gateway.New(gateway.Config{Upstream: upstream, Logger: slog.New(slog.DiscardHandler), Idempotency: idempotency.Config{Store: memstore.New()}})
	if err != nil {
		fmt.Println(err)
		return
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	admin, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx, ln, admin) }()

	res, err := http.Get("http://" + admin.Addr().String() + "/readyz")
	if err != nil {
		fmt.Println(err)
		return
	}
	res.Body.Close()
	fmt.Println("readyz:", res.StatusCode)

	stop() // in a program: signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	fmt.Println("Run returned:", <-done)
	// Output:
	// readyz: 200
	// Run returned: <nil>
}
