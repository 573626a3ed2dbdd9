package idempotency_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// A handler that aborts its response (its body broke off) has nothing more of it sent:
// the client's connection is cut, so the client cannot take the part for the whole, the
// key is left to its lease (abandoned), and Serve says so with ErrAborted.
func TestAbortCutsTheConnection(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	outcomes := make(chan idempotency.Outcome, 2)
	mw, err := idempotency.New(idempotency.Config{Store: store, Logger: slog.New(slog.DiscardHandler),
		OnOutcome: func(_ *http.Request, o idempotency.Outcome) { outcomes <- o }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mw.Shutdown(context.Background()) })
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":`) // and then the source of the answer broke
		c, _ := idempotency.ClaimFromContext(r.Context())
		c.Abort()
	})
	srv := httptest.NewServer(mw.Handler(h))
	t.Cleanup(srv.Close)
	req, _ := http.NewRequest("POST", srv.URL+"/pay", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "abort-1")
	res, err := http.DefaultClient.Do(req)
	if err == nil {
		body, rerr := io.ReadAll(res.Body)
		res.Body.Close()
		if rerr == nil {
			t.Fatalf("the client got a whole answer: %d %q", res.StatusCode, body)
		}
	}
	rec, err := store.Get(context.Background(), "", "abort-1")
	if err != nil || rec.State != idempotency.StateInProgress || !rec.Abandoned {
		t.Fatalf("record = %+v, %v; want in progress, abandoned", rec, err)
	}
	if outcome := <-outcomes; outcome != idempotency.OutcomeAbandoned {
		t.Errorf("outcome = %q, want %q", outcome, idempotency.OutcomeAbandoned)
	}

	// Served directly, Serve returns the outcome and ErrAborted, and sends nothing.
	req = httptest.NewRequest("POST", "/pay", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "abort-2")
	w := httptest.NewRecorder()
	o, err := mw.Serve(w, req, h)
	if o != idempotency.OutcomeAbandoned || !errors.Is(err, idempotency.ErrAborted) {
		t.Fatalf("Serve = %q, %v; want %q, ErrAborted", o, err, idempotency.OutcomeAbandoned)
	}
	if w.Body.Len() != 0 {
		t.Errorf("Serve sent %q of an aborted answer", w.Body.String())
	}
}
