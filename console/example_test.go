package console_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/console"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// A console over a store, read-only, as an http.Handler: here behind httptest, in a
// program behind the gateway's admin listener (gateway.AdminConfig.Console) or a server
// of its own.
func Example() {
	store := memstore.New()
	ctx := context.Background()
	res, _ := store.Claim(ctx, idempotency.ClaimRequest{Scope: "alice", Key: "pay-42", Fingerprint: "fp",
		Lease: time.Minute, TTL: time.Hour})
	_ = store.Complete(ctx, idempotency.Completion{Scope: "alice", Key: "pay-42", Token: res.Token,
		Response: idempotency.Response{Status: 201, Body: []byte(`{"id":42}`)}, TTL: time.Hour})

	c, err := console.New(console.Options{Store: store, StoreName: "memory:", ReadOnly: true,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewServer(c)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/keys?scope=alice&key=pay-42")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, resp.Header.Get("X-Frame-Options"))
	fmt.Println(strings.Contains(string(page), ">pay-42</a>"), strings.Contains(string(page), "Evict"))
	// Output:
	// 200 DENY
	// true false
}
