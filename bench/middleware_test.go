package bench

import (
	"context"
	"fmt"
	"io"
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

// BenchmarkMiddlewareBodies measures the bytes a keyed request allocates against the
// size of its body, request and response: how many copies of a body the middleware
// makes. The handler discards the request body and answers with a body of the response
// size (Content-Length set, as an upstream's is); bare is the same handler without the
// middleware, so (B/op - bare B/op) / size is the middleware's copies of the body. The
// store keeps no copy of the body (a network store sends it, rather than keep it), so
// that its copies are not counted as the middleware's.
func BenchmarkMiddlewareBodies(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10, 1 << 20} {
		payload := strings.Repeat("x", size)
		for _, c := range []struct {
			name      string
			protected bool
			req, resp int // body sizes
		}{
			{"bare/request", false, size, 16},
			{"keyed/request", true, size, 16},
			{"bare/response", false, 16, size},
			{"keyed/response", true, 16, size},
		} {
			b.Run(fmt.Sprintf("%s=%dKiB", c.name, size>>10), func(b *testing.B) {
				respBody := []byte(payload[:c.resp])
				var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", "application/octet-stream")
					w.Header().Set("Content-Length", strconv.Itoa(len(respBody)))
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write(respBody)
				})
				if c.protected {
					mw, err := idempotency.New(idempotency.Config{Store: bodilessStore{memstore.New()}, MaxResponse: 4 << 20,
						Logger: slog.New(slog.DiscardHandler)})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { _ = mw.Shutdown(context.Background()) })
					h = mw.Handler(h)
				}
				reqBody := payload[:c.req]
				b.ReportAllocs()
				b.SetBytes(int64(size))
				i := 0
				for b.Loop() {
					i++
					r := httptest.NewRequest(http.MethodPost, "/upload", strings.NewReader(reqBody))
					r.Header.Set("Idempotency-Key", "k-"+strconv.Itoa(i))
					w := discardWriter{h: http.Header{}}
					h.ServeHTTP(&w, r)
					if w.status != http.StatusCreated {
						b.Fatalf("status %d", w.status)
					}
				}
			})
		}
	}
}

// bodilessStore stores responses without their bodies.
type bodilessStore struct{ *memstore.Store }

func (s bodilessStore) Complete(ctx context.Context, c idempotency.Completion) error {
	c.Response.Body = nil
	return s.Store.Complete(ctx, c)
}

// discardWriter is a ResponseWriter that keeps nothing of the body, so that the
// benchmark counts only the bytes the middleware allocates.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
