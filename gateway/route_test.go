package gateway_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestRoutesPolicies: each route has its own policy, and a request the routes do not
// match has the Config's own.
func TestRoutesPolicies(t *testing.T) {
	t.Parallel()
	hooks := newUpstream(t)
	store := memstore.New()
	f := newFixture(t, store, nil, func(c *gateway.Config) {
		c.Routes = []gateway.Route{
			{Pattern: "POST /payments"},
			{Pattern: "POST /search", Off: true},
			{Pattern: "POST /notes", Idempotency: idempotency.Config{KeyOptional: true}},
			{Pattern: "/hooks/", Upstream: mustURL(t, hooks.URL)},
		}
	})
	expect := func(r reply, status int, what string) {
		t.Helper()
		if r.status != status {
			t.Fatalf("%s: %d %s, want %d", what, r.status, r.body, status)
		}
	}
	expect(f.do("POST", "/payments", "", `{}`), 400, "a payment without a key")
	expect(f.do("POST", "/payments", "p1", `{}`), 201, "a payment")
	if r := f.do("POST", "/payments", "p1", `{}`); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a payment's retry: %d %v, want a replay", r.status, r.header)
	}
	// An Off route forwards every request, its key untouched, each time.
	for range 2 {
		if r := f.do("POST", "/search", "s1", `{}`); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("a search: %d %v", r.status, r.header)
		}
	}
	expect(f.do("POST", "/notes", "", `{}`), 201, "a note without a key (optional)")
	f.do("POST", "/notes", "n1", `{}`)
	f.do("POST", "/notes", "n1", `{}`)
	// The catch-all is the Config's own policy: a key is required.
	expect(f.do("POST", "/other", "", `{}`), 400, "another path without a key")
	expect(f.do("PATCH", "/payments", "", `{}`), 400, "PATCH /payments, which POST /payments does not match")
	// The second upstream has its route's requests, once per key.
	f.do("POST", "/hooks/a", "h1", `{}`)
	f.do("POST", "/hooks/a", "h1", `{}`)

	for key, want := range map[string]int{"p1": 1, "s1": 2, "n1": 1, "": 1} {
		if got := f.up.callsFor(key); got != want {
			t.Errorf("upstream calls for key %q: %d, want %d", key, got, want)
		}
	}
	if got, other := hooks.callsFor("h1"), f.up.callsFor("h1"); got != 1 || other != 0 {
		t.Errorf("calls for h1: %d on the hooks upstream (want 1), %d on the other (want 0)", got, other)
	}
	// Each record is filed under its route's pattern, the catch-all's under "/".
	expect(f.do("POST", "/other", "o1", `{}`), 201, "another path")
	for key, want := range map[string]string{"p1": "POST /payments", "n1": "POST /notes", "h1": "/hooks/", "o1": "/"} {
		rec, err := store.Get(t.Context(), "", key)
		if err != nil {
			t.Fatalf("record %s: %v", key, err)
		}
		if rec.Route != want {
			t.Errorf("record %s: Route = %q, want %q", key, rec.Route, want)
		}
	}
}

// TestRouteMatching: a request is matched as ServeMux would match it — its cleaned
// path, its method in upper case, /tree for a /tree/ route — so that the way a path or a
// method is spelled cannot take a request out of a route that needs a key.
func TestRouteMatching(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memstore.New(), nil, func(c *gateway.Config) {
		c.Routes = []gateway.Route{
			{Pattern: "/", Off: true},
			{Pattern: "POST /payments"},
			{Pattern: "POST /orders/"},
			{Pattern: "POST /orders/{id}/notes", Off: true},
			{Pattern: "GET /report", Off: true},
		}
	})
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/payments", 400},
		{"POST", "//payments", 400},
		{"POST", "/x/../payments", 400},
		{"POST", "/pay%6Dents", 400},
		{"post", "/payments", 400}, // refused by the route's middleware: not forwarded as POST
		{"POST", "/orders", 400},   // ServeMux would redirect to /orders/
		{"POST", "/orders/7", 400},
		{"POST", "/orders/7/notes", 201}, // more specific than /orders/
		{"POST", "/search", 201},
		{"GET", "/payments", 201},
		{"GET", "/report", 201},
	} {
		// Written by hand, so that the path is sent as it is, not cleaned by a client.
		conn, err := net.Dial("tcp", strings.TrimPrefix(f.front.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", c.method, c.path)
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		conn.Close()
		if res.StatusCode != c.status {
			t.Errorf("%s %s: %d %s, want %d", c.method, c.path, res.StatusCode, b, c.status)
		}
	}
}

// TestNoRoute: without Config.Upstream a request no route matches is answered 404 and
// not forwarded.
func TestNoRoute(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	f := newFixture(t, memstore.New(), up, func(c *gateway.Config) {
		c.Upstream = nil
		c.Routes = []gateway.Route{{Pattern: "POST /a", Upstream: mustURL(t, up.URL)}}
	})
	r := f.do("POST", "/b", "k", `{}`)
	if r.status != 404 || r.problemType() != gateway.ProblemNoRoute {
		t.Fatalf("POST /b: %d %s", r.status, r.body)
	}
	if r := f.do("POST", "/a", "k", `{}`); r.status != 201 {
		t.Fatalf("POST /a: %d %s", r.status, r.body)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls: %d, want 1", n)
	}
}

func TestRouteErrors(t *testing.T) {
	t.Parallel()
	up := mustURL(t, "http://127.0.0.1:1")
	for _, c := range []struct {
		name   string
		routes []gateway.Route
		index  int
		want   string
	}{
		{"conflict", []gateway.Route{{Pattern: "POST /a/{x}"}, {Pattern: "POST /{y}/b"}}, 1, `conflicts with route "POST /a/{x}"`},
		{"duplicate", []gateway.Route{{Pattern: "POST /a"}, {Pattern: "POST /a"}}, 1, "also route 0's"},
		{"not a pattern", []gateway.Route{{Pattern: "POST a"}}, 0, "not a net/http pattern"},
		{"empty", []gateway.Route{{Pattern: ""}}, 0, "empty"},
		{"safe method keyed", []gateway.Route{{Pattern: "GET /report"}}, 0, "safe method"},
		{"method not keyed", []gateway.Route{{Pattern: "PUT /a", Idempotency: idempotency.Config{Methods: []string{"POST"}}}}, 0, "never need a key"},
		{"own store", []gateway.Route{{Pattern: "POST /a", Idempotency: idempotency.Config{Store: memstore.New()}}}, 0, "Store must be nil"},
		{"own memory bound", []gateway.Route{{Pattern: "POST /a", Idempotency: idempotency.Config{MaxBodyMemory: 1 << 20}}}, 0, "whole gateway"},
		{"ttl", []gateway.Route{{Pattern: "POST /a", UpstreamTimeout: time.Hour, Idempotency: idempotency.Config{TTL: time.Minute}}}, 0, "TTL"},
		{"two scopes", []gateway.Route{{Pattern: "POST /a", ScopeNone: true, ScopeCookie: "s"}}, 0, "more than one scope"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := gateway.New(gateway.Config{Upstream: up, Routes: c.routes, Idempotency: idempotency.Config{Store: memstore.New()}})
			var re *gateway.RouteError
			if !errors.As(err, &re) || re.Index != c.index || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want a RouteError of route %d with %q", err, c.index, c.want)
			}
		})
	}
	if _, err := gateway.New(gateway.Config{Routes: []gateway.Route{{Pattern: "POST /a"}}, Idempotency: idempotency.Config{Store: memstore.New()}}); err == nil || !strings.Contains(err.Error(), "no upstream") {
		t.Fatalf("a route without an upstream: %v", err)
	}
}

// TestReload: a reload changes the policy of the next requests, not of those in
// flight, and a reload that fails changes nothing.
func TestReload(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	f := newFixture(t, store, nil, func(c *gateway.Config) {
		c.Routes = []gateway.Route{{Pattern: "POST /held-once"}}
	})
	u := mustURL(t, f.up.URL)
	done := make(chan reply, 1)
	go func() { done <- f.do("POST", "/held-once", "k1", `{}`) }()
	await(t, "the first request upstream", f.up.arrived("k1"))

	bad := gateway.Config{Upstream: u, Routes: []gateway.Route{{Pattern: "POST /a/{x}"}, {Pattern: "POST /{y}/b"}}}
	if err := f.gw.Reload(bad); err == nil {
		t.Fatal("a reload with conflicting routes succeeded")
	}
	if r := f.do("POST", "/held-once", "k1", `{}`); r.status != 409 {
		t.Fatalf("after a failed reload, a duplicate: %d %s, want 409 (the running policy)", r.status, r.body)
	}
	if err := f.gw.Reload(gateway.Config{Upstream: u, Routes: []gateway.Route{{Pattern: "POST /held-once", Off: true}}}); err != nil {
		t.Fatal(err)
	}
	// The route is now Off: a new request goes through, unprotected…
	f.up.releaseKey("k2")
	if r := f.do("POST", "/held-once", "k2", `{}`); r.status != 201 {
		t.Fatalf("after the reload: %d %s", r.status, r.body)
	}
	if rec, err := store.Get(t.Context(), "", "k2"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("a request of an Off route left a record: %+v %v", rec, err)
	}
	// …while the one in flight finishes under the policy it began with: stored.
	f.up.releaseKey("k1")
	if r := <-done; r.status != 201 {
		t.Fatalf("the request in flight: %d %s", r.status, r.body)
	}
	rec, err := store.Get(t.Context(), "", "k1")
	if err != nil || rec.State != idempotency.StateDone {
		t.Fatalf("the request in flight was not stored: %+v %v", rec, err)
	}
	if err := f.gw.Reload(gateway.Config{Upstream: u, Idempotency: idempotency.Config{Store: memstore.New()}}); err == nil {
		t.Fatal("a reload with another store succeeded")
	}
}

// TestUnkeyedUpstreamErrorAdvice: the answer to an upstream failure tells a keyed
// request to retry with its key, and an unkeyed one (an Off route) that the gateway
// did not protect it.
func TestUnkeyedUpstreamErrorAdvice(t *testing.T) {
	t.Parallel()
	dead := mustURL(t, "http://"+testenv.DeadAddr(t))
	f := newFixture(t, memstore.New(), nil, func(c *gateway.Config) {
		c.Upstream = dead
		c.Routes = []gateway.Route{{Pattern: "POST /search", Off: true}}
	})
	keyed, off := f.do("POST", "/pay", "k", `{}`), f.do("POST", "/search", "k", `{}`)
	if keyed.status != 502 || !strings.Contains(keyed.body, "same Idempotency-Key") {
		t.Errorf("keyed: %d %s", keyed.status, keyed.body)
	}
	if off.status != 502 || strings.Contains(off.body, "Idempotency-Key") || !strings.Contains(off.body, "sent again") {
		t.Errorf("off route: %d %s, want a 502 that does not speak of a key", off.status, off.body)
	}
}
