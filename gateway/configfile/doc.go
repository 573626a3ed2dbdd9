// Package configfile reads the YAML file that describes one gateway: where it listens,
// its store, its upstreams, and the idempotency policy of each route. Load checks the
// whole file before anything is opened or connected — every key and value, the rules
// between them as gateway.Config.Resolve applies them, the routes' patterns together —
// and reports every error it finds, each with its file and line.
//
// # The file
//
//	listen: 127.0.0.1:8080
//	store: ${RETRYSAFE_STORE}
//	upstreams:
//	  api: http://127.0.0.1:3000
//	  hooks: http://127.0.0.1:3001
//	defaults:
//	  upstream: api
//	routes:
//	  - match: POST /payments
//	    conflict: wait
//	  - match: POST /search
//	    mode: off
//	  - match: POST /webhooks/stripe
//	    upstream: hooks
//	    key: {pointer: /id}
//	    scope: none
//
// The top-level keys, each optional, are listen, admin, console, admin_token, tls,
// admin_tls, store, log, otel, shutdown_timeout, max_body_memory, max_waiters, upstreams, defaults and routes.
// Keys lists every key of the file, what it takes, its default and what it does; the
// parser accepts those and no other, and retrysafe's configuration reference
// (docs/configuration.md) is generated from the same list.
//
// # Policies
//
// defaults and each route take the same keys (SectionPolicy); a route also takes match,
// its net/http pattern. A key a route leaves out has the defaults' value, and one
// neither sets has the package's default. key, scope and fingerprint are inherited
// whole: a route that sets key: {pointer: /id} does not keep the defaults' key header.
// A request has the route of the most specific pattern it matches, as ServeMux decides,
// whatever the order of the file.
//
// Durations are Go's (30s, 5m, 24h); sizes are bytes or 512KiB, 4MiB, 1GiB (KB, MB, GB
// in powers of 1000), as package bytesize reads them. Both must be positive: leave a key
// out for its default.
//
// # Strictness
//
// A key the format does not have is an error wherever it is (inside a route, key: or
// fingerprint: too), and so are a key written twice in a mapping, a list or a mapping
// where a string goes, an empty file, a file that is not a mapping, more than one YAML
// document, and YAML aliases (*name): shared settings go in defaults.
//
// # Secrets
//
// ${NAME} in store, admin_token, the URLs of upstreams and a policy's upstream is
// replaced with the environment variable NAME, so that a password need not be written
// in the file; a variable that is not set is an error at its line, as a gateway must
// not start without it. A check of the file away from its environment
// (Options.AllowUnsetEnv, as retrysafe config check does) lists those instead
// (File.UnsetEnv) and checks the rest. Nowhere else is ${…} expanded.
// A "$" not followed by "{" is kept as it is; a literal "${" is written %24{ in a URL.
// Errors show URLs with their passwords redacted.
//
// # Command-line flags over a file
//
// Options.Overrides set keys as if the file held them, naming their Source (a flag) in
// errors: retrysafe gateway's --ttl is defaults.ttl, --upstream defaults.upstream,
// --key-pointer defaults.key.pointer, --scope-none defaults.scope with value none,
// --fail-open defaults.on_store_error with value open, --require-key=false
// defaults.mode with value optional, --max-body-memory max_body_memory, --log-format
// log.format, and so on.
package configfile
