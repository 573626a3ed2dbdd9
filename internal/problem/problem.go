// Package problem writes RFC 9457 problem details, the body of every error answer the
// module's HTTP layers send (package idempotency's WriteProblem, package deadline's
// 504s), so that they all have one shape: the same members, the same headers.
package problem

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Details is an RFC 9457 problem details object.
type Details struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// Write answers d with status d.Status: its JSON and a newline, as
// application/problem+json, with Cache-Control: no-store (the answer is about one
// request; no cache may serve it for another) and the body's Content-Length.
// retryAfter > 0 adds a Retry-After header in seconds. Headers the caller set on w
// before go out with it.
func Write(w http.ResponseWriter, d Details, retryAfter int) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	body, _ := json.Marshal(d) // a struct of strings and an int always marshals
	body = append(body, '\n')
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(d.Status)
	_, _ = w.Write(body)
}
