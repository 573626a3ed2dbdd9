package gateway

import (
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// AdminConfig is what the admin listener serves beside /healthz, /readyz and /metrics.
type AdminConfig struct {
	// Console, when set, serves every path the probes and /metrics do not take: the
	// operator console (package console), which checks its own access.
	Console http.Handler
	// Token, when set, is the bearer token GET /metrics asks for (Authorization: Bearer
	// TOKEN), compared in constant time: metrics name routes and upstreams. The probes
	// stay open, so that a load balancer or an orchestrator can use them without it.
	Token string
}

// Gatherer returns the registry the gateway's metrics are gathered from (the one
// /metrics serves), or nil when Config.Registerer is not also a prometheus.Gatherer.
// Readers such as the console's outcome history sample it.
func (g *Gateway) Gatherer() prometheus.Gatherer { return g.gatherer }

// bearer serves h only to requests whose Authorization header carries token; an empty
// token lets every request through.
func bearer(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="retrysafe admin"`)
			plain(w, http.StatusUnauthorized, "a bearer token is required (Authorization: Bearer TOKEN)")
			return
		}
		h.ServeHTTP(w, r)
	})
}
