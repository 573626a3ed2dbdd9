package idempotency

import (
	"encoding/json"
	"net/http"
	"strconv"
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
	ProblemInvalidMethod    = "urn:retrysafe:problem:invalid-method"
	ProblemBodyTimeout      = "urn:retrysafe:problem:body-timeout"
	ProblemOverloaded       = "urn:retrysafe:problem:overloaded"
	ProblemDeadlineExceeded = "urn:retrysafe:problem:deadline-exceeded"
)

// WriteProblem writes p as application/problem+json. retryAfter > 0 adds a Retry-After
// header in seconds.
func WriteProblem(w http.ResponseWriter, p Problem, retryAfter int) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	body, _ := json.Marshal(p) // a struct of strings and an int always marshals
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}
