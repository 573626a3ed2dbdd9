package grpcretry

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/retry"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// KeyMetadata is the metadata key that carries a call's idempotency key, the gRPC
// counterpart of the Idempotency-Key header (metadata keys are lower case).
const KeyMetadata = "idempotency-key"

// PushbackTrailer is the trailer in which a server says how long to wait before the
// next attempt, in whole milliseconds, as gRPC's own retry design defines it. A negative
// or unparsable value means: do not retry.
const PushbackTrailer = "grpc-retry-pushback-ms"

// ErrPushback is the reason a loop stopped when the server's pushback trailer said not
// to retry.
var ErrPushback = errors.New("grpcretry: the server asked not to retry")

// Config configures UnaryClientInterceptor. The zero value of each field means the
// default documented on it.
type Config struct {
	// Policy says how often and how long to retry: attempts, backoff and jitter, the
	// longest wait a server may ask for, the retry budget (share one retry.Budget among
	// all the calls to one service), OnRetry. Its Retryable is not used: this package
	// classifies gRPC status codes itself (see the package documentation). Default the
	// zero Policy, retry.DefaultPolicy's.
	Policy retry.Policy
	// AttemptTimeout, when positive, bounds each attempt; the caller's deadline still
	// bounds the whole call, waits included. An attempt that runs out of its own time
	// ends with DEADLINE_EXCEEDED, an unknown outcome. Default 0: attempts are bounded by
	// the caller's deadline only.
	AttemptTimeout time.Duration
	// AutoKey, when true, gives each call whose outgoing metadata has no
	// idempotency-key (and for which RequestKey finds none) a fresh random (UUIDv4)
	// key, once per call, and sends the same key on every attempt. The server must
	// honour the key (see package grpcidem). Default false.
	AutoKey bool
	// RequestKey, when set, returns the key a request message carries in its own fields
	// (an AIP-155 request_id), or "" when it has none. A call whose request carries one
	// counts as keyed: its unknown outcomes are retried with the same message. Default
	// nil: only the idempotency-key metadata makes a call keyed.
	RequestKey func(req any) string
}

// UnaryClientInterceptor returns an interceptor that retries a unary call by the rules
// of the package documentation, with retry's loop (retry.Do): cfg.Policy's backoff,
// budget and limits, the server's requested delays honoured.
//
// A call that succeeds returns nil. A call that fails in a way no retry helps with
// returns the attempt's error as it is. A call the loop gave up on returns an
// *ExhaustedError: status.Code and status.FromError read the last attempt's status
// from it, and StopReason says why the loop stopped.
func UnaryClientInterceptor(cfg Config) grpc.UnaryClientInterceptor {
	p := cfg.Policy
	p.Retryable = retryable
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		keyed := hasKey(ctx) || (cfg.RequestKey != nil && cfg.RequestKey(req) != "")
		if !keyed && cfg.AutoKey {
			ctx = metadata.AppendToOutgoingContext(ctx, KeyMetadata, retry.NewKey())
			keyed = true
		}
		attempts := 0
		err := retry.Do(ctx, p, func(ctx context.Context) error {
			attempts++
			actx, cancel := ctx, context.CancelFunc(func() {})
			if cfg.AttemptTimeout > 0 {
				actx, cancel = context.WithTimeout(ctx, cfg.AttemptTimeout)
			}
			defer cancel()
			actx, state := withAttempt(actx)
			var (
				trailer metadata.MD
				pr      peer.Peer
			)
			err := invoker(actx, method, req, reply, cc, append(opts, grpc.Trailer(&trailer), grpc.Peer(&pr))...)
			if err == nil {
				return nil
			}
			fromServer := state.tracked.Load() && state.trailers.Load()
			return classify(ctx, err, keyed, trailer, fromServer, pr.Addr != nil)
		})
		return result(err, attempts)
	}
}

// hasKey reports whether ctx's outgoing metadata carries an idempotency key.
func hasKey(ctx context.Context) bool {
	md, _ := metadata.FromOutgoingContext(ctx)
	for _, v := range md.Get(KeyMetadata) {
		if v != "" {
			return true
		}
	}
	return false
}

// attemptError is a failed attempt and its verdict.
type attemptError struct {
	err   error
	retry bool
	delay time.Duration
	asked bool // the server asked for delay
}

func (e *attemptError) Error() string { return e.err.Error() }
func (e *attemptError) Unwrap() error { return e.err }

// RetryAfter reports the wait the server asked for, for retry's loop.
func (e *attemptError) RetryAfter() (time.Duration, bool) { return e.delay, e.asked }

// GRPCStatus is the attempt's status.
func (e *attemptError) GRPCStatus() *status.Status { return status.Convert(e.err) }

func retryable(err error) bool {
	var a *attemptError
	return errors.As(err, &a) && a.retry
}

// classify decides whether the failed attempt err of a call is worth another attempt.
// ctx is the caller's context (not the attempt's), trailer the attempt's trailer
// metadata, fromServer whether the status is known to be the server's (trailers
// arrived), sent whether the attempt got a stream on a connection.
func classify(ctx context.Context, err error, keyed bool, trailer metadata.MD, fromServer, sent bool) error {
	if ctx.Err() != nil || deadlinePassed(ctx) {
		return err // the caller's time is up or it gave up: never retried
	}
	st := status.Convert(err)
	a := &attemptError{err: err}
	switch st.Code() {
	case codes.Unavailable:
		// A server's UNAVAILABLE, or a connection that failed before the call was sent,
		// means the work was not done. A connection lost after the call got a stream
		// (no trailers arrived) may have lost the answer to work that was done.
		a.retry = fromServer || !sent || keyed
	case codes.ResourceExhausted:
		a.retry = true
	case codes.Aborted:
		// ABORTED is a conflict: retried only when the server says when to try again
		// (a key still in progress), never blindly.
		_, a.retry = retryInfo(st)
	case codes.DeadlineExceeded, codes.Unknown, codes.Internal:
		a.retry = keyed
	default:
		return err
	}
	if !a.retry {
		return err
	}
	if d, ok := retryInfo(st); ok {
		a.delay, a.asked = d, true
	}
	if v := trailer.Get(PushbackTrailer); len(v) > 0 {
		ms, perr := strconv.ParseInt(strings.TrimSpace(v[len(v)-1]), 10, 64)
		if perr != nil || ms < 0 {
			return &stopError{err: err}
		}
		a.delay, a.asked = max(a.delay, time.Duration(ms)*time.Millisecond), true
	}
	return a
}

// deadlinePassed reports whether ctx's deadline is at or before now. An attempt can end
// on the caller's deadline before ctx says so: the server's end of the stream (its
// deadline is the one the call sent) or the transport's own timer may fire before
// ctx's, and until ctx's has run, ctx.Err is nil.
func deadlinePassed(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// stopError is an attempt after which the server asked not to retry.
type stopError struct{ err error }

func (e *stopError) Error() string { return e.err.Error() }
func (e *stopError) Unwrap() error { return e.err }

// retryInfo returns the delay of a google.rpc.RetryInfo among st's details.
func retryInfo(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			if err := ri.GetRetryDelay().CheckValid(); err != nil {
				continue
			}
			return max(0, ri.GetRetryDelay().AsDuration()), true
		}
	}
	return 0, false
}

// ExhaustedError is the error of a call the loop gave up on while its failures were
// worth retrying. It matches its Reason and its Last error with errors.Is; status.Code
// and status.FromError read Last's status.
type ExhaustedError struct {
	Attempts int   // attempts made, the first included
	Last     error // the last attempt's error (a status error)
	// Reason is why the loop stopped: retry.ErrMaxAttempts, retry.ErrBudget,
	// retry.ErrDeadline, retry.ErrMaxElapsed, retry.ErrServerDelay, ErrPushback, or
	// the context's cause.
	Reason error
}

// Error reads "<reason> after <n> attempt(s): <last error>".
func (e *ExhaustedError) Error() string {
	unit := " attempts: "
	if e.Attempts == 1 {
		unit = " attempt: "
	}
	return e.Reason.Error() + " after " + strconv.Itoa(e.Attempts) + unit + e.Last.Error()
}

// Unwrap returns the last error and the reason.
func (e *ExhaustedError) Unwrap() []error { return []error{e.Last, e.Reason} }

// GRPCStatus is the last attempt's status, with its code, message and details.
func (e *ExhaustedError) GRPCStatus() *status.Status { return status.Convert(e.Last) }

// StopReason returns why the interceptor stopped retrying a call that failed with err
// (see ExhaustedError.Reason), or nil when err is not one it gave up on: a success, or
// a failure it did not retry because no retry helps.
func StopReason(err error) error {
	var e *ExhaustedError
	if errors.As(err, &e) {
		return e.Reason
	}
	return nil
}

// result turns retry.Do's error into the interceptor's.
func result(err error, attempts int) error {
	var ex *retry.ExhaustedError
	if errors.As(err, &ex) {
		return &ExhaustedError{Attempts: ex.Attempts, Last: bare(ex.Last), Reason: ex.Reason}
	}
	var stop *stopError
	if errors.As(err, &stop) {
		return &ExhaustedError{Attempts: attempts, Last: stop.err, Reason: ErrPushback}
	}
	return bare(err)
}

// bare strips the verdict from an attempt's error.
func bare(err error) error {
	var a *attemptError
	if errors.As(err, &a) {
		return a.err
	}
	return err
}
