// Package grpcdeadline carries package deadline's budgets across gRPC hops, so that one
// budget bounds a chain of HTTP and gRPC calls, whatever their order.
//
// gRPC carries a deadline by itself: a client's context deadline travels as
// grpc-timeout and becomes the server handler's context deadline. So a budget that
// arrives over HTTP (Request-Budget-Ms, read by deadline.Middleware into the request's
// context) is already the deadline of a gRPC call made with that context, and a gRPC
// server's deadline is already the budget deadline.Transport writes into an HTTP call
// made with its context. What this package adds is what package deadline adds to HTTP:
//
//   - UnaryClientInterceptor keeps a reserve back, as deadline.Transport does: the call
//     is sent with the caller's deadline minus the reserve (the hop's latency and the
//     time the caller needs to use the answer, which the next hop cannot see), and a
//     call that has no more than the reserve left is not sent at all: it fails at once
//     with DEADLINE_EXCEEDED, since the next hop could not finish it.
//   - The verdict travels back. When the caller's budget is spent — a call was refused
//     for lack of time, or the next hop says its budget ran out — the failure each hop
//     answers says so: over HTTP with deadline.ExhaustedHeader, over gRPC as
//     DEADLINE_EXCEEDED with the ExhaustedMetadata trailer. No hop above resends the
//     request, since its caller has stopped waiting. UnaryServerInterceptor answers a
//     gRPC caller so; UnaryClientInterceptor reports a gRPC hop's verdict to the
//     deadline.Middleware of an HTTP handler above it (deadline.NoteSpent).
//
// A chain HTTP → gRPC → HTTP:
//
//	// service A, HTTP: the caller's budget becomes the request's deadline
//	http.Handle("/", deadline.Middleware(deadline.Config{})(handlerA)) // calls B with r.Context()
//	connB, _ := grpc.NewClient(b, grpc.WithChainUnaryInterceptor(grpcdeadline.UnaryClientInterceptor(50*time.Millisecond)), …)
//
//	// service B, gRPC: the deadline arrives as grpc-timeout
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(grpcdeadline.UnaryServerInterceptor()))
//	clientC := &http.Client{Transport: deadline.Transport{Reserve: 50 * time.Millisecond}} // calls C with its ctx
//
// Under retries, put the reserve below the retry layer (after grpcretry's interceptor in
// the chain), so that each attempt is sent with the budget left when it is sent.
package grpcdeadline

import (
	"context"
	"errors"
	"time"

	"github.com/retrysafe/retrysafe/deadline"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ExhaustedMetadata is the trailer metadata entry with which a gRPC hop says that its
// caller's budget is spent, "?1" as deadline.ExhaustedHeader says it over HTTP. It
// comes with DEADLINE_EXCEEDED; a client must not resend the call.
const ExhaustedMetadata = "request-budget-exhausted"

// UnaryClientInterceptor sends each call with the caller's deadline less reserve, and
// does not send a call that has no more than reserve left: that fails with
// DEADLINE_EXCEEDED at once. A call without a deadline is sent as it is. When the call
// was refused, or its answer is DEADLINE_EXCEEDED with ExhaustedMetadata, or
// DEADLINE_EXCEEDED once its shortened deadline has passed, the caller's budget is spent,
// and the deadline.Middleware (or deadline.Track) above the caller's context learns it.
// A negative reserve is zero.
func UnaryClientInterceptor(reserve time.Duration) grpc.UnaryClientInterceptor {
	reserve = max(reserve, 0)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		dl, ok := ctx.Deadline()
		if !ok {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		send := dl.Add(-reserve)
		left := time.Until(send)
		if left < time.Millisecond { // grpc-timeout's finest unit that a server would act on
			deadline.NoteSpent(ctx)
			return status.Errorf(codes.DeadlineExceeded, "grpcdeadline: %v left, %v reserved: call not sent",
				max(time.Until(dl), 0).Round(time.Microsecond), reserve)
		}
		callCtx, cancel := context.WithDeadline(ctx, send)
		defer cancel()
		var trailer metadata.MD
		err := invoker(callCtx, method, req, reply, cc, append(opts, grpc.Trailer(&trailer))...)
		if status.Code(err) == codes.DeadlineExceeded &&
			(exhausted(trailer) || errors.Is(callCtx.Err(), context.DeadlineExceeded)) {
			deadline.NoteSpent(ctx)
		}
		return err
	}
}

func exhausted(md metadata.MD) bool {
	vs := md.Get(ExhaustedMetadata)
	return len(vs) > 0 && vs[0] == "?1"
}

// UnaryServerInterceptor does not run a call whose deadline has passed on its way, and
// answers a failed call whose caller's budget is spent — its
// deadline (grpc-timeout) has passed, or a call the handler made with its context found
// the budget spent (through deadline.Transport or UnaryClientInterceptor) — with
// DEADLINE_EXCEEDED and the ExhaustedMetadata trailer, whatever the handler's own error
// was, so that the verdict travels up the chain. A call without a deadline, and every
// successful call, is left as it is.
func UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// The budget was spent on the way: the work could not finish, so it does not start.
			_ = grpc.SetTrailer(ctx, metadata.Pairs(ExhaustedMetadata, "?1"))
			return nil, status.Error(codes.DeadlineExceeded, "the caller's budget was spent before the call could run")
		}
		tracked, spent := deadline.Track(ctx)
		resp, err := handler(tracked, req)
		if err == nil || !spent() {
			return resp, err
		}
		_ = grpc.SetTrailer(ctx, metadata.Pairs(ExhaustedMetadata, "?1"))
		if status.Code(err) == codes.DeadlineExceeded {
			return nil, err
		}
		return nil, status.Errorf(codes.DeadlineExceeded, "the caller's budget is spent: %v", status.Convert(err).Message())
	}
}
