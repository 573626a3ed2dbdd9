// Package retrysafecaddy is retrysafe's idempotency handler as a Caddy module: the
// http.handlers.idempotency handler and its Caddyfile directive, idempotency. It gives
// the requests it handles the Idempotency-Key semantics of retrysafe gateway, in front of
// whatever comes next in Caddy's chain (reverse_proxy, php_fastcgi, file_server):
//
//	{
//		order idempotency before reverse_proxy
//	}
//	:8080 {
//		idempotency {
//			store sqlite:/var/lib/caddy/keys.db
//		}
//		reverse_proxy 127.0.0.1:3000
//	}
//
// Build a Caddy with it with xcaddy build --with github.com/retrysafe/retrysafe/caddy, or,
// in this module, go build -o caddy ./cmd/caddy.
//
// # The policy
//
// The store is a DSN as retrysafe gateway's --store takes it (package storedsn). The
// other subdirectives are the policy keys of the gateway's configuration file (package
// configfile: mode, methods, key, scope, fingerprint, ttl, lease, store_timeout,
// max_body, body_timeout, max_response, on_store_error, conflict, wait_timeout,
// max_waiters_per_key), with their values and defaults, read by the same code: the
// handler gives them to configfile as the overrides of a file whose defaults are the
// policy, and runs the middleware gateway.Config.CatchAllPolicy resolves from it. A key
// whose value is a mapping in the file takes its member's name first (key pointer /id,
// scope header X-User, fingerprint ignore /ts /nonce). Caddy's matchers, route and handle
// blocks choose the requests; the gateway's keys that Caddy's configuration replaces
// (match, routes, upstream, upstreams, upstream_timeout, shutdown_timeout, listen, tls,
// admin, log, otel, …) are refused, each with what applies instead.
//
// The file's top-level max_body_memory and max_waiters, which bound the whole gateway,
// bound here every handler over one store in the process, since they share its state:
// the handler that opens the store sets them (or their defaults), a handler that leaves
// them out takes the store's, and one that sets another value is refused.
//
// # The store
//
// One store per DSN is opened, migrated and shared by every handler of the configuration
// and across configuration reloads (a caddy.UsagePool), with its janitor and the
// middleware state the gateway shares across its routes (the store's health, the answers
// held while the store is unreachable, the memory ceiling on bodies and the waiters). It
// is closed when the last configuration that uses it is unloaded, after the held answers
// had their chance to be stored.
//
// # One forward per claim
//
// The next handler receives a keyed request whose Idempotency-Key headers are hidden
// from net/http's transport (retry.HideIdempotencyKeys: they are still sent, under
// lower-case names), whose body has no GetBody and cannot be read again once closed, and
// whose context carries a client trace that stops any attempt to take a connection for
// it once its headers were written, so that neither Go's transport nor reverse_proxy's
// retries (lb_retry_match, request_buffers) resend it. An error of the
// next handler is answered here, as the gateway answers an upstream error: a dial error
// (the upstream never saw the request) releases the key, any other leaves it in progress
// until its lease ends, since the upstream may have acted; either is a 502
// problem+json, and Caddy's handle_errors routes do not see it.
//
// # Metrics, spans and logs
//
// The handler counts its requests with the gateway's collectors (gateway.Instruments:
// retrysafe_gateway_*, the route label being the Caddy server's name) in the registry
// Caddy gives each configuration and serves on its admin endpoint's /metrics. Under
// Caddy's tracing directive, its store calls and answers from the store are the
// gateway's spans (gateway.WrapStore), under Caddy's server span and with its
// TracerProvider; without it nothing is traced. Caddy's access log gets each request's
// outcome, as idempotency_outcome.
package retrysafecaddy
