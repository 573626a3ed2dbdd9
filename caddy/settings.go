package retrysafecaddy

import (
	"fmt"
	"strings"

	"github.com/retrysafe/retrysafe/idempotency"
)

// notInCaddy are the keys of retrysafe gateway's configuration file that Caddy's own
// configuration takes the place of, each with what does: the handler refuses them,
// saying so, rather than ignoring them.
var notInCaddy = map[string]string{
	"match":            "Caddy's request matchers (a matcher on the directive, or a handle block) choose the handler's requests",
	"routes":           "Caddy's request matchers (a matcher on the directive, or a handle block) choose the handler's requests, each handler with its own policy",
	"upstream":         "the next handler in Caddy's chain (reverse_proxy, php_fastcgi, …) is the upstream",
	"upstreams":        "the next handler in Caddy's chain (reverse_proxy, php_fastcgi, …) is the upstream",
	"upstream_timeout": "the next handler's own timeouts apply: reverse_proxy's transport http { dial_timeout, response_header_timeout, read_timeout, write_timeout }",
	"shutdown_timeout": "Caddy's grace_period bounds the requests in flight at a stop or reload; the answers the store could not take get 10s to be stored when the store is closed",
	"listen":           "the site's address is Caddy's",
	"tls":              "Caddy's tls directive and automatic HTTPS serve TLS",
	"admin_tls":        "Caddy's admin endpoint is Caddy's",
	"admin":            "Caddy's admin endpoint is Caddy's",
	"admin_token":      "Caddy's admin endpoint is Caddy's",
	"console":          "the operator console is retrysafe gateway's; Caddy has its admin endpoint",
	"log":              "the handler logs through Caddy's logger (http.handlers.idempotency), configured with Caddy's log options",
	"otel":             "Caddy's tracing directive traces requests",
	"defaults":         "the directive's settings are the policy",
}

// storeWide are the file's top-level keys the handler takes: bounds that the gateway
// puts on all its routes, and Caddy on all the handlers over one store (one DSN) in the
// process, since they share the store's state (bodies in memory, waiters).
var storeWide = []string{"max_body_memory", "max_waiters"}

// notInCaddyErr returns the error of a setting k that Caddy's configuration takes the
// place of, or nil.
func notInCaddyErr(k string) error {
	why, ok := notInCaddy[strings.Split(k, ".")[0]]
	if !ok {
		return nil
	}
	return fmt.Errorf("idempotency: %s is not a setting of the handler: %s", strings.ReplaceAll(k, ".", " "), why)
}

// storeBounds returns mcfg, the handler's resolved policy, for With over a store whose
// root has the bounds of store: a bound the handler leaves out is the store's (zero),
// one it sets must be the store's.
func storeBounds(policy map[string]string, mcfg, store idempotency.Config, storeName string) (idempotency.Config, error) {
	_, ownMemory := policy["max_body_memory"]
	_, ownWaiters := policy["max_waiters"]
	mismatch := func(key string, own, its int64) error {
		return fmt.Errorf("idempotency: %s %d differs from the %d of the store %s, which the handler that opened it set (or its default): "+
			"it bounds every handler over the store in this Caddy process; set it alike on all of them (changing it takes a Caddy restart, "+
			"or a configuration without the store first)", key, own, its, storeName)
	}
	switch {
	case !ownMemory:
		mcfg.MaxBodyMemory = 0
	case mcfg.MaxBodyMemory != store.MaxBodyMemory:
		return mcfg, mismatch("max_body_memory", mcfg.MaxBodyMemory, store.MaxBodyMemory)
	}
	switch {
	case !ownWaiters:
		mcfg.MaxWaiters = 0
	case mcfg.MaxWaiters != store.MaxWaiters:
		return mcfg, mismatch("max_waiters", int64(mcfg.MaxWaiters), int64(store.MaxWaiters))
	}
	return mcfg, nil
}
