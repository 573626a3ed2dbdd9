package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// counted is a handler that executes every request it gets and says which execution
// it was, so that two executions never look alike.
func counted(n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "execution %d", n.Add(1))
	})
}

func newKeyed(t *testing.T, cfg idempotency.Config, n *atomic.Int64) http.Handler {
	cfg.Store, cfg.Logger = memstore.New(), slog.New(slog.DiscardHandler)
	mw, err := idempotency.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mw.Shutdown(context.Background()) })
	return mw.Handler(counted(n))
}

func do(h http.Handler, body string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// A webhook keyed by its event id in the body, retried by its sender with another
// delivery timestamp (which the fingerprint ignores), executes once: the retries get the
// replay. Another event executes; a body without the id is refused.
func TestKeyFromTheBody(t *testing.T) {
	var n atomic.Int64
	h := newKeyed(t, idempotency.Config{KeyPointer: "/id", FingerprintIgnore: []string{"/delivered_at"}}, &n)
	first := do(h, `{"id":"evt_1","type":"charge.succeeded","delivered_at":1700000000}`)
	retry := do(h, `{"type":"charge.succeeded","delivered_at":1700000060,"id":"evt_1"}`)
	if first.Code != 201 || retry.Code != 201 || retry.Header().Get("Idempotent-Replayed") != "true" || retry.Body.String() != first.Body.String() {
		t.Fatalf("first %d %q, retry %d %v %q: want the retry replayed", first.Code, first.Body, retry.Code, retry.Header(), retry.Body)
	}
	if other := do(h, `{"id":"evt_2","type":"charge.succeeded","delivered_at":1}`); other.Code != 201 || other.Header().Get("Idempotent-Replayed") != "" {
		t.Errorf("another event: %d %v", other.Code, other.Header())
	}
	if n.Load() != 2 {
		t.Errorf("%d executions, want 2 (one per event)", n.Load())
	}
	// The same id with another payload (not only the ignored field) is a reused key.
	if w := do(h, `{"id":"evt_1","type":"charge.refunded","delivered_at":1}`); w.Code != http.StatusUnprocessableEntity {
		t.Errorf("same id, other event: %d, want 422", w.Code)
	}
	for _, body := range []string{`{"type":"x"}`, `not json`, ``} {
		if w := do(h, body); w.Code != http.StatusBadRequest {
			t.Errorf("body %q: %d, want 400 (no key)", body, w.Code)
		}
	}
	for _, body := range []string{`{"id":""}`, `{"id":{"a":1}}`, `{"id":"has space"}`, `{"id":"` + strings.Repeat("x", 256) + `"}`} {
		if w := do(h, body); w.Code != http.StatusBadRequest {
			t.Errorf("body %q: %d, want 400 (invalid key)", body, w.Code)
		}
	}
	if n.Load() != 2 {
		t.Errorf("%d executions after the refusals, want still 2", n.Load())
	}
}

// Without the ignore list, the sender's new timestamp makes its retry a 422: the list
// is what turns those retries into replays.
func TestFingerprintIgnoreIsWhatMakesTheReplay(t *testing.T) {
	var n atomic.Int64
	h := newKeyed(t, idempotency.Config{KeyPointer: "/id"}, &n)
	do(h, `{"id":"evt_1","delivered_at":1}`)
	if w := do(h, `{"id":"evt_1","delivered_at":2}`); w.Code != http.StatusUnprocessableEntity {
		t.Errorf("retry with another timestamp, nothing ignored: %d, want 422", w.Code)
	}
}

// A key in another header (a sender's delivery id) works like Idempotency-Key, which is
// then not a key.
func TestKeyHeader(t *testing.T) {
	var n atomic.Int64
	h := newKeyed(t, idempotency.Config{KeyHeader: "X-GitHub-Delivery"}, &n)
	a := do(h, `{}`, "X-GitHub-Delivery", "d-1")
	b := do(h, `{}`, "X-GitHub-Delivery", "d-1")
	if a.Code != 201 || b.Header().Get("Idempotent-Replayed") != "true" || n.Load() != 1 {
		t.Fatalf("%d, %d %v, %d executions", a.Code, b.Code, b.Header(), n.Load())
	}
	if w := do(h, `{}`, "Idempotency-Key", "k"); w.Code != http.StatusBadRequest {
		t.Errorf("only an Idempotency-Key: %d, want 400 (the key is X-GitHub-Delivery)", w.Code)
	}
	// A malformed key is reported under the header it came from.
	for _, bad := range [][]string{{"X-GitHub-Delivery", "a b"}, {"X-GitHub-Delivery", "d-2", "X-GitHub-Delivery", "d-3"}} {
		w := do(h, `{}`, bad...)
		if body := w.Body.String(); w.Code != http.StatusBadRequest || !strings.Contains(body, "X-GitHub-Delivery") || strings.Contains(body, `the Idempotency-Key`) {
			t.Errorf("%q: %d %s, want a 400 that names X-GitHub-Delivery", bad, w.Code, body)
		}
	}
}

// Cookie scopes: two session cookies never share a record; NoScope puts every caller in
// one scope.
func TestCookieAndNoScope(t *testing.T) {
	var n atomic.Int64
	h := newKeyed(t, idempotency.Config{Scope: idempotency.CookieScope("session")}, &n)
	do(h, `{}`, "Idempotency-Key", "k", "Cookie", "session=alice")
	do(h, `{}`, "Idempotency-Key", "k", "Cookie", "session=bob")
	if w := do(h, `{}`, "Idempotency-Key", "k", "Cookie", "session=alice"); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("alice's retry: %v, want the replay", w.Header())
	}
	if n.Load() != 2 {
		t.Errorf("%d executions, want 2: one per cookie", n.Load())
	}
	var m atomic.Int64
	none := newKeyed(t, idempotency.Config{Scope: idempotency.NoScope}, &m)
	do(none, `{}`, "Idempotency-Key", "k", "Authorization", "Bearer a")
	if w := do(none, `{}`, "Idempotency-Key", "k", "Authorization", "Bearer b"); w.Header().Get("Idempotent-Replayed") != "true" || m.Load() != 1 {
		t.Errorf("no scope, other credential: %v, %d executions; want the replay", w.Header(), m.Load())
	}
}

func TestKeySourceConfigErrors(t *testing.T) {
	for _, cfg := range []idempotency.Config{
		{KeyHeader: "X Key"}, {KeyPointer: "id"}, {KeyPointer: "/a~2"}, {FingerprintIgnore: []string{""}},
	} {
		if _, err := cfg.Resolve(); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

// A request without its key is answered in the words of whoever sends it. A webhook
// route (the key in the body, or in a sender's own header) is told where the key was
// expected, with no advice on making keys: its sender has one per event already. An
// API route keeps the advice its clients need.
func TestMissingKeyWording(t *testing.T) {
	for _, c := range []struct {
		name       string
		cfg        idempotency.Config
		body       string
		want, lack []string
	}{
		{"body pointer", idempotency.Config{KeyPointer: "/data/id"}, `{"type":"x","data":{}}`,
			[]string{"/data/id", "body"}, []string{"Idempotency-Key", "UUID", "generated"}},
		{"body not JSON", idempotency.Config{KeyPointer: "/id"}, `id=1`,
			[]string{"/id", "JSON"}, []string{"Idempotency-Key", "UUID", "generated"}},
		{"sender's header", idempotency.Config{KeyHeader: "X-GitHub-Delivery"}, `{}`,
			[]string{"X-GitHub-Delivery"}, []string{"Idempotency-Key", "UUID", "generated"}},
		{"API client", idempotency.Config{}, `{}`,
			[]string{"Idempotency-Key", "UUID"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var n atomic.Int64
			w := do(newKeyed(t, c.cfg, &n), c.body)
			var p idempotency.Problem
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != http.StatusBadRequest || p.Type != idempotency.ProblemMissingKey {
				t.Fatalf("%d %s (%v): want 400 %s", w.Code, w.Body, err, idempotency.ProblemMissingKey)
			}
			text := p.Title + "\n" + p.Detail
			for _, s := range c.want {
				if !strings.Contains(text, s) {
					t.Errorf("the problem does not say %q:\n%s", s, text)
				}
			}
			for _, s := range c.lack {
				if strings.Contains(text, s) {
					t.Errorf("the problem says %q:\n%s", s, text)
				}
			}
			if n.Load() != 0 {
				t.Errorf("%d executions, want none", n.Load())
			}
		})
	}
}

// A malformed key is reported under the name of where it came from: the body's
// pointer, or the sender's header.
func TestInvalidKeyWording(t *testing.T) {
	for _, c := range []struct {
		cfg    idempotency.Config
		body   string
		header []string
		want   string
	}{
		{idempotency.Config{KeyPointer: "/id"}, `{"id":""}`, nil, "/id"},
		{idempotency.Config{KeyHeader: "X-GitHub-Delivery"}, `{}`, []string{"X-GitHub-Delivery", "a b"}, "X-GitHub-Delivery"},
	} {
		var n atomic.Int64
		w := do(newKeyed(t, c.cfg, &n), c.body, c.header...)
		var p idempotency.Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Type != idempotency.ProblemInvalidKey {
			t.Fatalf("key at %s: %d %s", c.want, w.Code, w.Body)
		}
		if text := p.Title + "\n" + p.Detail; !strings.Contains(text, c.want) || strings.Contains(text, "Idempotency-Key") {
			t.Errorf("the problem does not name %s alone:\n%s", c.want, text)
		}
	}
}
