package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// The caller's trace: every traced test request carries it in traceparent.
const (
	callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpan  = "00f067aa0ba902b7"
	traceparent = "00-" + callerTrace + "-" + callerSpan + "-01"
	// secrets a span must never hold.
	secretAuth = "Bearer tok-SECRET-credential"
	secretBody = `{"card":"4242-SECRET-BODY"}`
)

// traced is a gateway fixture whose spans go to an in-memory exporter.
type traced struct {
	*fixture
	spans *tracetest.InMemoryExporter
}

func newTraced(t *testing.T, store idempotency.Store, up *upstream, edit func(*gateway.Config)) *traced {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	f := newFixture(t, store, up, func(c *gateway.Config) {
		c.TracerProvider = tp
		if edit != nil {
			edit(c)
		}
	})
	return &traced{f, exp}
}

// send sends a keyed POST with the caller's traceparent, the secret credential and
// body (unless body is given).
func (tf *traced) send(path, key string, body ...string) reply {
	tf.t.Helper()
	b := secretBody
	if len(body) > 0 {
		b = body[0]
	}
	return tf.do(http.MethodPost, path, key, b, "Traceparent", traceparent, "Authorization", secretAuth)
}

// request returns the tree of the n-th server span, in the order the requests began,
// of those that ended, and its children, waiting for n+1 server spans to end.
func (tf *traced) request(n int) (root tracetest.SpanStub, children []tracetest.SpanStub) {
	tf.t.Helper()
	var servers []tracetest.SpanStub
	testenv.Eventually(tf.t, 5*time.Second, func() bool {
		servers = servers[:0]
		for _, s := range tf.spans.GetSpans() {
			if s.SpanKind == trace.SpanKindServer {
				servers = append(servers, s)
			}
		}
		return len(servers) > n
	}, "server span %d", n)
	slices.SortFunc(servers, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	root = servers[n]
	for _, s := range tf.spans.GetSpans() {
		if s.Parent.SpanID() == root.SpanContext.SpanID() {
			children = append(children, s)
		}
	}
	slices.SortFunc(children, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	return root, children
}

func attr(s tracetest.SpanStub, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func names(spans []tracetest.SpanStub) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// wantAttrs checks the attributes of s that want names, as strings.
func wantAttrs(t *testing.T, s tracetest.SpanStub, want map[attribute.Key]string) {
	t.Helper()
	for k, v := range want {
		if got := attr(s, k).Emit(); got != v {
			t.Errorf("span %q: %s = %q, want %q", s.Name, k, got, v)
		}
	}
}

// noSecrets fails when any attribute or event of any span holds the key, the body,
// the credential or the scope (the credential's hash).
func noSecrets(t *testing.T, spans []tracetest.SpanStub, key string) {
	t.Helper()
	scope := idempotency.AuthorizationScope(&http.Request{Header: http.Header{"Authorization": {secretAuth}}})
	secrets := []string{key, secretBody, "SECRET", secretAuth, scope}
	check := func(span, where, v string) {
		for _, s := range secrets {
			if strings.Contains(v, s) {
				t.Errorf("span %q: %s holds %q: %q", span, where, s, v)
			}
		}
	}
	for _, s := range spans {
		check(s.Name, "name", s.Name)
		check(s.Name, "status", s.Status.Description)
		for _, kv := range s.Attributes {
			check(s.Name, string(kv.Key), kv.Value.Emit())
		}
		for _, e := range s.Events {
			check(s.Name, "event "+e.Name, e.Name)
			for _, kv := range e.Attributes {
				check(s.Name, "event "+string(kv.Key), kv.Value.Emit())
			}
		}
	}
	if len(spans) == 0 {
		t.Error("no spans to check")
	}
}

func keyHash(key string) string {
	scope := idempotency.AuthorizationScope(&http.Request{Header: http.Header{"Authorization": {secretAuth}}})
	return gateway.KeyHash(scope, key)
}

// TestTraceNewKeyAndReplay: a new key is a server span under the caller's traceparent
// with the claim, the upstream call and the completion as children, and the upstream
// receives the upstream span's context; its replay is a server span with its claim
// and a replay span, and no upstream call.
func TestTraceNewKeyAndReplay(t *testing.T) {
	t.Parallel()
	tf := newTraced(t, memstore.New(), nil, nil)
	const key = "key-RAW-new-1"
	first := tf.send("/echo", key)
	if first.status != http.StatusOK {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	root, kids := tf.request(0)
	if got := root.SpanContext.TraceID().String(); got != callerTrace {
		t.Errorf("server span's trace %s, want the caller's %s", got, callerTrace)
	}
	if got := root.Parent.SpanID().String(); got != callerSpan || !root.Parent.IsRemote() {
		t.Errorf("server span's parent %s (remote %v), want the caller's span %s", got, root.Parent.IsRemote(), callerSpan)
	}
	if root.Name != "POST /" {
		t.Errorf("server span %q, want POST /", root.Name)
	}
	wantAttrs(t, root, map[attribute.Key]string{
		"http.request.method": "POST", "http.route": "/", "http.response.status_code": "200",
		gateway.AttrOutcome: "executed", gateway.AttrKeyHash: keyHash(key), gateway.AttrStore: "memory",
		gateway.AttrScopeSource: "authorization",
	})
	if got, want := names(kids), []string{"store.claim", "upstream POST", "store.complete"}; !slices.Equal(got, want) {
		t.Fatalf("children %v, want %v", got, want)
	}
	claim, up, complete := kids[0], kids[1], kids[2]
	wantAttrs(t, claim, map[attribute.Key]string{gateway.AttrClaim: "claimed", gateway.AttrKeyHash: keyHash(key), gateway.AttrStore: "memory"})
	wantAttrs(t, complete, map[attribute.Key]string{"http.response.status_code": "200", gateway.AttrStoreOp: "complete"})
	if up.SpanKind != trace.SpanKindClient {
		t.Errorf("upstream span kind %v, want client", up.SpanKind)
	}
	u, _ := url.Parse(tf.up.URL)
	wantAttrs(t, up, map[attribute.Key]string{"http.response.status_code": "200", "server.address": u.Hostname(), "server.port": u.Port()})

	// The upstream saw the upstream span as its parent, in the caller's trace.
	var echo struct{ Header http.Header }
	if err := json.Unmarshal([]byte(first.body), &echo); err != nil {
		t.Fatal(err)
	}
	want := "00-" + callerTrace + "-" + up.SpanContext.SpanID().String() + "-01"
	if got := echo.Header.Get("Traceparent"); got != want {
		t.Errorf("upstream received traceparent %q, want the upstream span's %q", got, want)
	}

	second := tf.send("/echo", key)
	if second.status != http.StatusOK || second.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("second: %d replayed=%q", second.status, second.header.Get("Idempotent-Replayed"))
	}
	root2, kids2 := tf.request(1)
	wantAttrs(t, root2, map[attribute.Key]string{gateway.AttrOutcome: "replayed", "http.response.status_code": "200", gateway.AttrKeyHash: keyHash(key)})
	if got := root2.SpanContext.TraceID().String(); got != callerTrace {
		t.Errorf("replay's trace %s, want %s", got, callerTrace)
	}
	if got, want := names(kids2), []string{"store.claim", "replay"}; !slices.Equal(got, want) {
		t.Fatalf("replay's children %v, want %v", got, want)
	}
	wantAttrs(t, kids2[0], map[attribute.Key]string{gateway.AttrClaim: "done"})
	wantAttrs(t, kids2[1], map[attribute.Key]string{"http.response.status_code": "200"})
	noSecrets(t, tf.spans.GetSpans(), key)
}

// TestTraceConflictAndMismatch: a duplicate while the first is in flight is answered
// 409 with a conflict span; the key reused with another body, 422 with a mismatch
// span; neither calls the upstream.
func TestTraceConflictAndMismatch(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	tf := newTraced(t, memstore.New(), up, nil)
	const key = "key-RAW-busy"
	done := make(chan reply, 1)
	go func() {
		done <- doAt(t, tf.front.URL, http.MethodPost, "/block", key, secretBody, "Authorization", secretAuth)
	}()
	await(t, "the first request upstream", up.arrived(key))

	if r := tf.send("/block", key); r.status != http.StatusConflict {
		t.Fatalf("duplicate: %d, want 409", r.status)
	}
	root, kids := tf.request(0)
	wantAttrs(t, root, map[attribute.Key]string{gateway.AttrOutcome: "conflict", "http.response.status_code": "409", gateway.AttrKeyHash: keyHash(key)})
	if got, want := names(kids), []string{"store.claim", "conflict"}; !slices.Equal(got, want) {
		t.Fatalf("conflict's children %v, want %v", got, want)
	}
	wantAttrs(t, kids[0], map[attribute.Key]string{gateway.AttrClaim: "in-progress"})
	wantAttrs(t, kids[1], map[attribute.Key]string{"http.response.status_code": "409"})
	if root.Status.Code == codes.Error {
		t.Error("a 409 marks the server span failed")
	}

	up.release()
	if r := <-done; r.status != http.StatusCreated {
		t.Fatalf("first: %d", r.status)
	}
	if r := tf.send("/block", key, `{"other":"body"}`); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("other body: %d, want 422", r.status)
	}
	root, kids = tf.request(2) // after the first and the duplicate
	wantAttrs(t, root, map[attribute.Key]string{gateway.AttrOutcome: "mismatch", "http.response.status_code": "422"})
	if got, want := names(kids), []string{"store.claim", "mismatch"}; !slices.Equal(got, want) {
		t.Fatalf("mismatch's children %v, want %v", got, want)
	}
	wantAttrs(t, kids[1], map[attribute.Key]string{"http.response.status_code": "422"})
	noSecrets(t, tf.spans.GetSpans(), key)
}

// TestTraceUpstreamFailure: an upstream never reached is a failed upstream span and a
// release; one that breaks the connection after reading the request is a failed
// upstream span and an abandon; both server spans are marked failed (502).
func TestTraceUpstreamFailure(t *testing.T) {
	t.Parallel()
	// breaker reads the request and closes the connection without an answer.
	breaker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(breaker.Close)
	for _, c := range []struct {
		name, upstream, failure, keyOp, outcome string
	}{
		{"unreachable", "http://" + testenv.DeadAddr(t), "unreachable", "store.release", "released"},
		{"broken", breaker.URL, "failed", "store.abandon", "abandoned"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tf := newTraced(t, memstore.New(), nil, func(cfg *gateway.Config) {
				u, err := url.Parse(c.upstream)
				if err != nil {
					t.Fatal(err)
				}
				cfg.Upstream = u
			})
			key := "key-RAW-" + c.name
			if r := tf.send("/pay", key); r.status != http.StatusBadGateway {
				t.Fatalf("status %d, want 502", r.status)
			}
			root, kids := tf.request(0)
			wantAttrs(t, root, map[attribute.Key]string{gateway.AttrOutcome: c.outcome, "http.response.status_code": "502", "error.type": "502"})
			if root.Status.Code != codes.Error {
				t.Errorf("server span status %v, want error", root.Status.Code)
			}
			if got, want := names(kids), []string{"store.claim", "upstream POST", c.keyOp}; !slices.Equal(got, want) {
				t.Fatalf("children %v, want %v", got, want)
			}
			up := kids[1]
			wantAttrs(t, up, map[attribute.Key]string{"error.type": c.failure})
			if up.Status.Code != codes.Error {
				t.Errorf("upstream span status %v, want error", up.Status.Code)
			}
			noSecrets(t, tf.spans.GetSpans(), key)
		})
	}
}

// TestTraceStorePostgres: the store spans of a new key and its replay on PostgreSQL.
func TestTraceStorePostgres(t *testing.T) {
	t.Parallel()
	store := openPostgresShared(t, testenv.Schema(t, "gwtrace"), nil)
	tf := newTraced(t, store, nil, nil)
	const key = "key-RAW-pg"
	if r := tf.send("/pay", key); r.status != http.StatusCreated {
		t.Fatalf("first: %d", r.status)
	}
	if r := tf.send("/pay", key); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("second not replayed: %d", r.status)
	}
	for i, want := range [][]string{{"store.claim", "upstream POST", "store.complete"}, {"store.claim", "replay"}} {
		root, kids := tf.request(i)
		if got := names(kids); !slices.Equal(got, want) {
			t.Fatalf("request %d: children %v, want %v", i, got, want)
		}
		wantAttrs(t, root, map[attribute.Key]string{gateway.AttrStore: "postgresql"})
		for _, k := range kids {
			if strings.HasPrefix(k.Name, "store.") {
				wantAttrs(t, k, map[attribute.Key]string{gateway.AttrStore: "postgresql", gateway.AttrKeyHash: keyHash(key)})
				if k.Status.Code == codes.Error || !k.EndTime.After(k.StartTime) {
					t.Errorf("request %d: %s: status %v, %v to %v", i, k.Name, k.Status, k.StartTime, k.EndTime)
				}
			}
		}
	}
	noSecrets(t, tf.spans.GetSpans(), key)
}

// TestTracingOffForwardsTraceparent: without a TracerProvider the gateway is not in
// the trace: the caller's traceparent reaches the upstream unchanged.
func TestTracingOffForwardsTraceparent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memstore.New(), nil, nil)
	r := f.do(http.MethodPost, "/echo", "key-off", "{}", "Traceparent", traceparent)
	var echo struct{ Header http.Header }
	if err := json.Unmarshal([]byte(r.body), &echo); err != nil {
		t.Fatal(err)
	}
	if got := echo.Header.Get("Traceparent"); got != traceparent {
		t.Errorf("upstream received traceparent %q, want the caller's %q", got, traceparent)
	}
}

func TestKeyHash(t *testing.T) {
	t.Parallel()
	h := gateway.KeyHash("tenant", "k1")
	if len(h) != 16 || strings.Trim(h, "0123456789abcdef") != "" {
		t.Fatalf("KeyHash %q: want 16 hex digits", h)
	}
	// The scope is part of it, and no split of the same bytes collides.
	for _, other := range []string{gateway.KeyHash("tenan", "tk1"), gateway.KeyHash("", "k1"), gateway.KeyHash("tenant", "k2")} {
		if other == h {
			t.Errorf("KeyHash collides: %q", h)
		}
	}
	if gateway.KeyHash("tenant", "k1") != h {
		t.Error("KeyHash is not stable")
	}
}

// TestTraceHeartbeat: the lease renewals of a request in flight are store.extend spans
// under its server span.
func TestTraceHeartbeat(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	tf := newTraced(t, memstore.New(), up, func(c *gateway.Config) { c.Idempotency.Lease = 150 * time.Millisecond })
	const key = "key-RAW-beat"
	done := make(chan reply, 1)
	go func() { done <- tf.send("/block", key) }()
	testenv.Eventually(t, 5*time.Second, func() bool {
		for _, s := range tf.spans.GetSpans() {
			if s.Name == "store.extend" {
				return true
			}
		}
		return false
	}, "a lease renewal")
	up.release()
	if r := <-done; r.status != http.StatusCreated {
		t.Fatalf("status %d", r.status)
	}
	root, kids := tf.request(0)
	got := names(kids)
	if len(got) < 4 || got[0] != "store.claim" || got[1] != "upstream POST" || got[len(got)-1] != "store.complete" || !slices.Contains(got, "store.extend") {
		t.Fatalf("children %v, want the claim, the upstream call, renewals and the completion", got)
	}
	for _, k := range kids {
		if k.Name == "store.extend" {
			wantAttrs(t, k, map[attribute.Key]string{gateway.AttrKeyHash: keyHash(key), gateway.AttrStoreOp: "extend"})
		}
	}
	wantAttrs(t, root, map[attribute.Key]string{gateway.AttrOutcome: "executed"})
}

// TestTraceAfterReload: the routes of a reload trace their store calls and name their
// pattern; an Off route's request is a server span with only its upstream call.
func TestTraceAfterReload(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	tf := newTraced(t, store, nil, nil)
	u, _ := url.Parse(tf.up.URL)
	if err := tf.gw.Reload(gateway.Config{Upstream: u, Idempotency: idempotency.Config{Store: store},
		Routes: []gateway.Route{{Pattern: "POST /pay"}, {Pattern: "POST /echo", Off: true}}}); err != nil {
		t.Fatal(err)
	}
	if r := tf.send("/pay", "key-RAW-reload"); r.status != http.StatusCreated {
		t.Fatalf("status %d", r.status)
	}
	root, kids := tf.request(0)
	if root.Name != "POST /pay" {
		t.Errorf("server span %q, want POST /pay", root.Name)
	}
	if got, want := names(kids), []string{"store.claim", "upstream POST", "store.complete"}; !slices.Equal(got, want) {
		t.Fatalf("children %v, want %v", got, want)
	}
	if r := tf.send("/echo", ""); r.status != http.StatusOK {
		t.Fatalf("off route: status %d", r.status)
	}
	root, kids = tf.request(1)
	wantAttrs(t, root, map[attribute.Key]string{gateway.AttrOutcome: "pass-through", "http.route": "/echo", gateway.AttrRoute: "POST /echo", gateway.AttrScopeSource: ""})
	if got, want := names(kids), []string{"upstream POST"}; !slices.Equal(got, want) {
		t.Fatalf("off route's children %v, want %v", got, want)
	}
}
