// Package connecttest shows, with a real connect-go service and client, that the HTTP
// Idempotency-Key middleware (package idempotency) and retry.Transport give connect-go's
// unary calls the contract as they are: a Connect, gRPC or gRPC-Web unary call is an HTTP
// POST, its answer (status, headers, body and trailers) is stored and replayed byte for
// byte, and the middleware's own errors are written in the call's protocol, so that the
// client reads the right code. It has tests only.
package connecttest
