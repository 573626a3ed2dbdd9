// Package retrysafegrpc is the module of retrysafe's gRPC integration: a server
// interceptor that gives unary calls the Idempotency-Key contract of the HTTP middleware
// (package grpcidem), and a client interceptor that retries unary calls by retry's rules
// (package grpcretry). It is a module of its own so that neither the library's core
// packages nor the retrysafe binary depend on gRPC.
package retrysafegrpc
