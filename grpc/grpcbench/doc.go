// Package grpcbench holds the benchmarks of the gRPC interceptors: the CPU per call of
// the server interceptor (grpcidem) on the memory store and PostgreSQL against the bare
// call, and of the client interceptor (grpcretry) against a bare client. The commands
// and figures are in bench/README.md.
package grpcbench
