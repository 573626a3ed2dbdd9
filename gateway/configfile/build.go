package configfile

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
)

// placeholder stands in for an upstream where a check needs one and the file has
// none, or has one in error (reported already): the checks it serves do not look at
// the URL. It is in a File only for a URL that names a variable not set, with
// Options.AllowUnsetEnv.
func placeholder() *url.URL { return &url.URL{Scheme: "http", Host: "upstream.invalid"} }

// renamed is an error of the packages' checks with the file's names in its message
// (ttl, not Config.Idempotency.TTL); it wraps the original.
type renamed struct {
	msg string
	err error
}

func (e *renamed) Error() string { return e.msg }
func (e *renamed) Unwrap() error { return e.err }

// plain returns err without its package prefixes, which name no place in the file.
func plain(err error) error {
	msg := err.Error()
	for {
		t := strings.TrimPrefix(strings.TrimPrefix(msg, "gateway: "), "idempotency: ")
		if t == msg {
			return &renamed{msg: msg, err: err}
		}
		msg = t
	}
}

// yamlNames writes the Go field names of gateway.Config, gateway.Route and
// idempotency.Config in msg as the file's keys, so that an error reads in the terms of
// the file it is about.
func yamlNames(msg string) string {
	fields := []struct{ from, to string }{
		{"MaxWaitersPerKey", "max_waiters_per_key"}, {"MaxBodyMemory", "max_body_memory"},
		{"FingerprintIgnore", "fingerprint.ignore"}, {"UpstreamTimeout", "upstream_timeout"},
		{"ShutdownTimeout", "shutdown_timeout"}, {"StoreTimeout", "store_timeout"},
		{"BodyTimeout", "body_timeout"}, {"WaitTimeout", "wait_timeout"}, {"MaxResponse", "max_response"},
		{"MaxWaiters", "max_waiters"}, {"KeyPointer", "key.pointer"}, {"KeyHeader", "key.header"},
		{"KeyOptional", "mode optional"}, {"ScopeHeader", "scope.header"}, {"ScopeCookie", "scope.cookie"},
		{"ScopeNone", "scope none"}, {"Upstream", "upstream"}, {"FailOpen", "on_store_error open"},
		{"Conflict", "conflict"}, {"Methods", "methods"}, {"MaxBody", "max_body"}, {"Lease", "lease"},
		{"TTL", "ttl"}, {"Pattern", "match"},
	}
	var pairs []string
	for _, f := range fields {
		for _, prefix := range []string{"Config.Idempotency.", "Config.", "Idempotency."} {
			pairs = append(pairs, prefix+f.from, f.to)
		}
	}
	pairs = append(pairs, "make the route Off", "set mode: off", "make it Off", "set mode: off",
		"Pattern is empty", "match is empty")
	// Longer names first, so that Config.MaxBodyMemory is not read as Config.MaxBody.
	type pair struct{ from, to string }
	ps := make([]pair, 0, len(pairs)/2)
	for i := 0; i < len(pairs); i += 2 {
		ps = append(ps, pair{pairs[i], pairs[i+1]})
	}
	slices.SortStableFunc(ps, func(a, b pair) int { return len(b.from) - len(a.from) })
	args := make([]string, 0, len(pairs))
	for _, p := range ps {
		args = append(args, p.from, p.to)
	}
	return strings.NewReplacer(args...).Replace(msg)
}

// indexWord returns the index of the first occurrence of word in s that is not part
// of a longer word (max_body in max_body_memory), or -1.
func indexWord(s, word string) int {
	isWord := func(c byte) bool {
		return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
	}
	for off := 0; off < len(s); {
		i := strings.Index(s[off:], word)
		if i < 0 {
			return -1
		}
		i += off
		end := i + len(word)
		if (i == 0 || !isWord(s[i-1])) && (end == len(s) || !isWord(s[end])) {
			return i
		}
		off = i + 1
	}
	return -1
}

// locate returns where an error of s's check belongs: the first key of s that msg
// names, else the first gateway-wide key it names, else s itself.
func (p *parser) locate(d *doc, s *spec, msg string) (pos, string) {
	best, bestKey := -1, ""
	var at pos
	path := s.path
	for _, k := range slices.Sorted(maps.Keys(s.own)) {
		if i := indexWord(msg, k); i >= 0 && (best < 0 || i < best || i == best && len(k) > len(bestKey)) {
			best, bestKey, at = i, k, s.own[k]
		}
	}
	if best >= 0 {
		return at, path
	}
	for _, k := range []string{"max_body_memory", "max_waiters", "shutdown_timeout"} { // the gateway-wide keys
		if w, set := d.own[k]; set {
			if i := indexWord(msg, k); i >= 0 && (best < 0 || i < best) {
				best, at, path = i, w, k
			}
		}
	}
	if best >= 0 {
		return at, path
	}
	return s.at, s.path
}

// inherit returns route r with every key it does not set taken from defaults d. A
// key in error in d is in error in the result, so that it is not checked again.
func inherit(d, r *spec) *spec {
	m := *r
	m.bad = maps.Clone(r.bad)
	from := func(key string) bool {
		if _, own := r.own[key]; own || r.bad[key] {
			return false
		}
		if d.bad[key] {
			m.bad[key] = true
		}
		return true
	}
	if from("mode") {
		m.mode = d.mode
	}
	// A route whose pattern names a method receives only requests of that method: the
	// defaults' methods would add nothing to it, and the gateway keys that method.
	if patternMethod(r.match) == "" && from("methods") {
		m.methods = d.methods
	}
	if from("key") {
		m.keyHeader, m.keyPointer = d.keyHeader, d.keyPointer
	}
	if from("scope") {
		m.scopeKind, m.scopeName = d.scopeKind, d.scopeName
	}
	if from("fingerprint") {
		m.fingerprintMode, m.fingerprintIgnore = d.fingerprintMode, d.fingerprintIgnore
	}
	if from("ttl") {
		m.ttl = d.ttl
	}
	if from("lease") {
		m.lease = d.lease
	}
	if from("upstream_timeout") {
		m.upstreamTimeout = d.upstreamTimeout
	}
	if from("store_timeout") {
		m.storeTimeout = d.storeTimeout
	}
	if from("body_timeout") {
		m.bodyTimeout = d.bodyTimeout
	}
	if from("wait_timeout") {
		m.waitTimeout = d.waitTimeout
	}
	if from("max_body") {
		m.maxBody = d.maxBody
	}
	if from("max_response") {
		m.maxResponse = d.maxResponse
	}
	if from("on_store_error") {
		m.onStoreError = d.onStoreError
	}
	if from("conflict") {
		m.conflict = d.conflict
	}
	if from("max_waiters_per_key") {
		m.maxWaitersPerKey = d.maxWaitersPerKey
	}
	return &m
}

// idempotency is the middleware's part of s; unset keys are zero, the packages'
// defaults, but for the conflict policy, DefaultConflict.
func (s *spec) idempotency() idempotency.Config {
	return idempotency.Config{
		Methods:           slices.Clone(s.methods),
		KeyHeader:         s.keyHeader,
		KeyPointer:        s.keyPointer,
		FingerprintIgnore: slices.Clone(s.fingerprintIgnore),
		CanonicalJSON:     s.fingerprintMode == "json",
		KeyOptional:       s.mode == "optional",
		Lease:             s.lease,
		TTL:               s.ttl,
		MaxBody:           s.maxBody,
		BodyTimeout:       s.bodyTimeout,
		MaxResponse:       s.maxResponse,
		FailOpen:          s.onStoreError == "open",
		Conflict:          cmp.Or(idempotency.Conflict(s.conflict), DefaultConflict),
		WaitTimeout:       s.waitTimeout,
		MaxWaitersPerKey:  s.maxWaitersPerKey,
		StoreTimeout:      s.storeTimeout,
	}
}

// route is s as a gateway.Route.
func (s *spec) route(pattern string, up *url.URL) gateway.Route {
	r := gateway.Route{Pattern: pattern, Off: s.mode == "off", Upstream: up, Idempotency: s.idempotency(),
		UpstreamTimeout: s.upstreamTimeout}
	switch s.scopeKind {
	case "header":
		r.ScopeHeader = s.scopeName
	case "cookie":
		r.ScopeCookie = s.scopeName
	case "none":
		r.ScopeNone = true
	}
	return r
}

// ref resolves the upstream s names, a name of upstreams or a URL; bad is true when it
// is in error (reported).
func (p *parser) ref(f *File, d *doc, s *spec) (u *url.URL, label string, bad bool) {
	at, path, ref := s.own["upstream"], join(s.path, "upstream"), s.upstream
	if s.upstreamUnset { // listed in UnsetEnv: it can be checked no further
		return placeholder(), ref, false
	}
	if strings.Contains(ref, "://") {
		u, err := gateway.ParseUpstream(ref)
		if err != nil {
			p.report(at, path, plain(err))
			return nil, "", true
		}
		return u, u.Redacted(), false
	}
	if u, ok := f.Upstreams[ref]; ok {
		return u, ref, false
	}
	if d.badUpstream[ref] {
		return nil, "", true
	}
	if names := p.upstreamList(d); names != "" {
		p.errorf(at, path, "unknown upstream %q: want one of %s, or an absolute URL (http://host:port)", ref, names)
	} else {
		p.errorf(at, path, "unknown upstream %q: upstreams names none; want an absolute URL (http://host:port)", ref)
	}
	return nil, "", true
}

func (p *parser) upstreamList(d *doc) string {
	var names []string
	for _, n := range d.upstreamNames {
		if !d.badUpstream[n] {
			names = append(names, n)
		}
	}
	return strings.Join(names, ", ")
}

// check resolves the policy s alone, as a route of pattern, and returns the message
// of its error, or "".
func (p *parser) check(s *spec, pattern string, up *url.URL, gw idempotency.Config) (string, error) {
	cfg := gateway.Config{Idempotency: gw, Routes: []gateway.Route{s.route(pattern, up)}}
	_, err := cfg.Resolve()
	if err == nil {
		return "", nil
	}
	inner := err
	var re *gateway.RouteError
	if errors.As(err, &re) {
		inner = re.Err
	}
	return yamlNames(plain(inner).Error()), err
}

// build checks the policies of d, each alone and then together, and fills in
// f.Gateway; the errors are reported.
func (p *parser) build(f *File, d *doc) {
	def := d.defaults
	if def == nil {
		def = newSpec("defaults", pos{})
	}
	gw := idempotency.Config{MaxBodyMemory: d.maxBodyMemory, MaxWaiters: d.maxWaiters}

	// The defaults' upstream, which is the catch-all's: the one named, else the only
	// one there is.
	var defUp *url.URL
	defLabel, defBad := "", def.bad["upstream"]
	switch _, named := def.own["upstream"]; {
	case named:
		defUp, defLabel, defBad = p.ref(f, d, def)
	case len(d.upstreamNames) == 1:
		name := d.upstreamNames[0]
		if defUp = f.Upstreams[name]; defUp != nil {
			defLabel = name
		} else {
			defBad = true
		}
	}
	if defUp == nil && !defBad && len(d.routes) == 0 {
		if len(d.upstreamNames) > 1 {
			p.errorf(d.upstreamsAt, "upstreams", "there are several and no route: name the one for all requests in defaults.upstream")
		} else {
			p.errorf(pos{}, "", "no upstream: add upstreams (name: URL) and routes, or defaults.upstream")
		}
	}

	// Each policy alone, so that every one's error is reported; an error a route
	// inherits from the defaults is reported once, at the defaults.
	defMsg := ""
	if checkable(def) {
		var err error
		if defMsg, err = p.check(def, "/", orPlaceholder(defUp), gw); err != nil {
			at, path := p.locate(d, def, defMsg)
			p.report(at, path, &renamed{msg: defMsg, err: err})
		}
	}
	merged := make([]*spec, len(d.routes))
	ups := make([]*url.URL, len(d.routes))
	labels := make([]string, len(d.routes))
	for i, r := range d.routes {
		m := inherit(def, r)
		merged[i] = m
		switch _, named := r.own["upstream"]; {
		case named:
			var bad bool
			if ups[i], labels[i], bad = p.ref(f, d, r); bad {
				m.bad["upstream"] = true
			}
		case r.bad["upstream"] || defBad:
			m.bad["upstream"] = true
		case defUp != nil:
			ups[i], labels[i] = defUp, defLabel
		case r.bad["match"]:
			// Without a pattern the route is not checked further.
		default:
			if list := p.upstreamList(d); list != "" {
				p.errorf(r.at, r.path, "no upstream: name one of %s in upstream (defaults names none)", list)
			} else {
				p.errorf(r.at, r.path, "no upstream: the file has none; add one under upstreams: (name: URL) or set upstream: to a URL")
			}
			m.bad["upstream"] = true
		}
		if !checkable(m) {
			continue
		}
		if msg, err := p.check(m, m.match, orPlaceholder(ups[i]), gw); err != nil && msg != defMsg {
			at, path := p.locate(d, r, msg)
			p.report(at, path, &renamed{msg: msg, err: err})
		}
	}
	p.conflicts(d, defUp != nil || defBad)
	if len(p.errs) > 0 {
		return
	}

	// The gateway: the routes in the file's order, and the requests no route matches
	// with the defaults' policy, if the defaults have an upstream.
	cfg := gateway.Config{ShutdownTimeout: f.Gateway.ShutdownTimeout, Idempotency: gw, Upstream: defUp}
	userRoot := slices.ContainsFunc(d.routes, func(r *spec) bool { return r.match == "/" })
	var synth *gateway.Route
	if defUp != nil && !userRoot {
		if root := def.route("/", defUp); root.Off {
			// The Config's own fields cannot forward untouched: a route "/" does.
			synth = &root
		} else {
			cfg.Idempotency = root.Idempotency
			cfg.Idempotency.MaxBodyMemory, cfg.Idempotency.MaxWaiters = gw.MaxBodyMemory, gw.MaxWaiters
			cfg.ScopeHeader, cfg.ScopeCookie, cfg.ScopeNone = root.ScopeHeader, root.ScopeCookie, root.ScopeNone
			cfg.UpstreamTimeout = root.UpstreamTimeout
			f.catchAll = defLabel
		}
	}
	for i, m := range merged {
		cfg.Routes = append(cfg.Routes, m.route(m.match, ups[i]))
		f.routes = append(f.routes, routeInfo{upstream: labels[i]})
	}
	if synth != nil {
		cfg.Routes = append(cfg.Routes, *synth)
		f.routes = append(f.routes, routeInfo{upstream: defLabel, catchAll: true})
	}
	f.Gateway = cfg
	f.declaredHere = len(d.routes)
	// Every check has passed, each policy alone and the patterns together; this one
	// holds anyway, so that a File is always a Config that Resolve accepts.
	if _, err := cfg.Resolve(); err != nil {
		s, inner := def, err
		var re *gateway.RouteError
		if errors.As(err, &re) {
			inner = re.Err
			if re.Index >= 0 && re.Index < len(merged) {
				s = d.routes[re.Index]
			}
		}
		msg := yamlNames(plain(inner).Error())
		at, path := p.locate(d, s, msg)
		p.report(at, path, &renamed{msg: msg, err: err})
	}
}

// checkable reports whether s can be checked as a whole: a value in error (reported)
// would make the checks report its consequences too. An upstream takes no part in
// them.
func checkable(s *spec) bool {
	for k := range s.bad {
		if k != "upstream" {
			return false
		}
	}
	return true
}

func orPlaceholder(u *url.URL) *url.URL {
	if u == nil {
		return placeholder()
	}
	return u
}

// conflicts reports the routes whose patterns are another's, or conflict with one
// (requests match both and neither is more specific), as the gateway decides. A
// gateway reports the first; the route is then left out and the rest checked again,
// so that every conflict is reported.
func (p *parser) conflicts(d *doc, catchAll bool) {
	var live []*spec
	first := map[string]*spec{}
	for _, r := range d.routes {
		if r.bad["match"] {
			continue
		}
		if f, dup := first[r.match]; dup {
			p.errorf(r.at, r.path, "the pattern %q is also %s's (%s)", r.match, f.path, where(f.at))
			continue
		}
		first[r.match] = r
		live = append(live, r)
	}
	for range len(live) + 1 {
		cfg := gateway.Config{Routes: make([]gateway.Route, len(live))}
		if catchAll {
			cfg.Upstream = placeholder()
		}
		for i, r := range live {
			cfg.Routes[i] = gateway.Route{Pattern: r.match, Off: true, Upstream: placeholder(),
				Idempotency: idempotency.Config{Methods: idempotency.DefaultMethods()}} // the patterns only
		}
		_, err := cfg.Resolve()
		if err == nil {
			return
		}
		var re *gateway.RouteError
		if !errors.As(err, &re) || re.Index < 0 || re.Index >= len(live) {
			p.report(pos{}, "", plain(err))
			return
		}
		r := live[re.Index]
		p.report(r.at, r.path, &renamed{msg: yamlNames(plain(re.Err).Error()), err: re})
		live = slices.Delete(live, re.Index, re.Index+1)
	}
}

func where(at pos) string {
	if at.source != "" {
		return at.source
	}
	return fmt.Sprintf("line %d", at.line)
}
