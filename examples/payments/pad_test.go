package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

func TestPadded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ct, body string
		n        int
		padded   bool
	}{
		{"application/json", "{\"id\":1}\n", 1024, true},
		{"application/json; charset=utf-8", `{"id":1}`, 65536, true},
		{"application/json", "{}\n", 100, true},
		{"application/json", "{\"id\":1}\n", 5, false},  // already longer
		{"application/json", "{\"id\":1}\n", 12, false}, // no room for the member
		{"application/json", "[1,2]", 100, false},
		{"application/problem+json", `{"title":"x"}`, 100, false},
		{"text/plain", "{}", 100, false},
	} {
		got := padded(tc.ct, []byte(tc.body), tc.n)
		if !tc.padded {
			if string(got) != tc.body {
				t.Errorf("%q %q → %q, want it unchanged", tc.ct, tc.body, got)
			}
			continue
		}
		var v map[string]any
		if len(got) != tc.n || json.Unmarshal(got, &v) != nil || v["pad"] == nil || (len(v) > 1 && v["id"] != 1.0) {
			t.Errorf("%q %q → %d bytes %.60q, want %d bytes of JSON with a pad member", tc.ct, tc.body, len(got), got, tc.n)
		}
		if tc.body[len(tc.body)-1] == '\n' && got[len(got)-1] != '\n' {
			t.Errorf("%q: the trailing newline was lost", tc.body)
		}
	}
}

func TestPadJSON(t *testing.T) {
	t.Parallel()
	h := padJSON(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "9")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("{\"id\":1}\n"))
	}), 1024)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/payments", nil))
	if rec.Code != http.StatusCreated || rec.Body.Len() != 1024 || rec.Header().Get("Content-Length") != strconv.Itoa(1024) {
		t.Errorf("%d, %d bytes, Content-Length %q", rec.Code, rec.Body.Len(), rec.Header().Get("Content-Length"))
	}
	if _, err := parse([]string{"--pad", "-1"}, nil); err == nil {
		t.Error("--pad -1: no error")
	}
	if o, err := parse([]string{"--pad", "65536"}, nil); err != nil || o.pad != 65536 {
		t.Errorf("--pad 65536: %+v, %v", o, err)
	}
}
