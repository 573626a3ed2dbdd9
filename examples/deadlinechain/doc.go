// Package deadlinechain shows package deadline under package retry: a client whose every
// attempt tells the server how long the caller will still wait.
//
//	client := &http.Client{Transport: &retry.Transport{
//		Base: deadline.Transport{Reserve: 50 * time.Millisecond},
//	}}
//
// retry.Transport calls its Base once per attempt, so deadline.Transport stamps each
// attempt with the budget left at that moment, after the waits between attempts. When
// less than the reserve is left, deadline.Transport fails without sending, with an error
// matching context.DeadlineExceeded, and retry.Transport does not retry it. The reverse
// order would stamp the budget once and send the same, stale value on every attempt.
//
// A budget that runs out further down is final as well: the server's deadline.Middleware
// answers 504 with Request-Budget-Exhausted: ?1 (deadline.ExhaustedHeader, also on any
// failure its handler answers once the budget is spent, and on the failures of a hop
// whose own call found it spent), and retry.Transport returns that answer at once, of
// class retry.ErrCanceled (see retry.StopReason), instead of resending with the crumbs
// of the budget.
//
// The package has no API; see its example and tests.
package deadlinechain
