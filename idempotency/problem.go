package idempotency

import (
	"net/http"

	"github.com/retrysafe/retrysafe/internal/problem"
)

// Problem is an RFC 9457 problem details object. Every error the middleware answers
// is one, with content type application/problem+json.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// Problem types the middleware answers with.
const (
	ProblemMissingKey       = "urn:retrysafe:problem:missing-key"
	ProblemInvalidKey       = "urn:retrysafe:problem:invalid-key"
	ProblemInFlight         = "urn:retrysafe:problem:in-flight"
	ProblemMismatch         = "urn:retrysafe:problem:key-reused"
	ProblemBodyTooLarge     = "urn:retrysafe:problem:body-too-large"
	ProblemBodyUnreadable   = "urn:retrysafe:problem:body-unreadable"
	ProblemStoreUnavailable = "urn:retrysafe:problem:store-unavailable"
	ProblemStoreNotDurable  = "urn:retrysafe:problem:store-not-durable"
	ProblemInvalidMethod    = "urn:retrysafe:problem:invalid-method"
	ProblemBodyTimeout      = "urn:retrysafe:problem:body-timeout"
	ProblemOverloaded       = "urn:retrysafe:problem:overloaded"
	ProblemDeadlineExceeded = "urn:retrysafe:problem:deadline-exceeded"
)

// WriteProblem writes p as application/problem+json, with Cache-Control: no-store and
// its Content-Length. retryAfter > 0 adds a Retry-After header in seconds. Written by
// the middleware for a keyed Connect, gRPC or gRPC-Web request, it is that protocol's
// error instead, with the code that says the same (see the package documentation).
func WriteProblem(w http.ResponseWriter, p Problem, retryAfter int) {
	if rw, ok := w.(*rpcWriter); ok {
		rw.writeProblem(p, retryAfter)
		return
	}
	problem.Write(w, problem.Details(p), retryAfter)
}
