package retry

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"slices"
	"sync"
	"testing"
)

// warmUp sends a GET to /warm through rt and reads its answer whole, which leaves its
// connection idle in the pool for the next request.
func warmUp(t *testing.T, rt http.RoundTripper, url string) {
	t.Helper()
	resp, err := rt.RoundTrip(newRequest(t, context.Background(), http.MethodGet, url+"/warm", ""))
	if err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	readBody(t, resp)
}

// reuseTrace records, for each connection obtained, whether it was a reused one.
type reuseTrace struct {
	mu     sync.Mutex
	reused []bool
}

func (r *reuseTrace) context(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		r.mu.Lock()
		r.reused = append(r.reused, i.Reused)
		r.mu.Unlock()
	}})
}

func (r *reuseTrace) Reused() []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reused)
}

// countTarget returns the requests the server read for target.
func countTarget(s *rawServer, target string) []*rawRequest {
	var out []*rawRequest
	for _, r := range s.Requests() {
		if r.Target == target {
			out = append(out, r)
		}
	}
	return out
}

// A request that fails on a reused keep-alive connection after the server read it whole:
// a bare http.Transport sends it again by itself when it deems it replayable (any method
// with an Idempotency-Key or X-Idempotency-Key header), which a server that does not
// deduplicate executes twice. Through SendOnce an unsafe method is read once and the
// caller gets the error; the key still arrives with its value. Safe methods keep Go's
// resend.
func TestSendOnceNoHiddenResend(t *testing.T) {
	t.Parallel()
	requests := []struct {
		name, method, header, body string
		wantBare, wantOnce         int // reads by the server
	}{
		{"POST with Idempotency-Key and a body", http.MethodPost, "Idempotency-Key", `{"amount":100}`, 2, 1},
		{"POST with Idempotency-Key, no body", http.MethodPost, "Idempotency-Key", "", 2, 1},
		{"POST with X-Idempotency-Key and a body", http.MethodPost, "X-Idempotency-Key", `{"amount":100}`, 2, 1},
		{"PATCH with X-Idempotency-Key, no body", http.MethodPatch, "X-Idempotency-Key", "", 2, 1},
		{"DELETE with Idempotency-Key", http.MethodDelete, "Idempotency-Key", "", 2, 1},
		{"GET", http.MethodGet, "", "", 2, 2},
	}
	drops := []struct {
		name string
		mode int
	}{{"close", closeConn}, {"reset", resetConn}}
	for _, d := range drops {
		for _, rq := range requests {
			for _, once := range []bool{false, true} {
				name := d.name + "/" + rq.name + "/bare http.Transport"
				if once {
					name = d.name + "/" + rq.name + "/SendOnce"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					// Every connection: the first request is answered (keep-alive), the
					// second is read whole and then the connection is dropped unanswered.
					srv := newRawServer(t, func(r *rawRequest) rawReply {
						if r.Nth == 2 {
							return rawReply{Drop: d.mode}
						}
						return rawReply{Body: "ok"}
					})
					tr := &http.Transport{}
					t.Cleanup(tr.CloseIdleConnections)
					var rt http.RoundTripper = tr
					if once {
						rt = SendOnce(tr)
					}
					warmUp(t, rt, srv.URL())

					var trace reuseTrace
					req := newRequest(t, trace.context(context.Background()), rq.method, srv.URL()+"/op", rq.body)
					if rq.body != "" && req.GetBody == nil {
						t.Fatal("the request has no GetBody")
					}
					const key = "key-0123"
					if rq.header != "" {
						req.Header.Set(rq.header, key)
					}
					resp, err := rt.RoundTrip(req)
					if resp != nil {
						readBody(t, resp)
					}
					if r := trace.Reused(); len(r) == 0 || !r[0] {
						t.Fatalf("connections reused = %v: the request did not go out on the warm connection", r)
					}

					reads := countTarget(srv, "/op")
					want := rq.wantBare
					if once {
						want = rq.wantOnce
					}
					if len(reads) != want {
						t.Errorf("the server read the request %d times, want %d", len(reads), want)
					}
					switch {
					case want == 1 && err == nil:
						t.Errorf("RoundTrip returned %d and no error, want the failure", resp.StatusCode)
					case want == 2 && err != nil:
						t.Errorf("RoundTrip: %v, want the answer to the resend", err)
					}
					for _, r := range reads {
						if rq.header != "" {
							if got := r.Header(rq.header); !slices.Equal(got, []string{key}) {
								t.Errorf("%s on the wire = %q, want [%q]", rq.header, got, key)
							}
						}
						if r.Body != rq.body {
							t.Errorf("body on the wire %q, want %q", r.Body, rq.body)
						}
					}
				})
			}
		}
	}
}

// What the caller sees through SendOnce is what it would see through the base: its own
// request, unmodified, as the response's Request, and idle connections closed on request.
func TestSendOnceKeepsTheContract(t *testing.T) {
	t.Parallel()
	srv := newRawServer(t, func(r *rawRequest) rawReply { return rawReply{Body: "ok"} })
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	rt := SendOnce(tr)

	req := newRequest(t, context.Background(), http.MethodPost, srv.URL()+"/op", "x")
	req.Header.Set(IdempotencyKeyHeader, "k1")
	req.Header.Set("X-Idempotency-Key", "k2")
	before := req.Header.Clone()
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); body != "ok" {
		t.Errorf("body %q", body)
	}
	if resp.Request != req {
		t.Errorf("resp.Request is %p, want the caller's request %p", resp.Request, req)
	}
	if !equalHeaders(req.Header, before) {
		t.Errorf("the caller's header was modified: %v, was %v", req.Header, before)
	}
	if got := countTarget(srv, "/op"); len(got) != 1 || !slices.Equal(got[0].Header("Idempotency-Key"), []string{"k1"}) ||
		!slices.Equal(got[0].Header("X-Idempotency-Key"), []string{"k2"}) {
		t.Errorf("on the wire: %+v", got)
	}

	// CloseIdleConnections reaches the base: the next request needs a new connection.
	c, ok := rt.(interface{ CloseIdleConnections() })
	if !ok {
		t.Fatal("SendOnce's RoundTripper has no CloseIdleConnections")
	}
	c.CloseIdleConnections()
	var trace reuseTrace
	resp, err = rt.RoundTrip(newRequest(t, trace.context(context.Background()), http.MethodGet, srv.URL()+"/after", ""))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	if r := trace.Reused(); !slices.Equal(r, []bool{false}) {
		t.Errorf("connections reused after CloseIdleConnections = %v, want [false]", r)
	}
}

func equalHeaders(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// A caller's own lower-case entry and the moved canonical one end up on the wire in the
// order HTTP/1.1 writes them (sorted map keys: the canonical first).
func TestSendOnceMergesLowerCaseEntry(t *testing.T) {
	t.Parallel()
	srv := newRawServer(t, func(r *rawRequest) rawReply { return rawReply{} })
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	req := newRequest(t, context.Background(), http.MethodPost, srv.URL(), "")
	req.Header["Idempotency-Key"] = []string{"a"}
	req.Header["idempotency-key"] = []string{"b"}
	resp, err := SendOnce(tr).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	if got := srv.Requests()[0].Header("Idempotency-Key"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("on the wire %q, want [a b]", got)
	}
}

// Over HTTP/2 (which writes every header name in lower case) the key arrives too.
func TestSendOnceHTTP2(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Proto, r.Header.Get("Idempotency-Key"), r.Header.Get("X-Idempotency-Key"))
		mu.Unlock()
		io.WriteString(w, "ok")
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	base := srv.Client().Transport.(*http.Transport)
	if base.TLSClientConfig == nil {
		base.TLSClientConfig = &tls.Config{}
	}
	req := newRequest(t, context.Background(), http.MethodPost, srv.URL, "x")
	req.Header.Set(IdempotencyKeyHeader, "k1")
	req.Header.Set("X-Idempotency-Key", "k2")
	resp, err := SendOnce(base).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"HTTP/2.0", "k1", "k2"}; !slices.Equal(got, want) {
		t.Errorf("the server saw %q, want %q", got, want)
	}
}

// SendOnce of nil sends through http.DefaultTransport; SendOnce of a SendOnce is itself.
func TestSendOnceWrapping(t *testing.T) {
	t.Parallel()
	s, ok := SendOnce(nil).(*sendOnce)
	if !ok || s.base != http.DefaultTransport {
		t.Fatalf("SendOnce(nil) = %#v, want a SendOnce over http.DefaultTransport", SendOnce(nil))
	}
	tr := &http.Transport{}
	once := SendOnce(tr)
	if again := SendOnce(once); again != once {
		t.Errorf("SendOnce(SendOnce(tr)) wraps twice")
	}
}

// A request whose keys HideIdempotencyKeys hid is not resent by a bare http.Transport,
// and its keys arrive; a safe method's headers are left as they are.
func TestHideIdempotencyKeys(t *testing.T) {
	t.Parallel()
	srv := newRawServer(t, func(r *rawRequest) rawReply {
		if r.Nth == 2 {
			return rawReply{Drop: closeConn}
		}
		return rawReply{Body: "ok"}
	})
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	warmUp(t, tr, srv.URL())
	req := newRequest(t, context.Background(), http.MethodPost, srv.URL()+"/op", `{"amount":100}`)
	req.Header.Set("Idempotency-Key", "k1")
	req.Header.Set("X-Idempotency-Key", "k2")
	HideIdempotencyKeys(req)
	if _, ok := req.Header["Idempotency-Key"]; ok {
		t.Fatalf("the canonical key is still in the header map: %q", req.Header)
	}
	if resp, err := tr.RoundTrip(req); err == nil {
		readBody(t, resp)
		t.Fatalf("RoundTrip returned %d and no error, want the failure", resp.StatusCode)
	}
	reads := countTarget(srv, "/op")
	if len(reads) != 1 {
		t.Fatalf("the server read the request %d times, want 1", len(reads))
	}
	for name, want := range map[string]string{"Idempotency-Key": "k1", "X-Idempotency-Key": "k2"} {
		if got := reads[0].Header(name); !slices.Equal(got, []string{want}) {
			t.Errorf("%s on the wire = %q, want [%q]", name, got, want)
		}
	}

	get := newRequest(t, context.Background(), http.MethodGet, srv.URL()+"/op", "")
	get.Header.Set("Idempotency-Key", "k3")
	HideIdempotencyKeys(get)
	if got := get.Header["Idempotency-Key"]; !slices.Equal(got, []string{"k3"}) {
		t.Errorf("a GET's key = %q after HideIdempotencyKeys, want it left as it was", got)
	}
}

// TestHideIdempotencyKeysNoGrowth: renaming the key does not grow a header map that is
// full at its size (a proxy's outbound copy often is: eight headers fill the smallest),
// which would cost every request the map's move to a bigger table.
func TestHideIdempotencyKeysNoGrowth(t *testing.T) {
	full := func() http.Header {
		return http.Header{
			"Idempotency-Key": {"k"}, "User-Agent": {"a"}, "Content-Type": {"b"}, "Content-Length": {"c"},
			"Authorization": {"d"}, "X-Forwarded-For": {"e"}, "X-Forwarded-Host": {"f"}, "X-Forwarded-Proto": {"g"},
		}
	}
	req := &http.Request{Method: http.MethodPost}
	made := testing.AllocsPerRun(100, func() { req.Header = full() })
	hidden := testing.AllocsPerRun(100, func() {
		req.Header = full()
		HideIdempotencyKeys(req)
	})
	if hidden != made {
		t.Errorf("a full map of 8 headers: %v allocations with the key hidden, %v without: the map grew", hidden, made)
	}
	if got := req.Header["idempotency-key"]; len(req.Header) != 8 || !slices.Equal(got, []string{"k"}) {
		t.Errorf("after HideIdempotencyKeys: %q", req.Header)
	}
}
