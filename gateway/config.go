package gateway

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/retry"
)

// Config configures a Gateway. The zero value of every field but Upstream and Store
// means the default documented on it.
type Config struct {
	// Upstream is the service the gateway forwards to: an absolute http or https URL.
	// Its path, if any, prefixes the request's path (httputil.ProxyRequest.SetURL).
	// Required.
	Upstream *url.URL

	// Store keeps the idempotency records. Required. The caller owns it: the gateway
	// never closes it.
	Store idempotency.Store

	// Methods are the methods that need an Idempotency-Key. Default POST and PATCH.
	// Other methods are forwarded without touching the store.
	Methods []string

	// KeyOptional forwards keyed requests without an Idempotency-Key, unprotected.
	// Default false: they are answered 400.
	KeyOptional bool

	// ScopeHeader names a header carrying the principal (user, tenant) that the
	// authentication layer in front of the gateway sets: keys live in its value's scope.
	// The header is trusted as is, so the gateway must only be reachable through that
	// layer, which must overwrite any value a client sends. Default "": the scope is the
	// SHA-256 of the Authorization header (no header is one anonymous scope).
	ScopeHeader string

	// TTL is how long a record, and so the replay of a response, is kept. It must be
	// longer than Lease and than UpstreamTimeout, so that no record can expire while its
	// request may still run. Default idempotency.DefaultTTL (24h).
	TTL time.Duration

	// Lease is how long a key stays in progress without a heartbeat; the gateway renews
	// it while the upstream works. After a crash, or an upstream timeout, the key can be
	// taken over once its lease has ended. Default idempotency.DefaultLease (30s).
	Lease time.Duration

	// MaxBody is the largest request body accepted on a keyed request; larger is answered
	// 413 before anything is stored. Default idempotency.DefaultMaxBody (1 MiB).
	MaxBody int64

	// BodyTimeout bounds the reading of a keyed request's body: one not received in time
	// is answered 408 before anything is claimed. Default idempotency.DefaultBodyTimeout
	// (30s).
	BodyTimeout time.Duration

	// MaxBodyMemory is the most keyed-request body bytes held in memory at once, all
	// requests together; past it a request is answered 503 with Retry-After before
	// anything is claimed. Default idempotency.DefaultMaxBodyMemory (256 MiB).
	MaxBodyMemory int64

	// MaxResponse is the largest response body stored. Responses up to it are read whole
	// from the upstream, stored, and then sent (at the client's pace, however slow); a
	// larger response is passed on as it comes and its record kept without the body (the
	// work was done); a replay then says Idempotent-Body-Omitted: true. Default
	// idempotency.DefaultMaxResponse (4 MiB).
	MaxResponse int64

	// UpstreamTimeout bounds each upstream call from the moment it is forwarded until
	// its answer is settled — stored, for a keyed request; its headers received, for
	// another — whatever the client does. After that, only each wait for the upstream's
	// next bytes is bounded by it, so a client that reads slowly is never cut off.
	// Default DefaultUpstreamTimeout (30s).
	UpstreamTimeout time.Duration

	// FailOpen forwards requests unprotected when the store fails. Default false: fail
	// closed, answering 503 with Retry-After without forwarding.
	FailOpen bool

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
	Transport http.RoundTripper

	// ShutdownTimeout bounds each phase of Run's graceful shutdown: how long the
	// requests in flight get to finish before their connections are closed (a request
	// whose connection was closed still records the upstream's answer before Run
	// returns), and then how long answers the store could not take get to be stored.
	// Default UpstreamTimeout + 5s.
	ShutdownTimeout time.Duration
}

// DefaultUpstreamTimeout is Config.UpstreamTimeout's default.
const DefaultUpstreamTimeout = 30 * time.Second

// withDefaults validates cfg and fills in the defaults.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Upstream == nil {
		return cfg, errors.New("gateway: Config.Upstream is required")
	}
	if err := checkUpstream(cfg.Upstream); err != nil {
		return cfg, err
	}
	if cfg.Store == nil {
		return cfg, errors.New("gateway: Config.Store is required")
	}
	for _, d := range []struct {
		name string
		v    int64
	}{{"TTL", int64(cfg.TTL)}, {"Lease", int64(cfg.Lease)}, {"MaxBody", cfg.MaxBody},
		{"BodyTimeout", int64(cfg.BodyTimeout)}, {"MaxBodyMemory", cfg.MaxBodyMemory},
		{"MaxResponse", cfg.MaxResponse}, {"UpstreamTimeout", int64(cfg.UpstreamTimeout)},
		{"ShutdownTimeout", int64(cfg.ShutdownTimeout)}} {
		if d.v < 0 {
			return cfg, fmt.Errorf("gateway: Config.%s is negative", d.name)
		}
	}
	if cfg.ScopeHeader != "" && !validToken(cfg.ScopeHeader) {
		return cfg, fmt.Errorf("gateway: Config.ScopeHeader %q is not a header name", cfg.ScopeHeader)
	}
	if len(cfg.Methods) == 0 {
		cfg.Methods = idempotency.DefaultMethods()
	}
	cfg.Methods = slices.Clone(cfg.Methods)
	for i, m := range cfg.Methods {
		if !validToken(m) {
			return cfg, fmt.Errorf("gateway: Config.Methods: %q is not a method", m)
		}
		cfg.Methods[i] = strings.ToUpper(m)
		switch cfg.Methods[i] {
		case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
			// Safe methods have no effect to do twice, and Go's HTTP client resends them
			// by itself on a broken connection, which would break one forward per claim.
			return cfg, fmt.Errorf("gateway: Config.Methods: %s is a safe method and cannot need a key", cfg.Methods[i])
		}
	}
	cfg.TTL = cmp.Or(cfg.TTL, idempotency.DefaultTTL)
	cfg.Lease = cmp.Or(cfg.Lease, idempotency.DefaultLease)
	cfg.MaxBody = cmp.Or(cfg.MaxBody, idempotency.DefaultMaxBody)
	cfg.BodyTimeout = cmp.Or(cfg.BodyTimeout, idempotency.DefaultBodyTimeout)
	cfg.MaxBodyMemory = cmp.Or(cfg.MaxBodyMemory, idempotency.DefaultMaxBodyMemory)
	cfg.MaxResponse = cmp.Or(cfg.MaxResponse, idempotency.DefaultMaxResponse)
	cfg.UpstreamTimeout = cmp.Or(cfg.UpstreamTimeout, DefaultUpstreamTimeout)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, cfg.UpstreamTimeout+5*time.Second)
	// A record must outlive every request that may still write it: its lease's
	// renewals keep it alive, and the store refuses to expire a running lease, but the
	// settings must not ask for less.
	if cfg.TTL <= cfg.Lease {
		return cfg, fmt.Errorf("gateway: the TTL (%s) must be longer than the lease (%s)", cfg.TTL, cfg.Lease)
	}
	if cfg.TTL <= cfg.UpstreamTimeout {
		return cfg, fmt.Errorf("gateway: the TTL (%s) must be longer than the upstream timeout (%s), or a record could expire while its request still runs", cfg.TTL, cfg.UpstreamTimeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
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

// validToken reports whether s is an RFC 9110 token (a header name, a method).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
