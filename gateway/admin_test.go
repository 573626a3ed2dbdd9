package gateway_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// TestAdminWith: the console handler gets every path the probes and /metrics do not
// take; the token guards /metrics and leaves the probes open; Gatherer is the registry
// /metrics serves.
func TestAdminWith(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("http://127.0.0.1:1")
	reg := prometheus.NewRegistry()
	gw, err := gateway.New(gateway.Config{Upstream: u, Registerer: reg, Logger: slog.New(slog.DiscardHandler),
		Idempotency: idempotency.Config{Store: memstore.New()}})
	if err != nil {
		t.Fatal(err)
	}
	if gw.Gatherer() != reg {
		t.Errorf("Gatherer is not the Registerer given")
	}
	console := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "console "+r.URL.Path)
	})
	srv := httptest.NewServer(gw.AdminWith(gateway.AdminConfig{Console: console, Token: "tok"}))
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		path, token string
		status      int
		body        string
	}{
		{"/healthz", "", 200, "ok"},
		{"/readyz", "", 200, "ok"},
		{"/metrics", "", 401, "bearer token"},
		{"/metrics", "wrong", 401, "bearer token"},
		{"/metrics", "tok", 200, "retrysafe_gateway"},
		{"/", "", 200, "console /"},
		{"/keys/record", "", 200, "console /keys/record"},
	} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+c.path, nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != c.status || !strings.Contains(string(b), c.body) {
			t.Errorf("GET %s (token %q): %d %q, want %d with %q", c.path, c.token, res.StatusCode, b, c.status, c.body)
		}
	}
	// Without a console, / stays the mux's 404.
	plain := httptest.NewServer(gw.Admin())
	t.Cleanup(plain.Close)
	res, err := http.Get(plain.URL + "/keys")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("GET /keys without a console: %d, want 404", res.StatusCode)
	}
}
