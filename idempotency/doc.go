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
//	in progress elsewhere       → 409 problem+json with Retry-After
//	same key, another request   → 422 problem+json (a client bug: a key is one operation)
//	in progress, lease expired  → taken over with a new fencing token (the owner crashed);
//	                              the old owner's late completion is rejected
//
// Keys live in a scope (by default a hash of the Authorization header): two scopes never
// share a record. The handler's response is stored whatever its status, 5xx included
// (the endpoint started executing), except 429 and 503, a panic, a request the client
// abandoned before any answer, and a handler that calls Claim.Release: those say the work
// was not done, so the key is released and a retry executes again. Errors are RFC 9457
// application/problem+json. When the store is down the middleware fails closed (503, the
// handler never runs) unless Config.FailOpen is set.
//
// Stores: memstore (in process), sqlitestore (embedded, the default of the gateway),
// pgstore (PostgreSQL, with a transaction mode that commits the handler's business write
// and the stored response together) and redisstore. Every store passes the same
// conformance suite, idempotencytest.Run. Stores that keep expired records implement
// Janitor; run RunJanitor beside the server to delete them in small batches.
//
// This package imports only the standard library.
package idempotency
