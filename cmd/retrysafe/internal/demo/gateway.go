package demo

import (
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
)

// newGateway returns what sits between the fault proxy and the upstream: the retrysafe
// gateway (package gateway) on store, or, when store is nil (Config.Unprotected), a bare
// httputil.ReverseProxy that forwards every attempt.
func newGateway(upstream *url.URL, store idempotency.Store, tr *http.Transport, logger *slog.Logger) (http.Handler, error) {
	if store == nil {
		return &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(upstream)
				pr.SetXForwarded()
			},
			Transport: tr,
			ErrorLog:  slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		}, nil
	}
	return gateway.New(gateway.Config{
		Upstream: upstream,
		Idempotency: idempotency.Config{
			Store: store,
			// Short, so that a key abandoned to an upstream failure (none is injected
			// between the gateway and the upstream) would not hold a payment up for long.
			Lease: 5 * time.Second,
		},
		UpstreamTimeout: 5 * time.Second,
		Transport:       tr,
		Logger:          logger,
	})
}
