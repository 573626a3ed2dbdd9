package gateway

import (
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

	// TTL is how long a record, and so the replay of a response, is kept. Default 24h.
	TTL time.Duration

	// Lease is how long a key stays in progress without a heartbeat; the gateway renews
	// it while the upstream works. After a crash, or an upstream timeout, the key can be
	// taken over once its lease has ended. Default 30s.
	Lease time.Duration

	// MaxBody is the largest request body accepted on a keyed request; larger is answered
	// 413 before anything is stored. Default 1 MiB.
	MaxBody int64

	// MaxResponse is the largest response body stored. A larger response is passed on
	// and its record kept without the body (the work was done); a replay then says
	// Idempotent-Body-Omitted: true. Default 4 MiB.
	MaxResponse int64

	// UpstreamTimeout bounds each upstream round trip, the response body included. It
	// runs from the moment the request is forwarded, whatever the client does. Default 30s.
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
	// http.DefaultTransport keeping up to 256 idle connections to the upstream.
	Transport http.RoundTripper

	// ShutdownTimeout bounds Run's graceful shutdown: how long the requests in flight
	// get to finish before their connections are closed. A request whose connection was
	// closed still records the upstream's answer before Run returns. Default
	// UpstreamTimeout + 5s.
	ShutdownTimeout time.Duration

	// Clock returns the current time for leases, expiry and the janitor. Default
	// time.Now.
	Clock func() time.Time
}

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
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	cfg.Methods = slices.Clone(cfg.Methods)
	for i, m := range cfg.Methods {
		if !validToken(m) {
			return cfg, fmt.Errorf("gateway: Config.Methods: %q is not a method", m)
		}
		cfg.Methods[i] = strings.ToUpper(m)
	}
	if cfg.TTL == 0 {
		cfg.TTL = 24 * time.Hour
	}
	if cfg.Lease == 0 {
		cfg.Lease = 30 * time.Second
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = 1 << 20
	}
	if cfg.MaxResponse == 0 {
		cfg.MaxResponse = 4 << 20
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = 30 * time.Second
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = cfg.UpstreamTimeout + 5*time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = 512
		t.MaxIdleConnsPerHost = 256
		cfg.Transport = t
	}
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
