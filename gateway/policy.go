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

// CatchAllPolicy returns the idempotency middleware configuration the gateway would run
// the requests no route matches with (cfg's own fields), resolved as New resolves it:
// the scope chosen by ScopeHeader, ScopeCookie or ScopeNone, the defaults applied, the
// gateway's rules checked. Off reports that those requests are forwarded untouched
// (cfg has a route "/" with Off set). The Store is cfg.Idempotency.Store (which may be
// nil) and Route is "/". It is for a server that runs the middleware in front of a
// handler of its own (a proxy's handler module), so that its policy is the gateway's,
// read by the same code: Upstream is required here as by New, but nothing is sent to it.
func (cfg Config) CatchAllPolicy() (mw idempotency.Config, off bool, err error) {
	store := cfg.Idempotency.Store
	cfg, ps, err := cfg.resolve()
	if err != nil {
		return idempotency.Config{}, false, err
	}
	for i := range ps {
		if ps[i].pattern == catchAll {
			mw, _ = ps[i].middleware()
			mw.Store = store
			return mw, ps[i].off, nil
		}
	}
	return idempotency.Config{}, false, errors.New("gateway: CatchAllPolicy: the configuration has no catch-all route (Config.Upstream is nil)")
}
