package retry

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// TestReadAheadBrokenAnswer: the first answer to a keyed POST breaks off mid-body (the
// connection closes after half its Content-Length). The key makes asking again safe, so
// Transport, told to read answers ahead, retries and the caller reads the second answer
// whole. A streamed answer (text/event-stream), an unkeyed request's answer, and any
// answer of a Transport not told to read ahead are returned as they come, and the break
// is the caller's to see.
func TestReadAheadBrokenAnswer(t *testing.T) {
	t.Parallel()
	const whole = "the whole answer, which the first attempt cuts off halfway"
	for _, tc := range []struct {
		name        string
		key         bool
		readAhead   int64 // MaxBufferedResponse
		contentType string
		wantBody    bool // the caller reads the whole answer
		attempts    int64
	}{
		{"keyed", true, 1 << 20, "application/json", true, 2},
		{"keyed stream", true, 1 << 20, "text/event-stream", false, 1},
		{"unkeyed", false, 1 << 20, "application/json", false, 1},
		{"keyed, not read ahead", true, 0, "application/json", false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var attempts atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := attempts.Add(1)
				w.Header().Set("Content-Type", tc.contentType)
				w.Header().Set("Content-Length", strconv.Itoa(len(whole)))
				if n > 1 {
					_, _ = io.WriteString(w, whole)
					return
				}
				_, _ = io.WriteString(w, whole[:20])
				_ = http.NewResponseController(w).Flush()
				conn, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					_ = conn.Close() // the answer breaks off
				}
			}))
			t.Cleanup(srv.Close)
			tr := &Transport{NoBudget: true, MaxBufferedResponse: tc.readAhead, Policy: Policy{MaxAttempts: 3, Clock: newFakeClock()}}
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			if tc.key {
				req.Header.Set(IdempotencyKeyHeader, "k1")
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got := err == nil && string(body) == whole; got != tc.wantBody {
				t.Errorf("the caller read %q (%v); whole: %v, want %v", body, err, got, tc.wantBody)
			}
			if n := attempts.Load(); n != tc.attempts {
				t.Errorf("attempts = %d, want %d", n, tc.attempts)
			}
		})
	}
}
