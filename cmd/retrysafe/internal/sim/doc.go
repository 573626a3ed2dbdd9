// Package sim is what `retrysafe sim` runs: simulations, in virtual time, of what
// backoff and jitter buy, with this project's own retry package computing the waits.
//
// Run reproduces the AWS Architecture Blog's study "Exponential Backoff and Jitter"
// (Marc Brooker, 2015) as its simulator (aws-samples/aws-arch-backoff-simulator) models
// it: N clients each update one row under optimistic concurrency control, once. A
// client reads the row's version, then writes with that version; the write fails when
// another write happened in between, and the client backs off and starts again with a
// read. Every message takes a network delay of |Normal(10ms, 2ms)|. Waits are base 5ms,
// cap 2s, computed by retry.Policy.Backoff with JitterNone (plain exponential),
// JitterFull, JitterEqual or JitterDecorrelated, and Policy.Rand a seeded source; "no
// backoff" retries at once. Work is the number of writes (the blog's "calls"), time is
// when the last client has succeeded. Everything happens in a discrete-event simulation
// on a priority queue: nothing sleeps, and a seed gives the same figures every time.
//
// RunLayers is a scenario the blog did not have: retries at several layers (a client
// calls A, A calls B, B calls C, and each retries independently), with and without a
// retry.Budget per layer, to show the amplification one failure causes at the bottom:
// 3 layers × 3 attempts turn one failed request into 27 calls to C. It uses retry.Do,
// with a virtual clock, so the budget is the real one.
package sim
