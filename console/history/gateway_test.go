package history_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/console/history"
	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// countingUpstream counts the requests that reach it, by path:
//
//	/pay/ok, /ship/ok  201
//	/pay/slow          201 once the test closes release; arrived is closed on arrival
//	/pay/fail          the connection is closed without an answer
//	/pay/busy          503: the upstream says it did not do the work
type countingUpstream struct {
	mu      sync.Mutex
	calls   map[string]int
	arrived chan struct{}
	release chan struct{}
}

func (u *countingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	u.calls[r.URL.Path]++
	u.mu.Unlock()
	switch r.URL.Path {
	case "/pay/slow":
		close(u.arrived)
		<-u.release
	case "/pay/fail":
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	case "/pay/busy":
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"ok":true}`)
}

func (u *countingUpstream) count(paths ...string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, p := range paths {
		n += u.calls[p]
	}
	return n
}

// TestAgainstTheGateway: each class counts what was sent through a real gateway, read
// from the registry the gateway was given.
func TestAgainstTheGateway(t *testing.T) {
	t.Parallel()
	up := &countingUpstream{calls: map[string]int{}, arrived: make(chan struct{}), release: make(chan struct{})}
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()
	upURL, _ := url.Parse(upSrv.URL)
	reg := prometheus.NewRegistry()
	gw, err := gateway.New(gateway.Config{
		Upstream:        upURL,
		UpstreamTimeout: 5 * time.Second,
		Logger:          slog.New(slog.DiscardHandler),
		Registerer:      reg,
		Idempotency:     idempotency.Config{Store: memstore.New()},
		Routes:          []gateway.Route{{Pattern: "POST /pay/"}, {Pattern: "POST /ship/"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(gw)
	defer func() {
		front.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()

	h := history.New(reg, history.Options{})
	if err := h.Sample(); err != nil { // the baseline
		t.Fatal(err)
	}

	send := func(path, key, body string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, front.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := front.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	expect := func(got, want int, what string) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: status %d, want %d", what, got, want)
		}
	}

	const newKeys, replays = 5, 3
	for i := range newKeys {
		expect(send("/pay/ok", "k"+string(rune('a'+i)), `{"n":1}`), http.StatusCreated, "new key")
	}
	for i := range replays {
		expect(send("/pay/ok", "k"+string(rune('a'+i)), `{"n":1}`), http.StatusCreated, "replay")
	}
	expect(send("/pay/ok", "ka", `{"n":2}`), http.StatusUnprocessableEntity, "same key, other body")

	// A duplicate while the first is in flight: 409.
	first := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/pay/slow", strings.NewReader(`{"n":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "slow")
		resp, err := front.Client().Do(req)
		if err != nil {
			first <- 0
			return
		}
		_ = resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-up.arrived
	expect(send("/pay/slow", "slow", `{"n":1}`), http.StatusConflict, "duplicate in flight")
	close(up.release)
	expect(<-first, http.StatusCreated, "the first of the slow key")

	expect(send("/pay/fail", "fail", `{}`), http.StatusBadGateway, "upstream broke the connection")
	expect(send("/pay/busy", "busy", `{}`), http.StatusServiceUnavailable, "upstream busy")
	expect(send("/pay/ok", "", `{}`), http.StatusBadRequest, "missing key")
	expect(send("/ship/ok", "s1", `{}`), http.StatusCreated, "other route")
	expect(send("/ship/ok", "s2", `{}`), http.StatusCreated, "other route")

	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	os := h.Outcomes()
	checkSums(t, os)
	pay := routeOf(t, os, "POST /pay/")
	want := history.Counts{
		history.ClassExecuted:        newKeys + 1, // and the slow key's first
		history.ClassReplayed:        replays,
		history.ClassInFlight:        1,
		history.ClassMismatch:        1,
		history.ClassOther4xx:        1,
		history.ClassUpstreamFailure: 2,
	}
	if pay.Totals != want {
		t.Errorf("POST /pay/: %v, want %v (outcomes %+v)", pay.Totals, want, pay.Outcomes)
	}
	if got := up.count("/pay/ok", "/pay/slow"); uint64(got) != pay.Totals[history.ClassExecuted] {
		t.Errorf("the upstream answered %d, executed %d", got, pay.Totals[history.ClassExecuted])
	}
	if got := up.count("/pay/fail", "/pay/busy"); uint64(got) != pay.Totals[history.ClassUpstreamFailure] {
		t.Errorf("the upstream failed %d, upstream failures %d", got, pay.Totals[history.ClassUpstreamFailure])
	}
	ship := routeOf(t, os, "POST /ship/")
	if ship.Totals != (history.Counts{history.ClassExecuted: 2}) {
		t.Errorf("POST /ship/: %v, want 2 executed", ship.Totals)
	}

	// The store was called: a claim per request that got to the store (the 400 did not).
	lat := h.StoreLatency()
	claim := opOf(t, lat, "claim")
	if claim.Count < newKeys+replays || claim.Errors != 0 || claim.P50.Empty {
		t.Errorf("claim: %+v, want at least %d calls, no errors, a p50", claim, newKeys+replays)
	}
	if c := opOf(t, lat, "complete"); c.Count != newKeys+1+2 {
		t.Errorf("complete: %d calls, want %d (one per stored answer)", c.Count, newKeys+1+2)
	}
}

// TestGatewayDefaultRegistry: a gateway given no Registerer makes its own registry (with
// the Go and process collectors); Gatherer hands it to a History.
func TestGatewayDefaultRegistry(t *testing.T) {
	t.Parallel()
	up := &countingUpstream{calls: map[string]int{}}
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()
	upURL, _ := url.Parse(upSrv.URL)
	gw, err := gateway.New(gateway.Config{Upstream: upURL, Logger: slog.New(slog.DiscardHandler),
		Idempotency: idempotency.Config{Store: memstore.New()}})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(gw)
	defer func() {
		front.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	h := history.New(gw.Gatherer(), history.Options{})
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/pay/ok", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "one")
		resp, err := front.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	ro := routeOf(t, h.Outcomes(), "/")
	if ro.Totals != (history.Counts{history.ClassExecuted: 1, history.ClassReplayed: 1}) || up.count("/pay/ok") != 1 {
		t.Errorf("catch-all route: %v, upstream calls %d; want 1 executed, 1 replayed, 1 call", ro.Totals, up.count("/pay/ok"))
	}
}
