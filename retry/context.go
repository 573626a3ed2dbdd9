package retry

import (
	"context"
	"net/http"
)

type statusClassKey struct{}

// statusClass is one override; they form a list, the newest first.
type statusClass struct {
	code  int
	class error
	next  *statusClass
}

// WithStatusClass returns a copy of ctx in which the HTTP status code status has the class
// class instead of its default: Classify (through the context of resp.Request) and
// Transport (through the request's context) use it. A nil class makes the status a
// success. A later call for the same status wins.
//
// For a revoke, 404 means "already gone", a success:
//
//	ctx = retry.WithStatusClass(ctx, http.StatusNotFound, nil)
//
// For a read that may run ahead of replication, 404 is worth retrying:
//
//	ctx = retry.WithStatusClass(ctx, http.StatusNotFound, retry.ErrPlatform)
func WithStatusClass(ctx context.Context, status int, class error) context.Context {
	prev, _ := ctx.Value(statusClassKey{}).(*statusClass)
	return context.WithValue(ctx, statusClassKey{}, &statusClass{code: status, class: class, next: prev})
}

// statusClassFrom returns the class ctx sets for code, if it sets one.
func statusClassFrom(ctx context.Context, code int) (error, bool) {
	if ctx == nil {
		return nil, false
	}
	for s, _ := ctx.Value(statusClassKey{}).(*statusClass); s != nil; s = s.next {
		if s.code == code {
			return s.class, true
		}
	}
	return nil, false
}

type statusCheckKey struct{}

// WithStatusCheck returns a copy of ctx that carries a status check for Transport: a
// function that asks the server whether a request was executed (for example a GET of the
// resource the POST creates, found by a client-generated reference).
//
// Transport calls it, with the request's context, when a non-idempotent request without
// an Idempotency-Key failed in a retryable way after it may have reached the server (the
// connection was reset or the response lost after the request was written, a 502 …),
// instead of resending it blindly:
//
//   - a non-nil response is the outcome: Transport returns it in place of the failure;
//   - (nil, nil) means the request was not executed: resending is safe, and Transport
//     retries under its Policy;
//   - an error means the outcome is still unknown: Transport does not resend, and returns
//     the failure (an error matches ErrUnknownOutcome and the check's error).
func WithStatusCheck(ctx context.Context, check func(ctx context.Context) (*http.Response, error)) context.Context {
	return context.WithValue(ctx, statusCheckKey{}, check)
}

func statusCheckFrom(ctx context.Context) func(context.Context) (*http.Response, error) {
	f, _ := ctx.Value(statusCheckKey{}).(func(context.Context) (*http.Response, error))
	return f
}
