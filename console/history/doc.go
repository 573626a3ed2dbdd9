// Package history keeps the gateway's outcomes and store latencies over the last hour,
// for the operator console, and draws them as inline SVG charts.
//
// It samples the gateway's own Prometheus registry (a prometheus.Gatherer: the
// gateway.Config.Registerer given to the gateway, when it is a *prometheus.Registry) every
// Options.Interval and keeps, for each series, what changed since the previous sample,
// over Options.Window. Sampling reads the counters the gateway keeps anyway: it adds no
// work to the request path, whose cost per request is what the gateway is tuned for, and
// it needs no Prometheus server. Its own cost is one Gather every Interval.
//
// The series read are retrysafe_gateway_requests_total{route,outcome},
// retrysafe_gateway_store_duration_seconds{operation} and
// retrysafe_gateway_store_errors_total{operation}. The first sample is the baseline: the
// counts before it belong to no known interval and are not counted. A series that first
// appears after it counts from zero, as the gateway makes a series on its first request.
// A value lower than the previous one is a reset (the series was removed and made again,
// or the registry replaced): its whole value is the increase, as Prometheus's rate()
// takes it, so that no count is ever negative. A series missing from a sample is
// forgotten, and counts from zero should it come back. A sample whose Gather fails
// records nothing, so that the next one covers the gap.
//
// Memory is bounded: only samples with a change are kept, at most Window/Interval of
// them (should Sample be called more often, the oldest two are merged), each holding one
// entry per series that changed.
//
// # Outcome classes
//
// The gateway labels each request with an outcome (package idempotency's Outcome values
// and the gateway's own). ClassOf maps them onto the classes a chart shows:
//
//	class             outcome values                    why
//	executed          executed, done-aborted            the key was claimed, the upstream ran and
//	                                                    its answer is stored (done-aborted: stored,
//	                                                    then the answer broke off; a retry replays)
//	replayed          replayed                          answered from the store, upstream not called
//	409 in flight     conflict                          the key was in progress
//	422 mismatch      mismatch                          the key was reused with another request
//	other 4xx         missing-key, invalid-key,         the request itself was refused before
//	                  invalid-method, bad-body,         anything was claimed (400, 404, 408, 413)
//	                  hop-by-hop, no-route,
//	                  body-timeout, too-large
//	store error       store-error, failed-open,         the store failed: 503 (fail closed), or
//	                  stored-later, store-not-durable   forwarded unprotected (fail open), or the
//	                                                    answer is held until the store answers,
//	                                                    or the store cannot make writes durable
//	                                                    now: 503, nothing forwarded
//	upstream failure  released, abandoned               the upstream was not reached (502) or said
//	                                                    it did not do the work (its 429 or 503):
//	                                                    key released; or it timed out (504) or
//	                                                    broke the connection after the request was
//	                                                    sent: key left to its lease
//	other             pass-through, lease-lost,         unkeyed requests (nothing claimed), and
//	                  client-gone, overloaded,          requests that ended before an answer of the
//	                  deadline-exceeded,                upstream or the store: the client left,
//	                  budget-exhausted, error           the body memory bound (503), a spent
//	                                                    deadline or budget (504), a panic
//
// An outcome value not in the table is counted as other, and ClassOf says that it does
// not know it.
//
// # Charts
//
// OutcomeChart turns a route's RouteOutcomes into a ChartData and Chart draws it: a bar
// per Options.Bucket, stacked by class, the largest bar's count and a few times on the
// axes, a legend. The SVG is deterministic (it depends only on its ChartData), has no
// script, no external resource and no style attribute — colours are presentation
// attributes, which a Content-Security-Policy of style-src 'self' allows — and escapes
// every text. It carries an aria-label summing up the counts and a <title>.
//
// # Store latency
//
// StoreLatency gives each store operation's calls, errors and p50, p90 and p99 over the
// window, from the deltas of the duration histogram's buckets, interpolated linearly
// inside the bucket that holds the rank as PromQL's histogram_quantile does. A quantile
// above the largest finite bucket says so (Quantile.Above) rather than inventing a value.
package history
