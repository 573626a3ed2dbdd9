// Package model holds protocol.pml, a Promela model of the idempotency protocol (claim,
// lease, heartbeat, completion, release, abandon, takeover, held completions, the
// restart of a replica's process, and the failover of the store), and the test that
// checks it exhaustively with spin.
//
// The store is a primary and its standby: a write the store acknowledges is durable (on
// the standby, synchronous replication), a write whose outcome is unknown may be applied
// on the primary only, and a failover replaces the primary's record by the standby's. So
// an owner whose completion's outcome is unknown resends it until it is acknowledged
// (Complete is idempotent per token) and never confirms it by reading the record back;
// a claim carries the claimer's ID, and is granted its own in-progress record with a
// write; a claim whose outcome is unknown is answered 503 and taken back in the
// background (resent with its ID, and the key released if granted). With an
// asynchronous standby (-DASYNC) a failover can lose acknowledged writes: a documented
// window, shown real.
//
// A restart kills every attempt its replica runs, each as an owner crash (a held answer
// is lost with the process), and starts the new process's health as if it had just seen
// the store fail, so that it takes no key over for a lease: it knows nothing of the
// lease before it started, in which an outage it never saw may have kept a live owner
// elsewhere from renewing. The model assumes the old process's death and the new one's
// start are one instant (a downtime between them is a replica serving nothing) and
// counts the lease from the start, no later than the Go code, which counts it from the
// process's first claim on the store's clock; the windows that excuse a second execution
// judge a replica by its link's real history, which a restart does not reset.
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
//	spin -a -DNATT=2 protocol.pml && gcc -O2 -DSAFETY -o pan pan.c && ./pan -m1000000 -w24
//	spin -a -DNATT=2 -DBROKEN_EXTEND_NOOP -DONLY=inv_takeover protocol.pml && gcc -O2 -DSAFETY -o pan pan.c && ./pan
//	spin -t -p -DNATT=2 -DBROKEN_EXTEND_NOOP -DONLY=inv_takeover protocol.pml   # the counterexample, step by step
//
// The -D flags given to spin -t must be those given to spin -a.
package model
