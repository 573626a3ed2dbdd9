package gateway

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/retry"
)

// Config configures a Gateway. The zero value of every field but Upstream and
// Idempotency.Store means the default documented on it.
type Config struct {
	// Upstream is the service the gateway forwards to: an absolute http or https URL.
	// Its path, if any, prefixes the request's path (httputil.ProxyRequest.SetURL).
	// Required, unless Routes are set: then nil means that a request no route matches is
	// answered 404 (ProblemNoRoute) and not forwarded.
	Upstream *url.URL

	// Idempotency configures the idempotency middleware the gateway runs every request
	// through: the Store (required; the caller owns it and the gateway never closes it),
	// the keyed Methods, KeyOptional, Lease, TTL, MaxBody, BodyTimeout, MaxBodyMemory,
	// MaxResponse, FailOpen, StoreTimeout, CanonicalJSON and the rest, with the defaults
	// and checks of idempotency.New, which the gateway does not repeat. The gateway adds
	// its own rules: a safe method (GET, HEAD, OPTIONS, TRACE) cannot be keyed, since Go's
	// HTTP client resends those by itself on a broken connection; the TTL must be longer
	// than UpstreamTimeout, so no record expires while its request may still run; and
	// Idempotency.Logger defaults to Logger. OnOutcome and OnStoreCall, when set, are
	// called as well as the gateway's own accounting. Route is the gateway's: each
	// route's records are filed under its pattern ("/" for the catch-all).
	Idempotency idempotency.Config

	// ScopeHeader names a header carrying the principal (user, tenant) that the
	// authentication layer in front of the gateway sets: keys live in its value's scope.
	// The header is trusted as is, so the gateway must only be reachable through that
	// layer, which must overwrite any value a client sends. Default "": the scope is
	// Idempotency.Scope, whose default is the SHA-256 of the Authorization header (no
	// header is one anonymous scope). Setting both is an error.
	ScopeHeader string

	// ScopeCookie names a cookie whose value (hashed) is the scope, for an API whose
	// callers authenticate with a session cookie (idempotency.CookieScope): two cookies
	// never share a record. Default "".
	ScopeCookie string

	// ScopeNone puts every request in one scope (idempotency.NoScope): for senders
	// authenticated another way, such as a webhook's signature, whose keys are unique
	// across them. Default false.
	ScopeNone bool

	// UpstreamTimeout bounds each upstream call from the moment it is forwarded until
	// its answer is settled — stored, for a keyed request; its headers received, for
	// another — whatever the client does. After that, only each wait for the upstream's
	// next bytes is bounded by it, so a client that reads slowly is never cut off.
	// Default DefaultUpstreamTimeout (30s).
	UpstreamTimeout time.Duration

	// Logger receives the per-request lines and the gateway's errors. Default
	// slog.Default().
	Logger *slog.Logger

	// Registerer receives the gateway's metrics. Default: a new registry of the
	// gateway's own (with the Go and process collectors), served by Admin's /metrics.
	// When set, /metrics serves it if it is also a prometheus.Gatherer (as a
	// *prometheus.Registry is), and is absent otherwise. Two gateways need two
	// registerers (or prometheus.WrapRegistererWith).
	Registerer prometheus.Registerer

	// Transport sends the requests to the upstream. Default: a clone of
	// http.DefaultTransport keeping up to 256 idle connections to the upstream and
	// speaking HTTP/1.1 only. It is always used through retry.SendOnce, so that it never
	// resends a request by itself: one forward per claim. A Transport that speaks
	// HTTP/2 keeps one way to resend: Go's HTTP/2 client sends a request again when the
	// server resets its stream with PROTOCOL_ERROR, whether or not the server acted.
	// A request's length is its ContentLength, as the standard transports read it: the
	// header map it is handed holds no Content-Length.
	Transport http.RoundTripper

	// Routes give the requests that match their patterns a policy of their own, the
	// most specific route first (see Route). The fields above are the policy of the
	// requests no route matches, the catch-all route "/", unless a route has that
	// pattern. Default none: one policy for every request.
	Routes []Route

	// TracerProvider, when set, traces every request with OpenTelemetry: a server span
	// per request (the child of the caller's W3C traceparent), with the store calls, the
	// upstream call (whose context the upstream receives in traceparent) and the answer
	// from the store as its children. The spans hold the key only as KeyHash, never the
	// scope's value, a body, a header's value or an error's text (see the package
	// documentation). Default nil: no tracing, and no cost on the request path.
	TracerProvider trace.TracerProvider

	// ShutdownTimeout bounds each phase of Run's graceful shutdown: how long the
	// requests in flight get to finish before their connections are closed (a request
	// whose connection was closed still records the upstream's answer before Run
	// returns), and then how long answers the store could not take get to be stored.
	// Default the longest upstream timeout of the routes + DefaultShutdownGrace.
	ShutdownTimeout time.Duration
}

// The gateway's own defaults. The idempotency middleware's are in package idempotency
// (idempotency.DefaultTTL, …).
const (
	// DefaultUpstreamTimeout is Config.UpstreamTimeout's default.
	DefaultUpstreamTimeout = 30 * time.Second
	// DefaultShutdownGrace is what Config.ShutdownTimeout's default adds to the
	// upstream timeout: time for the last answers to be stored and sent.
	DefaultShutdownGrace = 5 * time.Second
)

// Resolve returns cfg with the defaults applied, the middleware's by
// idempotency.Config.Resolve, or the error New would return for it (but for a missing
// Idempotency.Store): a command line can check its flags or its file with it before it
// opens a store. An error of one of Routes is a *RouteError.
func (cfg Config) Resolve() (Config, error) {
	cfg, _, err := cfg.resolve()
	return cfg, err
}

// resolve is Resolve, which also returns the policies of the routes, the catch-all
// first. cfg must not have been resolved already (the middleware's Resolve sets a
// default scope, which would read as the caller's own).
func (cfg Config) resolve() (Config, []policy, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return cfg, nil, err
	}
	ps, err := cfg.policies()
	if err != nil {
		return cfg, nil, err
	}
	// The gateway-wide fields: the bounds of Idempotency, which every route shares, each
	// route's MaxBody checked against them with its policy. Without Upstream the
	// Config's own policy serves no request, so a default MaxBody of its own is not held
	// against a smaller MaxBodyMemory.
	if cfg.Upstream == nil && cfg.Idempotency.MaxBody == 0 {
		cfg.Idempotency.MaxBody = min(idempotency.DefaultMaxBody, cmp.Or(cfg.Idempotency.MaxBodyMemory, idempotency.DefaultMaxBodyMemory))
	}
	if cfg.Idempotency, err = cfg.Idempotency.Resolve(); err != nil {
		return cfg, nil, fmt.Errorf("gateway: %w", err)
	}
	longest := time.Duration(0)
	mux := http.NewServeMux()
	for i, p := range ps {
		longest = max(longest, p.upstreamTimeout)
		if register(mux, p.pattern) != nil {
			return cfg, nil, &RouteError{Index: p.index, Pattern: p.pattern, Err: conflicts(ps, i)}
		}
	}
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, longest+DefaultShutdownGrace)
	return cfg, ps, nil
}

// withDefaults checks the gateway's own fields and fills in their defaults; the
// middleware's are idempotency.Config.Resolve's to check and fill, and the policies'
// (scope, methods, TTL) policies'.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Upstream == nil && len(cfg.Routes) == 0 {
		return cfg, errors.New("gateway: Config.Upstream is required")
	}
	if cfg.Upstream != nil {
		if err := checkUpstream(cfg.Upstream); err != nil {
			return cfg, err
		}
	}
	if cfg.UpstreamTimeout < 0 {
		return cfg, errors.New("gateway: Config.UpstreamTimeout is negative")
	}
	if cfg.ShutdownTimeout < 0 {
		return cfg, errors.New("gateway: Config.ShutdownTimeout is negative")
	}
	cfg.UpstreamTimeout = cmp.Or(cfg.UpstreamTimeout, DefaultUpstreamTimeout)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Idempotency.Logger == nil {
		cfg.Idempotency.Logger = cfg.Logger
	}
	if cfg.Transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = 512
		t.MaxIdleConnsPerHost = 256
		// HTTP/1.1 to the upstream, as nginx does by default: Go's HTTP/2 client resends
		// by itself a request whose stream the server reset with PROTOCOL_ERROR, which
		// may come after the server acted on it.
		t.Protocols = new(http.Protocols)
		t.Protocols.SetHTTP1(true)
		cfg.Transport = t
	}
	cfg.Transport = retry.SendOnce(cfg.Transport)
	return cfg, nil
}

// checkTTL checks, once the middleware has applied its defaults, that no record can
// expire while its request may still run: the store refuses to expire a running lease,
// but the settings must not ask for less.
func checkTTL(mw idempotency.Config, upstreamTimeout time.Duration) error {
	if mw.TTL <= upstreamTimeout {
		return fmt.Errorf("gateway: Config.Idempotency.TTL (%s) must be longer than Config.UpstreamTimeout (%s), or a record could expire while its request still runs", mw.TTL, upstreamTimeout)
	}
	return nil
}

// checkUpstream accepts absolute http and https URLs with a host.
func checkUpstream(u *url.URL) error {
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("gateway: upstream %q: the scheme must be http or https", u.Redacted())
	case u.Host == "":
		return fmt.Errorf("gateway: upstream %q has no host", u.Redacted())
	case u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("gateway: upstream %q: a query or fragment is not allowed", u.Redacted())
	}
	return nil
}

// ParseUpstream parses and checks an upstream URL, as Config.Upstream requires it.
func ParseUpstream(s string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the message without the URL, which may hold a password
		}
		return nil, fmt.Errorf("gateway: upstream: %w", err)
	}
	if err := checkUpstream(u); err != nil {
		return nil, err
	}
	return u, nil
}
