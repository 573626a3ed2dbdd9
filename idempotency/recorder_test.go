package idempotency_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
)

// The answer's headers are taken when the handler writes the status: the client is
// sent all of them, a replay carries all but those never stored (Date, Keep-Alive, the
// names the Connection header lists), and nothing the handler changes afterwards, in
// place or added, reaches either.
func TestRecordedHeaders(t *testing.T) {
	t.Parallel()
	mw := newCtxMiddleware(t, idempotency.Config{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("X-Kept", "v1")
		hd.Set("Connection", "X-Hop")
		hd.Set("X-Hop", "hop")
		hd.Set("Keep-Alive", "timeout=5")
		hd.Set("Date", "Sun, 06 Dec 2026 12:00:00 GMT")
		w.WriteHeader(http.StatusCreated)
		hd["X-Kept"][0] = "changed in place"
		hd.Set("X-Late", "late")
		_, _ = w.Write([]byte("ok"))
	})
	first := keyed(t, context.Background(), mw, "hdr", h)
	replay := keyed(t, context.Background(), mw, "hdr", h)
	if first.Code != http.StatusCreated || replay.Code != http.StatusCreated {
		t.Fatalf("status %d, replay %d", first.Code, replay.Code)
	}
	if got := replay.Header().Get("Idempotent-Replayed"); got != "true" {
		t.Fatalf("second answer not a replay: %v", replay.Header())
	}
	for name, want := range map[string]string{"X-Kept": "v1", "X-Hop": "hop", "Keep-Alive": "timeout=5",
		"Date": "Sun, 06 Dec 2026 12:00:00 GMT", "Connection": "X-Hop", "X-Late": "", "Content-Length": "2"} {
		if got := first.Header().Get(name); got != want {
			t.Errorf("first answer's %s: %q, want %q", name, got, want)
		}
	}
	for name, want := range map[string]string{"X-Kept": "v1", "X-Hop": "", "Keep-Alive": "", "Date": "", "Connection": "", "X-Late": "", "Content-Length": "2"} {
		if got := replay.Header().Get(name); got != want {
			t.Errorf("replay's %s: %q, want %q", name, got, want)
		}
	}
}
