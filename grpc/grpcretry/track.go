package grpcretry

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// DialOptions returns what a client connection needs to retry through this package: the
// interceptor of cfg, the stats handler with which it tells a server's UNAVAILABLE from
// a lost connection (StatsHandler), and grpc.WithDisableRetry, so that grpc-go's own
// retries do not multiply its attempts.
func DialOptions(cfg Config) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDisableRetry(),
		grpc.WithStatsHandler(StatsHandler()),
		grpc.WithUnaryInterceptor(UnaryClientInterceptor(cfg)),
	}
}

// StatsHandler returns the stats handler (install it with grpc.WithStatsHandler) that
// tells the interceptor whether an attempt's status came from the server: whether
// trailers arrived. grpc-go reports a server's UNAVAILABLE and a connection lost in the
// middle of a call with the same code; only the trailers tell them apart. Without it,
// the interceptor takes every UNAVAILABLE of an attempt that got a stream for a possibly
// lost answer, and retries it only for a keyed call.
func StatsHandler() stats.Handler { return tracker{} }

type attemptKey struct{}

// attemptState is what the stats handler saw of one attempt.
type attemptState struct {
	tracked  atomic.Bool // the stats handler saw the attempt at all
	trailers atomic.Bool // trailers arrived: the status is the server's
}

func withAttempt(ctx context.Context) (context.Context, *attemptState) {
	a := new(attemptState)
	return context.WithValue(ctx, attemptKey{}, a), a
}

type tracker struct{}

func (tracker) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (tracker) HandleRPC(ctx context.Context, s stats.RPCStats) {
	a, _ := ctx.Value(attemptKey{}).(*attemptState)
	if a == nil || !s.IsClient() {
		return
	}
	a.tracked.Store(true)
	if _, ok := s.(*stats.InTrailer); ok {
		a.trailers.Store(true)
	}
}

func (tracker) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (tracker) HandleConn(context.Context, stats.ConnStats)                       {}
