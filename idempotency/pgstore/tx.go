package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/retrysafe/idempotency"
)

// ErrCommitUnknown is wrapped by the error WithTx returns when the connection failed
// during COMMIT and WithTx could not learn the outcome: the business write and the
// completion either both committed or both rolled back.
var ErrCommitUnknown = errors.New("pgstore: transaction commit outcome unknown")

// resolveTimeout bounds the look-up that settles an interrupted commit.
const resolveTimeout = 5 * time.Second

// WithTx runs fn in a transaction on the store's pool and commits it. When ctx carries
// an idempotency.Claim (the middleware puts it there), the completion of the claimed key
// with fn's response is written in the same transaction, so the business write and the
// stored response commit together or not at all ("work done, result not stored" cannot
// happen). The store's table must therefore be in the database fn writes to. The
// completed record is kept for the claim's TTL from the completion statement's instant
// on the store's clock, as Complete keeps it.
//
// With a claim in ctx:
//   - fn succeeds and the commit succeeds: the record is done with fn's response,
//     claim.MarkCompleted is called (the middleware will not complete it again), and the
//     response is returned.
//   - fn fails: the transaction is rolled back, claim.Release is called (the work was not
//     done, so the middleware releases the key and a retry executes), and fn's error is
//     returned as it is.
//   - the completion finds the claim stale (the key was taken over, deleted or already
//     completed): the transaction, fn's writes included, is rolled back, claim.Release is
//     called and the error wraps idempotency.ErrLeaseLost.
//   - the server rejects the commit: as when fn fails, the error is returned wrapped.
//   - the connection fails during COMMIT, so the outcome is unknown: WithTx reads the
//     record on another connection (for at most 5 s, without waiting for row locks),
//     since the completion makes it a witness of the commit. Done with the claim's
//     token: the transaction committed; WithTx calls claim.MarkCompleted and returns
//     the response and a nil error. Otherwise WithTx calls claim.Release and returns an
//     error, wrapping ErrCommitUnknown unless the record showed a rollback.
//
// Releasing after an unknown commit is safe: the transaction holds the record's row
// lock from its completion until it ends, and Release deletes only an in-progress
// record with the claim's token. The middleware's Release therefore waits for the
// transaction to end; if it committed, the record is done and Release changes nothing
// (retries replay the stored response), and if it rolled back, the key is released and a
// retry executes the work again, as it should. A takeover after the lease ends waits
// for the row lock in the same way.
//
// With a claim in ctx, the transaction and fn run on idempotency.Detach(ctx): the
// caller's cancellation and deadline do not reach them (a client that gives up does not
// roll back the work whose answer the middleware stores for its retry), but the loss of
// the claim's lease to another request does.
//
// Without a claim in ctx, WithTx runs fn in a transaction on ctx and commits it; an
// interrupted commit then always yields ErrCommitUnknown.
//
// fn must neither commit nor roll back tx. The transaction has the database's default
// isolation level.
func (s *Store) WithTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error)) (idempotency.Response, error) {
	claim, claimed := idempotency.ClaimFromContext(ctx)
	// The client's retry will want this work's answer: a client that leaves must not
	// roll it back. The work still ends if another request takes the key over.
	ctx, cancel := idempotency.Detach(ctx)
	defer cancel()
	release := func() {
		if claimed {
			claim.Release()
		}
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		release()
		return idempotency.Response{}, fmt.Errorf("pgstore: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after Commit; covers a panic in fn

	resp, err := fn(ctx, tx)
	if err != nil {
		release()
		return resp, err
	}
	if claimed {
		if err := s.complete(ctx, tx, claim.Completion(resp)); err != nil {
			release()
			return resp, err
		}
	}
	err = tx.Commit(ctx)
	if err == nil {
		if claimed {
			claim.MarkCompleted()
		}
		return resp, nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback) || pgconn.SafeToRetry(err) {
		release() // the server answered, or never got the COMMIT: rolled back
		return resp, fmt.Errorf("pgstore: commit: %w", err)
	}
	outcome := outcomeUnknown
	if claimed {
		outcome = s.committed(ctx, claim)
	}
	if outcome == outcomeCommitted {
		claim.MarkCompleted()
		return resp, nil
	}
	release() // safe whatever the outcome: see above
	if outcome == outcomeRolledBack {
		return resp, fmt.Errorf("pgstore: commit: %w", err)
	}
	return resp, fmt.Errorf("pgstore: commit: %w: %w", ErrCommitUnknown, err)
}

type outcome int

const (
	outcomeUnknown outcome = iota
	outcomeCommitted
	outcomeRolledBack
)

// committed settles an interrupted commit by reading the claimed record. The
// transaction updated that row, so it holds the row's lock until it ends: if FOR SHARE
// NOWAIT gets the lock, the transaction is over, and the row's state says how it ended.
func (s *Store) committed(ctx context.Context, claim *idempotency.Claim) outcome {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	var done bool
	err := s.pool.QueryRow(ctx, "SELECT state = 'done' FROM "+s.table+
		" WHERE scope = $1 AND key = $2 AND token = $3 FOR SHARE NOWAIT",
		[]byte(claim.Scope), []byte(claim.Key), claim.Token).Scan(&done)
	switch {
	case err != nil: // locked, gone, taken over, or unreachable
		return outcomeUnknown
	case done:
		return outcomeCommitted
	default:
		return outcomeRolledBack
	}
}
