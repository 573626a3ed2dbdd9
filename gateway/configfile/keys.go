package configfile

import (
	"slices"
	"strconv"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/bytesize"
	"github.com/retrysafe/retrysafe/internal/durfmt"
)

// The sections of the file a key can be in, in KeyDoc.Section.
const (
	SectionTop         = ""                   // the top level
	SectionLog         = "log"                // log: {format, level}
	SectionTLS         = "tls"                // tls: and admin_tls: {cert, key}
	SectionPolicy      = "policy"             // defaults: and each item of routes:
	SectionKey         = "policy.key"         // a policy's key: {header | pointer}
	SectionScope       = "policy.scope"       // a policy's scope: {header | cookie}
	SectionFingerprint = "policy.fingerprint" // a policy's fingerprint: {mode, ignore}
)

// KeyDoc documents one key of the file format.
type KeyDoc struct {
	Section string // one of the Section constants
	Name    string // the key as written in the file
	Value   string // what it takes
	Default string // its value when left out
	Doc     string // what it does
}

// Keys returns every key of the file format, section by section, in the order the
// documentation lists them. The parser accepts these keys and no other: a key it reads
// must be listed here, so the documentation generated from this list (retrysafe help
// config-reference, docs/configuration.md) names every key the file can hold.
func Keys() []KeyDoc {
	dur, size := durfmt.Format, bytesize.Format
	return []KeyDoc{
		{SectionTop, "listen", "HOST:PORT", "the caller's (retrysafe gateway's --listen, 127.0.0.1:8080)", "the address the proxy listens on"},
		{SectionTop, "admin", `HOST:PORT or "off"`, "the caller's (--admin, 127.0.0.1:9090)", "the address of /healthz, /readyz, /metrics and the operator console"},
		{SectionTop, "console", "on, off or read-only", "the caller's (--console, on)", "the operator console on the admin listener, as --console"},
		{SectionTop, "admin_token", "a string; write ${NAME} to take it from the environment", "none", "the token the console and /metrics ask for, as --admin-token. Required (here, by flag or by RETRYSAFE_ADMIN_TOKEN) when admin is not a loopback address and the console is on"},
		{SectionTop, "tls", "{cert: FILE, key: FILE}", "none: plain HTTP", "serve HTTPS on the proxy listener, and on the admin listener unless admin_tls is set, as --tls-cert and --tls-key; both or neither. retrysafe gateway reads the files at start and again on SIGHUP (a pair that does not load is refused and the served one stays); changing the file names takes a restart"},
		{SectionTop, "admin_tls", "{cert: FILE, key: FILE}", "that of tls", "the admin listener's own certificate and key, as --admin-tls-cert and --admin-tls-key"},
		{SectionTop, "store", "a DSN, as --store takes it (sqlite:PATH, postgres://…, redis://…, memory:); ${NAME} is expanded", "the caller's (--store, sqlite:retrysafe.db)", "the idempotency store"},
		{SectionTop, "log", "{format: text|json, level: debug|info|warn|error}", "the caller's (text, info)", "the log's format and level"},
		{SectionTop, "otel", "true or false", "false", "trace with OpenTelemetry, as --otel; the endpoint and the rest come from the OTEL_ environment"},
		{SectionTop, "shutdown_timeout", "a duration", "the longest upstream_timeout of the routes + " + dur(gateway.DefaultShutdownGrace), "how long the requests in flight get at shutdown, and then the answers the store could not take get to be stored"},
		{SectionTop, "max_body_memory", "a size", size(idempotency.DefaultMaxBodyMemory), "the ceiling on body bytes in memory, both ways: keyed requests' bodies and the answers kept until they are stored and sent. Past it, new keyed requests get 503 with Retry-After; answers coming in are finished. It bounds the whole gateway, and sets retrysafe gateway's soft memory limit"},
		{SectionTop, "max_waiters", "a whole number", strconv.Itoa(idempotency.DefaultMaxWaiters), "duplicates that may wait (conflict: wait) at once, in the whole gateway; past it a duplicate gets 409 at once"},
		{SectionTop, "upstreams", "a mapping of NAME: URL", "none", "the services the gateway forwards to: absolute http or https URLs, whose path prefixes the request's; ${NAME} is expanded. Names are letters, digits, '-', '_' and '.'"},
		{SectionTop, "defaults", "a policy", "the packages' defaults", "the policy of every route for each key the route does not set, and that of the requests no route matches"},
		{SectionTop, "routes", "a list of policies, each with match", "none: one policy, the defaults, for every request", "the routes, each a net/http pattern with its own policy"},

		{SectionLog, "format", "text or json", "text", "the log's format"},
		{SectionLog, "level", "debug, info, warn or error", "info", "the lowest level logged"},

		{SectionTLS, "cert", "a file name", "none", "the certificate, PEM: the leaf first, then any intermediates"},
		{SectionTLS, "key", "a file name", "none", "the certificate's private key, PEM"},

		{SectionPolicy, "match", `a net/http ServeMux pattern, "[METHOD ][HOST]/[PATH]"`, "required in a route; not allowed in defaults", "the requests the route takes: POST /payments, POST /orders/{id}/refunds, /webhooks/. A request has the route of the most specific pattern it matches, as ServeMux decides, whatever the order of the file; two patterns that requests can both match with neither more specific are an error, as is one pattern written twice"},
		{SectionPolicy, "upstream", "a name from upstreams, or an absolute URL; ${NAME} is expanded", "the defaults' upstream, which defaults to the only upstream when there is one", "where the requests go. With several upstreams and no defaults.upstream, every route must name one, and a request that matches no route is answered 404 and not forwarded"},
		{SectionPolicy, "mode", "required, optional or off", "required", "required: a keyed request without a key is answered 400; optional: it is forwarded unprotected; off: nothing is keyed or stored, whatever the method (a route whose pattern names GET must be off)"},
		{SectionPolicy, "methods", "a list of methods, or one", "the pattern's method when it names one, else the defaults' methods, else POST, PATCH", "the methods that need a key. Safe methods (GET, HEAD, OPTIONS, TRACE) cannot be keyed"},
		{SectionPolicy, "key", "{header: NAME} or {pointer: /json/pointer}", "{header: " + idempotency.DefaultKeyHeader + "}", "where the key is read: a header, or the body's member at an RFC 6901 pointer (a webhook's event id: {pointer: /id}). Exactly one. Inherited whole"},
		{SectionPolicy, "scope", "authorization, none, {header: NAME} or {cookie: NAME}", "authorization", "whose keys they are: the SHA-256 of the Authorization header; a header set by the auth layer in front, trusted as is; a session cookie, hashed; or one scope for all (senders authenticated another way, such as a webhook's signature). Inherited whole"},
		{SectionPolicy, "fingerprint", "{mode: full|json, ignore: [/json/pointer, …]}", "{mode: full}", "what makes a retry the same request. Inherited whole"},
		{SectionPolicy, "ttl", "a duration", dur(idempotency.DefaultTTL), "how long a response is kept for replay; longer than lease and upstream_timeout"},
		{SectionPolicy, "lease", "a duration", dur(idempotency.DefaultLease), "how long a key stays in progress without its owner (after a crash or an upstream timeout) before a retry may take it over"},
		{SectionPolicy, "upstream_timeout", "a duration", dur(gateway.DefaultUpstreamTimeout), "bound on each upstream call until its answer is stored (an unkeyed call's: until its headers come); then only each wait for the upstream's bytes, at the client's pace"},
		{SectionPolicy, "store_timeout", "a duration", dur(idempotency.DefaultStoreTimeout), "bound on each store call"},
		{SectionPolicy, "max_body", "a size", size(idempotency.DefaultMaxBody), "largest request body of a keyed request, else 413; at most max_body_memory"},
		{SectionPolicy, "body_timeout", "a duration", dur(idempotency.DefaultBodyTimeout), "time a keyed request's body gets to arrive, else 408"},
		{SectionPolicy, "max_response", "a size", size(idempotency.DefaultMaxResponse), "largest response body stored; a larger one is passed on and stored without its body"},
		{SectionPolicy, "on_store_error", "closed or open", "closed", "closed: answer 503 with Retry-After when the store fails; open: forward unprotected"},
		{SectionPolicy, "conflict", "reject or wait", "wait, retrysafe gateway's default (--conflict)", "a duplicate of a request in progress: reject answers 409 with Retry-After (the IETF draft's answer, and the zero value of idempotency.Config and gateway.Config); wait waits for the first to finish and answers with its response, replayed, up to wait_timeout and the ceilings max_waiters and max_waiters_per_key (past them: 409 with Retry-After)"},
		{SectionPolicy, "wait_timeout", "a duration", dur(idempotency.DefaultWaitTimeout), "the longest a duplicate waits under conflict: wait; then 409 with Retry-After (at once for a key kept after a 504 whose lease outlasts it)"},
		{SectionPolicy, "max_waiters_per_key", "a whole number", strconv.Itoa(idempotency.DefaultMaxWaitersPerKey), "duplicates of one key that may wait at once; past it 409 at once"},

		{SectionKey, "header", "a header name", idempotency.DefaultKeyHeader, "the key is this header's value"},
		{SectionKey, "pointer", "an RFC 6901 JSON pointer", "none", "the key is the JSON body's member at this pointer"},

		{SectionScope, "header", "a header name", "none", "the scope is this header's value, set by the auth layer in front and trusted as is"},
		{SectionScope, "cookie", "a cookie name", "none", "the scope is this cookie's value, hashed"},

		{SectionFingerprint, "mode", "full or json", "full", "full compares the body's bytes; json its JSON canonically (key order and white space do not matter)"},
		{SectionFingerprint, "ignore", "a list of JSON pointers", "none", "members left out of the fingerprint (a field the sender changes on every delivery); implies json"},
	}
}

// knownKeys returns the names Keys lists in section, for the parser: it reads these
// and reports any other key as unknown.
func knownKeys(section string) []string {
	var out []string
	for _, k := range Keys() {
		if k.Section == section {
			out = append(out, k.Name)
		}
	}
	return out
}

// documented reports whether Keys lists name in section.
func documented(section, name string) bool {
	return slices.Contains(knownKeys(section), name)
}
