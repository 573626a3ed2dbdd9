// Package model holds protocol.pml, a Promela model of the idempotency protocol (claim,
// lease, heartbeat, completion, release, abandon, takeover, held completions), and the
// test that checks it exhaustively with spin.
//
// The model's header maps each of its transitions to the Go function that implements
// it, and each State and Outcome of package idempotency to the model (or says why it is
// not modelled); TestMapping fails when a constant is added to the Go code and not to
// the model, or when a function the table names no longer exists. TestModel runs spin
// on the model, which must verify with no error and a complete search, and on each
// deliberately broken variant, for which spin must find a counterexample of the
// invariant the variant breaks; it also shows each documented window real (allowed
// none, spin finds a second execution in it). RETRYSAFE_LONG=1 adds larger bounds and
// the model with expiry and the janitor. The package has no code: it is documentation
// that is checked.
//
// To run spin by hand (Debian's package spin; it needs gcc):
//
//	spin -a -DNATT=2 protocol.pml && gcc -O2 -DSAFETY -o pan pan.c && ./pan -m1000000
//	spin -a -DNATT=2 -DBROKEN_EXTEND_NOOP -DONLY=inv_takeover protocol.pml && gcc -O2 -DSAFETY -o pan pan.c && ./pan
//	spin -t -p -DNATT=2 -DBROKEN_EXTEND_NOOP -DONLY=inv_takeover protocol.pml   # the counterexample, step by step
//
// The -D flags given to spin -t must be those given to spin -a.
package model
