package gateway

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"math"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/deadline"
	"github.com/retrysafe/retrysafe/idempotency"
)

// Gateway is the idempotency reverse proxy. Make one with New; it is an http.Handler.
type Gateway struct {
	cfg      Config
	store    idempotency.Store // cfg.Store, instrumented
	metrics  *metrics
	gatherer prometheus.Gatherer // nil: no /metrics
	proxy    *httputil.ReverseProxy
	mw       *idempotency.Middleware
	handler  http.Handler
	// protected are the request headers the upstream must receive as the gateway saw
	// them: the key, the scope's source and the content type (both fingerprinted).
	protected []string

	active   tracker     // requests being served
	draining atomic.Bool // Run is shutting down: /readyz answers 503
	running  atomic.Bool
}

// New returns a Gateway, or an error when cfg is unusable.
func New(cfg Config) (*Gateway, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	g := &Gateway{cfg: cfg}
	reg := cfg.Registerer
	if reg == nil {
		r := newRegistry()
		reg, g.gatherer = r, r
	} else if ga, ok := reg.(prometheus.Gatherer); ok {
		g.gatherer = ga
	}
	if g.metrics, err = newMetrics(reg); err != nil {
		return nil, err
	}
	g.store = instrument(cfg.Store, g.metrics)

	var scope func(*http.Request) string
	g.protected = []string{"Idempotency-Key", "Authorization", "Content-Type"}
	if h := cfg.ScopeHeader; h != "" {
		scope = func(r *http.Request) string { return r.Header.Get(h) }
		g.protected[1] = http.CanonicalHeaderKey(h)
	}
	g.mw, err = idempotency.New(idempotency.Config{
		Store:         g.store,
		Methods:       cfg.Methods,
		KeyOptional:   cfg.KeyOptional,
		Scope:         scope,
		Lease:         cfg.Lease,
		TTL:           cfg.TTL,
		MaxBody:       cfg.MaxBody,
		BodyTimeout:   cfg.BodyTimeout,
		MaxBodyMemory: cfg.MaxBodyMemory,
		MaxResponse:   cfg.MaxResponse,
		FailOpen:      cfg.FailOpen,
		Logger:        cfg.Logger,
		OnOutcome: func(r *http.Request, o idempotency.Outcome) {
			if ex := exchangeFrom(r.Context()); ex != nil {
				ex.setOutcome(string(o))
			}
		},
	})
	if err != nil {
		g.metrics.unregister(reg) // so that a corrected Config can register them again
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(cfg.Upstream)
			pr.SetXForwarded()
		},
		// deadline.Transport tells the upstream, in Request-Budget-Ms, how long the
		// gateway will wait for it: what is left of UpstreamTimeout.
		Transport:      deadline.Transport{Base: cfg.Transport},
		ModifyResponse: g.modifyResponse,
		ErrorHandler:   g.upstreamError,
		ErrorLog:       log.New(slogWriter{cfg.Logger}, "", 0),
		// Without a pool ReverseProxy allocates a 32 KiB copy buffer per request: over
		// half the bytes a proxied request allocated in BenchmarkGateway's profile.
		BufferPool: &bufferPool{},
	}
	// The server's budget for a request is the time to receive its body and to call the
	// upstream: a caller whose own budget (Request-Budget-Ms) is already spent is
	// answered 504 before anything is claimed, and one whose budget runs out while its
	// body arrives is answered 504 too; a body slower than BodyTimeout is a 408.
	g.handler = deadline.Middleware(deadline.Config{Budget: cfg.BodyTimeout + cfg.UpstreamTimeout, Logger: cfg.Logger})(
		g.mw.Handler(http.HandlerFunc(g.forward)))
	return g, nil
}

// ProblemHopByHop (400): the request's Connection header lists a header the upstream
// must receive — the Idempotency-Key, the header its scope comes from, or its content
// type — which a proxy must drop as hop-by-hop.
const ProblemHopByHop = "urn:retrysafe:problem:hop-by-hop-header"

// hopByHop returns the first protected header r's Connection header lists, or "".
func (g *Gateway) hopByHop(r *http.Request) string {
	for _, v := range r.Header.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			name = http.CanonicalHeaderKey(strings.TrimSpace(name))
			if slices.Contains(g.protected, name) {
				return name
			}
		}
	}
	return ""
}

// exchange is one request's state, shared by the layers of the gateway through the
// request's context.
type exchange struct {
	sent atomic.Bool // the upstream request's headers were written

	mu          sync.Mutex
	call        *upstreamCall
	outcome     string
	failure     failure
	upstreamErr error
	upstreamDur time.Duration
	upstreamSt  int
	body        *watchedBody
}

func (ex *exchange) setOutcome(o string) {
	ex.mu.Lock()
	ex.outcome = o
	ex.mu.Unlock()
}

type exchangeKey struct{}

func exchangeFrom(ctx context.Context) *exchange {
	ex, _ := ctx.Value(exchangeKey{}).(*exchange)
	return ex
}

// ServeHTTP proxies r to the upstream under the idempotency middleware.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.active.add()
	defer g.active.done()
	start := time.Now()
	ex := &exchange{}
	cw := &clientWriter{ResponseWriter: w}
	defer func() { g.finish(r, ex, cw, start) }()
	if name := g.hopByHop(r); name != "" {
		ex.setOutcome("hop-by-hop")
		idempotency.WriteProblem(cw, idempotency.Problem{Type: ProblemHopByHop, Title: "Header listed as hop-by-hop",
			Status: http.StatusBadRequest,
			Detail: "The Connection header lists " + name + ", which the upstream must receive (it is the key, the scope or fingerprinted): the request was not forwarded."}, 0)
		return
	}
	g.handler.ServeHTTP(cw, r.WithContext(context.WithValue(r.Context(), exchangeKey{}, ex)))
}

// forward runs as the owner of the key (or for an unkeyed request) and sends the
// request upstream.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request) {
	ex := exchangeFrom(r.Context())
	claim, keyed := idempotency.ClaimFromContext(r.Context())
	if keyed {
		g.metrics.inFlight.Inc()
		defer g.metrics.inFlight.Dec()
	}
	// A keyed request is detached from the client: a client that goes away must not
	// cancel the upstream request, whose answer its retry will want. An unkeyed one
	// (nothing will be stored) ends with its client, as through any proxy.
	parent := r.Context()
	var settled <-chan struct{}
	if keyed {
		parent = context.WithoutCancel(parent)
		settled = claim.Stored()
	}
	call := startUpstreamCall(parent, g.cfg.UpstreamTimeout, settled)
	defer call.stop()
	ex.mu.Lock()
	ex.call = call
	ex.mu.Unlock()
	ctx := sentTrace(call.ctx, &ex.sent)
	start := time.Now()
	defer func() {
		ex.mu.Lock()
		defer ex.mu.Unlock()
		ex.upstreamDur = time.Since(start)
		if ex.body != nil && ex.failure == failNone {
			if err := ex.body.failed(); err != nil {
				ex.failure, ex.upstreamErr = failBody, err
				if keyed {
					claim.Abandon()
				}
				// The answer is incomplete: under an http.Server (which recovers this
				// panic quietly) the client's connection is cut, so that it cannot take
				// a truncated answer for a whole one — and the middleware, seeing the
				// handler panic, sends nothing of what it held and keeps the key to its
				// lease. ReverseProxy has panicked so already, under a server.
				if v := recover(); v != nil && v != http.ErrAbortHandler {
					panic(v)
				}
				if r.Context().Value(http.ServerContextKey) != nil {
					panic(http.ErrAbortHandler)
				}
			}
		}
		result := ex.failure.String()
		switch {
		case result != "":
		case ex.upstreamSt >= 100 && ex.upstreamSt <= 599:
			result = strconv.Itoa(ex.upstreamSt/100) + "xx"
		default:
			result = "other"
		}
		g.metrics.upstreamDur.WithLabelValues(result).Observe(ex.upstreamDur.Seconds())
	}()
	g.proxy.ServeHTTP(w, r.WithContext(ctx))
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
	b := &watchedBody{ReadCloser: res.Body, call: ex.call}
	res.Body = b
	ex.body, ex.upstreamSt = b, res.StatusCode
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
	lease := int(math.Ceil(g.cfg.Lease.Seconds()))
	retry := "Retry it with the same Idempotency-Key."
	if keyed {
		retry = fmt.Sprintf("Retry it with the same Idempotency-Key: until the key's lease ends (%s) a retry is answered 409; after it the request is forwarded again with the same key.", g.cfg.Lease)
	}
	switch f {
	case failUnreachable:
		if keyed {
			claim.Release()
		}
		idempotency.WriteProblem(w, idempotency.Problem{Type: ProblemUpstreamUnreachable, Title: "Upstream unreachable",
			Status: http.StatusBadGateway,
			Detail: "The request was not forwarded: the upstream could not be reached. Retry it with the same Idempotency-Key."}, 1)
		return
	case failTimeout:
		if !keyed {
			lease = 0
		} else {
			claim.Abandon()
		}
		idempotency.WriteProblem(w, idempotency.Problem{Type: ProblemUpstreamTimeout, Title: "Upstream timed out",
			Status: http.StatusGatewayTimeout,
			Detail: fmt.Sprintf("The request was forwarded and the upstream did not answer within %s: it may or may not have been executed. %s", g.cfg.UpstreamTimeout, retry)}, lease)
	default:
		if !keyed {
			lease = 0
		} else {
			claim.Abandon()
		}
		idempotency.WriteProblem(w, idempotency.Problem{Type: ProblemUpstreamFailed, Title: "Upstream connection failed",
			Status: http.StatusBadGateway,
			Detail: "The request was forwarded and the connection to the upstream failed before an answer: it may or may not have been executed. " + retry}, lease)
	}
}

// finish logs the request and counts it.
func (g *Gateway) finish(r *http.Request, ex *exchange, cw *clientWriter, start time.Time) {
	d := time.Since(start)
	ex.mu.Lock()
	outcome, f, uerr, udur, upstreamSt := ex.outcome, ex.failure, ex.upstreamErr, ex.upstreamDur, ex.upstreamSt
	ex.mu.Unlock()
	status := cw.status
	switch {
	case status == 0 && f == failBody:
		status = upstreamSt // the answer that broke off; the client got none of it
	case status == 0:
		status = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	if outcome == "" {
		// The middleware never saw it: deadline.Middleware answered (the caller's budget
		// was spent), or the request panicked before.
		outcome = "budget-exhausted"
		if status != http.StatusGatewayTimeout {
			outcome = "error"
		}
	}
	g.metrics.requests.WithLabelValues(outcome).Inc()
	g.metrics.requestDur.WithLabelValues(outcome).Observe(d.Seconds())

	level := slog.LevelInfo
	if outcome == string(idempotency.OutcomePassThrough) {
		level = slog.LevelDebug
	}
	ctx := r.Context()
	if !g.cfg.Logger.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 12)
	attrs = append(attrs,
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.String("outcome", outcome),
		slog.Int("status", status),
		slog.Duration("latency", d),
	)
	if k := r.Header.Get("Idempotency-Key"); k != "" {
		if len(k) > 80 {
			k = k[:80] + "…"
		}
		attrs = append(attrs, slog.String("key", k))
	}
	if udur > 0 {
		attrs = append(attrs, slog.Duration("upstream_latency", udur))
	}
	if f != failNone {
		attrs = append(attrs, slog.String("upstream_error", f.String()), slog.String("err", uerr.Error()))
	}
	if cw.gone {
		attrs = append(attrs, slog.Bool("client_gone", true))
	}
	attrs = append(attrs, slog.String("remote", r.RemoteAddr))
	g.cfg.Logger.LogAttrs(ctx, level, "request", attrs...)
}

// clientWriter is the client's ResponseWriter as the gateway's layers see it. It
// remembers the status, and hides write errors: when the client has gone, the rest of
// the upstream's answer is still read and recorded (for the client's retry) instead of
// aborting the copy.
type clientWriter struct {
	http.ResponseWriter
	status int
	gone   bool
}

func (w *clientWriter) WriteHeader(code int) {
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *clientWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
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
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if !w.gone {
		if err := http.NewResponseController(w.ResponseWriter).Flush(); err != nil {
			w.gone = true
		}
	}
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *clientWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// slogWriter adapts a slog.Logger to the log.Logger that net/http wants for its errors.
type slogWriter struct{ l *slog.Logger }

func (s slogWriter) Write(p []byte) (int, error) {
	msg := string(p)
	if n := len(msg); n > 0 && msg[n-1] == '\n' {
		msg = msg[:n-1]
	}
	s.l.Warn(msg)
	return len(p), nil
}

// bufferPool is the ReverseProxy's pool of 32 KiB copy buffers.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) == 32<<10 {
		buf = buf[:cap(buf)]
		b.p.Put(&buf)
	}
}
