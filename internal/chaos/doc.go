// Package chaos is the exactly-once chaos suite (issue 5): a test that runs the real
// system — gateway processes, a PostgreSQL ledger, a failing network — under load while
// processes die, and checks that every logical payment took effect at most once and that
// every payment a client saw succeed is recorded.
//
// For each store (TestChaos/postgres, /sqlite, /redis) it wires, on 127.0.0.1:
//
//	32 clients ───────── fault proxy ─── retrysafe gateway ───────── payments upstream
//	retry.Transport      one per         processes of the binary,   POST /payments: a row in
//	with AutoKey, each   replica:        --lease 2s, on one store:  a PostgreSQL ledger; no
//	attempt to the next  refuse, black   PostgreSQL (2 replicas),   idempotency layer, but the
//	proxy in turn        hole, read      SQLite (1), Redis (2)      forwarded Idempotency-Key
//	                     timeout, reset,                            is UNIQUE per user
//	                     response lost
//
// The PostgreSQL is a disposable cluster the test creates (initdb and pg_ctl from
// /usr/lib/postgresql/*/bin, run as the postgres user, in a temporary directory, on a
// free port, fsync on) and removes; it holds the ledger of every run and the PostgreSQL
// store. Redis is the machine's shared server (RETRYSAFE_REDIS_URL), under a unique key
// prefix, and is not restarted.
//
// Each client makes logical payments one after the other, each with its own ref in the
// body, until it gets a final answer (a 2xx, or a 4xx other than 408, 409, 425, 429):
// retry.Transport retries the attempts under one key, and when a failure comes after it
// returned (a body cut off) or it gives up, the client sends the payment again with the
// same key. Meanwhile a seeded schedule SIGKILLs a random gateway replica every 1.5–5s
// and restarts it with the same flags on the same address, and, for the PostgreSQL
// store, stops PostgreSQL as a crash would (pg_ctl stop -m immediate) and starts it
// again, once. After the load, the payments in flight finish (the drain), the gateways
// get SIGTERM (they must exit 0), the lease is left to run out, and Check compares the
// clients' payments, the ledger and the store:
//
//	duplicates       logical payments with more than one ledger row
//	lost             payments a client saw succeed without a ledger row
//	phantoms         ledger rows under a key no client used
//	mismatched       answers or rows that disagree (id, key, ref, amount)
//	stuck            keys still in progress in the store after the lease
//	store disagrees  succeeded payments whose record would not replay what the client saw
//	unfinished       payments without a final answer after the drain
//	failed           payments answered with a final 4xx
//
// All must be 0, and no gateway may exit unasked. The report also counts operations,
// HTTP attempts, replays, 409s, the faults injected by kind, the kills, restarts and
// PostgreSQL restarts, and the gateways' outcomes (from their request logs).
//
// # What the gateway alone cannot prevent
//
// A replica killed after the upstream executed a request and before the completion was
// stored leaves the key in progress; after the lease the next retry takes it over and
// forwards the request again. An upstream that is not idempotency-aware records a second
// payment in that window: the limit of any gateway in front of a non-idempotent service.
// The gateway forwards the Idempotency-Key so the upstream can close it, and this
// upstream does (UNIQUE (user_id, idempotency_key): a second delivery finds the payment
// and answers it again), so the suite proves the gateway and the upstream together
// exactly-once. The report counts those second deliveries as "gateway re-forwards" —
// what the gateway alone could not prevent — and says why each happened: from the
// gateways' request logs and the kill times, the gateway that got the first 201 was
// killed before it stored the completion, or its completion failed (store down), or its
// lease ran out while renewals failed; re-forwards that follow the upstream's own 503
// (a commit whose outcome it could not know, during the PostgreSQL restart) are counted
// apart. RETRYSAFE_CHAOS_NAIVE_UPSTREAM=1 drops the constraint to show it: the
// re-forwards then become duplicates and the suite fails (in that mode the re-forward
// count misses a delivery after a 503 whose commit did happen; the duplicates count is
// exact).
//
// # Running it
//
//	go test ./internal/chaos -run TestChaos -v                      # ~3 minutes
//	RETRYSAFE_CHAOS_DURATION=10m go test ./internal/chaos -run 'TestChaos/postgres' -v -timeout 30m
//
// RETRYSAFE_CHAOS_DURATION sets each store's load (default 40s PostgreSQL, 25s SQLite,
// 25s Redis); RETRYSAFE_CHAOS_SEED repeats a schedule (the kill times and fault
// decisions; which request meets which fault still depends on scheduling). -short skips
// the suite. Without initdb and pg_ctl (RETRYSAFE_PG_BIN names their directory when it
// is not /usr/lib/postgresql/*/bin or on $PATH) it skips, naming them; with
// RETRYSAFE_REQUIRE_SERVICES=1 it fails instead. Without Redis (RETRYSAFE_REDIS_URL) the
// redis run skips the same way. The suite runs on Linux.
package chaos
