package gateway

import (
	"errors"
	"net/http"

	"github.com/retrysafe/retrysafe/idempotency"
)

// middleware returns the middleware configuration of the policy p, as the gateway runs
// it, but for Store and OnStoreCall, and the request headers the upstream must receive
// as the gateway saw them: the key's, the scope's source and the content type (the last
// two are fingerprinted or decide whose key it is).
func (p *policy) middleware() (idempotency.Config, []string) {
	mcfg := p.mw
	// The records are filed under the route's pattern, the label of its metrics, so
	// that an operator finds a route's keys by the name its charts show.
	mcfg.Route = p.pattern
	protected := []string{http.CanonicalHeaderKey(mcfg.KeyHeader), "Content-Type"}
	switch {
	case p.scopeHeader != "":
		mcfg.Scope = idempotency.HeaderScope(p.scopeHeader)
		protected = append(protected, http.CanonicalHeaderKey(p.scopeHeader))
	case p.scopeCookie != "":
		mcfg.Scope = idempotency.CookieScope(p.scopeCookie)
		protected = append(protected, "Cookie")
	case p.scopeNone:
		mcfg.Scope = idempotency.NoScope
	case !p.ownScope: // the default, the Authorization header's hash
		mcfg.Scope = idempotency.AuthorizationScope
		protected = append(protected, "Authorization")
	}
	return mcfg, protected
}

// Policy is a route's policy, resolved as New resolves it.
type Policy struct {
	// Middleware is the route's idempotency middleware configuration, the defaults
	// applied and the scope chosen by ScopeHeader, ScopeCookie or ScopeNone; Route is
	// the route's pattern, Store Config.Idempotency.Store (which may be nil).
	Middleware idempotency.Config
	// Off: the route's requests are forwarded untouched.
	Off bool
	// Protected are the request headers the upstream must receive as the gateway saw
	// them: the key's, the scope's source and the content type.
	Protected []string
}

// RefuseHopByHop answers r 400 ProblemHopByHop, as the gateway does, and returns true
// when r's Connection header lists one of p.Protected, which a proxy would drop as
// hop-by-hop before the upstream sees it.
func (p Policy) RefuseHopByHop(w http.ResponseWriter, r *http.Request) bool {
	if p.Off {
		return false
	}
	name := hopByHop(r, p.Protected)
	if name == "" {
		return false
	}
	writeHopByHop(w, name)
	return true
}

// CatchAllPolicy returns the policy the gateway would give the requests no route
// matches (cfg's own fields, or a route "/"), checked and resolved as New resolves it.
// It is for a server that runs the middleware in front of a handler of its own (a
// proxy's handler module), so that its policy is the gateway's, read by the same code:
// Upstream is required here as by New, but nothing is sent to it.
func (cfg Config) CatchAllPolicy() (Policy, error) {
	store := cfg.Idempotency.Store
	cfg, ps, err := cfg.resolve()
	if err != nil {
		return Policy{}, err
	}
	for i := range ps {
		if ps[i].pattern == catchAll {
			mw, protected := ps[i].middleware()
			mw.Store = store
			return Policy{Middleware: mw, Off: ps[i].off, Protected: protected}, nil
		}
	}
	return Policy{}, errors.New("gateway: CatchAllPolicy: the configuration has no catch-all route (Config.Upstream is nil)")
}
