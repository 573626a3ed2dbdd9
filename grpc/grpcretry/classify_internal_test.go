package grpcretry

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// deadlineRunOut is a caller's context whose deadline has passed while its timer has not
// yet fired: Err is still nil.
type deadlineRunOut struct{ context.Context }

func (deadlineRunOut) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// An attempt that ends on the caller's deadline before the caller's context says so
// (here as grpc-go reports a server's RST_STREAM at the deadline) is returned as it is,
// not retried and not wrapped: the caller's time is up.
func TestClassifyCallerDeadlinePassed(t *testing.T) {
	err := status.Error(codes.DeadlineExceeded, "stream terminated by RST_STREAM with error code: CANCEL")
	if got := classify(deadlineRunOut{context.Background()}, err, true, nil, false, true); got != err {
		t.Fatalf("classify: %#v, want the attempt's error as it is", got)
	}
	// With time left, the same error of a keyed call is another attempt's business.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if got := classify(ctx, err, true, nil, false, true); !retryable(got) {
		t.Fatalf("classify with an hour left: %#v, want a retryable attempt", got)
	}
}
