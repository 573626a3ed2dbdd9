package configfile_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/gateway/configfile"
	"github.com/retrysafe/retrysafe/idempotency"
)

// env is a LookupEnv over vars.
func env(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

func parse(src string, opt configfile.Options) (*configfile.File, error) {
	if opt.LookupEnv == nil {
		opt.LookupEnv = env(nil)
	}
	return configfile.Parse("gw.yaml", []byte(src), opt)
}

func mustParse(t *testing.T, src string, opt configfile.Options) *configfile.File {
	t.Helper()
	f, err := parse(src, opt)
	if err != nil {
		t.Fatalf("Parse:\n%v", err)
	}
	if _, err := f.Gateway.Resolve(); err != nil {
		t.Fatalf("Resolve of a parsed file: %v", err)
	}
	return f
}

// errorsOf returns the *configfile.Error values err joins.
func errorsOf(t *testing.T, err error) []*configfile.Error {
	t.Helper()
	var j interface{ Unwrap() []error }
	if !errors.As(err, &j) {
		t.Fatalf("not a joined error: %v", err)
	}
	var out []*configfile.Error
	for _, e := range j.Unwrap() {
		var ce *configfile.Error
		if !errors.As(e, &ce) {
			t.Fatalf("not a *configfile.Error: %T %v", e, e)
		}
		out = append(out, ce)
	}
	return out
}

func route(t *testing.T, f *configfile.File, pattern string) gateway.Route {
	t.Helper()
	for _, r := range f.Gateway.Routes {
		if r.Pattern == pattern {
			return r
		}
	}
	t.Fatalf("no route %q", pattern)
	return gateway.Route{}
}

func TestConfigExample(t *testing.T) {
	t.Parallel()
	f, err := configfile.Load(filepath.Join("..", "..", "examples", "gateway.yaml"), configfile.Options{LookupEnv: env(nil)})
	if err != nil {
		t.Fatalf("Load:\n%v", err)
	}
	if _, err := f.Gateway.Resolve(); err != nil {
		t.Fatal(err)
	}
	if f.Listen != "127.0.0.1:8080" || f.Admin != "127.0.0.1:9090" || f.Store != "sqlite:retrysafe.db" || f.LogFormat != "json" || f.LogLevel != "info" {
		t.Errorf("top level: %+v", f)
	}
	if f.RouteCount() != 6 || len(f.Gateway.Routes) != 6 || len(f.Upstreams) != 2 {
		t.Fatalf("%d routes (%d in the Config), %d upstreams", f.RouteCount(), len(f.Gateway.Routes), len(f.Upstreams))
	}
	api, hooks := f.Upstreams["api"], f.Upstreams["hooks"]
	if f.Gateway.Upstream != api || f.Gateway.ShutdownTimeout != 35*time.Second {
		t.Errorf("catch-all upstream %v, shutdown %s", f.Gateway.Upstream, f.Gateway.ShutdownTimeout)
	}
	if p := route(t, f, "POST /payments"); p.Idempotency.Conflict != idempotency.ConflictWait || p.Idempotency.WaitTimeout != 20*time.Second ||
		p.Upstream != api || p.Idempotency.TTL != 24*time.Hour || p.UpstreamTimeout != 30*time.Second {
		t.Errorf("payments: %+v", p)
	}
	if r := route(t, f, "POST /payments/{id}/refunds"); r.Idempotency.Conflict != idempotency.ConflictReject {
		t.Errorf("refunds: conflict %q, want reject", r.Idempotency.Conflict)
	}
	if s := route(t, f, "POST /search"); !s.Off {
		t.Errorf("search is not off: %+v", s)
	}
	if a := route(t, f, "POST /admin/"); a.ScopeCookie != "session" {
		t.Errorf("admin: %+v", a)
	}
	if g := route(t, f, "POST /webhooks/github"); g.Idempotency.KeyHeader != "X-GitHub-Delivery" || !g.ScopeNone || g.Upstream != hooks {
		t.Errorf("github: %+v", g)
	}
	s := route(t, f, "POST /webhooks/stripe")
	if s.Idempotency.KeyPointer != "/id" || !s.ScopeNone || s.Upstream != hooks || !slices.Equal(s.Idempotency.FingerprintIgnore, []string{"/pending_webhooks"}) ||
		s.Idempotency.MaxBody != 512<<10 || s.Idempotency.KeyHeader != "" {
		t.Errorf("stripe: %+v", s)
	}
	var b strings.Builder
	if err := f.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	table := b.String()
	for _, want := range []string{
		"ROUTE ", "POST /payments ", "wait 20s", "pointer /id", "json, ignore /pending_webhooks", "cookie session",
		"header X-GitHub-Delivery", "body 512KiB, response 4MiB", "/ (catch-all)", "hooks     http://127.0.0.1:3001",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
	if lines := strings.Split(strings.TrimSpace(table), "\n"); !strings.HasPrefix(lines[len(lines)-1], "/ (catch-all)") {
		t.Errorf("the catch-all is not last:\n%s", table)
	}
}

// A route takes each key it leaves out from the defaults, and the packages' default
// when the defaults leave it out too; key, scope and fingerprint are taken whole.
func TestConfigInheritance(t *testing.T) {
	t.Parallel()
	f := mustParse(t, `
upstreams: {api: "http://a:1"}
defaults:
  ttl: 2h
  lease: 10s
  key: {header: X-Key}
  scope: {header: X-User}
  fingerprint: {mode: json}
  methods: [POST, PUT]
  mode: optional
  on_store_error: open
routes:
  - match: POST /own
    ttl: 3h
    key: {pointer: /id}
    scope: none
    fingerprint: {ignore: [/at]}
    mode: required
  - match: POST /inherits
  - match: /any
`, configfile.Options{})
	own, inh, any := route(t, f, "POST /own"), route(t, f, "POST /inherits"), route(t, f, "/any")
	if own.Idempotency.TTL != 3*time.Hour || own.Idempotency.Lease != 10*time.Second {
		t.Errorf("own ttl, inherited lease: %+v", own.Idempotency)
	}
	if own.Idempotency.KeyPointer != "/id" || own.Idempotency.KeyHeader != "" || !own.ScopeNone || own.ScopeHeader != "" {
		t.Errorf("key and scope are not replaced whole: %+v", own)
	}
	if !slices.Equal(own.Idempotency.FingerprintIgnore, []string{"/at"}) || own.Idempotency.CanonicalJSON {
		t.Errorf("fingerprint: %+v", own.Idempotency)
	}
	if own.Idempotency.KeyOptional || !own.Idempotency.FailOpen {
		t.Errorf("mode required, on_store_error inherited: %+v", own.Idempotency)
	}
	if inh.Idempotency.TTL != 2*time.Hour || inh.Idempotency.KeyHeader != "X-Key" || inh.ScopeHeader != "X-User" ||
		!inh.Idempotency.CanonicalJSON || !inh.Idempotency.KeyOptional || !inh.Idempotency.FailOpen {
		t.Errorf("inherits: %+v", inh)
	}
	// The packages' defaults are zero fields, and the defaults' methods reach only a
	// route whose pattern names no method.
	if inh.Idempotency.MaxBody != 0 || inh.UpstreamTimeout != 0 || len(inh.Idempotency.Methods) != 0 {
		t.Errorf("package defaults: %+v", inh)
	}
	if !slices.Equal(any.Idempotency.Methods, []string{"POST", "PUT"}) {
		t.Errorf("methods of /any: %v", any.Idempotency.Methods)
	}
	// The catch-all is the defaults.
	if c := f.Gateway; c.Upstream == nil || c.Idempotency.TTL != 2*time.Hour || c.ScopeHeader != "X-User" || !c.Idempotency.KeyOptional {
		t.Errorf("catch-all: %+v", c)
	}
}

func TestConfigUpstreams(t *testing.T) {
	t.Parallel()
	t.Run("the only one is the default", func(t *testing.T) {
		t.Parallel()
		f := mustParse(t, "upstreams: {api: 'http://a:1/v1'}\n", configfile.Options{})
		if f.Gateway.Upstream == nil || f.Gateway.Upstream.String() != "http://a:1/v1" || f.RouteCount() != 0 {
			t.Errorf("%+v", f.Gateway)
		}
	})
	t.Run("a URL in defaults", func(t *testing.T) {
		t.Parallel()
		f := mustParse(t, "defaults: {upstream: 'https://api.example'}\n", configfile.Options{})
		if f.Gateway.Upstream.String() != "https://api.example" || len(f.Upstreams) != 0 {
			t.Errorf("%+v", f.Gateway)
		}
	})
	t.Run("several and none named: no catch-all", func(t *testing.T) {
		t.Parallel()
		f := mustParse(t, `
upstreams: {a: "http://a:1", b: "http://b:1"}
routes:
  - {match: POST /a, upstream: a}
  - {match: POST /b, upstream: b}
  - {match: POST /c, upstream: "http://c:1"}
`, configfile.Options{})
		if f.Gateway.Upstream != nil || len(f.Gateway.Routes) != 3 {
			t.Fatalf("%+v", f.Gateway)
		}
		if route(t, f, "POST /b").Upstream != f.Upstreams["b"] || route(t, f, "POST /c").Upstream.Host != "c:1" {
			t.Errorf("%+v", f.Gateway.Routes)
		}
		var b strings.Builder
		if err := f.WriteTable(&b); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), "404: no route") || !strings.Contains(b.String(), "http://c:1") {
			t.Errorf("table:\n%s", b.String())
		}
	})
}

// Defaults with mode off forward the requests no route matches untouched: the Config
// has a route "/" for them, unless the file has its own.
func TestConfigCatchAllOff(t *testing.T) {
	t.Parallel()
	f := mustParse(t, `
upstreams: {api: "http://a:1"}
defaults: {mode: off}
routes:
  - {match: POST /payments, mode: required}
  - {match: GET /report}
`, configfile.Options{})
	if f.RouteCount() != 2 || len(f.Gateway.Routes) != 3 {
		t.Fatalf("%d routes: %+v", f.RouteCount(), f.Gateway.Routes)
	}
	if r := f.Gateway.Routes[2]; r.Pattern != "/" || !r.Off || r.Upstream != f.Upstreams["api"] {
		t.Errorf("catch-all: %+v", r)
	}
	if p := route(t, f, "POST /payments"); p.Off {
		t.Errorf("payments is off")
	}
	if r := route(t, f, "GET /report"); !r.Off {
		t.Errorf("report is not off")
	}
	var b strings.Builder
	if err := f.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(b.String()), " "), "/ (catch-all) off api") {
		t.Errorf("table:\n%s", b.String())
	}

	g := mustParse(t, `
upstreams: {api: "http://a:1"}
defaults: {mode: off}
routes: [{match: /, mode: optional}]
`, configfile.Options{})
	if len(g.Gateway.Routes) != 1 || g.Gateway.Routes[0].Off || !g.Gateway.Routes[0].Idempotency.KeyOptional {
		t.Errorf("the file's own /: %+v", g.Gateway.Routes)
	}
}

// Each bad input is reported at its line, with its path, in the file's terms.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	const ok = "upstreams: {api: 'http://a:1'}\n"
	for _, c := range []struct {
		name, src string
		want      string // one of the errors, whole
	}{
		{"empty", "", `gw.yaml: the file is empty: want a mapping of keys (upstreams, defaults, routes, …)`},
		{"comments only", "# nothing\n", `gw.yaml: the file is empty`},
		{"null document", "---\n~\n", `gw.yaml: the file is empty`},
		{"a list", "- a\n- b\n", `gw.yaml:1: the file is a list: want a mapping`},
		{"a string", "hello\n", `gw.yaml:1: the file is "hello": want a mapping`},
		{"syntax", ok + "defaults:\n  ttl: 1h: 2h\n", `gw.yaml:3: invalid YAML: mapping values are not allowed in this context`},
		{"two documents", ok + "---\nlisten: :1\n", `gw.yaml:2: a second YAML document: a file describes one gateway`},
		{"unknown top", ok + "lisen: :80\n", `gw.yaml:2: unknown field "lisen" (did you mean listen?)`},
		{"unknown in defaults", ok + "defaults:\n  tll: 24h\n", `gw.yaml:3: unknown field "tll" in defaults (did you mean ttl?)`},
		{"unknown in a route", ok + "routes:\n  - match: POST /a\n    colour: red\n", `gw.yaml:4: unknown field "colour" in routes[0]`},
		{"unknown in key", ok + "routes:\n  - match: POST /a\n    key: {header: X, extra: 1}\n", `gw.yaml:4: unknown field "extra" in routes[0].key`},
		{"unknown in fingerprint", ok + "defaults:\n  fingerprint:\n    mode: json\n    ignored: [/a]\n", `gw.yaml:5: unknown field "ignored" in defaults.fingerprint (did you mean ignore?)`},
		{"unknown in scope", ok + "defaults:\n  scope: {head: X}\n", `gw.yaml:3: unknown field "head" in defaults.scope (did you mean header?)`},
		{"unknown in log", ok + "log: {format: json, colour: no}\n", `gw.yaml:2: unknown field "colour" in log`},
		{"match in defaults", ok + "defaults: {match: POST /a}\n", `gw.yaml:2: unknown field "match" in defaults: only a route has a pattern`},
		{"duplicate key", ok + "defaults:\n  ttl: 1h\n  ttl: 2h\n", `gw.yaml:4: duplicate key "ttl" in defaults: also at line 3`},
		{"duplicate top key", ok + "listen: :1\nlisten: :2\n", `gw.yaml:3: duplicate key "listen": also at line 2`},
		{"route without match", ok + "routes:\n  - ttl: 1h\n", `gw.yaml:3: routes[0]: no match: every route needs its pattern (match: POST /payments)`},
		{"route not a mapping", ok + "routes:\n  - POST /a\n", `gw.yaml:3: routes[0]: want a mapping of keys, not "POST /a"`},
		{"routes not a list", ok + "routes: {match: POST /a}\n", `gw.yaml:2: routes: want a list of routes (- match: POST /payments), not a mapping`},
		{"empty match", ok + "routes:\n  - match: ''\n", `gw.yaml:3: routes[0].match: is empty`},
		{"list for a string", ok + "listen: [a]\n", `gw.yaml:2: listen: want a string, not a list`},
		{"mapping for a string", ok + "store: {a: b}\n", `gw.yaml:2: store: want a string, not a mapping`},
		{"no value", ok + "defaults:\n  ttl:\n", `gw.yaml:3: defaults.ttl: has no value`},
		{"non-string key", ok + "defaults:\n  [a]: 1\n", `gw.yaml:3: defaults: a key must be a string, not a list`},
		{"alias", ok + "x: &a 1h\n", `gw.yaml:2: unknown field "x"`},
		{"alias use", ok + "defaults:\n  ttl: &t 1h\n  lease: *t\n", `gw.yaml:4: defaults.lease: aliases (*t) are not supported: put shared settings in defaults`},
		{"bad listen", ok + "listen: 8080\n", `gw.yaml:2: listen: "8080" is not an address: want HOST:PORT (127.0.0.1:8080, :8080)`},
		{"bad admin", ok + "admin: nowhere\n", `gw.yaml:2: admin: "nowhere" is not an address: want HOST:PORT (127.0.0.1:8080, :8080), or "off"`},
		{"bad duration", ok + "routes:\n  - match: POST /a\n    ttl: 5x\n", `gw.yaml:4: routes[0].ttl: "5x" is not a duration (such as 30s, 5m, 24h)`},
		{"zero duration", ok + "defaults: {lease: 0s}\n", `gw.yaml:2: defaults.lease: must be positive, not 0s (leave it out for the default)`},
		{"negative duration", ok + "shutdown_timeout: -1s\n", `gw.yaml:2: shutdown_timeout: must be positive, not -1s`},
		{"bad size", ok + "defaults: {max_body: lots}\n", `gw.yaml:2: defaults.max_body: invalid size "lots"`},
		{"zero size", ok + "max_body_memory: 0\n", `gw.yaml:2: max_body_memory: must be positive, not 0`},
		{"bad count", ok + "max_waiters: many\n", `gw.yaml:2: max_waiters: "many" is not a whole number`},
		{"negative count", ok + "defaults: {max_waiters_per_key: -1}\n", `gw.yaml:2: defaults.max_waiters_per_key: must be positive, not -1`},
		{"bad mode", ok + "defaults: {mode: maybe}\n", `gw.yaml:2: defaults.mode: "maybe" is not a mode: want required, optional or off`},
		{"bool mode", ok + "defaults: {mode: false}\n", `gw.yaml:2: defaults.mode: "false" is not a mode: want required, optional or off`},
		{"bad conflict", ok + "defaults: {conflict: queue}\n", `gw.yaml:2: defaults.conflict: "queue" is not a conflict policy: want reject or wait`},
		{"bad on_store_error", ok + "defaults: {on_store_error: retry}\n", `gw.yaml:2: defaults.on_store_error: "retry" is not a store-error policy: want closed or open`},
		{"bad fingerprint mode", ok + "defaults: {fingerprint: {mode: xml}}\n", `gw.yaml:2: defaults.fingerprint.mode: "xml" is not a fingerprint mode: want full or json`},
		{"fingerprint full with ignore", ok + "defaults: {fingerprint: {mode: full, ignore: [/a]}}\n", `gw.yaml:2: defaults.fingerprint: ignore compares bodies as JSON, which mode full does not`},
		{"fingerprint scalar", ok + "defaults: {fingerprint: json}\n", `gw.yaml:2: defaults.fingerprint: want {mode: full|json, ignore: [/json/pointer, …]}, not "json"`},
		{"bad log format", ok + "log: {format: xml}\n", `gw.yaml:2: log.format: "xml" is not a log format: want text or json`},
		{"bad log level", ok + "log: {level: loud}\n", `gw.yaml:2: log.level: "loud" is not a log level: want debug, info, warn or error`},
		{"key both", ok + "defaults:\n  key: {header: X, pointer: /id}\n", `gw.yaml:3: defaults.key: want exactly one of header and pointer`},
		{"key none", ok + "defaults:\n  key: {}\n", `gw.yaml:3: defaults.key: want exactly one of header and pointer`},
		{"key scalar", ok + "defaults:\n  key: X-Key\n", `gw.yaml:3: defaults.key: want {header: NAME} or {pointer: /json/pointer}, not "X-Key"`},
		{"scope scalar", ok + "defaults: {scope: user}\n", `gw.yaml:2: defaults.scope: "user" is not a scope: want authorization, none, {header: NAME} or {cookie: NAME}`},
		{"scope both", ok + "defaults: {scope: {header: X, cookie: s}}\n", `gw.yaml:2: defaults.scope: want authorization, none, {header: NAME} or {cookie: NAME}: exactly one`},
		{"empty methods", ok + "defaults: {methods: []}\n", `gw.yaml:2: defaults.methods: is empty: leave it out for the default`},
		{"unknown upstream", ok + "routes:\n  - match: POST /a\n    upstream: ap\n", `gw.yaml:4: routes[0].upstream: unknown upstream "ap": want one of api, or an absolute URL (http://host:port)`},
		{"host:port is not a URL", ok + "defaults: {upstream: 'localhost:3000'}\n", `gw.yaml:2: defaults.upstream: unknown upstream "localhost:3000"`},
		{"bad upstream URL", "upstreams:\n  api: ftp://a\n", `gw.yaml:2: upstreams.api: upstream "ftp://a": the scheme must be http or https`},
		{"upstream URL with a query", ok + "routes: [{match: POST /a, upstream: 'http://u:pw@b/?q=1'}]\n", `gw.yaml:2: routes[0].upstream: upstream "http://u:xxxxx@b/?q=1": a query or fragment is not allowed`},
		{"bad upstream name", "upstreams:\n  'a b': http://a\n", `gw.yaml:2: upstreams: "a b" is not an upstream name`},
		{"no upstream", "listen: :1\n", `gw.yaml: no upstream: add upstreams (name: URL) and routes, or defaults.upstream`},
		{"several upstreams, no route", "upstreams:\n  a: http://a\n  b: http://b\n", `gw.yaml:1: upstreams: there are several and no route: name the one for all requests in defaults.upstream`},
		{"empty key header", "upstreams: {a: 'http://a'}\nroutes:\n  - match: POST /x\n    key: {header: ''}\n", `gw.yaml:4: routes[0].key.header: is empty: want the key's header`},
		{"empty key pointer", "upstreams: {a: 'http://a'}\nroutes:\n  - match: POST /x\n    key: {pointer: ' '}\n", `gw.yaml:4: routes[0].key.pointer: is empty: want the key's pointer`},
		{"empty scope cookie", "upstreams: {a: 'http://a'}\nroutes:\n  - match: POST /x\n    scope: {cookie: ''}\n", `gw.yaml:4: routes[0].scope.cookie: is empty: want the cookie's name`},
		{"no upstreams at all", "routes:\n  - match: POST /x\n", `gw.yaml:2: routes[0]: no upstream: the file has none; add one under upstreams: (name: URL) or set upstream: to a URL`},
		{"route without upstream", "upstreams: {a: 'http://a', b: 'http://b'}\nroutes:\n  - match: POST /x\n", `gw.yaml:3: routes[0]: no upstream: name one of a, b in upstream (defaults names none)`},
		{"conflicting patterns", ok + "routes:\n  - match: POST /a/{x}\n  - match: POST /{y}/b\n",
			`gw.yaml:4: routes[1]: the pattern conflicts with route "POST /a/{x}": requests match both and neither is more specific`},
		{"duplicate patterns", ok + "routes:\n  - match: POST /a\n  - match: POST /a\n", `gw.yaml:4: routes[1]: the pattern "POST /a" is also routes[0]'s (line 3)`},
		{"bad pattern", ok + "routes:\n  - match: POST /a/{\n", `gw.yaml:3: routes[0]: not a net/http pattern:`},
		{"ttl under lease", ok + "defaults:\n  lease: 1h\n  ttl: 30m\n", `gw.yaml:4: defaults: ttl (30m0s) must be longer than lease (1h0m0s)`},
		{"ttl under upstream timeout", ok + "routes:\n  - match: POST /a\n    upstream_timeout: 2m\n    ttl: 1m\n",
			`gw.yaml:5: routes[0]: ttl (1m0s) must be longer than upstream_timeout (2m0s), or a record could expire while its request still runs`},
		{"safe method", ok + "routes:\n  - match: GET /report\n", `gw.yaml:3: routes[0]: GET is a safe method and cannot need a key: set mode: off`},
		{"pattern's method not keyed", ok + "routes:\n  - match: POST /a\n    methods: [PATCH]\n",
			`gw.yaml:4: routes[0]: the pattern matches only POST, which is not in methods (PATCH): the route would never need a key; set mode: off or key POST`},
		{"bad header name", ok + "routes:\n  - match: POST /a\n    key: {header: 'a b'}\n", `gw.yaml:4: routes[0]: key.header "a b" is not a header name`},
		{"bad pointer", ok + "routes:\n  - match: POST /a\n    key:\n      pointer: id\n", `gw.yaml:5: routes[0]: key.pointer "id" must name a member of the body (/id)`},
		{"max_body over max_body_memory", ok + "max_body_memory: 1MiB\nroutes:\n  - match: POST /a\n    max_body: 2MiB\n",
			`gw.yaml:5: routes[0]: max_body_memory (1048576) is smaller than max_body (2097152)`},
		{"max_body_memory under the default max_body", ok + "max_body_memory: 512KiB\n",
			`gw.yaml:2: max_body_memory: max_body_memory (524288) is smaller than max_body (1048576)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := parse(c.src, configfile.Options{})
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			for _, e := range errorsOf(t, err) {
				if strings.HasPrefix(e.Error(), c.want) {
					return
				}
			}
			t.Errorf("got\n%v\nwant an error starting %q", err, c.want)
		})
	}
}

// Every error of a file is reported, in the order of the lines, each a *Error.
func TestConfigAllErrors(t *testing.T) {
	t.Parallel()
	_, err := parse(`upstreams: {api: "http://a:1"}
routes:
  - match: POST /b
    upstream: nowhere
  - match: POST /a
    ttl: soon
    lease: 0s
defaults:
  tll: 1h
`, configfile.Options{})
	errs := errorsOf(t, err)
	var got []string
	for _, e := range errs {
		got = append(got, fmt.Sprintf("%d %s", e.Line, e.Path))
	}
	want := []string{"4 routes[0].upstream", "6 routes[1].ttl", "7 routes[1].lease", "9 "}
	if !slices.Equal(got, want) {
		t.Errorf("errors at %q, want %q:\n%v", got, want, err)
	}
	if !errors.Is(err, configfile.ErrUnknownField) {
		t.Errorf("errors.Is(ErrUnknownField) fails: %v", err)
	}
}

func TestConfigErrorValues(t *testing.T) {
	t.Parallel()
	_, err := parse("upstreams: {api: 'http://a:1'}\nroutes:\n  - match: POST /a/{x}\n  - match: POST /{y}/b\n", configfile.Options{})
	var re *gateway.RouteError
	if !errors.As(err, &re) || re.Pattern != "POST /{y}/b" {
		t.Errorf("a conflict is not a *gateway.RouteError: %v", err)
	}
	_, err = parse("upstreams: {api: 'http://a:1'}\nlisten: :1\nlisten: :2\n", configfile.Options{})
	if !errors.Is(err, configfile.ErrDuplicateKey) {
		t.Errorf("not ErrDuplicateKey: %v", err)
	}
	e := &configfile.Error{File: "f.yaml", Line: 3, Path: "defaults.ttl", Err: errors.New("bad")}
	if e.Error() != "f.yaml:3: defaults.ttl: bad" {
		t.Errorf("%q", e.Error())
	}
	e = &configfile.Error{File: "f.yaml", Source: "--ttl", Path: "defaults.ttl", Err: errors.New("bad")}
	if e.Error() != "--ttl: defaults.ttl: bad" {
		t.Errorf("%q", e.Error())
	}
}

func TestConfigEnv(t *testing.T) {
	t.Parallel()
	src := `
listen: "127.0.0.1:${PORT}"
store: "postgres://app:${PGPASS}@db/app"
upstreams:
  api: "http://${API_HOST}:3000"
routes:
  - match: POST /hooks
    upstream: "${HOOKS_URL}"
    key: {header: "${NOT_EXPANDED}"}
`
	vars := map[string]string{"PGPASS": "s3cret", "API_HOST": "api", "HOOKS_URL": "http://hooks:1", "PORT": "1"}
	_, err := parse(src, configfile.Options{LookupEnv: env(vars)})
	// ${…} is not expanded in a key header: it stays, and is no header name.
	if err == nil || !strings.Contains(err.Error(), `key.header "${NOT_EXPANDED}" is not a header name`) {
		t.Fatalf("%v", err)
	}
	f := mustParse(t, strings.Replace(src, `key: {header: "${NOT_EXPANDED}"}`, "", 1), configfile.Options{LookupEnv: env(vars)})
	if f.Listen != "127.0.0.1:${PORT}" || f.Store != "postgres://app:s3cret@db/app" || f.Upstreams["api"].Host != "api:3000" ||
		route(t, f, "POST /hooks").Upstream.Host != "hooks:1" {
		t.Errorf("%+v", f)
	}

	// Unset: an error at the line, for each; set to "": expanded to "".
	_, err = parse(src, configfile.Options{LookupEnv: env(map[string]string{"API_HOST": "api"})})
	for _, want := range []string{
		"gw.yaml:3: store: ${PGPASS}: environment variable not set",
		"gw.yaml:8: routes[0].upstream: ${HOOKS_URL}: environment variable not set",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("lacks %q:\n%v", want, err)
		}
	}
	if !errors.Is(err, configfile.ErrUnsetEnv) {
		t.Errorf("not ErrUnsetEnv: %v", err)
	}
	f = mustParse(t, "store: 'sqlite:${DIR}gw.db'\nupstreams: {api: 'http://a'}\n", configfile.Options{LookupEnv: env(map[string]string{"DIR": ""})})
	if f.Store != "sqlite:gw.db" {
		t.Errorf("store %q", f.Store)
	}
	for src, want := range map[string]string{
		"store: 'sqlite:${DIR'\n": `store: ${ without its closing }`,
		"store: 'sqlite:${1X}'\n": `store: ${1X}: not a variable name`,
	} {
		if _, err := parse(src+"upstreams: {api: 'http://a'}\n", configfile.Options{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", src, err, want)
		}
	}
	// A "$" that starts no ${…} is kept.
	f = mustParse(t, "store: 'redis://:pa$$w@r/0'\nupstreams: {api: 'http://a'}\n", configfile.Options{})
	if f.Store != "redis://:pa$$w@r/0" {
		t.Errorf("store %q", f.Store)
	}
}

// With AllowUnsetEnv (a check of the file away from where it runs), a variable that is
// not set is no error: each use is listed in UnsetEnv, at its line, and the checks that
// need the value are left out; the file's other errors are still reported.
func TestAllowUnsetEnv(t *testing.T) {
	t.Parallel()
	src := `store: "postgres://app:${PGPASS}@db/app"
admin_token: ${TOKEN}
upstreams:
  api: "http://${API_HOST}:3000"
routes:
  - match: POST /hooks
    upstream: "${HOOKS_URL}"
  - match: POST /pay
    upstream: api
`
	checked := 0
	opt := configfile.Options{AllowUnsetEnv: true, CheckStore: func(string) error { checked++; return nil }}
	f := mustParse(t, src, opt)
	var got []string
	for _, e := range f.UnsetEnv {
		if !errors.Is(e, configfile.ErrUnsetEnv) {
			t.Errorf("%v is not ErrUnsetEnv", e)
		}
		got = append(got, e.Error())
	}
	want := []string{
		"gw.yaml:1: store: ${PGPASS}: environment variable not set",
		"gw.yaml:2: admin_token: ${TOKEN}: environment variable not set",
		"gw.yaml:4: upstreams.api: ${API_HOST}: environment variable not set",
		"gw.yaml:7: routes[0].upstream: ${HOOKS_URL}: environment variable not set",
	}
	if !slices.Equal(got, want) {
		t.Errorf("UnsetEnv:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if checked != 0 {
		t.Errorf("the store DSN was checked %d times without its variable", checked)
	}
	if n := f.RouteCount(); n != 2 {
		t.Errorf("%d routes, want 2", n)
	}
	// The file's own errors are still errors, beside its unset variables.
	if _, err := parse(src+"    ttl: soon\n", opt); err == nil || !strings.Contains(err.Error(), "gw.yaml:10: routes[1].ttl") ||
		!strings.Contains(err.Error(), want[0]) {
		t.Errorf("a bad ttl: %v", err)
	}
	// All set: nothing is listed.
	all := env(map[string]string{"PGPASS": "p", "TOKEN": "t", "API_HOST": "api", "HOOKS_URL": "http://hooks:1"})
	if f := mustParse(t, src, configfile.Options{AllowUnsetEnv: true, LookupEnv: all}); len(f.UnsetEnv) != 0 {
		t.Errorf("UnsetEnv %v with every variable set", f.UnsetEnv)
	}
}

func TestConfigCheckStore(t *testing.T) {
	t.Parallel()
	check := func(dsn string) error {
		if strings.HasPrefix(dsn, "mysql:") {
			return errors.New("unknown store")
		}
		return nil
	}
	_, err := parse("upstreams: {api: 'http://a'}\nstore: mysql://db\n", configfile.Options{CheckStore: check})
	if err == nil || err.Error() != "gw.yaml:2: store: unknown store" {
		t.Errorf("%v", err)
	}
	mustParse(t, "upstreams: {api: 'http://a'}\nstore: 'memory:'\n", configfile.Options{CheckStore: check})
}

func TestConfigOverrides(t *testing.T) {
	t.Parallel()
	const src = `
upstreams: {api: "http://a:1"}
defaults:
  ttl: 2h
  key: {header: X-Key}
  scope: authorization
routes:
  - match: POST /own
    ttl: 3h
  - match: POST /inherits
`
	f := mustParse(t, src, configfile.Options{Overrides: []configfile.Override{
		{Key: "defaults.ttl", Value: "5h", Source: "--ttl"},
		{Key: "defaults.key.pointer", Value: "/id", Source: "--key-pointer"},
		{Key: "defaults.scope.cookie", Value: "sid", Source: "--scope-cookie"},
		{Key: "defaults.methods", Value: "POST, PUT", Source: "--methods"},
		{Key: "defaults.lease", Value: "1m", Source: "--lease"},
		{Key: "listen", Value: ":9", Source: "--listen"},
		{Key: "log.level", Value: "debug", Source: "--log-level"},
		{Key: "upstreams.hooks", Value: "http://h:2", Source: "--hooks"},
		{Key: "defaults.upstream", Value: "hooks", Source: "--upstream"},
	}})
	own, inh := route(t, f, "POST /own"), route(t, f, "POST /inherits")
	if own.Idempotency.TTL != 3*time.Hour || inh.Idempotency.TTL != 5*time.Hour || inh.Idempotency.Lease != time.Minute {
		t.Errorf("ttl: the route's own wins, the override replaces the defaults': %s %s", own.Idempotency.TTL, inh.Idempotency.TTL)
	}
	if inh.Idempotency.KeyPointer != "/id" || inh.Idempotency.KeyHeader != "" || inh.ScopeCookie != "sid" {
		t.Errorf("key and scope are replaced whole: %+v", inh)
	}
	if !slices.Equal(f.Gateway.Idempotency.Methods, []string{"POST", "PUT"}) || f.Listen != ":9" || f.LogLevel != "debug" {
		t.Errorf("methods %v, listen %q, log level %q", f.Gateway.Idempotency.Methods, f.Listen, f.LogLevel)
	}
	if f.Gateway.Upstream.Host != "h:2" || inh.Upstream.Host != "h:2" || len(f.Upstreams) != 2 {
		t.Errorf("upstream: %v %v", f.Gateway.Upstream, inh.Upstream)
	}

	// An override's errors name its Source; its value is taken as it is.
	for _, c := range []struct {
		o    configfile.Override
		want string
	}{
		{configfile.Override{Key: "defaults.ttl", Value: "5x", Source: "--ttl"}, `--ttl: defaults.ttl: "5x" is not a duration`},
		{configfile.Override{Key: "defaults.ttl", Value: "1s", Source: "--ttl"}, `--ttl: defaults: ttl (1s) must be longer than lease (30s)`},
		{configfile.Override{Key: "defaults.tll", Value: "1h", Source: "--tll"}, `--tll: unknown field "tll" in defaults (did you mean ttl?)`},
		{configfile.Override{Key: "defaults.scope", Value: "user", Source: "--scope"}, `--scope: defaults.scope: "user" is not a scope`},
		{configfile.Override{Key: "routes.ttl", Value: "1h", Source: "--x"}, `--x: cannot set routes.ttl: routes is a list in the file`},
		{configfile.Override{Key: "defaults..ttl", Value: "1h", Source: "--y"}, `--y: "defaults..ttl" is not a key of the file`},
		{configfile.Override{Key: "defaults.upstream", Value: "${API}", Source: "--upstream"}, `--upstream: defaults.upstream: unknown upstream "${API}"`},
		{configfile.Override{Key: "defaults.ttl", Value: "bad"}, `override defaults.ttl: defaults.ttl: "bad" is not a duration`},
	} {
		_, err := parse(src, configfile.Options{Overrides: []configfile.Override{c.o}, LookupEnv: env(map[string]string{"API": "http://x"})})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.o, err, c.want)
		}
	}

	// Two overrides of one exclusive group are both kept, and conflict.
	_, err := parse(src, configfile.Options{Overrides: []configfile.Override{
		{Key: "defaults.scope.header", Value: "X-User", Source: "--scope-header"},
		{Key: "defaults.scope.cookie", Value: "sid", Source: "--scope-cookie"},
	}})
	if err == nil || !strings.Contains(err.Error(), "--scope-header: defaults.scope: want authorization, none, {header: NAME} or {cookie: NAME}: exactly one") {
		t.Errorf("%v", err)
	}

	// Overrides make the mappings they need; an empty file stays an error.
	g := mustParse(t, "listen: :1\n", configfile.Options{Overrides: []configfile.Override{
		{Key: "defaults.upstream", Value: "http://a:1", Source: "--upstream"},
		{Key: "defaults.scope", Value: "none", Source: "--scope-none"},
	}})
	if g.Gateway.Upstream.Host != "a:1" || !g.Gateway.ScopeNone {
		t.Errorf("%+v", g.Gateway)
	}
	if _, err := parse("", configfile.Options{Overrides: []configfile.Override{{Key: "listen", Value: ":1"}}}); err == nil {
		t.Error("an empty file with overrides is accepted")
	}
}

func TestConfigLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := configfile.Load(filepath.Join(dir, "missing.yaml"), configfile.Options{})
	var ce *configfile.Error
	if !errors.As(err, &ce) || ce.File != filepath.Join(dir, "missing.yaml") || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%v", err)
	}
	path := filepath.Join(dir, "gw.yaml")
	if err := os.WriteFile(path, []byte("upstreams: {api: 'http://a'}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := configfile.Load(path, configfile.Options{})
	if err != nil || f.Path != path {
		t.Fatalf("%v %+v", err, f)
	}
}

func TestConfigTableOfDefaults(t *testing.T) {
	t.Parallel()
	f := mustParse(t, "upstreams: {api: 'http://u:secret@a'}\n", configfile.Options{})
	var b strings.Builder
	if err := f.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	want := "/ (catch-all)  required POST,PATCH  api       header Idempotency-Key  authorization  full         wait 10s  24h  30s    body 1MiB, response 4MiB\n"
	if !strings.HasSuffix(got, want) || strings.Contains(got, "secret") {
		t.Errorf("table:\n%s\nwant it to end with\n%s", got, want)
	}
}

// The placeholder URL of the checks never reaches a File.
func TestConfigNoPlaceholder(t *testing.T) {
	t.Parallel()
	f := mustParse(t, "upstreams: {a: 'http://a', b: 'http://b'}\nroutes: [{match: POST /x, upstream: a}]\n", configfile.Options{})
	for _, r := range f.Gateway.Routes {
		if r.Upstream == nil || r.Upstream.Host == "upstream.invalid" {
			t.Errorf("%+v", r)
		}
	}
	if f.Gateway.Upstream != nil {
		t.Errorf("catch-all %v", f.Gateway.Upstream)
	}
}

// A policy that sets no conflict policy waits (DefaultConflict), unlike the packages'
// zero value; defaults.conflict: reject is inherited by the routes that set none.
func TestConfigConflictDefault(t *testing.T) {
	t.Parallel()
	const up = "upstreams: {api: 'http://a'}\n"
	f := mustParse(t, up+"routes:\n  - match: POST /a\n", configfile.Options{})
	if got := route(t, f, "POST /a").Idempotency.Conflict; got != idempotency.ConflictWait {
		t.Errorf("a route that sets none: conflict %q, want wait", got)
	}
	if got := f.Gateway.Idempotency.Conflict; got != idempotency.ConflictWait {
		t.Errorf("the catch-all: conflict %q, want wait", got)
	}
	f = mustParse(t, up+"defaults: {conflict: reject}\nroutes:\n  - match: POST /a\n  - match: POST /b\n    conflict: wait\n", configfile.Options{})
	if got := route(t, f, "POST /a").Idempotency.Conflict; got != idempotency.ConflictReject {
		t.Errorf("under defaults.conflict reject: %q", got)
	}
	if got := route(t, f, "POST /b").Idempotency.Conflict; got != idempotency.ConflictWait {
		t.Errorf("a route's own wait: %q", got)
	}
	if got := f.Gateway.Idempotency.Conflict; got != idempotency.ConflictReject {
		t.Errorf("the catch-all under defaults.conflict reject: %q", got)
	}
}

// TestConfigSmallBodyMemory: a max_body_memory below the default max_body is taken when
// every policy's max_body is within it, with a catch-all and with routes only; the
// gateway's own middleware configuration is resolved with it.
func TestConfigSmallBodyMemory(t *testing.T) {
	for name, src := range map[string]string{
		"catch-all":   "max_body_memory: 64KiB\ndefaults:\n  upstream: http://a\n  max_body: 16KiB\n",
		"routes only": "max_body_memory: 64KiB\nupstreams: {a: 'http://a'}\ndefaults:\n  max_body: 16KiB\nroutes:\n  - match: POST /a\n",
	} {
		t.Run(name, func(t *testing.T) {
			f := mustParse(t, src, configfile.Options{})
			cfg, err := f.Gateway.Resolve()
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Idempotency.MaxBodyMemory; got != 64<<10 {
				t.Errorf("MaxBodyMemory %d, want %d", got, 64<<10)
			}
		})
	}
}
