package grpcidem

import (
	"net/http"

	"google.golang.org/grpc/codes"
)

// httpStatus is the HTTP status a call's answer is stored under: the usual mapping of
// gRPC codes to HTTP (google.rpc.Code's documented equivalents). It decides one thing,
// through the engine's release rule: UNAVAILABLE (503) and RESOURCE_EXHAUSTED (429)
// release the key, because a method that answers them says it did not do the work;
// every other answer is stored and replayed. Operators' tools show it as the record's
// status.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.Canceled:
		return 499 // the client closed the request (no standard name)
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	default: // Unknown, Internal, DataLoss and codes unknown to this version
		return http.StatusInternalServerError
	}
}

// released is the engine's release rule for calls: the statuses of the codes that say
// the work was not done.
func released(status int) bool {
	return status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests
}
