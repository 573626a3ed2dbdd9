package retrysafecaddy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/gateway/configfile"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/retry"
	"github.com/retrysafe/retrysafe/storedsn"
)

func init() {
	caddy.RegisterModule(Handler{})
	httpcaddyfile.RegisterHandlerDirective("idempotency", parseCaddyfile)
}

// Handler is the http.handlers.idempotency module.
type Handler struct {
	// Store is the idempotency store's DSN, as retrysafe gateway's --store takes it.
	// Default storedsn.Default (sqlite:retrysafe.db, in Caddy's working directory).
	Store string `json:"store,omitempty"`

	// Policy holds the policy keys of retrysafe gateway's configuration file (those of
	// its defaults: section), each by its dotted name (ttl, conflict, key.pointer,
	// scope, scope.header, fingerprint.ignore) with its value as the file writes it,
	// and its top-level max_body_memory and max_waiters, which bound every handler over
	// the store; the values of methods and fingerprint.ignore are comma-separated. A
	// key left out has the file's default.
	Policy map[string]string `json:"policy,omitempty"`

	mw     *idempotency.Middleware // nil: mode off
	in     *gateway.Instruments    // the metrics, in the configuration's registry
	reg    *prometheus.Registry    // the configuration's registry
	store  *sharedStore
	policy gateway.Policy
	lease  time.Duration
	dsn    string // the key of the store in the pool; "" when none was taken
	logger *slog.Logger
}

// CaddyModule returns the module's information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.idempotency", New: func() caddy.Module { return new(Handler) }}
}

// overrides returns the store and the policy as configfile overrides of the defaults,
// and the store-wide bounds as overrides of the file's top-level keys.
func (h *Handler) overrides() ([]configfile.Override, error) {
	out := []configfile.Override{{Key: "store", Value: h.Store, Source: "idempotency store"}}
	for _, k := range slices.Sorted(maps.Keys(h.Policy)) {
		if err := notInCaddyErr(k); err != nil {
			return nil, err
		}
		key := "defaults." + k
		if slices.Contains(storeWide, k) {
			key = k
		}
		out = append(out, configfile.Override{Key: key, Value: h.Policy[k], Source: "idempotency " + strings.ReplaceAll(k, ".", " ")})
	}
	return out, nil
}

// placeholderFile is the configuration file the handler's policy overrides: the
// gateway's rules need an upstream, which the handler never calls (its upstream is the
// next handler).
const placeholderFile = "defaults:\n  upstream: http://next-handler.invalid\n"

// Provision resolves the policy as retrysafe gateway would, and takes the store from
// the pool.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Slogger()
	overrides, err := h.overrides()
	if err != nil {
		return err
	}
	f, err := configfile.Parse("Caddyfile", []byte(placeholderFile), configfile.Options{
		Overrides:  overrides,
		CheckStore: storedsn.Check,
		LookupEnv:  func(string) (string, bool) { return "", false }, // Caddy expands {$NAME} itself
	})
	if err != nil {
		return fmt.Errorf("idempotency: %w", err)
	}
	cfg := f.Gateway
	cfg.Logger = h.logger
	policy, err := cfg.CatchAllPolicy()
	if err != nil {
		return fmt.Errorf("idempotency: %w", err)
	}
	if policy.Off {
		return nil
	}
	h.policy = policy
	dsn := f.Store
	if dsn == "" {
		dsn = storedsn.Default
	}
	v, _, err := stores.LoadOrNew(dsn, func() (caddy.Destructor, error) { return openStore(dsn, policy.Middleware) })
	if err != nil {
		return fmt.Errorf("idempotency: %w", err)
	}
	h.dsn = dsn
	s := v.(*sharedStore)
	h.store = s
	mcfg, err := storeBounds(h.Policy, policy.Middleware, s.root.Config(), s.opened.Name)
	if err != nil {
		return err
	}
	// Each configuration has a registry of its own, which Caddy serves on /metrics: the
	// collectors are registered in it (the other handlers of the configuration adopt
	// them), and the store's own calls (the probe's pings) count in every registry of a
	// configuration that uses the store.
	h.reg = ctx.GetMetricsRegistry()
	if h.in, err = gateway.NewInstruments(h.reg, configState{h.reg}); err != nil {
		return fmt.Errorf("idempotency: %w", err)
	}
	s.observe(h.reg, h.in)
	mcfg.OnStoreCall = h.in.ObserveStore
	if h.mw, err = s.root.With(mcfg); err != nil {
		return fmt.Errorf("idempotency: %w", err)
	}
	h.lease = h.mw.Config().Lease
	return nil
}

// Cleanup gives the store back to the pool, which closes it when no configuration uses
// it any more.
func (h *Handler) Cleanup() error {
	if h.dsn == "" {
		return nil
	}
	if h.in != nil {
		h.store.unobserve(h.reg)
	}
	_, err := stores.Delete(h.dsn)
	h.dsn = ""
	return err
}

// ServeHTTP runs the request through the middleware, with next as its upstream, and
// counts it (and, under Caddy's tracing, traces it) as the gateway does.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) (err error) {
	outcome := idempotency.Outcome("error") // the gateway's, for a request that panicked
	if h.mw == nil {
		return next.ServeHTTP(w, r)
	}
	r, q := h.in.Route(serverName(r)).Start(r)
	var sw *statusWriter // for the spans' status
	if q.Traced() {
		sw = &statusWriter{ResponseWriter: w}
		w = sw
	}
	defer func() {
		status := 0
		if sw != nil {
			status = sw.status
		}
		q.End(outcome, status)
		// The gateway's line for each request names its outcome; Caddy's is its access
		// log, which gets the outcome as a field.
		if extra, ok := r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); ok {
			extra.Set(zap.String("idempotency_outcome", string(outcome)))
		}
	}()
	if h.policy.RefuseHopByHop(w, r) {
		outcome = "hop-by-hop" // the gateway's
		return nil
	}
	var nextErr error // of a request the middleware did not claim: Caddy's to answer
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		claim, keyed := idempotency.ClaimFromContext(r.Context())
		if !keyed {
			nextErr = next.ServeHTTP(w, r)
			return
		}
		defer q.Forwarding()()
		out, stop := sendOnce(r)
		defer stop()
		defer func() {
			if v := recover(); v != nil {
				if v != errResend {
					panic(v)
				}
				h.upstreamError(w, r, claim, errResend)
			}
		}()
		if err := next.ServeHTTP(w, out); err != nil {
			h.upstreamError(w, r, claim, err)
		}
	})
	outcome, err = h.mw.Serve(w, r, upstream)
	if errors.Is(err, idempotency.ErrAborted) {
		panic(http.ErrAbortHandler)
	}
	return nextErr
}

// serverName is the route label of r's metrics: the name of the Caddy server that serves
// it (srv0, or its name in the JSON configuration), as Caddy's own metrics label theirs.
func serverName(r *http.Request) string {
	if srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && srv != nil {
		return srv.Name()
	}
	return ""
}

// statusWriter remembers the status written, for the spans of a traced request.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach Caddy's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// sendOnce returns r for the next handler, with nothing that lets the request be sent
// again: its Idempotency-Key headers hidden from net/http's transport, which would
// resend a request bearing one on a reused connection that broke, no GetBody, a body
// that cannot be read again once closed (reverse_proxy closes a body it read before it
// retries), and a client trace that stops any attempt to take a connection for it once
// its headers were written: reverse_proxy with request_buffers replays a body of its
// own, and its lb_retry_match may match the request's method. The attempt is stopped
// by a panic with errResend in the trace's GetConn hook, which runs in the goroutine
// that called the transport, before any connection is taken; ServeHTTP recovers it.
// stop ends the context the request was given.
func sendOnce(r *http.Request) (*http.Request, context.CancelFunc) {
	var wrote atomic.Bool
	trace := &httptrace.ClientTrace{
		WroteHeaders: func() { wrote.Store(true) },
		GetConn: func(string) {
			if wrote.Load() {
				panic(errResend)
			}
		},
	}
	ctx, cancel := context.WithCancel(httptrace.WithClientTrace(r.Context(), trace))
	out := r.WithContext(ctx)
	out.Header = r.Header.Clone()
	retry.HideIdempotencyKeys(out)
	out.GetBody = nil
	if r.Body != nil && r.Body != http.NoBody {
		out.Body = &onceBody{rc: r.Body}
	}
	return out, cancel
}

// errResend stops a second attempt to send a keyed request (sendOnce).
var errResend = errors.New("idempotency: the keyed request was sent once and is not sent again")

// errSentOnce is what a second read of a keyed request's body returns.
var errSentOnce = errors.New("idempotency: the keyed request's body was sent once and is not sent again")

// onceBody is a request body that cannot be read after it is closed.
type onceBody struct {
	mu     sync.Mutex
	rc     io.ReadCloser
	closed bool
}

func (b *onceBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errSentOnce
	}
	return b.rc.Read(p)
}

func (b *onceBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return nil // the middleware owns the body underneath
}

// upstreamError answers the error of the next handler for a claimed request, as the
// gateway answers a failed upstream call: a dial error means the upstream never saw the
// request, so the key is released; after any other the upstream may have acted, so the
// key stays in progress until its lease ends.
func (h *Handler) upstreamError(w http.ResponseWriter, r *http.Request, claim *idempotency.Claim, err error) {
	var dial reverseproxy.DialError
	if errors.As(err, &dial) {
		claim.Release()
		idempotency.WriteProblem(w, idempotency.Problem{Type: gateway.ProblemUpstreamUnreachable, Title: "Upstream unreachable",
			Status: http.StatusBadGateway,
			Detail: "The request was not forwarded: the upstream could not be reached. Retry it with the same Idempotency-Key."}, 1)
		return
	}
	claim.Abandon()
	h.logger.WarnContext(r.Context(), "idempotency: the next handler failed after the request was claimed; the key stays in progress until its lease ends", "err", err)
	idempotency.WriteProblem(w, idempotency.Problem{Type: gateway.ProblemUpstreamFailed, Title: "Upstream connection failed",
		Status: http.StatusBadGateway,
		Detail: fmt.Sprintf("The request was forwarded and failed before an answer: it may or may not have been executed. Retry it with the same Idempotency-Key: until the key's lease ends (%s) a retry is answered 409; after it the request is forwarded again with the same key.", h.lease)},
		int(math.Ceil(h.lease.Seconds())))
}

// stores holds the open stores by DSN. It is the one package-level variable: a store
// must outlive the configuration that opened it, so that a reload keeps it (and the
// answers held while it is unreachable), and Caddy's usage pools are how modules share
// a resource across configurations.
var stores = caddy.NewUsagePool()

// sharedStore is an open store, its janitor, and the root middleware whose state every
// handler over the store shares (idempotency.Middleware.With).
type sharedStore struct {
	// observers are the metrics of the configurations that use the store, by their
	// registry: the root's store calls (the probe's pings, the held answers stored) count
	// in each.
	mu          sync.Mutex
	observers   map[*prometheus.Registry]*observer
	opened      *storedsn.Opened
	root        *idempotency.Middleware
	logger      *slog.Logger
	stopJanitor context.CancelFunc
	janitorDone chan struct{}
}

// openTimeout bounds opening and migrating a store; shutdownTimeout bounds the storing
// of the held answers when the store is closed.
const (
	openTimeout     = 30 * time.Second
	shutdownTimeout = 10 * time.Second
)

// openStore opens the store of dsn, and makes the root middleware with the policy of the
// first handler that uses it (mcfg, resolved): the root serves no request, but its lease
// is one of the group's, and the group holds takeovers back for its longest lease, so a
// root with a default lease of its own would slow the takeovers of shorter leases.
func openStore(dsn string, mcfg idempotency.Config) (*sharedStore, error) {
	logger := mcfg.Logger
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	o, err := storedsn.OpenWith(ctx, dsn, storedsn.Options{Logger: logger})
	if err != nil {
		return nil, err
	}
	if err := o.Migrate(ctx); err != nil {
		_ = o.Close()
		return nil, fmt.Errorf("applying the schema of %s: %w", o.Name, err)
	}
	s := &sharedStore{opened: o, logger: logger, janitorDone: make(chan struct{}), observers: map[*prometheus.Registry]*observer{}}
	// The store is traced under the span of the request each call is made for, with that
	// span's TracerProvider (Caddy's tracing directive): no span, no tracing.
	mcfg.Store, mcfg.OnOutcome = gateway.WrapStore(o.Store), nil
	mcfg.OnStoreCall = s.observeStore
	root, err := idempotency.New(mcfg)
	if err != nil {
		_ = o.Close()
		return nil, err
	}
	s.root = root
	jctx, stop := context.WithCancel(context.Background())
	s.stopJanitor = stop
	if o.Janitor != nil {
		go func() {
			defer close(s.janitorDone)
			idempotency.RunJanitor(jctx, o.Janitor, idempotency.JanitorConfig{Logger: logger, Middleware: root})
		}()
	} else {
		close(s.janitorDone)
	}
	logger.Info("idempotency: store opened", "store", o.Name)
	return s, nil
}

// observer is the metrics of one configuration's registry, and how many of its handlers
// use the store.
type observer struct {
	in       *gateway.Instruments
	handlers int
}

// observe counts the root's store calls in reg, with in (a handler's Instruments there),
// until each handler that called it calls unobserve.
func (s *sharedStore) observe(reg *prometheus.Registry, in *gateway.Instruments) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.observers[reg]
	if o == nil {
		o = &observer{in: in}
		s.observers[reg] = o
	}
	o.handlers++
}

func (s *sharedStore) unobserve(reg *prometheus.Registry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o := s.observers[reg]; o != nil {
		if o.handlers--; o.handlers == 0 {
			delete(s.observers, reg)
		}
	}
}

// configState is the state the gauges of a configuration's registry report: that of the
// stores its handlers use, summed (the waiters, the body memory), or whether any of them
// cannot make writes durable.
type configState struct{ reg *prometheus.Registry }

// each calls f with the root of each store the configuration uses.
func (c configState) each(f func(*idempotency.Middleware)) {
	stores.Range(func(_, v any) bool {
		s, ok := v.(*sharedStore)
		if !ok {
			return true
		}
		s.mu.Lock()
		_, uses := s.observers[c.reg]
		s.mu.Unlock()
		if uses {
			f(s.root)
		}
		return true
	})
}

func (c configState) Waiting() (n int) {
	c.each(func(m *idempotency.Middleware) { n += m.Waiting() })
	return n
}

func (c configState) StoreNotDurable() (not bool) {
	c.each(func(m *idempotency.Middleware) { not = not || m.StoreNotDurable() })
	return not
}

func (c configState) BodyMemory() (n int64) {
	c.each(func(m *idempotency.Middleware) { n += m.BodyMemory() })
	return n
}

// observeStore is the root's OnStoreCall.
func (s *sharedStore) observeStore(op idempotency.StoreOp, took time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.observers {
		o.in.ObserveStore(op, took, err)
	}
}

// Destruct stores the held answers (for up to shutdownTimeout), stops the janitor and
// closes the store: no handler uses it any more.
func (s *sharedStore) Destruct() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := s.root.Shutdown(ctx)
	s.stopJanitor()
	<-s.janitorDone
	s.logger.Info("idempotency: store closed", "store", s.opened.Name)
	return errors.Join(err, s.opened.Close())
}

// parseCaddyfile reads the idempotency directive.
func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// listKeys are the policy keys whose value is a list.
var listKeys = []string{"methods", "ignore"}

// mappings are the policy keys whose value is a mapping in the file: their
// subdirectives name the member first (key pointer /id), unless they take one word
// (scope none).
var mappings = []string{"key", "scope", "fingerprint"}

// UnmarshalCaddyfile reads
//
//	idempotency [<matcher>] {
//		store <dsn>
//		<policy key> <value...>
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		name, args := d.Val(), d.RemainingArgs()
		if name == "store" {
			if len(args) != 1 {
				return d.ArgErr()
			}
			h.Store = args[0]
			continue
		}
		key := name
		if slices.Contains(mappings, name) && len(args) >= 2 {
			key, args = name+"."+args[0], args[1:]
		}
		last := key[strings.LastIndex(key, ".")+1:]
		if len(args) == 0 || len(args) > 1 && !slices.Contains(listKeys, last) {
			return d.ArgErr()
		}
		if h.Policy == nil {
			h.Policy = map[string]string{}
		}
		if _, dup := h.Policy[key]; dup {
			return d.Errf("%s is set twice", strings.ReplaceAll(key, ".", " "))
		}
		h.Policy[key] = strings.Join(args, ",")
	}
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
