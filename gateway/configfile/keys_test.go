package configfile

import (
	"errors"
	"strings"
	"testing"
)

// TestKeysAreTheParsers: every key Keys documents is one the parser reads (a file
// setting it alone, with a valid value, is not refused as unknown), and the parser
// refuses a key Keys does not document, whatever the section. With the parser's
// guard, a key read by the parser but missing from Keys is refused as unknown, which
// the parser's own tests of that key then see.
func TestKeysAreTheParsers(t *testing.T) {
	t.Parallel()
	// A valid file that sets the key, for each key of Keys. The routes' files need the
	// upstream they forward to.
	samples := map[string]string{
		"listen":                     "listen: 127.0.0.1:8080",
		"admin":                      "admin: off",
		"console":                    "console: read-only",
		"admin_token":                "admin_token: secret",
		"store":                      `store: "memory:"`,
		"tls":                        "tls: {cert: a.crt, key: a.key}",
		"admin_tls":                  "admin_tls: {cert: b.crt, key: b.key}",
		"tls.cert":                   "tls: {cert: a.crt, key: a.key}",
		"tls.key":                    "tls: {cert: a.crt, key: a.key}",
		"log":                        "log: {format: json}",
		"otel":                       "otel: false",
		"shutdown_timeout":           "shutdown_timeout: 40s",
		"max_body_memory":            "max_body_memory: 64MiB",
		"max_waiters":                "max_waiters: 10",
		"upstreams":                  "upstreams: {api: http://127.0.0.1:3000}",
		"defaults":                   "defaults: {upstream: http://127.0.0.1:3000}",
		"routes":                     "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a}]",
		"log.format":                 "log: {format: text}",
		"log.level":                  "log: {level: debug}",
		"policy.match":               "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a}]",
		"policy.upstream":            "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, upstream: api}]",
		"policy.mode":                "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, mode: optional}]",
		"policy.methods":             "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: /a, methods: [POST, PUT]}]",
		"policy.key":                 "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, key: {header: X-Key}}]",
		"policy.scope":               "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, scope: none}]",
		"policy.fingerprint":         "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, fingerprint: {mode: json}}]",
		"policy.ttl":                 "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, ttl: 48h}]",
		"policy.lease":               "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, lease: 20s}]",
		"policy.upstream_timeout":    "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, upstream_timeout: 10s}]",
		"policy.store_timeout":       "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, store_timeout: 2s}]",
		"policy.max_body":            "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, max_body: 64KiB}]",
		"policy.body_timeout":        "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, body_timeout: 5s}]",
		"policy.max_response":        "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, max_response: 1MiB}]",
		"policy.on_store_error":      "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, on_store_error: open}]",
		"policy.conflict":            "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, conflict: reject}]",
		"policy.wait_timeout":        "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, conflict: wait, wait_timeout: 3s}]",
		"policy.max_waiters_per_key": "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, max_waiters_per_key: 4}]",
		"policy.key.header":          "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, key: {header: X-Key}}]",
		"policy.key.pointer":         "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, key: {pointer: /id}}]",
		"policy.scope.header":        "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, scope: {header: X-User}}]",
		"policy.scope.cookie":        "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, scope: {cookie: session}}]",
		"policy.fingerprint.mode":    "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, fingerprint: {mode: json}}]",
		"policy.fingerprint.ignore":  "upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, fingerprint: {ignore: [/ts]}}]",
	}
	seen := map[string]bool{}
	for _, k := range Keys() {
		name := k.Name
		if k.Section != SectionTop {
			name = k.Section + "." + k.Name
		}
		if seen[name] {
			t.Errorf("Keys lists %s twice", name)
		}
		seen[name] = true
		if k.Value == "" || k.Default == "" || k.Doc == "" {
			t.Errorf("Keys: %s lacks its value, default or documentation: %+v", name, k)
		}
		file, ok := samples[name]
		if !ok {
			t.Errorf("Keys lists %s, which this test has no sample of: add one", name)
			continue
		}
		if !strings.Contains(file, k.Name+":") {
			t.Errorf("the sample of %s does not set it: %q", name, file)
		}
		if !strings.Contains(file, "upstream") {
			file = "defaults: {upstream: http://127.0.0.1:3000}\n" + file // a gateway needs one
		}
		if _, err := Parse("sample.yaml", []byte(file+"\n"), Options{}); err != nil {
			t.Errorf("%s: the parser refuses a file setting it: %v", name, err)
		}
	}
	for name := range samples {
		if !seen[name] {
			t.Errorf("the sample of %s is of a key Keys does not list", name)
		}
	}
	// A key no section documents is refused in every section.
	for _, file := range []string{
		"bogus: 1",
		"log: {bogus: 1}",
		"tls: {bogus: x}",
		"defaults: {bogus: 1}",
		"defaults: {match: POST /a}",
		"upstreams: {api: http://127.0.0.1:3000}\nroutes: [{match: POST /a, bogus: 1}]",
		"defaults: {key: {bogus: x}}",
		"defaults: {scope: {bogus: x}}",
		"defaults: {fingerprint: {bogus: x}}",
	} {
		_, err := Parse("bogus.yaml", []byte(file+"\n"), Options{})
		if !errors.Is(err, ErrUnknownField) {
			t.Errorf("%q: got %v, want an error matching ErrUnknownField", file, err)
		}
	}
}
