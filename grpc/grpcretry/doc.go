// Package grpcretry is a unary client interceptor that retries gRPC calls by the rules of
// package retry, with retry's loop: its Policy (attempts, backoff and jitter, the
// longest wait a server may ask for), its shared Budget, and its stop reasons.
//
// # Which failures are retried
//
// A failure is retried when a retry can help and cannot do the work twice. Some codes
// say the server did not do the work; others leave the outcome unknown, and those are
// retried only for a call that carries a key the server deduplicates on: the
// idempotency-key metadata (KeyMetadata; Config.AutoKey adds one), or a key in the
// request message itself such as an AIP-155 request_id (Config.RequestKey).
//
//	code                     retried           why
//	UNAVAILABLE              always (*)        the server (or a connection that never took the call) did not do the work
//	RESOURCE_EXHAUSTED       always            the server refused the work (rate limit, quota, overload)
//	ABORTED                  with RetryInfo    a conflict; retried only when the server says when (a key still in progress)
//	DEADLINE_EXCEEDED        with a key (**)   the attempt's time ran out: the work may have been done
//	UNKNOWN, INTERNAL        with a key        the server failed while working: the work may have been done
//	INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, UNAUTHENTICATED,
//	FAILED_PRECONDITION, OUT_OF_RANGE, UNIMPLEMENTED, DATA_LOSS, CANCELLED
//	                         never             the same call fails the same way, or a person must act
//
// (*) A connection lost after the call got a stream on it is an unknown outcome: the
// request may have reached the server and only the answer been lost. grpc-go reports it
// as UNAVAILABLE, like a server's UNAVAILABLE, and the two differ only in what arrived: a
// status the server sent comes in trailers; a lost connection ends the call without
// any. StatsHandler sees the trailers (DialOptions installs it). The rule:
//
//   - UNAVAILABLE with trailers: the server's, retried;
//   - UNAVAILABLE of an attempt that never got a stream on a connection (the dial
//     failed, the picker had none; grpc.Peer stayed empty): not sent, retried;
//   - any other UNAVAILABLE (no trailers after a stream was opened, or no StatsHandler
//     to tell): an unknown outcome, retried only with a key.
//
// grpc-go itself resends, transparently, a call the server never received (a stream
// refused, or beyond a GOAWAY's last stream): those never reach this interceptor.
//
// (**) Only an attempt's own deadline (Config.AttemptTimeout). When the caller's context
// is done, nothing is retried: the caller stopped waiting.
//
// # Delays the server asks for
//
// A google.rpc.RetryInfo in the status details (its retry_delay) and the
// grpc-retry-pushback-ms trailer (PushbackTrailer) set the wait before the next attempt,
// the longer of the two when both are present, plus a little upward jitter; never less.
// A wait longer than Policy.MaxServerDelay ends the loop (retry.ErrServerDelay). A
// negative or unparsable pushback means "do not retry": the loop stops with
// ErrPushback, as gRPC's retry design says.
//
// # Deadlines
//
// Each attempt gets its own deadline (Config.AttemptTimeout) inside the caller's, and the
// caller's bounds the whole call, waits included: a wait that would leave less than
// Policy.MinAttempt before it ends the loop at once (retry.ErrDeadline).
//
// # Beside grpc-go's own retries
//
// grpc-go retries by a service config's retryPolicy too. Use one layer, never both: the
// retries multiply, and grpc-go's layer knows nothing of keys, so it would resend an
// unknown outcome whenever its policy lists the code. Dial with grpc.WithDisableRetry()
// when you use this interceptor, as DialOptions does (the transparent resend of a call the server never
// received stays, and is safe). Use grpc-go's retryPolicy instead only for calls that
// are idempotent by nature and where the gRPC-specific throttling is enough.
//
// # Setting up
//
//	conn, err := grpc.NewClient(target, append(grpcretry.DialOptions(grpcretry.Config{
//		Policy:  retry.Policy{Budget: retry.NewBudget(0, 0)}, // one budget per service
//		AutoKey: true,
//	}), grpc.WithTransportCredentials(creds))...)
//
// # Stop reasons
//
// A call the interceptor gave up on returns an *ExhaustedError; StopReason returns why
// (retry.ErrMaxAttempts, retry.ErrBudget, retry.ErrDeadline, ErrPushback …), and
// status.Code of the error is the last attempt's code.
package grpcretry
