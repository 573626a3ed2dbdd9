// Package fence orders writers: leases with monotonically increasing fencing tokens on
// PostgreSQL (pgx v5), and conditional writes that reject a stale token or a lost
// compare-and-swap.
//
// Idempotency keys protect against duplication; fencing tokens protect against
// ordering: a holder that paused (a GC pause, a stalled VM, a slow network) past its
// lease's expiry still believes it holds the lease, and its late write would overwrite
// the newer holder's. Every acquisition gets a token greater than all before it, and
// every write carries the token, so the database can refuse the old one:
//
//	lease, err := leases.Acquire(ctx, "billing-sync", hostname, 30*time.Second)
//	if errors.Is(err, fence.ErrHeld) {
//		return nil // another replica is doing it
//	}
//	defer lease.Release(context.WithoutCancel(ctx))
//	ctx = lease.Context() // cancelled when the lease is lost
//	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if err := lease.Check(ctx, tx); err != nil {
//			return err // ErrStaleToken: the lease moved on; nothing is written
//		}
//		_, err := tx.Exec(ctx, "UPDATE invoices SET …")
//		return err
//	})
//
// # Leases
//
// One table (by default public.retrysafe_leases) holds one row per lease name: the
// holder (NULL once released), the token of the latest acquisition, and acquired_at and
// expires_at. Store.Migrate creates it from the embedded schema.sql, idempotently and
// under an advisory lock, like the idempotency stores' Migrate.
//
// Store.Acquire is one statement, INSERT … ON CONFLICT (name) DO UPDATE … WHERE the lease
// is free or expired, so exactly one of any number of concurrent acquisitions wins;
// the others get ErrHeld (a *HeldError naming the holder). It never waits for the lease.
//
// Expiry is decided by the database's clock only: clock_timestamp() when the row is
// examined (not now(), the transaction's start, which a statement that waited for a row
// lock would read too early). The application's clocks may disagree with each other
// and with the database; the database is the one referee. The application's clock
// (Config.Clock) is used only as a stopwatch: a Lease's Context is cancelled when its
// TTL has passed since the last renewal that succeeded was sent, which is never later
// than the database's expiry (the database computed its expiry after the request was
// sent), so a holder cut off from the database stops by itself.
//
// # Fencing tokens
//
// Tokens come from one PostgreSQL sequence per table (<table>_token_seq, CACHE 1,
// never reset), drawn inside the statement that takes the row: for a takeover, in DO
// UPDATE, after the row lock, hence after the previous acquisition committed; so every
// token is greater than every token issued before it for that name. Release keeps the
// row and its token, and even a row deleted by hand cannot make a token repeat, because
// the sequence does not go back. Tokens are unique across the table's names and have
// gaps (a contended acquisition draws and discards one).
//
// This is the rule of the idempotency PostgreSQL store (package idempotency/pgstore),
// whose takeover of an expired in-progress record sets token = nextval(sequence) in an
// UPDATE conditioned on the token it read. The code is not shared: pgstore's claim is one
// statement over its records table that also reads or replays the stored response, and
// its expiry uses the time the middleware passes in (an injectable clock the conformance
// suite drives), while a fence lease is its own row with the database's clock. Sharing
// would cost pgstore a second statement per request.
//
// # Heartbeat
//
// A Lease is renewed every TTL/3 by a goroutine until Release (Config.ManualRenew turns
// it off: call Lease.Renew). A renewal that finds the lease expired or taken over
// cancels the Lease's Context with ErrLeaseLost; a failed renewal (the database is
// unreachable) is retried, and the Context is cancelled when the TTL has passed since the
// last renewal that succeeded was sent. An expired lease is never renewed, even if no
// one took it. Release stops the heartbeat, cancels the Context (ErrReleased) and frees
// the lease; its token is kept.
//
// # Conditional writes
//
// Three checks, each used inside the caller's pgx.Tx, each writing nothing and returning
// a sentinel when it fails (return it from the transaction function, so that the
// transaction rolls back):
//
//   - Store.Check / Lease.Check: the token is the lease's current token, and the lease is
//     held and unexpired, by SELECT … FOR SHARE on the lease row. The lock keeps the lease
//     from being taken over (or renewed) until the caller's transaction ends, so the
//     caller's writes commit only under a current token. ErrStaleToken otherwise.
//   - Table.UpdateFenced: per resource, the row remembers the last token that wrote it:
//     UPDATE … SET …, last_fence = $token WHERE id = $1 AND last_fence <= $token. An older
//     token is refused (ErrStaleToken) even if it checked the lease a moment before.
//   - Table.UpdateVersioned: compare-and-swap on a version column: UPDATE … SET …,
//     version = version + 1 WHERE id = $1 AND version = $2. ErrConflict when another
//     writer got there first.
//
// The same patterns written by hand: any UPDATE (or INSERT … ON CONFLICT DO UPDATE …
// WHERE) whose WHERE clause carries the token or version condition, followed by a check
// that it affected a row (pgconn.CommandTag.RowsAffected), is a conditional write.
//
// A Redis lease is not provided.
package fence
