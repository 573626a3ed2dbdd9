package idempotencytest

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// testMiddlewareDown checks the middleware in front of a failing store: fail closed (503
// problem+json with Retry-After, the handler never runs) by default, and the handler runs
// unprotected with FailOpen.
func testMiddlewareDown(t *testing.T, s idempotency.Store) {
	t.Helper()
	for _, failOpen := range []bool{false, true} {
		mw, err := idempotency.New(idempotency.Config{Store: s, FailOpen: failOpen, StoreTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = mw.Shutdown(context.Background()) })
		runs := 0
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			w.WriteHeader(http.StatusCreated)
		}))
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if failOpen {
			if w.Code != http.StatusCreated || runs != 1 {
				t.Errorf("fail open: status %d, runs %d; want 201 and 1", w.Code, runs)
			}
			continue
		}
		var p idempotency.Problem
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" ||
			w.Header().Get("Content-Type") != "application/problem+json" ||
			json.Unmarshal(w.Body.Bytes(), &p) != nil || p.Type != idempotency.ProblemStoreUnavailable {
			t.Errorf("store down: %d %v %s; want 503 problem+json with Retry-After", w.Code, w.Header(), w.Body)
		}
		if runs != 0 {
			t.Error("store down: the handler ran (fail closed must not run it)")
		}
	}
}
