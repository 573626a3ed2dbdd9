package deadline_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/deadline"
)

// TestTrack: under Track, a call through Transport that is refused for lack of time, or
// answered with ExhaustedHeader, marks the budget spent; a call under a shorter deadline
// of the handler's does not, and neither does a successful call.
func TestTrack(t *testing.T) {
	t.Parallel()
	exhausted := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(deadline.ExhaustedHeader, "?1")
		w.WriteHeader(http.StatusGatewayTimeout)
	}))
	t.Cleanup(exhausted.Close)
	fine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(fine.Close)
	get := func(ctx context.Context, url string, reserve time.Duration) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Transport: deadline.Transport{Reserve: reserve}}
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	for _, tc := range []struct {
		name  string
		call  func(ctx context.Context)
		spent bool
	}{
		{"a successful call", func(ctx context.Context) { get(ctx, fine.URL, 0) }, false},
		{"the next hop's verdict", func(ctx context.Context) { get(ctx, exhausted.URL, 0) }, true},
		{"not sent for lack of time", func(ctx context.Context) { get(ctx, fine.URL, time.Hour) }, true},
		{"under the handler's own shorter deadline", func(ctx context.Context) {
			child, cancel := deadline.Reserve(ctx, time.Minute)
			defer cancel()
			get(child, exhausted.URL, 0)
		}, false},
		{"another protocol's call (NoteSpent)", deadline.NoteSpent, true},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		tracked, spent := deadline.Track(ctx)
		tc.call(tracked)
		if got := spent(); got != tc.spent {
			t.Errorf("%s: spent %v, want %v", tc.name, got, tc.spent)
		}
		cancel()
	}
	untracked, spent := deadline.Track(t.Context())
	deadline.NoteSpent(untracked)
	if spent() {
		t.Error("without a deadline: spent")
	}
}

// TestNoteSpentUnderMiddleware: a handler whose call of another protocol found the
// caller's budget spent (NoteSpent) answers its failure with ExhaustedHeader.
func TestNoteSpentUnderMiddleware(t *testing.T) {
	t.Parallel()
	for _, note := range []bool{false, true} {
		h := deadline.Middleware(deadline.Config{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if note {
				deadline.NoteSpent(r.Context())
			}
			w.WriteHeader(http.StatusBadGateway)
		}))
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.Header.Set(deadline.DefaultHeader, "10000") // under the server's budget: the caller's sets the deadline
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if got := w.Header().Get(deadline.ExhaustedHeader) == "?1"; got != note {
			t.Errorf("NoteSpent %v: %s on the 502: %v, want %v", note, deadline.ExhaustedHeader, got, note)
		}
	}
}
