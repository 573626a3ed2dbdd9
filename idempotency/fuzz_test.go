package idempotency_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// quote writes key as a structured-field string.
func quote(key string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

// FuzzParseKey: any header value either is refused or gives a key of 1 to 255 visible
// ASCII characters, which its quoted form gives back, and which its bare form gives
// back whenever the bare form is allowed.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a\\b"`, `"`, `""`, `a,b`, `"a", "b"`, `"a";p=1`,
		" k ", "\tk", strings.Repeat("x", 256), `"` + strings.Repeat("x", 255) + `"`, "clé", `"a\qb"`, "8e03978e-40d5-43e8-bc93-6894a57f9324"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := idempotency.ParseKey(v)
		if err != nil {
			if key != "" {
				t.Fatalf("ParseKey(%q) = %q with error %v", v, key, err)
			}
			return
		}
		if key == "" || len(key) > idempotency.MaxKeyLen {
			t.Fatalf("ParseKey(%q) = %q: length %d", v, key, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x21 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte %#x", v, key, key[i])
			}
		}
		if again, err := idempotency.ParseKey(quote(key)); err != nil || again != key {
			t.Fatalf("quoted form of %q gives %q, %v", key, again, err)
		}
		if !strings.ContainsAny(key, "\",;\\") {
			if again, err := idempotency.ParseKey(key); err != nil || again != key {
				t.Fatalf("bare form of %q gives %q, %v", key, again, err)
			}
		}
		// A comma outside quotes makes a list, never a key.
		if !strings.HasPrefix(strings.TrimLeft(v, " \t"), `"`) && strings.Contains(v, ",") {
			t.Fatalf("ParseKey(%q) accepted a list as %q", v, key)
		}
	})
}

// FuzzCanonicalJSONFingerprint: with canonical JSON, two bodies that decode to the
// same JSON value have one fingerprint, and re-encoding a body (another key order and
// spacing) never changes it; a body that is not JSON is hashed as its bytes.
func FuzzCanonicalJSONFingerprint(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[1,2,{"c":null}]}`, `{"b":2, "a":1}`, `[1e3, 1000, 1.0]`, `"x"`, `{}`, `not json`,
		`{"a":1}{"b":2}`, `{"a":"\u00e9"}`, `{"a":1,"a":2}`, "\xff", `{"n":12345678901234567890123}`} {
		f.Add(s)
	}
	fp := func(body []byte) string {
		return idempotency.Fingerprint("POST", "/p", "", "application/json", body, true)
	}
	f.Fuzz(func(t *testing.T, body string) {
		got := fp([]byte(body))
		if got != fp([]byte(body)) {
			t.Fatal("the fingerprint of one body changed")
		}
		var v any
		dec := json.NewDecoder(strings.NewReader(body))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil || dec.More() {
			if raw := idempotency.Fingerprint("POST", "/p", "", "application/json", []byte(body), false); raw != got {
				t.Fatalf("body %q is not JSON, yet canonical fingerprinting changed it", body)
			}
			return
		}
		// Re-encoded with other spacing (and, for objects, Go's sorted key order).
		re, err := json.MarshalIndent(v, " ", "\t")
		if err != nil {
			t.Fatal(err)
		}
		if fp(re) != got {
			t.Fatalf("body %q and its re-encoding %q have different fingerprints", body, re)
		}
	})
}

// FuzzKeyFromBody: whatever body a webhook sender sends, a route keyed by a JSON
// pointer answers 201 (a key it could read, executed or replayed), 400 (none, or
// malformed) or 422 (a key an earlier input used with another body), never anything
// else, and never panics.
func FuzzKeyFromBody(f *testing.F) {
	for _, s := range []string{`{"id":"evt_1"}`, `{"id":12}`, `{"id":""}`, `{"a":{"id":1}}`, `[1,2]`, `{"id":"x"} {}`, `not json`, ``} {
		f.Add(s)
	}
	mw, err := idempotency.New(idempotency.Config{Store: memstore.New(), KeyPointer: "/id",
		FingerprintIgnore: []string{"/created"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated && w.Code != http.StatusBadRequest && w.Code != http.StatusUnprocessableEntity {
			t.Fatalf("body %q: %d %s", body, w.Code, w.Body)
		}
	})
}
