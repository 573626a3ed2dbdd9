// Package idempotency makes POST and PATCH endpoints safe to retry with the
// Idempotency-Key header (IETF draft-ietf-httpapi-idempotency-key-header, Stripe's
// semantics).
//
// A client generates a key once per logical operation and sends it on every attempt.
// The middleware fingerprints the request (method, path, query, content type, body),
// claims the key in a Store with one atomic operation, runs the handler, and stores its
// response. A retry with the same key gets the stored response again, marked
// Idempotent-Replayed: true, and the handler does not run a second time:
//
//	done, same request          → the stored response, replayed
//	in progress elsewhere       → 409 problem+json with Retry-After (the zero value,
//	                              ConflictReject); with Config.Conflict ConflictWait (the
//	                              default of retrysafe gateway), a wait (bounded, woken
//	                              in process or by polling the store) and then the stored
//	                              response; past the bound or the ceilings, the 409
//	same key, another request   → 422 problem+json (a client bug: a key is one operation)
//	in progress, lease expired  → taken over with a new fencing token (the owner crashed);
//	                              the old owner's late completion is rejected
//
// The handler's response is held until it is stored and then sent, so a client never
// holds an answer its retry could not get again (a response larger than
// Config.MaxResponse is completed, without its body, as soon as it passes the limit, and
// then streamed). When the store cannot be reached to store it, the client still gets
// the response, and the Middleware keeps it, with its key, stores it as soon as the store
// answers (retrying at least every second), and answers retries that reach this process
// from it; call Middleware.Shutdown after the server stops to give such responses their
// chance and to learn of those that never were stored. A key whose owner could not renew
// its lease because the store was unreachable is not taken over: for a lease after this
// process last saw the store fail (a store call failing or slow, or its probe, which
// pings every third of a lease), and for a lease after its first claim (it cannot know
// of an outage before), claims leave expired leases alone.
//
// Several policies over one store (a gateway's routes, each with its own methods, key,
// scope, lease and limits, rebuilt when the configuration is reloaded): make the first
// middleware with New and every other from it with Middleware.With. They share what the
// process knows and holds of the store: its health, which decides takeovers (a middleware
// that missed an outage another saw would take over a key whose live owner is still
// storing its answer), the probe, the held responses (a retry through any of them gets
// the answer another holds), the waiters of each key (woken by its owner in any of them),
// and the bounds MaxBodyMemory and MaxWaiters. One Shutdown serves them all.
//
// Work whose answer a retry will want must not end with its client: Detach gives a
// handler a context that keeps the request's values but not its cancellation, and ends
// only if the key is taken over. The stores' transaction modes (pgstore.Store.WithTx,
// sqlitestore.Store.WithTx) run on it. A handler that detaches all its work, as a proxy
// does, can be a ClaimHandler: it is handed the claim with the request as it came, and
// the request costs no copy with a context of its own. A keyed request's
// ResponseWriter refuses to be hijacked (ErrHijackKeyed): its response is stored and
// replayed.
//
// Leases and expiry are decided on the store's clock (the server's, for PostgreSQL and
// Redis), so processes whose clocks disagree agree on them.
//
// Keys live in a scope (by default a hash of the Authorization header): two scopes never
// share a record. The handler's response is stored whatever its status, 5xx included
// (the endpoint started executing), except 429 and 503, a panic, a request the client
// abandoned before any answer, and a handler that calls Claim.Release: those say the work
// was not done, so the key is released and a retry executes again. Errors are RFC 9457
// application/problem+json. When the store is down the middleware fails closed (503, the
// handler never runs) unless Config.FailOpen is set.
//
// A replay carries the stored status, body, trailers and headers byte for byte, each
// name's values in order, Set-Cookie included (it goes only to the same key in the same
// scope, and carries the body whole already); its Date is its own, Content-Length is
// the stored body's, and the hop-by-hop headers, those the answer's Connection header
// names and Authorization are never stored. Response.Header gives the whole rule.
//
// Connect, gRPC and gRPC-Web unary calls are HTTP POSTs, and the middleware protects
// them as they are (connect-go's handlers, grpc-gateway): their answer, trailers
// included, is stored and replayed byte for byte. Two things follow their protocols:
// the middleware's own answers to such a keyed request are that protocol's errors
// (Connect's JSON error, or a trailers-only grpc-status), with the code that says the
// same as the problem would — aborted with a google.rpc.RetryInfo for a key in flight,
// failed_precondition for a reused key, invalid_argument, unavailable, deadline_exceeded
// — so that their clients read it; and a gRPC answer, always HTTP 200, releases the key
// by its grpc-status (UNAVAILABLE as 503, RESOURCE_EXHAUSTED as 429, CANCELLED as 499).
// A handler that answers 499 (Client Closed Request, the RPC frameworks' answer to a
// cancelled call) to a client that is gone releases the key, as one that wrote nothing.
//
// Stores: memstore (in process), sqlitestore (embedded, the default of the gateway),
// pgstore (PostgreSQL, with a transaction mode that commits the handler's business write
// and the stored response together) and redisstore. Every store passes the same
// conformance suite, idempotencytest.Run. Stores that keep expired records implement
// Janitor; run RunJanitor beside the server to delete them in small batches, with
// JanitorConfig.Middleware so that it is held back after a store outage as takeovers are.
//
// This package imports only the standard library.
package idempotency
