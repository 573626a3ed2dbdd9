package gateway_test

import (
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
)

// TestCatchAllPolicy: the policy of the requests no route matches, as New resolves it:
// the scope from ScopeHeader, the defaults applied, the headers a Connection header must
// not list, Off from a route "/", and New's errors.
func TestCatchAllPolicy(t *testing.T) {
	t.Parallel()
	up, _ := url.Parse("http://127.0.0.1:1")
	p, err := gateway.Config{Upstream: up, ScopeHeader: "X-User",
		Idempotency: idempotency.Config{TTL: time.Hour, Conflict: idempotency.ConflictWait}}.CatchAllPolicy()
	if err != nil || p.Off {
		t.Fatalf("CatchAllPolicy: %v, off %v", err, p.Off)
	}
	mw := p.Middleware
	r := httptest.NewRequest("POST", "/payments", nil)
	r.Header.Set("X-User", "alice")
	if got := mw.Scope(r); got != "alice" {
		t.Errorf("the scope of a request from alice: %q", got)
	}
	if mw.Route != "/" || mw.TTL != time.Hour || mw.Lease != idempotency.DefaultLease || mw.Conflict != idempotency.ConflictWait ||
		len(mw.Methods) != 2 || mw.Store != nil {
		t.Errorf("the resolved policy: route %q, ttl %s, lease %s, conflict %q, methods %v, store %v", mw.Route, mw.TTL, mw.Lease, mw.Conflict, mw.Methods, mw.Store)
	}

	for _, c := range []struct {
		connection string
		refused    bool
	}{{"keep-alive", false}, {"close, x-user", true}, {"Idempotency-Key", true}, {"content-type", true}, {"authorization", false}} {
		r := httptest.NewRequest("POST", "/payments", nil)
		r.Header.Set("Connection", c.connection)
		w := httptest.NewRecorder()
		if got := p.RefuseHopByHop(w, r); got != c.refused || got && w.Code != 400 {
			t.Errorf("Connection: %s: refused %v (%d), want %v", c.connection, got, w.Code, c.refused)
		}
	}

	if p, err := (gateway.Config{Upstream: up, Routes: []gateway.Route{{Pattern: "/", Off: true}}}).CatchAllPolicy(); err != nil || !p.Off {
		t.Errorf("a route / that is off: %v, off %v", err, p.Off)
	}
	for name, cfg := range map[string]gateway.Config{
		"two scopes":        {Upstream: up, ScopeHeader: "X-User", ScopeNone: true},
		"ttl under lease":   {Upstream: up, Idempotency: idempotency.Config{TTL: time.Second}},
		"no catch-all":      {Routes: []gateway.Route{{Pattern: "POST /payments", Upstream: up}}},
		"safe method keyed": {Upstream: up, Idempotency: idempotency.Config{Methods: []string{"GET"}}},
	} {
		if _, err := cfg.CatchAllPolicy(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
