package bench

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// paymentBody is the body of every POST /payments the benchmarks send.
const paymentBody = `{"amount":1250,"currency":"EUR"}`

// createdHandler answers every request 201 with a small JSON body, as POST /payments does.
func createdHandler() http.HandlerFunc {
	body := []byte(`{"id":1,"user":"bench","amount":1250,"currency":"EUR","created_at":"2026-01-02T03:04:05Z"}` + "\n")
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/1")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	}
}

// BenchmarkMiddleware measures the middleware's own cost on the in-memory store, without
// network: bare is the handler alone, first-execution a new key each time (claim, run,
// complete), replay one completed key answered from the store. Every case builds the
// same request, key header included, so the differences are the middleware's.
func BenchmarkMiddleware(b *testing.B) {
	cases := []struct {
		name      string
		protected bool
		key       func(i int) string
		want      string // the Idempotent-Replayed header expected
	}{
		{"bare", false, func(i int) string { return "bare-" + strconv.Itoa(i) }, ""},
		{"first-execution", true, func(i int) string { return "first-" + strconv.Itoa(i) }, ""},
		{"replay", true, func(int) string { return "replay" }, "true"},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var h http.Handler = createdHandler()
			if c.protected {
				// A new store for every run, so that each run's keys are new.
				mw, err := idempotency.New(idempotency.Config{Store: memstore.New(), Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = mw.Shutdown(context.Background()) })
				h = mw.Handler(h)
			}
			serve := func(i int) *httptest.ResponseRecorder {
				r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(paymentBody))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Idempotency-Key", c.key(i))
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			if c.name == "replay" {
				serve(0) // the execution that the loop replays
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				w := serve(i)
				if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != c.want {
					b.Fatalf("answer %d %v %s", w.Code, w.Header(), w.Body)
				}
			}
		})
	}
}
