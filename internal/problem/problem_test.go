package problem_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/retrysafe/retrysafe/internal/problem"
)

func TestWrite(t *testing.T) {
	for _, tc := range []struct {
		name       string
		d          problem.Details
		retryAfter int
		body       string
	}{
		{"detail", problem.Details{Type: "urn:x", Title: "T", Status: 409, Detail: "d <&>"}, 2,
			`{"type":"urn:x","title":"T","status":409,"detail":"d \u003c\u0026\u003e"}` + "\n"},
		{"no detail", problem.Details{Type: "urn:y", Title: "U", Status: 504}, 0,
			`{"type":"urn:y","title":"U","status":504}` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			w.Header().Set("X-Kept", "1")
			problem.Write(w, tc.d, tc.retryAfter)
			if w.Code != tc.d.Status || w.Body.String() != tc.body {
				t.Errorf("got %d %q, want %d %q", w.Code, w.Body, tc.d.Status, tc.body)
			}
			want := http.Header{"Content-Type": {"application/problem+json"}, "Cache-Control": {"no-store"},
				"X-Kept": {"1"}, "Content-Length": {strconv.Itoa(len(tc.body))}}
			if tc.retryAfter > 0 {
				want.Set("Retry-After", strconv.Itoa(tc.retryAfter))
			}
			for k := range want {
				if w.Header().Get(k) != want.Get(k) {
					t.Errorf("%s: %q, want %q", k, w.Header().Get(k), want.Get(k))
				}
			}
			if len(w.Header()) != len(want) {
				t.Errorf("header %v, want %v", w.Header(), want)
			}
		})
	}
}
