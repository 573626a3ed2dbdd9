package retry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
)

// A keyed request that fails on a reused keep-alive connection after the server read it:
// every execution the server sees is an attempt of Transport's own, counted by the Policy
// and reported to OnRetry, never a resend hidden inside Base.
func TestTransportCountsEveryAttempt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		key     string
		autoKey bool
		drop    int
	}{
		{"caller's key, close", "k-1", false, closeConn},
		{"caller's key, reset", "k-1", false, resetConn},
		{"AutoKey, close", "", true, closeConn},
		{"AutoKey, reset", "", true, resetConn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Every connection: the first request is answered, the second read whole and
			// then dropped unanswered.
			srv := newRawServer(t, func(r *rawRequest) rawReply {
				if r.Nth == 2 {
					return rawReply{Drop: tc.drop}
				}
				return rawReply{Body: "ok"}
			})
			base := &http.Transport{}
			t.Cleanup(base.CloseIdleConnections)
			var mu sync.Mutex
			retries := 0
			tr := &Transport{Base: base, Policy: testPolicy(newFakeClock()), NoBudget: true, AutoKey: tc.autoKey,
				OnRetry: func(*http.Request, Attempt) { mu.Lock(); retries++; mu.Unlock() }}
			warmUp(t, tr, srv.URL())

			req := newRequest(t, context.Background(), http.MethodPost, srv.URL()+"/op", `{"amount":100}`)
			if tc.key != "" {
				req.Header.Set(IdempotencyKeyHeader, tc.key)
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, resp)
			mu.Lock()
			attempts := retries + 1
			mu.Unlock()
			execs := countTarget(srv, "/op")
			if len(execs) != attempts {
				t.Errorf("the server executed the request %d times, Transport counted %d attempts", len(execs), attempts)
			}
			if attempts != 2 {
				t.Errorf("attempts = %d, want 2 (the dropped one and its retry)", attempts)
			}
			var keys []string
			for _, r := range execs {
				keys = append(keys, r.Header(IdempotencyKeyHeader)...)
			}
			if len(keys) != len(execs) || (len(keys) > 1 && keys[0] != keys[1]) || keys[0] == "" {
				t.Errorf("keys on the wire %q, want one per execution, all the same", keys)
			}
		})
	}
}

// With AutoKey, a 307 or 308 redirect is the same logical request: http.Client sends the
// redirected request through RoundTrip again, and it carries the key of the first. The
// response's Request is the keyed request. A 303 turns the POST into a GET, which needs no
// key.
func TestTransportRedirectKeepsKey(t *testing.T) {
	t.Parallel()
	type seen struct{ path, method, key string }
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, seen{r.URL.Path, r.Method, r.Header.Get(IdempotencyKeyHeader)})
		mu.Unlock()
		switch r.URL.Path {
		case "/a":
			http.Redirect(w, r, "/b", http.StatusTemporaryRedirect)
		case "/b":
			http.Redirect(w, r, "/c", http.StatusPermanentRedirect)
		case "/see-other":
			http.Redirect(w, r, "/c", http.StatusSeeOther)
		default:
			w.WriteHeader(201)
		}
	}))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &Transport{Base: newBase(t), Policy: testPolicy(newFakeClock()), AutoKey: true}}

	resp, err := client.Post(srv.URL+"/a", "application/json", strings.NewReader(`{"amount":100}`))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	mu.Lock()
	chain := slices.Clone(got)
	got = nil
	mu.Unlock()
	if len(chain) != 3 || chain[2].path != "/c" {
		t.Fatalf("requests %+v, want /a, /b, /c", chain)
	}
	for _, s := range chain {
		if s.method != http.MethodPost || s.key == "" || s.key != chain[0].key {
			t.Errorf("%s: %s with key %q, want POST with the key of /a, %q", s.path, s.method, s.key, chain[0].key)
		}
	}
	if resp.Request == nil || resp.Request.Header.Get(IdempotencyKeyHeader) != chain[0].key {
		t.Errorf("resp.Request does not carry the key %q", chain[0].key)
	}

	resp, err = client.Post(srv.URL+"/see-other", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0].key == "" || got[1].method != http.MethodGet || got[1].key != "" {
		t.Errorf("303: requests %+v, want a keyed POST, then a GET without a key", got)
	}
}

// A key the caller set under a map key of another case is the key: Transport uses its
// value and sends one header, and treats the request as keyed.
func TestTransportKeyInAnyCase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		header  http.Header
		autoKey bool
		want    []string // the key lines of each request on the wire
	}{
		{"lower case, AutoKey", http.Header{"idempotency-key": {"k"}}, true, []string{"k"}},
		{"upper case, no AutoKey", http.Header{"IDEMPOTENCY-KEY": {"k"}}, false, []string{"k"}},
		{"canonical and lower case, same value", http.Header{"Idempotency-Key": {"k"}, "idempotency-key": {"k"}}, true, []string{"k"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// 503 to the first execution: the request is retried only when it counts as
			// keyed.
			srv := newRawServer(t, func(r *rawRequest) rawReply {
				if r.Conn == 1 && r.Nth == 1 {
					return rawReply{Status: 503}
				}
				return rawReply{Body: "ok"}
			})
			tr := &Transport{Base: newBase(t), Policy: testPolicy(newFakeClock()), NoBudget: true, AutoKey: tc.autoKey}
			req := newRequest(t, context.Background(), http.MethodPost, srv.URL(), "x")
			for k, v := range tc.header {
				req.Header[k] = v
			}
			before := req.Header.Clone()
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 {
				t.Errorf("status %d, want 200 after a retry", resp.StatusCode)
			}
			readBody(t, resp)
			reqs := srv.Requests()
			if len(reqs) != 2 {
				t.Errorf("%d executions, want 2", len(reqs))
			}
			for _, r := range reqs {
				if got := r.Header(IdempotencyKeyHeader); !slices.Equal(got, tc.want) {
					t.Errorf("key lines on the wire %q, want %q (all lines: %q)", got, tc.want, r.Lines)
				}
			}
			if !equalHeaders(req.Header, before) {
				t.Errorf("the caller's header was modified: %v, was %v", req.Header, before)
			}
		})
	}
}
