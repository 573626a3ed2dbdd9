// Package clients drives real HTTP client libraries, each with its own retry logic,
// through a fault proxy that loses answers into the real retrysafe gateway binary, in
// front of an upstream that never deduplicates, and counts what each logical request
// came to: the upstream's executions (duplicates), the requests lost, the final
// statuses (409s above all).
//
// The pieces, all on loopback:
//
//	client (node: axios + axios-retry, stripe-node; python: requests + urllib3 Retry)
//	  → Proxy: forwards each request whole, then, for a seeded ~30% of them, closes
//	    the client's connection before the answer comes back (the request runs; its
//	    answer is lost, the client sees a network error and retries)
//	  → retrysafe gateway (the binary, its default flags but --upstream, --listen,
//	    --admin and --store, a SQLite file of the run's own)
//	  → Upstream: counts executions per logical request and answers a Stripe-shaped
//	    JSON object. It holds a first execution whose answer the proxy will lose until
//	    the client's retry has reached the gateway — the gateway answered it (reject's
//	    409), or it waits there (the gateway's requests_waiting) — or a bound passes:
//	    the retry of a lost answer meets its first attempt in flight, as it does when
//	    the upstream is slower than the client's retry, and the figures do not depend
//	    on the machine's speed.
//
// Each logical request carries its logical id (LID) in its body, so that the proxy and
// the upstream attribute attempts and executions to it whatever key the client sent
// (stripe-node makes its own).
package clients
