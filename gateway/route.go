package gateway

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/httpname"
)

// Route is the policy of the requests that match Pattern. Its zero fields have the
// packages' defaults (idempotency.DefaultTTL, DefaultUpstreamTimeout, …), not the
// values of the Config around it, but for Upstream.
type Route struct {
	// Pattern is a net/http ServeMux pattern, "[METHOD ][HOST]/[PATH]", with wildcards
	// ({id}, {rest...}) and {$}: POST /payments, POST /orders/{id}/refunds, /webhooks/.
	// Of the routes a request matches, the most specific has it, as ServeMux decides;
	// two patterns that conflict (neither is more specific) are an error. A request
	// whose path is not clean (//payments, /a/../payments) has the route of its cleaned
	// path, as ServeMux would route it, and is forwarded as it came; one for /tree when
	// /tree/ is a route (which ServeMux answers with a redirect) has the /tree/ route.
	// A method is matched in upper case, so that post /payments has the route of POST
	// /payments (whose middleware refuses it unless the route is Off). Required.
	Pattern string

	// Off forwards the route's requests untouched: no key is read and nothing is
	// stored, whatever the method. Default false.
	Off bool

	// Upstream is where the route's requests go, as Config.Upstream. Default
	// Config.Upstream.
	Upstream *url.URL

	// Idempotency is the route's policy, with the fields and defaults of
	// Config.Idempotency, but Methods, whose default is the pattern's method when it
	// names one (POST /payments keys POST requests), and three fields that are the
	// gateway's and must be zero here: Store, MaxBodyMemory and MaxWaiters (the bounds
	// of the whole gateway, set in Config.Idempotency). A route whose pattern names a
	// safe method (GET /report) must be Off. Its Route is set by the gateway to Pattern
	// (the route label of the metrics), whatever it holds.
	Idempotency idempotency.Config

	// ScopeHeader, ScopeCookie and ScopeNone choose the route's scope, as the Config
	// fields of the same names do. Default: the SHA-256 of the Authorization header.
	ScopeHeader, ScopeCookie string
	ScopeNone                bool

	// UpstreamTimeout bounds the route's upstream calls, as Config.UpstreamTimeout.
	// Default DefaultUpstreamTimeout (30s).
	UpstreamTimeout time.Duration
}

// RouteError is an error in one of Config.Routes.
type RouteError struct {
	Index   int    // in Config.Routes
	Pattern string // the route's Pattern
	Err     error
}

func (e *RouteError) Error() string {
	return fmt.Sprintf("gateway: route %q: %v", e.Pattern, strings.TrimPrefix(e.Err.Error(), "gateway: "))
}

func (e *RouteError) Unwrap() error { return e.Err }

// ProblemNoRoute (404): the request matches no route and the gateway has no catch-all
// (Config.Upstream is nil): it was not forwarded.
const ProblemNoRoute = "urn:retrysafe:problem:no-route"

// catchAll is the pattern of the route that the Config's own fields make: every request
// no other route matches.
const catchAll = "/"

// policy is a route resolved: what the gateway builds a route from.
type policy struct {
	index           int // in Config.Routes; -1 for the catch-all of the Config's own fields
	pattern         string
	off             bool
	upstream        *url.URL
	mw              idempotency.Config // resolved; Store nil
	scopeHeader     string
	scopeCookie     string
	scopeNone       bool
	ownScope        bool // mw.Scope was set by the caller
	upstreamTimeout time.Duration
}

// policies returns the resolved policies of cfg, which withDefaults has checked and
// defaulted: the catch-all first (absent when cfg.Upstream is nil), then the routes in
// order.
func (cfg Config) policies() ([]policy, error) {
	var out []policy
	if cfg.Upstream != nil && !slices.ContainsFunc(cfg.Routes, func(r Route) bool { return r.Pattern == catchAll }) {
		p := policy{index: -1, pattern: catchAll, upstream: cfg.Upstream, mw: cfg.Idempotency, scopeHeader: cfg.ScopeHeader,
			scopeCookie: cfg.ScopeCookie, scopeNone: cfg.ScopeNone, ownScope: cfg.Idempotency.Scope != nil,
			upstreamTimeout: cfg.UpstreamTimeout}
		p.mw.Store = nil
		if err := p.resolve(); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	seen := map[string]int{}
	for i, r := range cfg.Routes {
		p, err := cfg.routePolicy(r)
		p.index = i
		if err == nil {
			if j, dup := seen[r.Pattern]; dup {
				err = fmt.Errorf("the pattern is also route %d's", j)
			}
		}
		if err != nil {
			return nil, &RouteError{Index: i, Pattern: r.Pattern, Err: err}
		}
		seen[r.Pattern] = i
		out = append(out, p)
	}
	return out, nil
}

func (cfg Config) routePolicy(r Route) (policy, error) {
	method, err := checkPattern(r.Pattern)
	if err != nil {
		return policy{}, err
	}
	mw := r.Idempotency
	switch {
	case mw.Store != nil:
		return policy{}, errors.New("Idempotency.Store must be nil: the store is the gateway's (Config.Idempotency.Store)")
	case mw.MaxBodyMemory != 0 || mw.MaxWaiters != 0:
		return policy{}, errors.New("Idempotency.MaxBodyMemory and Idempotency.MaxWaiters must be zero: they bound the whole gateway (Config.Idempotency)")
	}
	if method != "" && len(mw.Methods) == 0 && !r.Off {
		mw.Methods = []string{method}
	}
	// The gateway-wide bounds, so that MaxBody is checked against them.
	mw.MaxBodyMemory, mw.MaxWaiters = cfg.Idempotency.MaxBodyMemory, cfg.Idempotency.MaxWaiters
	if mw.Logger == nil {
		mw.Logger = cfg.Logger
	}
	p := policy{pattern: r.Pattern, off: r.Off, upstream: cmp.Or(r.Upstream, cfg.Upstream), mw: mw,
		scopeHeader: r.ScopeHeader, scopeCookie: r.ScopeCookie, scopeNone: r.ScopeNone, ownScope: mw.Scope != nil,
		upstreamTimeout: cmp.Or(r.UpstreamTimeout, DefaultUpstreamTimeout)}
	switch {
	case p.upstream == nil:
		return policy{}, errors.New("no upstream: the route has none and Config.Upstream is nil")
	case r.UpstreamTimeout < 0:
		return policy{}, errors.New("UpstreamTimeout is negative")
	}
	if err := checkUpstream(p.upstream); err != nil {
		return policy{}, err
	}
	if !r.Off && method != "" && isSafe(method) {
		return policy{}, fmt.Errorf("%s is a safe method and cannot need a key: make the route Off", method)
	}
	if err := p.resolve(); err != nil {
		return policy{}, err
	}
	if !r.Off && method != "" && !slices.Contains(p.mw.Methods, method) {
		return policy{}, fmt.Errorf("the pattern matches only %s, which is not in Idempotency.Methods (%s): the route would never need a key; make it Off or key %s",
			method, strings.Join(p.mw.Methods, ", "), method)
	}
	return p, nil
}

// resolve checks a policy's scope and methods and applies the middleware's defaults.
func (p *policy) resolve() error {
	if p.scopeHeader != "" && !httpname.Valid(p.scopeHeader) {
		return fmt.Errorf("gateway: Config.ScopeHeader %q is not a header name", p.scopeHeader)
	}
	if p.scopeCookie != "" && !httpname.Valid(p.scopeCookie) {
		return fmt.Errorf("gateway: Config.ScopeCookie %q is not a cookie name", p.scopeCookie)
	}
	sources := 0
	for _, set := range []bool{p.scopeHeader != "", p.scopeCookie != "", p.scopeNone, p.ownScope} {
		if set {
			sources++
		}
	}
	if sources > 1 {
		return errors.New("gateway: more than one scope source is set: Config.ScopeHeader, Config.ScopeCookie, Config.ScopeNone and Config.Idempotency.Scope exclude each other")
	}
	for _, m := range p.mw.Methods {
		if !p.off && isSafe(strings.ToUpper(m)) {
			// Safe methods have no effect to do twice, and Go's HTTP client resends them
			// by itself on a broken connection, which would break one forward per claim.
			return fmt.Errorf("gateway: Config.Idempotency.Methods: %s is a safe method and cannot need a key", strings.ToUpper(m))
		}
	}
	var err error
	if p.mw, err = p.mw.Resolve(); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	return checkTTL(p.mw, p.upstreamTimeout)
}

func isSafe(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// checkPattern reports whether ServeMux accepts pattern, and returns the method it
// names ("" for all methods).
func checkPattern(pattern string) (method string, err error) {
	if pattern == "" {
		return "", errors.New("Pattern is empty")
	}
	if err := handle(http.NewServeMux(), pattern, http.NotFoundHandler()); err != nil {
		return "", fmt.Errorf("not a net/http pattern: %w", err)
	}
	if i := strings.IndexAny(pattern, " \t"); i >= 0 && !strings.HasPrefix(pattern, "/") {
		method = pattern[:i]
	}
	return method, nil
}

// conflicts returns an error naming the route that pattern conflicts with, of those
// before it.
func conflicts(ps []policy, i int) error {
	for j := range i {
		if err := register(http.NewServeMux(), ps[j].pattern, ps[i].pattern); err != nil {
			return fmt.Errorf("the pattern conflicts with route %q: requests match both and neither is more specific", ps[j].pattern)
		}
	}
	return errors.New("the pattern conflicts with another route's")
}

// register adds patterns to mux, or returns the error ServeMux panics with.
func register(mux *http.ServeMux, patterns ...string) error {
	for _, p := range patterns {
		if err := handle(mux, p, http.NotFoundHandler()); err != nil {
			return err
		}
	}
	return nil
}

// handle is mux.Handle, with the panic by which ServeMux reports a pattern it cannot
// parse, or one that conflicts with another, returned as an error.
func handle(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

// routeHandler marks a route in a table's ServeMux: the mux finds the route, the
// gateway serves it.
type routeHandler struct{ rt *route }

func (routeHandler) ServeHTTP(http.ResponseWriter, *http.Request) {}

// table is the gateway's routes at one moment. A reload swaps in a new table; a
// request keeps the route it was matched to.
type table struct {
	mux       *http.ServeMux // nil: one route, single
	single    *route
	byPattern map[string]*route
	fallback  *route // the catch-all; nil: none
}

// match returns the route of r, or nil when none matches.
func (t *table) match(r *http.Request) *route {
	if t.mux == nil {
		return t.single
	}
	probe := r
	if up := upperASCII(r.Method); up != r.Method {
		probe = r.Clone(r.Context()) // rare: a method not in canonical case
		probe.Method = up
	}
	h, pattern := t.mux.Handler(probe)
	if rh, ok := h.(routeHandler); ok {
		return rh.rt
	}
	// ServeMux answers a path that is not clean, and /tree when /tree/ is a route, with a
	// redirect, and names the route the redirect goes to: the request has that route.
	if rt := t.byPattern[pattern]; rt != nil {
		return rt
	}
	return t.fallback
}

func upperASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if 'a' <= s[i] && s[i] <= 'z' {
			return strings.ToUpper(s)
		}
	}
	return s
}
