// Package gateway is a reverse proxy that gives any HTTP API, in any language, the
// Idempotency-Key semantics of package idempotency. It composes deadline.Middleware,
// the idempotency middleware and an httputil.ReverseProxy (with Rewrite), and is what
// `retrysafe gateway` runs.
//
// A keyed request (POST and PATCH by default) is claimed in the store, forwarded, and
// the upstream's response stored and passed on; a retry with the same key gets the
// stored response again with Idempotent-Replayed: true, and the upstream does not see
// it. Everything in the idempotency contract holds: 409 with Retry-After while the key
// is in flight (Idempotency.Conflict's zero value, reject; with ConflictWait, the
// default of retrysafe gateway and of its configuration file, a duplicate waits for the
// answer instead, up to WaitTimeout and the waiter ceilings, then 409), 422 for a key
// reused with another request, 400 for a missing or
// malformed key, 413 for a body over Idempotency.MaxBody, 503 when the store is down (fail
// closed). The Idempotency-Key header is forwarded unchanged, so an idempotency-aware
// upstream dedupes too; X-Forwarded-For, -Host and -Proto are set; hop-by-hop headers
// are stripped. Request-Budget-Ms (package deadline) tells the upstream how long the
// gateway will wait for it; a caller whose own Request-Budget-Ms is already spent is
// answered 504 before anything is claimed.
//
// A request whose Connection header names the Idempotency-Key, the header its scope comes
// from or its Content-Type is answered 400: a proxy drops the headers Connection names,
// and the upstream must receive those the gateway keyed and fingerprinted. Keyed bodies
// are bounded in size (Idempotency.MaxBody, 413) and in time (Idempotency.BodyTimeout,
// 408) before anything is claimed. Bodies in memory, both ways — keyed requests' bodies
// and the answers kept until they are stored and sent — have one ceiling
// (Idempotency.MaxBodyMemory): past it, new keyed requests get 503 with Retry-After
// before anything is claimed, while answers already coming in are finished and sent
// whole. A keyed request's body is dropped once the upstream has it and has answered, so
// that a request and its answer hold the larger of the two, not both.
//
// # Routes
//
// A real API is mixed: POST /payments must need a key, POST /search must pass through
// untouched, a webhook carries its key in the body. Config.Routes give the requests
// that match a net/http pattern a policy of their own (Route): the key's source, the
// scope, the fingerprint, the limits, the conflict policy, the upstream, or Off. Of the
// routes a request matches, the most specific has it, as ServeMux decides, and the
// Config's own fields are the policy of the requests no route matches. Matching is
// ServeMux's, on the cleaned path and the method in upper case, so that no spelling of
// a path or a method takes a request out of a route that needs a key; the request is
// forwarded as it came. Reload swaps in new routes atomically: a request keeps the
// route it was matched to until it ends. Every route's middleware is made with
// idempotency.Middleware.With from one root, so they share what the process knows of
// the store (its health, which decides takeovers), the answers it could not store yet,
// the waiters and the ceiling on bodies in memory, across routes and reloads.
//
// # The upstream call and what its failures mean
//
// Each claim is forwarded once. The transport goes through retry.SendOnce, so Go's HTTP
// client never resends a keyed request by itself (it would, on a reused keep-alive
// connection that broke after the request was written), and the default transport
// speaks HTTP/1.1 to the upstream, as Go's HTTP/2 client resends a request whose stream
// was reset with PROTOCOL_ERROR.
//
// The upstream request runs on a context detached from the client's
// (context.WithoutCancel): a client that disconnects does not cancel it, so the
// upstream's answer is still stored and the client's retry gets it. A lost response is
// not lost work. Config.UpstreamTimeout bounds the call until its answer is stored
// (answers up to Idempotency.MaxResponse are read whole from the upstream first, then sent to
// the client at its pace); after that only each wait for the upstream's next bytes is
// bounded by it, so a client that reads slowly is never cut off and its key is completed
// whatever its pace.
//
// When the round trip fails, what happened to the key depends on whether the request
// can have reached the upstream. The gateway traces every round trip (httptrace's
// WroteHeaders): an HTTP server cannot act on a request whose headers it has not
// received, so until the request's headers were written the upstream never saw it.
//
//	never reached (dial, DNS or TLS error; headers never written)
//	    → 502 problem+json, type ProblemUpstreamUnreachable, key released: a retry
//	      forwards again at once.
//	written, no answer within UpstreamTimeout
//	    → 504 problem+json, type ProblemUpstreamTimeout, key abandoned: it stays in
//	      progress until its lease ends (a retry meanwhile gets 409), then the next retry
//	      takes it over and forwards again, with the same Idempotency-Key.
//	written, the connection broke before an answer (reset, EOF)
//	    → 502 problem+json, type ProblemUpstreamFailed, key abandoned, as above.
//	the answer's body broke off after its status was sent
//	    → the client's connection is aborted and the key abandoned, as above.
//
// The upstream's own answers are stored whatever their status, 5xx included, except 429
// and 503, which are passed through and release the key (the upstream says it did not
// do the work).
//
// # Operating it
//
// Run serves the proxy and an admin listener (Admin: /healthz, /readyz, /metrics) until
// its context ends, then shuts down gracefully: it stops accepting, lets the requests in
// flight finish and record their responses, gives the answers the store could not take
// (it was unreachable) their chance to be stored, logs each one it could not store, and
// returns. It runs the store's janitor
// when the store has one. Every keyed request is logged on one line (log/slog, message
// "request") with its method, path and outcome; status, the status the client was sent,
// absent when it was sent none (it had gone: client_gone=true); upstream_status, what
// the upstream answered, when it did (for a client that had gone, what its retry is
// replayed); latency_ms and upstream_latency_ms, in milliseconds; the key, and the
// upstream's failure (upstream_error, err). Metrics (all prefixed retrysafe_gateway_):
//
//	requests_total{route,outcome}             counter: requests by route (its pattern;
//	                                          "/" for the catch-all) and outcome
//	request_duration_seconds{route,outcome}   histogram: whole request latency
//	upstream_duration_seconds{upstream,result}
//	                                          histogram: upstream round trips, by
//	                                          upstream (host:port) and status
//	                                          class (2xx…5xx) or failure (unreachable,
//	                                          timeout, failed)
//	store_duration_seconds{operation}         histogram: store calls (claim, complete, …)
//	store_errors_total{operation}             counter: store calls that failed
//	keys_in_flight                            gauge: keys this gateway holds while it
//	                                          forwards their requests
//	requests_waiting                          gauge: duplicates waiting for a key in
//	                                          progress (--conflict wait)
//	store_not_durable                         gauge: 1 while the store says it cannot
//	                                          make writes durable (its synchronous
//	                                          standby or replicas do not acknowledge
//	                                          them): keyed requests get 503
//	                                          store-not-durable until it can
//	body_memory_bytes                         gauge: body bytes of keyed requests held
//	                                          in memory, requests' and answers', against
//	                                          Idempotency.MaxBodyMemory
//
// With Config.TracerProvider set (retrysafe gateway --otel), every request is an
// OpenTelemetry server span, "METHOD /path-pattern", the child of the caller's W3C
// traceparent, with children for the store calls made for it (store.claim,
// store.complete, store.release, store.abandon, store.extend), the upstream call (a
// client span, whose traceparent the upstream receives) and an answer from the store
// (replay, conflict, mismatch). The spans carry the route, outcome, status, store and
// KeyHash of the scope and key; never the key, the scope's value, a body, a header's
// value or an error's text (trace.go). Without it nothing of this runs: the request
// path only tests, at each step, that tracing is off.
//
// Several gateways sharing one PostgreSQL or Redis store behave as one: the claim is
// atomic in the store, so of concurrent duplicates sent to different replicas exactly
// one is forwarded.
//
// # One keyed request, file by file
//
// A POST with an Idempotency-Key, from the listener to a PostgreSQL store and back, is
// read in eight files of four packages (nine with route.go, when there are routes).
// Each request's state lives in two places only: the gateway's exchange (gateway.go)
// and the middleware's Claim and recorder (claim.go, recorder.go); what happened to it
// is the Outcome that Serve returns, never read back from a status code.
//
//  1. gateway/run.go — Run serves the listener with an http.Server whose handler is the
//     Gateway, and at shutdown waits for the requests in flight and the answers held.
//  2. gateway/gateway.go — ServeHTTP finds the request's route in the current table
//     (route.go's match, a ServeMux lookup), makes the request's exchange, refuses a
//     Connection header that names a protected header, and hands the request to the
//     budget layer of its route,
//     then serve, which calls the middleware's Serve with forward as the handler (a
//     ClaimHandler: handed the claim, not a copy of the request carrying it) and
//     keeps the Outcome it returns. forward sends the request once through the
//     ReverseProxy (retry.SendOnce under it), bounded by an upstreamCall; its hooks,
//     modifyResponse and upstreamError, classify what the upstream did and Release,
//     Abandon or Abort the claim accordingly. finish logs the request and counts it.
//     When the answer broke off, ServeHTTP cuts the client's connection last.
//  3. deadline/middleware.go — Middleware gives the request its deadline (the caller's
//     Request-Budget-Ms and the server's budget), answers 504 when it is already spent,
//     and marks failures once it is.
//  4. idempotency/middleware.go — Serve checks the method and the key, reads the body
//     within its limits, fingerprints it, and claims the key in the store (a takeover
//     only on a second claim, bound to the store's clock). A lost claim is answered
//     there: replay, 409 or 422.
//  5. idempotency/claim.go — execute runs the handler as the owner of the Claim (with
//     the claim in its request's context, or handed to a ClaimHandler), renews
//     its lease (heartbeat), and then completes the record (finish → Store.Complete),
//     releases or abandons the key, and only then lets the recorder send the answer.
//  6. idempotency/recorder.go — the recorder holds the handler's answer until it is
//     stored, passes a too-large one through, and sends it; Replay writes a stored one.
//  7. idempotency/pgstore/pgstore.go — Claim and Complete: one statement each, fenced by
//     the token and decided on the database's clock.
//  8. idempotency/pgstore/batch.go — with batching on (the command line's default), the
//     claims and completions that arrive together share one statement: runClaims and
//     runCompletes.
//
// On the way the request calls helpers whose names say what they return and which the
// walk does not need to enter: ParseKey (idempotency/key.go), readBody
// (idempotency/body.go), Fingerprint (idempotency/fingerprint.go), and batch.Group, the
// generic grouping of calls under pgstore's batch.go (internal/batch). The answer to
// a retry takes the same road and stops at step 4. With another store, steps 7 and 8 are
// that store's file: sqlitestore.go and batch.go, redisstore.go, memstore.go.
package gateway
