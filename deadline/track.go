package deadline

import (
	"context"
	"errors"
)

// NoteSpent tells the Middleware (or Track) above ctx that a call made with ctx found
// the caller's budget spent: it was not sent for lack of time, or the next hop said
// that the budget it was given ran out. Transport does this for HTTP calls; a client of
// another protocol (a gRPC interceptor) calls it so that the verdict travels up the
// same way, and the failure the handler answers carries ExhaustedHeader. Only a call
// bounded by the request's own deadline counts: one bounded by a shorter deadline of
// the handler's (Reserve, a Ladder step) ran out of the handler's share, not of the
// caller's budget.
func NoteSpent(ctx context.Context) { noteSpent(ctx) }

// Track is Middleware's bookkeeping for a server of another protocol, whose caller's
// budget arrives as its context's deadline (a gRPC server's, from grpc-timeout): it
// returns a context under which Transport and NoteSpent record a call that found that
// budget spent, and a function that reports whether the budget is spent — the
// context's deadline has passed, or such a call was recorded — so that the server can
// answer its caller with its own protocol's verdict. Without a deadline on ctx it
// returns ctx, and spent always reports false.
func Track(ctx context.Context) (_ context.Context, spent func() bool) {
	dl, ok := ctx.Deadline()
	if !ok {
		return ctx, func() bool { return false }
	}
	st := &hopState{deadline: dl}
	return context.WithValue(ctx, hopKey{}, st), func() bool {
		return st.outbound.Load() || errors.Is(ctx.Err(), context.DeadlineExceeded)
	}
}
