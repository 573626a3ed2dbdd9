// Package retry retries politely: only what is safe to retry, with capped exponential
// backoff and jitter, honouring the server's Retry-After and rate-limit reset headers,
// within a retry budget and the caller's deadline.
//
// The rules:
//
//   - Idempotent methods (GET, HEAD, OPTIONS, PUT, DELETE, TRACE) are retried on
//     retryable failures. POST and PATCH are retried only with an Idempotency-Key (the
//     same key on every attempt), or when the request provably never left the client.
//   - Failures are classified (Classify): auth (401/403) and not found (404/410) and
//     invalid requests (other 4xx) are never retried; rate limits (429), in-progress
//     conflicts (409 with Retry-After) and platform failures (5xx, resets, timeouts) are.
//     A failure that says the caller's time budget is spent (BudgetExhaustedHeader, sent
//     by package deadline) is final.
//   - Waits use jitter (full by default) and a cap; a wait the server asks for is honoured
//     with jitter added upward only; no wait outlives the context's deadline, and no
//     retry starts with less than Policy.MinAttempt (10ms) left before it.
//   - Retry at one layer: a Budget keeps a failing dependency from seeing N× its load.
//     Transport keeps one per host by default, which lets retries through while at
//     least a third of a host's attempts succeed and stops them, for that host, when
//     they fail for almost everyone.
//
// Do and DoValue run any function under a Policy; Transport is an http.RoundTripper
// that applies the rules to every request: it can give each POST and PATCH its own
// Idempotency-Key (AutoKey, keys from NewKey), and reads two per-request settings from
// the request's context: WithStatusClass (a status's class for this call, such as 404
// meaning success for a revoke) and WithStatusCheck (how to learn the outcome of a
// request that may have been executed, instead of resending it). When Transport stops at
// an HTTP answer it returns that response with a nil error, whatever its status, and
// StopReason says why it stopped there. SendOnce, which Transport uses under every
// attempt, keeps Go's http.Transport from resending a keyed request by itself.
//
// Every error the package builds is one line, so it survives a log line or an HTTP
// body. This package imports only the standard library.
package retry
