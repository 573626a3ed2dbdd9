package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/retrysafe/idempotency"
)

// This file is the gateway's OpenTelemetry tracing (Config.TracerProvider). Off, the
// request path does none of it: ServeHTTP, forward, finish and the proxy's Rewrite test
// one pointer (Gateway.tracing, exchange.tr) and the store is not wrapped.
//
// A traced request is one server span, "METHOD /path" (the path of its route's
// pattern), whose parent is the caller's W3C traceparent when it sent one. Its
// children are the store calls made for it ("store.claim", "store.complete",
// "store.release", "store.abandon", "store.extend", "store.get"; trace_store.go), the
// upstream call (a client span, "upstream METHOD", whose context the upstream receives
// in traceparent), and, for a request answered from the store, the answer: "replay",
// "conflict" (409) or "mismatch" (422).
//
// What the spans never hold: the key (only KeyHash of scope and key), the scope's value
// (only where it comes from: authorization, header, cookie, none or custom), bodies,
// header values, the query, error texts (which may quote a key or a DSN; only a class
// of the error, in error.type).

// TracerName is the instrumentation scope of the gateway's spans.
const TracerName = "github.com/retrysafe/retrysafe/gateway"

// Attributes of the gateway's spans beyond OpenTelemetry's semantic conventions
// (http.request.method, http.route, http.response.status_code, server.address,
// server.port, error.type).
const (
	AttrOutcome     = attribute.Key("retrysafe.outcome")      // server span: the idempotency outcome (executed, replayed, …)
	AttrRoute       = attribute.Key("retrysafe.route")        // server span: the route's whole pattern, as the metrics' route label
	AttrKeyHash     = attribute.Key("retrysafe.key.hash")     // KeyHash of the request's scope and key
	AttrScopeSource = attribute.Key("retrysafe.scope.source") // where the scope comes from, never its value
	AttrStore       = attribute.Key("retrysafe.store")        // the store: postgresql, sqlite, redis, memory, or its package
	AttrStoreOp     = attribute.Key("retrysafe.store.operation")
	AttrClaim       = attribute.Key("retrysafe.claim.result") // claimed, took-over, in-progress, done
)

// KeyHash is what the gateway's spans record of an idempotency key: the first 16 hex
// digits of the SHA-256 of its scope, a newline and the key. It tells the requests of
// one key apart from the others' and matches them across retries and replicas, and
// does not reveal the key or the scope (the scope is often a user's or tenant's
// identifier, by default the hash of a credential). An operator who knows a key finds
// its traces by computing it. The newline cannot occur in a key, so that no other
// scope and key have the same input. A hash is not a secret's protection: whoever
// knows the scope can test guesses of a key against it, which is why keys should be
// random (a UUID), as clients make them.
func KeyHash(scope, key string) string {
	var buf [192]byte // most scopes and keys: no allocation but the result
	b := append(append(append(buf[:0], scope...), '\n'), key...)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// tracing is the gateway's instrumentation, made by New when Config.TracerProvider is
// set; nil otherwise.
type tracing struct {
	tracer trace.Tracer // nil: that of the span of each request (WrapStore)
	prop   propagation.TraceContext
	store  attribute.KeyValue
}

func newTracing(tp trace.TracerProvider, store idempotency.Store) *tracing {
	if tp == nil {
		return nil
	}
	return &tracing{tracer: tp.Tracer(TracerName), store: AttrStore.String(storeName(store))}
}

// storeName names a store by its package: postgresql, sqlite, redis, memory for this
// module's, the package's name for another.
func storeName(s idempotency.Store) string {
	name := strings.TrimLeft(fmt.Sprintf("%T", s), "*")
	if i := strings.IndexByte(name, '.'); i >= 0 {
		name = name[:i]
	}
	switch name {
	case "pgstore":
		return "postgresql"
	case "sqlitestore":
		return "sqlite"
	case "redisstore":
		return "redis"
	case "memstore":
		return "memory"
	}
	return name
}

// reqTrace is the tracing state of one request.
type reqTrace struct {
	ctx  context.Context // the request's context, its server span in it
	span trace.Span
	up   trace.Span // the upstream call's, while it runs

	mu         sync.Mutex
	keyHash    string
	answerFrom time.Time // when the last claim ended: where an answer from the store starts
}

type reqTraceKey struct{}

// reqTraceFrom returns the tracing state of the request whose context ctx is (or is
// under), or nil.
func reqTraceFrom(ctx context.Context) *reqTrace {
	tr, _ := ctx.Value(reqTraceKey{}).(*reqTrace)
	return tr
}

// start starts r's server span, a child of the caller's traceparent if any, and
// returns r with it in its context.
func (t *tracing) start(r *http.Request, ex *exchange) *http.Request {
	ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	name, attrs := r.Method, make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs, attribute.String("http.request.method", r.Method), t.store)
	if rt := ex.rt; rt != nil {
		name += " " + rt.httpRoute
		attrs = append(attrs, attribute.String("http.route", rt.httpRoute), AttrRoute.String(rt.label))
		if rt.scopeSource != "" {
			attrs = append(attrs, AttrScopeSource.String(rt.scopeSource))
		}
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(ex.start),
		trace.WithAttributes(attrs...))
	tr := &reqTrace{span: span}
	tr.ctx = context.WithValue(ctx, reqTraceKey{}, tr)
	ex.tr = tr
	return r.WithContext(tr.ctx)
}

// setKey records the request's key hash, from its claim.
func (tr *reqTrace) setKey(hash string) {
	tr.mu.Lock()
	tr.keyHash = hash
	tr.mu.Unlock()
}

// key returns the request's key hash, "" before its claim.
func (tr *reqTrace) key() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.keyHash
}

// claimed records when a claim of the request ended.
func (tr *reqTrace) claimed(at time.Time) {
	tr.mu.Lock()
	tr.answerFrom = at
	tr.mu.Unlock()
}

// startUpstream starts the upstream call's client span under ctx, the call's context,
// and returns ctx with it: the proxy's Rewrite injects it into the upstream request.
func (t *tracing) startUpstream(ctx context.Context, ex *exchange, r *http.Request) context.Context {
	u := ex.rt.upstream
	attrs := []attribute.KeyValue{attribute.String("http.request.method", r.Method), attribute.String("server.address", u.Hostname())}
	if p := upstreamPort(u.Scheme, u.Port()); p > 0 {
		attrs = append(attrs, attribute.Int("server.port", p))
	}
	ctx, ex.tr.up = t.tracer.Start(ctx, "upstream "+r.Method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	return ctx
}

func upstreamPort(scheme, port string) int {
	if port == "" {
		if scheme == "https" {
			return 443
		}
		return 80
	}
	p, _ := strconv.Atoi(port)
	return p
}

// endUpstream ends the upstream span: the status the upstream answered, or the
// failure's class (unreachable, timeout, failed, body-failed).
func (tr *reqTrace) endUpstream(status int, f failure) {
	span := tr.up
	if span == nil {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 2)
	if status > 0 {
		attrs = append(attrs, attribute.Int("http.response.status_code", status))
	}
	switch {
	case f != failNone:
		attrs = append(attrs, attribute.String("error.type", f.String()))
		span.SetStatus(codes.Error, "upstream "+f.String())
	case status >= 400:
		attrs = append(attrs, attribute.String("error.type", strconv.Itoa(status)))
		span.SetStatus(codes.Error, "")
	}
	span.SetAttributes(attrs...)
	span.End()
}

// inject gives the upstream request the context of the upstream span (traceparent,
// tracestate), replacing the caller's: the upstream's spans are the call's children.
func (t *tracing) inject(out *http.Request) {
	t.prop.Inject(out.Context(), propagation.HeaderCarrier(out.Header))
}

// answerSpan names the span of a request answered from the store with outcome, or "".
func answerSpan(outcome string) string {
	switch idempotency.Outcome(outcome) {
	case idempotency.OutcomeReplayed:
		return "replay"
	case idempotency.OutcomeConflict:
		return "conflict"
	case idempotency.OutcomeMismatch:
		return "mismatch"
	}
	return ""
}

// end ends the request's server span at now, with its outcome and status; a request
// answered from the store gets its answer's span first, from the end of its claim.
func (t *tracing) end(ex *exchange, outcome string, status int, now time.Time) {
	tr := ex.tr
	hash := tr.answer(t.tracer, ex.start, outcome, status, now)
	span := tr.span
	attrs := make([]attribute.KeyValue, 0, 4)
	attrs = append(attrs, AttrOutcome.String(outcome), attribute.Int("http.response.status_code", status))
	if hash != "" {
		attrs = append(attrs, AttrKeyHash.String(hash))
	}
	if status >= 500 {
		attrs = append(attrs, attribute.String("error.type", strconv.Itoa(status)))
		span.SetStatus(codes.Error, outcome)
	}
	span.SetAttributes(attrs...)
	span.End(trace.WithTimestamp(now))
}

// answer makes the span of a request answered from the store with outcome (replay,
// conflict, mismatch), from the end of its claim (or start) to now, and returns the
// request's key hash ("" when it had no claim).
func (tr *reqTrace) answer(tracer trace.Tracer, start time.Time, outcome string, status int, now time.Time) string {
	tr.mu.Lock()
	hash, from := tr.keyHash, tr.answerFrom
	tr.mu.Unlock()
	if name := answerSpan(outcome); name != "" {
		if from.IsZero() {
			from = start
		}
		_, span := tracer.Start(tr.ctx, name, trace.WithTimestamp(from),
			trace.WithAttributes(attribute.Int("http.response.status_code", status), AttrKeyHash.String(hash)))
		span.End(trace.WithTimestamp(now))
	}
	return hash
}

// patternPath is the path of a ServeMux pattern, "[METHOD ][HOST]/[PATH]": its
// http.route.
func patternPath(pattern string) string {
	if i := strings.IndexByte(pattern, '/'); i >= 0 {
		return pattern[i:]
	}
	return pattern
}

// scopeSource names where a route's scope comes from, for AttrScopeSource.
func scopeSource(p policy) string {
	switch {
	case p.off:
		return ""
	case p.scopeHeader != "":
		return "header"
	case p.scopeCookie != "":
		return "cookie"
	case p.scopeNone:
		return "none"
	case p.ownScope:
		return "custom"
	}
	return "authorization"
}

// errorType is what a span records of an error: its class, never its text, which may
// quote a key, a DSN or an address.
func errorType(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, idempotency.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, idempotency.ErrClosed):
		return "closed"
	case ne != nil:
		return "network"
	}
	return fmt.Sprintf("%T", err)
}
