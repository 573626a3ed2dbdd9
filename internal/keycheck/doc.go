// Package keycheck checks whether an HTTP endpoint honours Idempotency-Key, from the
// outside, as `retrysafe check` does: it sends a battery of real requests with fresh
// random keys and compares what comes back with what the IETF draft
// (draft-ietf-httpapi-idempotency-key-header) and Stripe's behaviour say should.
//
// The cases, in the order they are sent:
//
//	missing key        no Idempotency-Key: 400 when keys are required. An endpoint that
//	                   executes the request reports "keys optional" (advisory).
//	replay             the same key and body twice, one after the other: the same status
//	                   and body (required); Idempotent-Replayed: true on the second
//	                   (advisory, Stripe's marker).
//	concurrent         the same key and body 20 times at once: one execution, that is
//	                   identical responses, or 409s and one result (required).
//	other body         the first key with another body: 422, or at least a 4xx that is
//	                   not a replay (required).
//	other route        the first key on a sibling route: not the first route's response
//	                   (required).
//	two credentials    one key under two Authorization values: two independent
//	                   executions (required; not applicable without two credentials).
//	malformed keys     empty, 256 characters, a control character: 400 (the 256-character
//	                   case is advisory: the draft sets no length, Stripe stops at 255).
//	409 Retry-After    every 409 says when to retry (required: without it a careful
//	                   client does not retry a 409 at all).
//	problem+json       the idempotency errors are application/problem+json (advisory).
//
// A response can only prove "one execution" when two executions would look different.
// keycheck compares the responses to two different keys: when they are identical, and
// the API sends no replay marker, the cases that count executions say "not applicable"
// rather than guess.
//
// Every request but the missing-key and malformed-key ones is a valid request, and any
// of them may execute on the server: run it against a test deployment. Requests says
// how many will be sent.
package keycheck
