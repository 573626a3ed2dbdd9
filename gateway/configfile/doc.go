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
// The top-level keys, each optional:
//
//	listen            HOST:PORT the proxy listens on. Default: the caller's (retrysafe
//	                  gateway's --listen, 127.0.0.1:8080).
//	admin             HOST:PORT of /healthz, /readyz, /metrics and the operator console,
//	                  or "off". Default: the caller's (--admin, 127.0.0.1:9090).
//	console           the operator console on the admin listener: on, off or read-only,
//	                  as --console. Default: the caller's (on).
//	admin_token       the token the console and /metrics ask for, as --admin-token;
//	                  write it as ${NAME} to take it from the environment rather than keep
//	                  the secret in the file. Required (here, by flag or by
//	                  RETRYSAFE_ADMIN_TOKEN) when admin is not a loopback address and the
//	                  console is on.
//	tls               {cert: FILE, key: FILE}: serve HTTPS on the proxy listener, and on
//	                  the admin listener unless admin_tls is set, with the certificate
//	                  in cert (PEM, the leaf first, then any intermediates) and its
//	                  private key in key, as --tls-cert and --tls-key; both or neither.
//	                  retrysafe gateway reads the files at start and again on SIGHUP
//	                  (a pair that does not load is refused and the served one stays);
//	                  changing the file names takes a restart. Default: plain HTTP.
//	admin_tls         {cert: FILE, key: FILE}: the admin listener's own pair, as
//	                  --admin-tls-cert and --admin-tls-key. Default: that of tls.
//	store             the store's DSN, as --store takes it (sqlite:PATH, postgres://…,
//	                  redis://…, memory:). Default: the caller's (sqlite:retrysafe.db).
//	log               {format: text|json, level: debug|info|warn|error}. Default: the
//	                  caller's (text, info).
//	otel              true: trace with OpenTelemetry, as --otel (the endpoint and the rest
//	                  from the OTEL_ environment; see the README's Tracing). Default
//	                  false.
//	shutdown_timeout  how long the requests in flight get at shutdown, and then the
//	                  answers the store could not take get to be stored. Default the
//	                  longest upstream_timeout of the routes + gateway.DefaultShutdownGrace
//	                  (5s).
//	max_body_memory   the ceiling on body bytes in memory, both ways: keyed requests'
//	                  bodies and the answers kept until they are stored and sent. Past
//	                  it, new keyed requests get 503 with Retry-After; answers coming
//	                  in are finished. It bounds the whole gateway, and sets retrysafe
//	                  gateway's soft memory limit (see its --help). Default
//	                  idempotency.DefaultMaxBodyMemory (256MiB).
//	max_waiters       duplicates that may wait (conflict: wait) at once, in the whole
//	                  gateway; past it a duplicate gets 409 at once. Default
//	                  idempotency.DefaultMaxWaiters (1024).
//	upstreams         name: URL, the services the gateway forwards to; absolute http or
//	                  https URLs, whose path prefixes the request's. Names are letters,
//	                  digits, '-', '_' and '.'. Default none.
//	defaults          a policy (below): that of every route for each key the route does
//	                  not set, and that of the requests no route matches. Default: the
//	                  packages' defaults.
//	routes            a list of policies, each with its pattern in match. Default none:
//	                  one policy, the defaults, for every request.
//
// # Policies
//
// defaults and each route take these keys; a route also takes match. A key a route
// leaves out has the defaults' value, and one neither sets has the default below. key,
// scope and fingerprint are inherited whole: a route that sets key: {pointer: /id}
// does not keep the defaults' key header.
//
//	match                a net/http ServeMux pattern, "[METHOD ][HOST]/[PATH]", with
//	                     wildcards ({id}, {rest...}) and {$}: POST /payments, POST
//	                     /orders/{id}/refunds, /webhooks/. A request has the route of the
//	                     most specific pattern it matches, as ServeMux decides, whatever
//	                     the order of the file; two patterns that requests can both match
//	                     with neither more specific (POST /a/{x} and POST /{y}/b) are an
//	                     error, as is one pattern written twice. Required in a route, not
//	                     allowed in defaults.
//	upstream             a name from upstreams, or an absolute URL. Default: the defaults'
//	                     upstream, which defaults to the only upstream when there is one.
//	                     With several and no defaults.upstream, every route must name one,
//	                     and a request that matches no route is answered 404
//	                     (gateway.ProblemNoRoute) and not forwarded.
//	mode                 required: a keyed request without a key is answered 400;
//	                     optional: it is forwarded unprotected; off: nothing is keyed or
//	                     stored, whatever the method, and the requests are forwarded
//	                     untouched (a route whose pattern names GET must be off). Default
//	                     required.
//	methods              the methods that need a key: a list, or one method. Default: the
//	                     pattern's method when it names one (POST /payments keys POST),
//	                     else the defaults' methods, else idempotency.DefaultMethods (POST,
//	                     PATCH). The defaults' methods do not reach a route whose pattern
//	                     names a method: it receives no other. Safe methods (GET, HEAD,
//	                     OPTIONS, TRACE) cannot be keyed.
//	key                  where the key is read: {header: NAME}, or {pointer: /json/pointer}
//	                     for the body's member at that RFC 6901 pointer (a webhook's event
//	                     id: {pointer: /id}). Exactly one. Default {header: Idempotency-Key}
//	                     (idempotency.DefaultKeyHeader).
//	scope                whose keys they are: authorization (the SHA-256 of the
//	                     Authorization header), {header: NAME} (a principal set by the auth
//	                     layer in front, trusted as is), {cookie: NAME} (a session cookie,
//	                     hashed), or none (one scope for all, for senders authenticated
//	                     another way, such as a webhook's signature). Default
//	                     authorization.
//	fingerprint          what makes a retry the same request: {mode: full} compares the
//	                     body's bytes, {mode: json} its JSON canonically (key order and
//	                     white space do not matter); ignore: [/json/pointer, …] leaves
//	                     those members out (a field the sender changes on every delivery)
//	                     and implies json. Default {mode: full}.
//	ttl                  how long a response is kept for replay; longer than lease and
//	                     upstream_timeout. Default idempotency.DefaultTTL (24h).
//	lease                how long a key stays in progress without its owner (after a crash
//	                     or an upstream timeout) before a retry may take it over. Default
//	                     idempotency.DefaultLease (30s).
//	upstream_timeout     bound on each upstream call until its answer is stored; then only
//	                     each wait for the upstream's bytes. Default
//	                     gateway.DefaultUpstreamTimeout (30s).
//	store_timeout        bound on each store call. Default idempotency.DefaultStoreTimeout
//	                     (5s).
//	max_body             largest request body of a keyed request, else 413; at most
//	                     max_body_memory. Default idempotency.DefaultMaxBody (1MiB).
//	body_timeout         time a keyed request's body gets to arrive, else 408. Default
//	                     idempotency.DefaultBodyTimeout (30s).
//	max_response         largest response body stored; a larger one is passed on and
//	                     stored without its body. Default idempotency.DefaultMaxResponse
//	                     (4MiB).
//	on_store_error       closed: answer 503 with Retry-After when the store fails; open:
//	                     forward unprotected. Default closed.
//	conflict             a duplicate of a request in progress: reject answers 409 with
//	                     Retry-After; wait waits for the first to finish and answers with
//	                     its response, replayed, up to wait_timeout and the ceilings
//	                     max_waiters and max_waiters_per_key (past them: 409 with
//	                     Retry-After). Default wait (DefaultConflict), as retrysafe
//	                     gateway's --conflict; reject is the IETF draft's 409, and the
//	                     zero value of idempotency.Config and gateway.Config.
//	wait_timeout         the longest a duplicate waits under conflict: wait; then 409
//	                     with Retry-After (at once for a key kept after a 504 whose
//	                     lease outlasts it).
//	                     Default idempotency.DefaultWaitTimeout (10s).
//	max_waiters_per_key  duplicates of one key that may wait at once; past it 409 at once.
//	                     Default idempotency.DefaultMaxWaitersPerKey (128).
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
