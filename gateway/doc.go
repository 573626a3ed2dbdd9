// Package gateway is a reverse proxy that gives any HTTP API, in any language, the
// Idempotency-Key semantics of package idempotency. It composes deadline.Middleware,
// the idempotency middleware and an httputil.ReverseProxy (with Rewrite), and is what
// `retrysafe gateway` runs.
//
// A keyed request (POST and PATCH by default) is claimed in the store, forwarded, and
// the upstream's response stored and passed on; a retry with the same key gets the
// stored response again with Idempotent-Replayed: true, and the upstream does not see
// it. Everything in the idempotency contract holds: 409 with Retry-After while the key
// is in flight, 422 for a key reused with another request, 400 for a missing or
// malformed key, 413 for a body over Config.MaxBody, 503 when the store is down (fail
// closed). The Idempotency-Key header is forwarded unchanged, so an idempotency-aware
// upstream dedupes too; X-Forwarded-For, -Host and -Proto are set; hop-by-hop headers
// are stripped. Request-Budget-Ms (package deadline) tells the upstream how long the
// gateway will wait for it; a caller whose own Request-Budget-Ms is already spent is
// answered 504 before anything is claimed.
//
// A request whose Connection header names the Idempotency-Key, the header its scope comes
// from or its Content-Type is answered 400: a proxy drops the headers Connection names,
// and the upstream must receive those the gateway keyed and fingerprinted. Keyed bodies
// are bounded in size (Config.MaxBody, 413), in time (Config.BodyTimeout, 408) and,
// together, in memory (Config.MaxBodyMemory, 503 with Retry-After), before anything is
// claimed.
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
// (answers up to Config.MaxResponse are read whole from the upstream first, then sent to
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
// when the store has one. Every keyed request is logged on one line (log/slog) with its
// outcome and latency. Metrics (all prefixed retrysafe_gateway_):
//
//	requests_total{outcome}                   counter: requests by idempotency outcome
//	request_duration_seconds{outcome}         histogram: whole request latency
//	upstream_duration_seconds{result}         histogram: upstream round trips, by status
//	                                          class (2xx…5xx) or failure (unreachable,
//	                                          timeout, failed)
//	store_duration_seconds{operation}         histogram: store calls (claim, complete, …)
//	store_errors_total{operation}             counter: store calls that failed
//	keys_in_flight                            gauge: keys this gateway holds while it
//	                                          forwards their requests
//
// Several gateways sharing one PostgreSQL or Redis store behave as one: the claim is
// atomic in the store, so of concurrent duplicates sent to different replicas exactly
// one is forwarded.
package gateway
