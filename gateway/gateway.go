package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/deadline"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/dueq"
	"github.com/retrysafe/retrysafe/internal/durfmt"
	"github.com/retrysafe/retrysafe/internal/promreg"
	"github.com/retrysafe/retrysafe/retry"
)

// This file is the request path, in the order a request takes it: ServeHTTP makes the
// request's exchange (all the gateway's state of one request), deadline.Middleware
// gives it its budget, the idempotency middleware (Serve) claims its key or answers it
// from the store, forward sends it upstream once through the ReverseProxy, and finish
// logs and counts it with the outcome Serve returned.

// Gateway is the idempotency reverse proxy. Make one with New; it is an http.Handler.
type Gateway struct {
	cfg      Config
	root     *idempotency.Middleware // the store's shared state; every route's middleware is made With it
	metrics  *metrics
	gatherer prometheus.Gatherer // nil: no /metrics
	buffers  *bufferPool
	tracing  *tracing          // nil: Config.TracerProvider is nil
	store    idempotency.Store // what the middlewares call: the Config's store, traced when tracing is on

	table    atomic.Pointer[table] // the routes; Reload swaps it
	reloadMu sync.Mutex

	active   tracker     // requests being served
	draining atomic.Bool // Run is shutting down: /readyz answers 503
	running  atomic.Bool
}

// route is one route as the gateway serves it.
type route struct {
	policy
	label     string                  // the route label of the metrics: its pattern
	series    *routeSeries            // its metrics' series
	mw        *idempotency.Middleware // nil: the route is Off
	proxy     *httputil.ReverseProxy
	handler   http.Handler // deadline.Middleware, then serve
	forwardH  http.Handler // forward: the middleware's handler
	keyHeader string       // logged
	logRoute  bool         // the gateway has several routes: its lines name the route
	// protected are the request headers the upstream must receive as the gateway saw
	// them: the key, the scope's source and the content type (both fingerprinted).
	protected []string
	// scopeSource says where the scope comes from, for the spans: authorization,
	// header, cookie, none or custom ("" for an Off route); httpRoute is the pattern's
	// path, their http.route.
	scopeSource, httpRoute string
	// bounds are the upstream timeouts of the route's calls, one queue for all of them
	// (they share one timeout): most calls settle long before theirs.
	bounds dueq.Queue[*upstreamCall]
}

// New returns a Gateway, or an error when cfg is unusable.
func New(cfg Config) (*Gateway, error) {
	if cfg.Idempotency.Store == nil {
		return nil, errors.New("gateway: Config.Idempotency.Store is required")
	}
	cfg, ps, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	g := &Gateway{cfg: cfg, buffers: &bufferPool{}, store: cfg.Idempotency.Store}
	if g.tracing = newTracing(cfg.TracerProvider, g.store); g.tracing != nil {
		g.store = g.tracing.wrapStore(g.store)
	}
	reg := cfg.Registerer
	if reg == nil {
		r := newRegistry()
		reg, g.gatherer = r, r
	} else if ga, ok := reg.(prometheus.Gatherer); ok {
		g.gatherer = ga
	}
	var root atomic.Pointer[idempotency.Middleware] // set once the middleware is made
	waiting := func() int {
		if m := root.Load(); m != nil {
			return m.Waiting()
		}
		return 0
	}
	notDurable := func() bool {
		m := root.Load()
		return m != nil && m.StoreNotDurable()
	}
	bodyMemory := func() int64 {
		if m := root.Load(); m != nil {
			return m.BodyMemory()
		}
		return 0
	}
	if g.metrics, err = newMetrics(reg, false, waiting, notDurable, bodyMemory); err != nil {
		return nil, err
	}
	// The root holds what every route shares of the store: what it knows of the
	// store's health, the answers it could not store yet, the ceiling on bodies in
	// memory and the waiters. It serves no request itself.
	rcfg := cfg.Idempotency
	rcfg.Store, rcfg.OnOutcome, rcfg.OnStoreCall = g.store, nil, g.observeStore(cfg.Idempotency.OnStoreCall)
	if g.root, err = idempotency.New(rcfg); err != nil {
		promreg.Unregister(reg, g.metrics.slots()...) // so that a corrected Config can register them again
		return nil, fmt.Errorf("gateway: %w", err)
	}
	root.Store(g.root)
	t, err := g.build(ps)
	if err != nil {
		promreg.Unregister(reg, g.metrics.slots()...)
		return nil, err
	}
	g.table.Store(t)
	return g, nil
}

// Reload replaces the gateway's routes and policies with those of cfg, atomically: a
// request already matched to a route finishes under that route's policy, and the next
// ones have the new routes. On error nothing changes. What the gateway shares across
// routes stays New's: cfg's Idempotency.Store must be nil or the gateway's, its
// Idempotency.MaxBodyMemory and MaxWaiters zero or New's, and its Logger, Registerer,
// Transport, TracerProvider and ShutdownTimeout are not used (the gateway keeps its
// own). Keys and answers are the store's, so a record made under one configuration is
// replayed under the next, if the request still matches it.
func (g *Gateway) Reload(cfg Config) error {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	own := g.cfg.Idempotency
	switch {
	case cfg.Idempotency.Store != nil && cfg.Idempotency.Store != own.Store:
		return errors.New("gateway: Reload: Config.Idempotency.Store is not the gateway's; a new store needs a new Gateway")
	case cfg.Idempotency.MaxBodyMemory != 0 && cfg.Idempotency.MaxBodyMemory != own.MaxBodyMemory,
		cfg.Idempotency.MaxWaiters != 0 && cfg.Idempotency.MaxWaiters != own.MaxWaiters:
		return fmt.Errorf("gateway: Reload: Config.Idempotency.MaxBodyMemory and MaxWaiters bound the whole gateway and cannot change (%d bytes, %d waiters)", own.MaxBodyMemory, own.MaxWaiters)
	}
	cfg.Idempotency.Store = own.Store
	cfg.Idempotency.MaxBodyMemory, cfg.Idempotency.MaxWaiters = own.MaxBodyMemory, own.MaxWaiters
	cfg.Logger, cfg.Registerer, cfg.Transport, cfg.ShutdownTimeout = g.cfg.Logger, g.cfg.Registerer, g.cfg.Transport, g.cfg.ShutdownTimeout
	_, ps, err := cfg.resolve()
	if err != nil {
		return err
	}
	t, err := g.build(ps)
	if err != nil {
		return err
	}
	g.table.Store(t)
	return nil
}

// observeStore returns the OnStoreCall of the routes' middlewares: the gateway's
// metrics, then the caller's own.
func (g *Gateway) observeStore(user func(idempotency.StoreOp, time.Duration, error)) func(idempotency.StoreOp, time.Duration, error) {
	return func(op idempotency.StoreOp, took time.Duration, err error) {
		g.metrics.observeStore(string(op), took, err)
		if user != nil {
			user(op, took, err)
		}
	}
}

// build makes the routes of ps into a table.
func (g *Gateway) build(ps []policy) (*table, error) {
	routes := make([]*route, len(ps))
	for i, p := range ps {
		rt, err := g.newRoute(p)
		if err != nil {
			return nil, g.routeError(ps, i, err)
		}
		routes[i] = rt
	}
	t := &table{byPattern: make(map[string]*route, len(routes))}
	if len(routes) == 1 && routes[0].pattern == catchAll {
		t.single = routes[0]
		return t, nil
	}
	t.mux = http.NewServeMux()
	for i, rt := range routes {
		rt.logRoute = true
		t.byPattern[rt.pattern] = rt
		if rt.pattern == catchAll {
			t.fallback = rt
		}
		if err := handle(t.mux, rt.pattern, routeHandler{rt}); err != nil {
			return nil, g.routeError(ps, i, conflicts(ps, i))
		}
	}
	return t, nil
}

// routeError reports an error of ps[i]: a RouteError, but for the implicit catch-all,
// whose fields are the Config's own.
func (g *Gateway) routeError(ps []policy, i int, err error) error {
	if ps[i].index < 0 {
		return err
	}
	return &RouteError{Index: ps[i].index, Pattern: ps[i].pattern, Err: err}
}

// newRoute makes the middleware, proxy and handlers of p.
func (g *Gateway) newRoute(p policy) (*route, error) {
	rt := &route{policy: p, label: p.pattern, keyHeader: p.mw.KeyHeader, scopeSource: scopeSource(p), httpRoute: patternPath(p.pattern)}
	rt.bounds.Init(p.upstreamTimeout, (*upstreamCall).expire)
	if !p.off {
		var mcfg idempotency.Config
		mcfg, rt.protected = p.middleware()
		mcfg.Store = g.store
		mcfg.OnStoreCall = g.observeStore(p.mw.OnStoreCall)
		mw, err := g.root.With(mcfg)
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		rt.mw = mw
	}
	upstream, tracing := p.upstream, g.tracing
	rt.series = g.metrics.forRoute(rt.label, upstream.Host)
	rt.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// http.Transport (and HTTP/2's) sends the request's ContentLength and ignores
			// the Content-Length in its header map: the copy of it there only takes room.
			// Without it a client's few headers, the forwarding headers and
			// Request-Budget-Ms fit in the smallest map, where one more entry makes the
			// map grow into a table of its own, for every request.
			delete(pr.Out.Header, "Content-Length")
			pr.SetURL(upstream)
			pr.SetXForwarded()
			inMemoryBody(pr.Out)
			// The outbound request is the proxy's copy: its keys are hidden from
			// http.Transport's resend here, so that retry.SendOnce below need not copy it.
			retry.HideIdempotencyKeys(pr.Out)
			if tracing != nil {
				tracing.inject(pr.Out)
			}
		},
		// deadline.Transport tells the upstream, in Request-Budget-Ms, how long the
		// gateway will wait for it: what is left of UpstreamTimeout. It sets the header
		// on the proxy's outbound request, which is the proxy's own copy.
		Transport:      traceHooks{deadline.Transport{Base: g.cfg.Transport, InPlace: true}},
		ModifyResponse: g.modifyResponse,
		ErrorHandler:   g.upstreamError,
		// What the proxy logs of a failed round trip or body copy, the request's own
		// line says (upstream_error): the proxy's lines are for debugging.
		ErrorLog: log.New(slogWriter{g.cfg.Logger, slog.LevelDebug}, "", 0),
		// Without a pool ReverseProxy allocates a 32 KiB copy buffer per request: over
		// half the bytes a proxied request allocated in BenchmarkGateway's profile.
		BufferPool: g.buffers,
	}
	// The server's budget for a request is the time to receive its body and to call the
	// upstream: a caller whose own budget (Request-Budget-Ms) is already spent is
	// answered 504 before anything is claimed, and one whose budget runs out while its
	// body arrives is answered 504 too; a body slower than BodyTimeout is a 408.
	budget := p.mw.BodyTimeout + p.upstreamTimeout
	rt.forwardH = forwarder{g}
	rt.handler = deadline.Middleware(deadline.Config{Budget: budget, Logger: g.cfg.Logger})(http.HandlerFunc(g.serve))
	return rt, nil
}

// inMemoryBody gives out, when its body is one the idempotency middleware read into
// memory, a reader of that body from GetBody in place of the proxy's wrapper around it:
// http.Transport sends a body it knows to be in memory in the same write as the
// headers, and flushes the headers to the upstream by themselves first for any other,
// one write and one TCP segment more per request. Only the middleware's bodies have a
// GetBody (a server's request has none), and it returns the same bytes every time.
func inMemoryBody(out *http.Request) {
	if out.Body == nil || out.GetBody == nil {
		return
	}
	if b, err := out.GetBody(); err == nil {
		out.Body = b
	}
}

// ProblemHopByHop (400): the request's Connection header lists a header the upstream
// must receive — the Idempotency-Key, the header its scope comes from, or its content
// type — which a proxy must drop as hop-by-hop.
const ProblemHopByHop = "urn:retrysafe:problem:hop-by-hop-header"

// Outcomes the gateway reports beyond the middleware's (idempotency.Outcome).
const (
	outcomeHopByHop        = "hop-by-hop"       // 400: Connection names a protected header
	outcomeBudgetExhausted = "budget-exhausted" // 504 from deadline.Middleware: nothing ran
	outcomeError           = "error"            // the request panicked before an outcome
	outcomeNoRoute         = "no-route"         // 404: no route matched
)

// hopByHop returns the first of the protected headers that r's Connection header
// lists, or "".
func hopByHop(r *http.Request, protected []string) string {
	for _, v := range r.Header.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			name = http.CanonicalHeaderKey(strings.TrimSpace(name))
			if slices.Contains(protected, name) {
				return name
			}
		}
	}
	return ""
}

// writeHopByHop answers a request whose Connection header lists the protected header
// name.
func writeHopByHop(w http.ResponseWriter, name string) {
	idempotency.WriteProblem(w, idempotency.Problem{Type: ProblemHopByHop, Title: "Header listed as hop-by-hop",
		Status: http.StatusBadRequest,
		Detail: "The Connection header lists " + name + ", which the upstream must receive (it is the key, the scope or fingerprinted): the request was not forwarded."}, 0)
}

// exchange is the gateway's state of one request, made by ServeHTTP and read by finish,
// in one allocation with what the request needs on the way. The layers below ServeHTTP
// find it through the ResponseWriter they are handed (exchangeOf); the ReverseProxy's
// hooks (modifyResponse, upstreamError), handed only the request, in the context of the
// upstream call (exchangeFrom).
type exchange struct {
	start   time.Time // read from time.Now: it has the monotonic clock's reading (now)
	client  clientWriter
	reqBody clientBody // the client's request body, as the gateway's layers read it
	rt      *route     // nil: no route matched

	sent     atomic.Bool           // the upstream request's headers were written
	trace    httptrace.ClientTrace // sets sent; see bodyStep
	noServer withoutServer         // the upstream call's context, as the proxy sees it
	linked   linkedContext         // an unkeyed call's parent, when beforeBudget allows
	upstream upstreamCall          // the call, once forward has made it
	answer   watchedBody           // the upstream's answer's body, once it came
	// dropClaim is the claim of a keyed request with a body, whose body is dropped once
	// bodyDone has both bodyWritten and bodyAnswered.
	dropClaim *idempotency.Claim
	bodyDone  atomic.Int32

	mu          sync.Mutex
	outcome     string
	abort       bool          // the answer broke off: the client's connection must be cut
	call        *upstreamCall // &upstream, once made
	failure     failure
	upstreamErr error
	upstreamDur time.Duration
	upstreamSt  int
	body        *watchedBody // &answer, once the answer came

	tr *reqTrace // nil: the gateway does not trace
}

func (ex *exchange) setOutcome(o string) {
	ex.mu.Lock()
	ex.outcome = o
	ex.mu.Unlock()
}

type exchangeKey struct{}

// exchangeFrom returns the exchange of the upstream call whose context is ctx, or nil.
func exchangeFrom(ctx context.Context) *exchange {
	ex, _ := ctx.Value(exchangeKey{}).(*exchange)
	return ex
}

// now returns the time now, read from the monotonic clock only and added to the
// exchange's start, at half the cost of time.Now: a request reads the clock often.
func (ex *exchange) now() time.Time { return ex.start.Add(time.Since(ex.start)) }

// exchangeOf returns the exchange whose client's writer w is, or wraps.
func exchangeOf(w http.ResponseWriter) *exchange {
	for {
		switch t := w.(type) {
		case *clientWriter:
			return t.ex
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return nil
		}
	}
}

// ServeHTTP proxies r to the upstream under the idempotency middleware.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.active.add()
	defer g.active.done()
	rt := g.table.Load().match(r)
	ex := &exchange{start: time.Now(), client: clientWriter{ResponseWriter: w, ctx: r.Context()}, rt: rt}
	ex.client.ex = ex
	if r.Body != nil && r.Body != http.NoBody {
		ex.reqBody.ReadCloser = r.Body
		r.Body = &ex.reqBody
	}
	if g.tracing != nil {
		r = g.tracing.start(r, ex)
	}
	defer g.finish(r, ex) // also when the request panics
	if rt == nil {
		ex.setOutcome(outcomeNoRoute)
		idempotency.WriteProblem(&ex.client, idempotency.Problem{Type: ProblemNoRoute, Title: "No route",
			Status: http.StatusNotFound, Detail: "No route of the gateway matches " + r.Method + " " + r.URL.Path + ": the request was not forwarded."}, 0)
		return
	}
	if name := hopByHop(r, rt.protected); name != "" {
		ex.setOutcome(outcomeHopByHop)
		writeHopByHop(&ex.client, name)
		return
	}
	rt.handler.ServeHTTP(&ex.client, r)
	ex.mu.Lock()
	if ex.outcome == "" {
		// serve never ran: deadline.Middleware answered, the caller's budget being spent.
		ex.outcome = outcomeBudgetExhausted
	}
	abort := ex.abort
	ex.mu.Unlock()
	if abort && r.Context().Value(http.ServerContextKey) != nil {
		// The answer broke off after its status was sent: cutting the client's
		// connection is how net/http tells the client that it is not whole. (Served
		// another way, as by a test's recorder, the handler just returns.)
		panic(http.ErrAbortHandler)
	}
}

// serve runs the request through its route's idempotency middleware, with forward as
// the handler, and keeps the outcome it returns; the request of an Off route goes to
// forward as it is.
func (g *Gateway) serve(w http.ResponseWriter, r *http.Request) {
	ex := exchangeOf(w)
	o, err := idempotency.OutcomePassThrough, error(nil)
	if ex.rt.mw == nil {
		g.forward(w, r, nil)
	} else {
		o, err = ex.rt.mw.Serve(w, r, ex.rt.forwardH)
	}
	ex.mu.Lock()
	ex.outcome = string(o)
	ex.abort = ex.abort || errors.Is(err, idempotency.ErrAborted)
	ex.mu.Unlock()
}

// forwarder is forward as the middleware's handler: a keyed request comes to it with
// its claim (idempotency.ClaimHandler), and one the middleware passes through without.
type forwarder struct{ g *Gateway }

func (f forwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) { f.g.forward(w, r, nil) }

func (f forwarder) ServeClaimed(w http.ResponseWriter, r *http.Request, c *idempotency.Claim) {
	f.g.forward(w, r, c)
}

// forward runs as the owner of claim's key (or, claim nil, for an unkeyed request) and
// sends the request upstream, once. The upstream call's context carries the claim
// (withoutServer), for the proxy's hooks and the transports under it.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, claim *idempotency.Claim) {
	ex := exchangeOf(w)
	keyed := claim != nil
	if keyed {
		g.metrics.inFlight.Inc()
		defer g.metrics.inFlight.Dec()
	}
	// A keyed request is detached from the client: a client that goes away must not
	// cancel the upstream request, whose answer its retry will want. An unkeyed one
	// (nothing will be stored) ends with its client, as through any proxy.
	parent := r.Context()
	var settled <-chan struct{}
	start := ex.now()
	if keyed {
		parent = context.WithoutCancel(parent)
		settled = claim.Stored()
	} else if up, ok := beforeBudget(parent, start.Add(ex.rt.bounds.Every())); ok {
		// The call's own bound comes before the request's deadline, so the call ends
		// with the client without the deadline's cancellation being made for it.
		ex.linked = linkedContext{Context: up, values: parent}
		parent = &ex.linked
	}
	call := &ex.upstream
	call.start(parent, start, &ex.rt.bounds, settled)
	defer call.stop()
	ex.mu.Lock()
	ex.call = call
	ex.mu.Unlock()
	// The proxy does not see the server in the context, so a body that breaks off while
	// it copies makes it return rather than panic: the break is then handled here, in
	// the open, and the client's connection cut by ServeHTTP once it is accounted for.
	// The context carries the exchange, for the proxy's hooks.
	ex.noServer.Context, ex.noServer.ex, ex.noServer.claim = call.ctx, ex, claim
	if keyed && r.ContentLength > 0 {
		// Once the upstream has the body, its bytes are room for the answer
		// (Claim.DropBody): the pair then holds the larger of the two in memory, not both.
		ex.dropClaim = claim
		ex.trace.WroteRequest = ex.wroteRequest
	}
	// The trace hooks (ex.trace) are set on the outbound request by the proxy's
	// transport (traceHooks).
	var ctx context.Context = &ex.noServer
	if ex.tr != nil {
		ctx = g.tracing.startUpstream(ctx, ex, r)
	}
	ex.rt.proxy.ServeHTTP(w, r.WithContext(ctx))

	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.upstreamDur = ex.now().Sub(start)
	if ex.body != nil && ex.failure == failNone {
		if err := ex.body.failed(); err != nil {
			// The answer is incomplete: the middleware sends nothing more of it and
			// keeps the key to its lease (or stored, if it already was), and the
			// client's connection is cut, so that it cannot take a truncated answer for
			// a whole one.
			ex.failure, ex.upstreamErr, ex.abort = failBody, err, true
			if keyed {
				claim.Abort()
			}
		}
	}
	result := ex.failure.String()
	if result == "" {
		result = statusClass(ex.upstreamSt)
	}
	ex.rt.series.upstream.of(result).Observe(ex.upstreamDur.Seconds())
	if ex.tr != nil {
		ex.tr.endUpstream(ex.upstreamSt, ex.failure)
	}
}

// statusClass is the result label of an upstream answer with status code: 2xx for 201.
func statusClass(code int) string {
	switch code / 100 {
	case 1:
		return "1xx"
	case 2:
		return "2xx"
	case 3:
		return "3xx"
	case 4:
		return "4xx"
	case 5:
		return "5xx"
	}
	return "other"
}

// withoutServer hides the http.Server from the context the ReverseProxy sees: under a
// server the proxy panics with http.ErrAbortHandler when a body copy fails, and the
// gateway handles that failure itself (forward). It carries the exchange, and the
// claim of a keyed request (ClaimFromContext), which the middleware handed forward
// rather than put in the request's context.
type withoutServer struct {
	context.Context
	ex    *exchange
	claim *idempotency.Claim // nil: unkeyed
}

func (c *withoutServer) Value(key any) any {
	switch key {
	case http.ServerContextKey:
		return nil
	case exchangeKey{}:
		return c.ex
	case idempotency.ClaimKey{}:
		if c.claim != nil {
			return c.claim
		}
	}
	return c.Context.Value(key)
}

// unmade is a request's context whose cancellation of its own is made only when asked
// for (lazyctx), as deadline.Middleware's is: the budget's deadline and its timer.
type unmade interface {
	Unmade() (parent context.Context, deadline time.Time, ok bool)
}

// beforeBudget returns the context under ctx's budget (the client's, ended when it
// leaves) when ctx's own cancellation has not been made and its deadline is not before
// bound, the end of an unkeyed upstream call's own bound. The call's context can then
// hang off it (linkedContext): until the answer's headers the call ends at its bound
// first, and after them each wait for the answer's body is bounded by the upstream
// timeout, at the client's pace, as a keyed call's answer is once stored. Made for
// every unkeyed call, the budget's cancellation would cost each a context, a timer of
// the runtime's and a link into the client's context.
func beforeBudget(ctx context.Context, bound time.Time) (context.Context, bool) {
	u, ok := ctx.(unmade)
	if !ok {
		return nil, false
	}
	up, deadline, ok := u.Unmade()
	if !ok || !deadline.IsZero() && deadline.Before(bound) {
		return nil, false
	}
	return up, true
}

// linkedContext is an unkeyed upstream call's parent under beforeBudget: it ends with
// the context under the request's budget and has the request's values. Value goes to
// the request's context, whose cancellation is not made: its own lookups go on to the
// context under it, the one this ends with, so the call's cancellation links into that
// context's as a child of it would (without a goroutine of its own).
type linkedContext struct {
	context.Context                 // under the budget: Done, Err, Deadline
	values          context.Context // the request's
}

func (c *linkedContext) Value(key any) any { return c.values.Value(key) }

// traceHooks is the proxy's transport, over the gateway's: it sets each outbound
// request's trace hooks (exchange.hook).
type traceHooks struct{ base http.RoundTripper }

func (t traceHooks) RoundTrip(req *http.Request) (*http.Response, error) {
	if ex := exchangeFrom(req.Context()); ex != nil {
		req = ex.hook(req)
	}
	return t.base.RoundTrip(req)
}

// hook returns req with ex's trace hooks set: WroteHeaders, which sets ex.sent once
// the request's headers have been written, and WroteRequest when forward asked for it.
// The ReverseProxy gives every outbound request a trace of its own, made for that
// request, with only its Got1xxResponse hook: the hooks are set on it. A second trace
// would cost every request httptrace's composition of the two, field by field through
// reflection, and a context more. When the trace has hooks of these kinds already
// (another trace was composed into it), or there is none, a trace of ex's own is added
// the usual way.
func (ex *exchange) hook(req *http.Request) *http.Request {
	ex.trace.WroteHeaders = ex.markSent
	if tr := httptrace.ContextClientTrace(req.Context()); tr != nil && tr.WroteHeaders == nil && tr.WroteRequest == nil {
		tr.WroteHeaders, tr.WroteRequest = ex.trace.WroteHeaders, ex.trace.WroteRequest
		return req
	}
	return req.WithContext(httptrace.WithClientTrace(req.Context(), &ex.trace))
}

func (ex *exchange) markSent() { ex.sent.Store(true) }

// The two events after which http.Transport needs a keyed request's body no more: it
// has written it whole (it reads it no more), and the upstream's answer came (it will
// not send the request again: it resends only a request of which nothing reached the
// wire, which a written body in its write buffer may still be, and nothing is answered
// before something has arrived).
const (
	bodyWritten = 1 << iota
	bodyAnswered
)

// wroteRequest is the trace's WroteRequest of a keyed request with a body.
func (ex *exchange) wroteRequest(info httptrace.WroteRequestInfo) {
	if info.Err == nil {
		ex.bodyStep(bodyWritten)
	}
}

// bodyStep records one of the events; after both, the body is dropped (Claim.DropBody).
func (ex *exchange) bodyStep(event int32) {
	if before := ex.bodyDone.Or(event); before&event == 0 && before|event == bodyWritten|bodyAnswered {
		ex.dropClaim.DropBody()
	}
}

// modifyResponse watches the upstream's body so that a body that breaks off is not
// stored as a whole answer, and bounds each wait for it once the answer is settled.
func (g *Gateway) modifyResponse(res *http.Response) error {
	ex := exchangeFrom(res.Request.Context())
	if ex == nil {
		return nil
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	b := &ex.answer
	b.ReadCloser, b.call = res.Body, ex.call
	res.Body = b
	ex.body, ex.upstreamSt = b, res.StatusCode
	if ex.dropClaim != nil {
		ex.bodyStep(bodyAnswered)
	}
	if ex.call != nil && ex.call.settled == nil {
		ex.call.settle() // unkeyed: nothing to store, the answer is under way
	}
	return nil
}

// upstreamError answers a failed round trip, and releases or abandons the key according
// to classify.
func (g *Gateway) upstreamError(w http.ResponseWriter, out *http.Request, err error) {
	ctx := out.Context()
	ex := exchangeFrom(ctx)
	sent := ex != nil && ex.sent.Load()
	f := classify(err, sent)
	if ex != nil {
		ex.mu.Lock()
		ex.failure, ex.upstreamErr = f, err
		ex.mu.Unlock()
	}
	claim, keyed := idempotency.ClaimFromContext(ctx)
	var leaseDur, timeout time.Duration
	if ex != nil {
		timeout = ex.rt.upstreamTimeout
		if ex.rt.mw != nil {
			leaseDur = ex.rt.mw.Config().Lease
		}
	}
	lease := int(math.Ceil(leaseDur.Seconds()))
	// An unkeyed request (an Off route, an optional key left out, a method not keyed)
	// was not protected: whether to send it again is the client's call.
	retry := "It had no idempotency key, so the gateway did not protect it: send it again only if doing it twice is harmless."
	if keyed {
		retry = fmt.Sprintf("Retry it with the same Idempotency-Key: until the key's lease ends (%s) a retry is answered 409; after it the request is forwarded again with the same key.", leaseDur)
	}
	if f == failUnreachable {
		if keyed {
			claim.Release()
		}
		again := "It can be sent again."
		if keyed {
			again = "Retry it with the same Idempotency-Key."
		}
		idempotency.WriteProblem(w, idempotency.Problem{Type: ProblemUpstreamUnreachable, Title: "Upstream unreachable",
			Status: http.StatusBadGateway,
			Detail: "The request was not forwarded: the upstream could not be reached. " + again}, 1)
		return
	}
	// The upstream may have acted: the key stays in progress until its lease ends, and
	// the answer says when a retry can go through again.
	if keyed {
		claim.Abandon()
	} else {
		lease = 0
	}
	p := idempotency.Problem{Type: ProblemUpstreamFailed, Title: "Upstream connection failed", Status: http.StatusBadGateway,
		Detail: "The request was forwarded and the connection to the upstream failed before an answer: it may or may not have been executed. " + retry}
	if f == failTimeout {
		p = idempotency.Problem{Type: ProblemUpstreamTimeout, Title: "Upstream timed out", Status: http.StatusGatewayTimeout,
			Detail: fmt.Sprintf("The request was forwarded and the upstream did not answer within %s: it may or may not have been executed. %s", timeout, retry)}
	}
	idempotency.WriteProblem(w, p, lease)
}

// finish logs the request and counts it, under the outcome the middleware returned (or
// the gateway's own: hop-by-hop, budget-exhausted, error).
func (g *Gateway) finish(r *http.Request, ex *exchange) {
	// One instant ends the request for its latency, its span and its line: the line's
	// time less its latency is when the request began, however long what follows takes
	// (a tool that matches lines to what the upstream saw relies on it).
	end := ex.now()
	d := end.Sub(ex.start)
	ex.mu.Lock()
	outcome, f, uerr, udur, upstreamSt := ex.outcome, ex.failure, ex.upstreamErr, ex.upstreamDur, ex.upstreamSt
	ex.mu.Unlock()
	if outcome == "" {
		outcome = outcomeError // ServeHTTP did not get to the end: the request panicked
	}
	cw := &ex.client
	// status is what the client was sent; 0 when it was sent nothing, having gone
	// before it was written anything or before the handler ended without a word.
	status, gone := cw.status, cw.gone
	switch {
	case cw.statusLost:
		status, gone = 0, true
	case status == 0 && f == failBody:
		// The answer broke off before its status was sent: the client got none of it.
	case status == 0 && cw.ctx.Err() != nil:
		// Nothing written, and the context ended: a word now would reach no one,
		// unless only a read of the body failed, which is not the client's leaving.
		gone = gone || cw.left()
	case status == 0 && outcome == outcomeError:
		// A panic: net/http cuts the connection without a word.
	case status == 0:
		status = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	// A span says what the client was answered, or would have been had it stayed.
	traced := cw.status
	switch {
	case traced == 0 && f == failBody:
		traced = upstreamSt
	case traced == 0:
		traced = http.StatusOK
	}
	label, keyHeader := "", ""
	if ex.rt != nil {
		label, keyHeader = ex.rt.label, ex.rt.keyHeader
		s := ex.rt.series.outcomes.of(outcome)
		s.requests.Inc()
		s.dur.Observe(d.Seconds())
	} else {
		g.metrics.requests.WithLabelValues(label, outcome).Inc()
		g.metrics.requestDur.WithLabelValues(label, outcome).Observe(d.Seconds())
	}
	if ex.tr != nil {
		g.tracing.end(ex, outcome, traced, end)
	}

	level := slog.LevelInfo
	if outcome == string(idempotency.OutcomePassThrough) {
		level = slog.LevelDebug
	}
	ctx := r.Context()
	if !g.cfg.Logger.Enabled(ctx, level) {
		return
	}
	// The line names only a status the client was sent (status), and what the
	// upstream answered (upstream_status), which is what is stored for a retry when the
	// client had gone (client_gone). Durations are in milliseconds (_ms).
	attrs := make([]slog.Attr, 0, 13)
	attrs = append(attrs,
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.String("outcome", outcome),
	)
	if status != 0 {
		attrs = append(attrs, slog.Int("status", status))
	}
	if upstreamSt != 0 {
		attrs = append(attrs, slog.Int("upstream_status", upstreamSt))
	}
	attrs = append(attrs, durfmt.Millis("latency_ms", d))
	if ex.rt != nil && ex.rt.logRoute {
		attrs = append(attrs, slog.String("route", label))
	}
	if k := r.Header.Get(keyHeader); keyHeader != "" && k != "" {
		if len(k) > 80 {
			k = k[:80] + "…"
		}
		attrs = append(attrs, slog.String("key", k))
	}
	if udur > 0 {
		attrs = append(attrs, durfmt.Millis("upstream_latency_ms", udur))
	}
	if f != failNone {
		attrs = append(attrs, slog.String("upstream_error", f.String()), slog.String("err", uerr.Error()))
	}
	if gone {
		attrs = append(attrs, slog.Bool("client_gone", true))
	}
	attrs = append(attrs, slog.String("remote", r.RemoteAddr))
	rec := slog.NewRecord(end, level, "request", 0)
	rec.AddAttrs(attrs...)
	_ = g.cfg.Logger.Handler().Handle(ctx, rec)
}

// clientWriter is the client's ResponseWriter as the gateway's layers see it. It
// remembers the status, whether the client was there to be sent it, and hides write
// errors: when the client has gone, the rest of the upstream's answer is still read and
// recorded (for the client's retry) instead of aborting the copy.
type clientWriter struct {
	http.ResponseWriter
	ex  *exchange       // whose client this is
	ctx context.Context // the client's request's, which net/http cancels when it goes
	// status is the status written, statusLost true when the client had gone by
	// then: nothing written after its connection closed reaches it.
	status     int
	statusLost bool
	gone       bool // a write failed: the client has gone
}

// wrote records the status code written, the first final one.
func (w *clientWriter) wrote(code int) {
	if w.status != 0 || code < 200 && code != http.StatusSwitchingProtocols {
		return
	}
	w.status = code
	w.statusLost = w.left()
}

// left reports whether the client has gone: net/http cancels its request's context
// when its connection closes, and also when a read of its body fails (a body timeout),
// the client being still there to be answered; so only when no read failed.
func (w *clientWriter) left() bool {
	return w.ctx.Err() != nil && !w.ex.reqBody.failed.Load()
}

// clientBody is the client's request body, which says whether a read of it failed.
type clientBody struct {
	io.ReadCloser
	failed atomic.Bool
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.failed.Store(true)
	}
	return n, err
}

func (w *clientWriter) WriteHeader(code int) {
	w.wrote(code)
	w.ResponseWriter.WriteHeader(code)
}

func (w *clientWriter) Write(p []byte) (int, error) {
	w.wrote(http.StatusOK)
	if w.gone {
		return len(p), nil
	}
	if _, err := w.ResponseWriter.Write(p); err != nil {
		w.gone = true
	}
	return len(p), nil
}

// Flush implements http.Flusher.
func (w *clientWriter) Flush() {
	w.wrote(http.StatusOK)
	if !w.gone {
		if err := http.NewResponseController(w.ResponseWriter).Flush(); err != nil {
			w.gone = true
		}
	}
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *clientWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// slogWriter adapts a slog.Logger to the log.Logger that net/http wants for its errors,
// logging each line at level.
type slogWriter struct {
	l     *slog.Logger
	level slog.Level
}

func (s slogWriter) Write(p []byte) (int, error) {
	msg := string(p)
	if n := len(msg); n > 0 && msg[n-1] == '\n' {
		msg = msg[:n-1]
	}
	s.l.Log(context.Background(), s.level, msg)
	return len(p), nil
}

// bufferPool is the ReverseProxy's pool of 32 KiB copy buffers. It holds each as a
// pointer to its array, which a returned slice converts back to without an allocation
// (a *[]byte would need one per Put).
type bufferPool struct{ p sync.Pool }

const copyBufferSize = 32 << 10

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[copyBufferSize]byte); ok {
		return v[:]
	}
	return make([]byte, copyBufferSize)
}

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) == copyBufferSize {
		b.p.Put((*[copyBufferSize]byte)(buf[:copyBufferSize]))
	}
}

// Problem types of the gateway's own error answers (RFC 9457). The middleware's are in
// package idempotency.
const (
	// ProblemUpstreamUnreachable (502): the request never reached the upstream; the key
	// was released, so a retry forwards again.
	ProblemUpstreamUnreachable = "urn:retrysafe:problem:upstream-unreachable"
	// ProblemUpstreamTimeout (504): the request was sent and no answer came in time; the
	// outcome is unknown and the key stays in progress until its lease ends.
	ProblemUpstreamTimeout = "urn:retrysafe:problem:upstream-timeout"
	// ProblemUpstreamFailed (502): the request was sent and the connection broke before
	// an answer; the outcome is unknown and the key stays in progress until its lease
	// ends.
	ProblemUpstreamFailed = "urn:retrysafe:problem:upstream-failed"
)

// failure is what a failed upstream round trip means for the key.
type failure int

const (
	failNone failure = iota
	// failUnreachable: the upstream cannot have seen the request. Release the key.
	failUnreachable
	// failTimeout: the request was sent; no answer came before the deadline. Outcome
	// unknown: keep the key in progress until its lease ends.
	failTimeout
	// failBroken: the request was sent; the connection failed before an answer. Outcome
	// unknown, as for failTimeout.
	failBroken
	// failBody: the answer's status was passed on, then its body broke off. The upstream
	// acted; the stored answer would be incomplete: keep the key in progress.
	failBody
)

// String is the failure's name in logs and in the upstream metric's result label.
func (f failure) String() string {
	switch f {
	case failUnreachable:
		return "unreachable"
	case failTimeout:
		return "timeout"
	case failBroken:
		return "failed"
	case failBody:
		return "body-failed"
	}
	return ""
}

// classify tells a round trip that never reached the upstream from one whose outcome is
// unknown. sent reports whether the request's headers were written to a connection
// (httptrace's WroteHeaders, on any attempt: the transport may retry a request on a new
// connection). An HTTP server cannot act on a request whose headers it has not
// received, so an error before that point — dial, DNS, TLS, a budget spent before
// sending — means the upstream never saw the request, whatever the error says. After
// it, the upstream may have executed the request: a timeout (a context deadline or a
// net.Error that says Timeout) is failTimeout, anything else failBroken. err nil is
// failNone.
func classify(err error, sent bool) failure {
	if err == nil {
		return failNone
	}
	if !sent {
		return failUnreachable
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return failTimeout
	}
	return failBroken
}

// errUpstreamTimeout is the cause of an upstream call cut by the upstream timeout.
var errUpstreamTimeout = fmt.Errorf("gateway: upstream timeout: %w", context.DeadlineExceeded)

// upstreamCall bounds one upstream call. Until its answer is settled the whole call is
// bounded by the upstream timeout; after, only each wait for the upstream's bytes is:
// the copy to the client goes at the client's pace, and a slow client must not make
// the upstream look late. A keyed call is settled when its answer is stored (the
// middleware's Claim.Stored), which for an answer it keeps whole is after the upstream
// sent all of it; another call when its response headers arrive.
type upstreamCall struct {
	ctx     context.Context // &dctx
	dctx    deadlineContext
	cancel  context.CancelCauseFunc
	settled <-chan struct{} // nil: settle is called by the gateway

	mu     sync.Mutex
	bounds *dueq.Queue[*upstreamCall] // the route's: the bound on the whole call, then on each wait
	total  dueq.Item[*upstreamCall]   // in bounds until settled
	wait   dueq.Item[*upstreamCall]   // in bounds while a read of the settled answer waits
	done   bool                       // settled
}

// start starts the call's bound, on the route's queue of bounds, under parent, at now.
func (c *upstreamCall) start(parent context.Context, now time.Time, bounds *dueq.Queue[*upstreamCall], settled <-chan struct{}) {
	ctx, cancel := context.WithCancelCause(parent)
	timeout := bounds.Every()
	deadline := now.Add(timeout)
	if d, ok := parent.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.cancel, c.settled, c.bounds = cancel, settled, bounds
	// The deadline the upstream is told of (Request-Budget-Ms): the gateway's wait.
	c.dctx = deadlineContext{Context: ctx, deadline: deadline}
	c.ctx = &c.dctx
	bounds.Push(&c.total, c)
}

func (c *upstreamCall) expire() { c.cancel(errUpstreamTimeout) }

// settle ends the bound on the whole call.
func (c *upstreamCall) settle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done {
		c.done = true
		c.bounds.Remove(&c.total)
	}
}

// read runs one read of the upstream's body into p, bounded by the timeout once the
// call is settled. The bound is an entry in the route's queue, which holds every bound
// of the route's calls (all of one duration: one timer for them all), rather than a
// timer of the runtime's per read.
func (c *upstreamCall) read(r io.Reader, p []byte) (int, error) {
	if c.settled != nil {
		select {
		case <-c.settled:
			c.settle()
		default:
		}
	}
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	if !done {
		return r.Read(p)
	}
	c.bounds.Push(&c.wait, c)
	defer c.bounds.Remove(&c.wait)
	return r.Read(p)
}

func (c *upstreamCall) stop() {
	c.bounds.Remove(&c.total)
	c.cancel(nil)
}

// deadlineContext reports deadline as its deadline while its cancellation is its own:
// the upstream timeout can be lifted once the answer is settled.
type deadlineContext struct {
	context.Context
	deadline time.Time
}

func (c *deadlineContext) Deadline() (time.Time, bool) { return c.deadline, true }

// watchedBody wraps an upstream response body: it remembers a read error other than
// io.EOF (the body broke off), and bounds each read as the call says.
type watchedBody struct {
	io.ReadCloser
	call *upstreamCall
	mu   sync.Mutex
	err  error
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.call.read(b.ReadCloser, p)
	if err != nil && !errors.Is(err, io.EOF) {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
	}
	return n, err
}

func (b *watchedBody) failed() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}
