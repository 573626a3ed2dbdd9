// Package deadline budgets time per call and per stack, and carries the budget across
// hops.
//
// The rule: a request with a 15 s total budget cannot contain a 15 s LLM call plus a 2 s
// database call. A ladder of AI providers that gives each provider 15 s and tries
// several in sequence gives the request no budget at all, and its p95 is the sum of the
// worst cases. Timeout budgets must be explicit: every request gets one,
// every call inside it gets a share, and the shares add up to no more than the whole.
// Work that cannot fit in any request budget (a long generation, a batch, a slow
// third party) does not belong on the request path: move it behind the async boundary
// (a queue, see package redeliver) and answer 202 with a way to fetch the result.
//
// The parts:
//
//   - Middleware (inbound) gives every request a context deadline: the smaller of the
//     caller's remaining budget, read from the Request-Budget-Ms header, and the server's
//     own budget (Config.Budget, 30 s by default). A caller whose budget is spent gets
//     504 problem+json and the handler never runs; a handler that gives up at its
//     deadline without writing gets the same 504, never an empty 200. Once the
//     caller's budget is spent, every failure answered says so (ExhaustedHeader), and
//     a client must not resend it.
//   - Transport (outbound) writes the remaining budget of each outgoing request's context,
//     minus a reserve, into the same header, so the next hop knows how long its caller
//     will wait. When nothing is left after the reserve it fails fast, without sending,
//     with an error that matches context.DeadlineExceeded.
//   - Reserve keeps time back for what comes after a call: the child context it returns
//     ends d before its parent's, so a slow call cannot eat the time the database write
//     after it needs.
//   - Ladder tries alternatives in order (AI providers, replicas, caches), each bounded by
//     its share of the budget, and never runs past the total. When all fail, its error
//     names each, on one line.
//
// # How the budget propagates
//
// A budget crosses a hop as a relative number: the milliseconds the caller has left, in
// the Request-Budget-Ms header (DefaultHeader). A client with 500 ms left, calling
// service A through Transport with a 50 ms reserve, sends
//
//	Request-Budget-Ms: 450
//
// A's Middleware gives its handler a context that ends at most 450 ms after the request
// arrived. When A's handler calls service B with that context, again through Transport,
// B receives what A has left then, minus A's reserve, and so on down the stack: every hop
// ends before its caller stops waiting, and no hop starts work that cannot finish.
//
// When the budget runs out somewhere down the stack, the verdict travels back up: B's
// Middleware answers 504 with Request-Budget-Exhausted: ?1 (ExhaustedHeader); A's
// Transport sees it (or refuses a call for lack of time itself) and A's Middleware puts
// the same header on whatever failure A's handler answers; the client, seeing it, does
// not retry. No hop resends a request whose caller has stopped waiting.
//
// Because the header carries time remaining, not an absolute deadline, the clocks of the
// hosts never need to agree: clock skew between them does not matter. What does matter is
// the hop itself: the request's transit, queueing in proxies and the server's accept
// queue, and the response's way back all happen outside both budgets' view, and eat into
// the caller's time. That is what Transport.Reserve is for: set it to about the hop's
// round-trip latency at the percentile you care for, plus the time the caller needs to
// use the answer.
//
// # Composing with retries
//
// Put Transport below the retry layer, so that each attempt is a RoundTrip through it
// and carries the budget remaining at the moment it is sent:
//
//	client := &http.Client{Transport: &retry.Transport{
//		Base: deadline.Transport{Reserve: 50 * time.Millisecond},
//	}}
//
// The other order would stamp the budget once and send a stale, too generous value on
// every retry. Transport's fail-fast error matches context.DeadlineExceeded, which a
// retry layer treats as final: no retry is attempted with no time left. An answer that
// carries ExhaustedHeader is final too: package retry classifies it retry.ErrCanceled.
// The module's examples/deadlinechain shows the two together.
//
// This package imports only the standard library; it does not depend on package retry.
// Context deadlines run on the runtime's clock, so this package has no clock to inject;
// its tests use real time in milliseconds.
package deadline
