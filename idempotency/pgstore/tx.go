package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/headercodec"
)

// ErrCommitUnknown is wrapped by the error WithTx returns when the outcome of COMMIT is
// unknown and no acknowledged write confirmed it: the business write and the completion
// either both committed (and may yet be lost by a failover to a standby that does not
// have them) or both rolled back.
var ErrCommitUnknown = errors.New("pgstore: transaction commit outcome unknown")

// resolveTimeout bounds the write that settles a commit whose outcome is unknown.
const resolveTimeout = 5 * time.Second

// staleCompletion is the SQLSTATE (division_by_zero) of the error the transaction-mode
// completion raises when it completes no row, so that the COMMIT sent behind it in the
// same round trip is skipped and the transaction does not commit.
const staleCompletion = "22012"

// WithTx runs fn in a transaction on the store's pool and commits it. When ctx carries
// an idempotency.Claim (the middleware puts it there), the completion of the claimed key
// with fn's response is written in the same transaction, so the business write and the
// stored response commit together or not at all ("work done, result not stored" cannot
// happen). The store's table must therefore be in the database fn writes to. The
// completed record is kept for the claim's TTL from the completion statement's instant
// on the store's clock, as Complete keeps it.
//
// Round trips: BEGIN goes to the server with fn's first statement, and the completion
// with COMMIT, each pair in one round trip (a pipeline), so that a handler that runs one
// statement costs two round trips rather than four. The completion raises an error when
// the claim is stale, and PostgreSQL then skips the COMMIT behind it.
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
//   - the outcome of the completion and COMMIT is unknown — the connection failed
//     during them, or the server reported the commit with the warning that its wait for
//     a synchronous standby was cancelled (see "Durability and replication" in the
//     package doc) — WithTx writes the record again, unchanged, on another connection,
//     when it is done under the claim's token (for at most 5 s, waiting for the
//     record's row lock; a record in progress is left as it is). Acknowledged, that
//     write, which comes after the transaction's commit in the same server's WAL,
//     confirms the transaction: WithTx calls claim.MarkCompleted and returns the
//     response and a nil error. Otherwise WithTx calls claim.Release and returns an
//     error wrapping ErrCommitUnknown (and idempotency.ErrNotDurable after the
//     warning): a record still in progress does not show a rollback, since the
//     completion and COMMIT may yet reach the server, and a record done is not
//     confirmed by reading it from a primary that may be lost.
//
// Releasing after an unknown commit is safe: the transaction can commit only together
// with its completion, which requires the record in progress with the claim's token,
// and from its completion until it ends it holds the record's row lock, while Release
// deletes only an in-progress record with the claim's token. So either the transaction
// commits first (the record is done; Release, which waits for the row lock, changes
// nothing, and retries replay the stored response), or Release deletes the record
// first (the completion then finds no record, and the transaction rolls back; a retry
// executes the work again, as it should). A takeover after the lease ends waits for the
// row lock in the same way.
//
// With a claim in ctx, the transaction and fn run on idempotency.Detach(ctx): the
// caller's cancellation and deadline do not reach them (a client that gives up does not
// roll back the work whose answer the middleware stores for its retry), but the loss of
// the claim's lease to another request does.
//
// Without a claim in ctx, WithTx runs fn in a transaction on ctx and commits it; an
// interrupted commit then always yields ErrCommitUnknown.
//
// fn must neither commit nor roll back tx: its Commit returns an error and commits
// nothing, its Rollback rolls back and ends the transaction (WithTx then returns an
// error). The transaction has the database's default isolation level.
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
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		release()
		return idempotency.Response{}, fmt.Errorf("pgstore: begin: %w", err)
	}
	// The pool discards a connection that is still in a transaction when it comes back
	// (the rollback of an aborted one failed, the connection broke).
	defer conn.Release()
	tx := &lazyTx{ctx: ctx, conn: conn.Conn()}
	defer tx.abort() // a transaction that did not end: fn failed or panicked, the commit failed

	resp, err := fn(ctx, tx)
	_ = tx.settle() // an error fn did not read aborted the transaction: the commit finds it
	if err != nil {
		release()
		return resp, err
	}
	if !claimed {
		if err := tx.commit(ctx); err != nil {
			if rolledBack(err) {
				return resp, fmt.Errorf("pgstore: commit: %w", err)
			}
			return resp, fmt.Errorf("pgstore: commit: %w: %w", ErrCommitUnknown, err)
		}
		return resp, nil
	}

	c := claim.Completion(resp)
	headers := headercodec.Encode(c.Response.Header, c.Response.Trailer)
	d, _ := tx.conn.PgConn().CustomData()[durabilityKey].(*durability)
	if d != nil {
		d.warned = false
	}
	stale, err := tx.completeAndCommit(ctx, s.sql.completeTx, completeArgs(c, headers, s.now()))
	switch {
	case err == nil && (d == nil || !d.warned):
		claim.MarkCompleted()
		s.inflight.Settled(claim.Token)
		return resp, nil
	case err == nil:
		err = errNotDurable // committed on the primary; maybe on no standby
	case stale:
		release()
		return resp, fmt.Errorf("pgstore: complete: %w", idempotency.ErrLeaseLost)
	case rolledBack(err):
		release()
		return resp, fmt.Errorf("pgstore: commit: %w", err)
	}
	if s.confirmed(ctx, claim) {
		claim.MarkCompleted()
		s.inflight.Settled(claim.Token)
		return resp, nil
	}
	release() // safe whatever the outcome: see above
	return resp, fmt.Errorf("pgstore: commit: %w: %w", ErrCommitUnknown, err)
}

// rolledBack reports whether err, from a commit, shows that the transaction did not
// commit: the server answered with an error or with ROLLBACK, nothing was sent, or fn
// had rolled the transaction back.
func rolledBack(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback) || pgconn.SafeToRetry(err) ||
		errors.Is(err, pgx.ErrTxClosed)
}

// confirmed settles a commit whose outcome is unknown by a write, never by a read (a
// read from a primary that may be lost confirms nothing): the second statement of a
// completion sent again, which, when the record is done under the claim's token, writes
// it again, changing nothing, and otherwise writes nothing. Acknowledged, that write confirms the transaction, which committed before it
// in the same server's WAL. It waits for the record's row lock, which the transaction
// holds until it ends, for at most 5 s.
func (s *Store) confirmed(ctx context.Context, claim *idempotency.Claim) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	return s.completeAgain(ctx, claim.Scope, claim.Key, claim.Token) == nil
}

// lazyTx is the pgx.Tx that WithTx gives fn. Its BEGIN goes to the server in one round
// trip with the first statement fn runs (Exec, Query or QueryRow: a pipeline of the two),
// rather than in a round trip of its own; the other methods, and Conn, begin the
// transaction first. It is not safe for concurrent use, as no pgx.Tx is.
type lazyTx struct {
	ctx  context.Context // WithTx's, for the methods that take none
	conn *pgx.Conn
	// tx is the transaction once BEGIN has been sent; nil before.
	tx pgx.Tx
	// pending is the pipeline of BEGIN and the first statement while its results are
	// being read (rows not yet closed, a row not yet scanned).
	pending pgx.BatchResults
	// ended: committed or rolled back, by WithTx or by fn's Rollback.
	ended bool
}

var _ pgx.Tx = (*lazyTx)(nil)

// errTxEnded is what the methods of a lazyTx return once the transaction has ended.
var errTxEnded = fmt.Errorf("pgstore: WithTx transaction: %w", pgx.ErrTxClosed)

// pipelined reports whether a statement with args can go in a pipeline: pgx batches
// take no query options but a QueryRewriter (named arguments are one).
func pipelined(args []any) bool {
	if len(args) == 0 {
		return true
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// settle finishes reading the pipeline of BEGIN and the first statement, when fn left
// its rows or row unread.
func (t *lazyTx) settle() error {
	if t.pending == nil {
		return nil
	}
	br := t.pending
	t.pending = nil
	return br.Close()
}

// begin sends BEGIN on its own, unless it has been sent.
func (t *lazyTx) begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.settle(); err != nil {
		return nil, err
	}
	switch {
	case t.ended:
		return nil, errTxEnded
	case t.tx != nil:
		return t.tx, nil
	}
	tx, err := t.conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	t.tx = tx
	return tx, nil
}

// first sends BEGIN and the statement sql in one pipeline and returns its results, the
// BEGIN read, or nil when the transaction has begun already. The results become
// pending.
func (t *lazyTx) first(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	if err := t.settle(); err != nil {
		return nil, err
	}
	switch {
	case t.ended:
		return nil, errTxEnded
	case t.tx != nil:
		return nil, nil
	}
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, &b)
	t.tx = br.Tx()
	t.pending = br
	if _, err := br.Exec(); err != nil { // BEGIN
		_ = t.settle() // reports the same error
		return nil, err
	}
	return br, nil
}

func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if pipelined(args) {
		br, err := t.first(ctx, sql, args)
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		if br != nil {
			tag, err := br.Exec()
			if cerr := t.settle(); err == nil {
				err = cerr
			}
			return tag, err
		}
	}
	tx, err := t.begin(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return tx.Exec(ctx, sql, args...)
}

func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if pipelined(args) {
		br, err := t.first(ctx, sql, args)
		if err != nil {
			return failedRows(err), err
		}
		if br != nil {
			rows, err := br.Query()
			return &firstRows{Rows: rows, t: t}, err
		}
	}
	tx, err := t.begin(ctx)
	if err != nil {
		return failedRows(err), err
	}
	return tx.Query(ctx, sql, args...)
}

func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if pipelined(args) {
		br, err := t.first(ctx, sql, args)
		if err != nil {
			return pgx.FailedBatchResults(&pgx.Batch{}, err).QueryRow()
		}
		if br != nil {
			return &firstRow{row: br.QueryRow(), t: t}
		}
	}
	tx, err := t.begin(ctx)
	if err != nil {
		return pgx.FailedBatchResults(&pgx.Batch{}, err).QueryRow()
	}
	return tx.QueryRow(ctx, sql, args...)
}

func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	tx, err := t.begin(ctx)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return tx.SendBatch(ctx, b)
}

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	tx, err := t.begin(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, columns, src)
}

func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Prepare(ctx, name, sql)
}

// Begin starts a pseudo nested transaction (a savepoint) in the transaction.
func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	tx, err := t.begin(t.ctx)
	if err != nil { // the large objects of a closed transaction, which report it
		var b pgx.Batch
		b.BeginTx(pgx.TxOptions{})
		tx = pgx.FailedBatchResults(&b, err).Tx()
	}
	return tx.LargeObjects()
}

// Conn is the transaction's connection, in the transaction: Conn begins it first, so
// that statements run on the connection directly are part of it.
func (t *lazyTx) Conn() *pgx.Conn {
	_, _ = t.begin(t.ctx) // a failure shows in the connection's next statement
	return t.conn
}

// Commit refuses: WithTx commits the transaction, with the completion of the claim.
func (t *lazyTx) Commit(context.Context) error {
	return errors.New("pgstore: WithTx commits the transaction; fn must not")
}

// Rollback rolls the transaction back and ends it: WithTx then returns an error.
func (t *lazyTx) Rollback(ctx context.Context) error {
	_ = t.settle() // the rollback ends whatever it reported
	if t.ended {
		return errTxEnded
	}
	t.ended = true
	if t.tx == nil {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// commit commits the transaction, if it began.
func (t *lazyTx) commit(ctx context.Context) error {
	if t.ended {
		return errTxEnded
	}
	t.ended = true
	if t.tx == nil {
		return nil
	}
	return t.tx.Commit(ctx)
}

// completeAndCommit sends the completion statement sql (which raises staleCompletion
// when it completes no row) and COMMIT in one pipeline, with BEGIN before them when fn
// ran no statement. stale is true when the completion found the claim stale; the
// transaction did not commit then.
func (t *lazyTx) completeAndCommit(ctx context.Context, sql string, args []any) (stale bool, err error) {
	if t.ended {
		return false, errTxEnded
	}
	var b pgx.Batch
	if t.tx == nil {
		b.BeginTx(pgx.TxOptions{})
	}
	b.Queue(sql, args...).Fn = func(br pgx.BatchResults) error {
		_, err := br.Exec()
		var pgErr *pgconn.PgError
		stale = errors.As(err, &pgErr) && pgErr.Code == staleCompletion
		return err
	}
	b.Queue("commit").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" {
			return pgx.ErrTxCommitRollback
		}
		return nil
	})
	br := t.conn.SendBatch(ctx, &b)
	if t.tx == nil {
		t.tx = br.Tx()
	}
	err = br.Close()
	if err == nil || t.conn.PgConn().TxStatus() == 'I' {
		t.ended = true // committed, or the server rolled back
	}
	return stale, err
}

// abort rolls back a transaction that has not ended (fn failed or panicked, or the
// commit did not happen), so that the connection goes back to the pool idle.
func (t *lazyTx) abort() {
	_ = t.settle()
	if t.ended || t.tx == nil {
		return
	}
	t.ended = true
	if t.conn.IsClosed() || t.conn.PgConn().TxStatus() == 'I' {
		return
	}
	_, _ = t.conn.Exec(context.WithoutCancel(t.ctx), "rollback")
}

// firstRows are the rows of the statement sent with BEGIN: closing them, or reading
// past the last, finishes the pipeline.
type firstRows struct {
	pgx.Rows
	t   *lazyTx
	err error // of finishing the pipeline
}

func (r *firstRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.finish()
	return false
}

func (r *firstRows) Close() {
	r.Rows.Close()
	r.finish()
}

func (r *firstRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (r *firstRows) finish() {
	if r.t.pending != nil {
		r.Rows.Close()
		r.err = r.t.settle()
	}
}

// firstRow is the row of the statement sent with BEGIN: scanning it finishes the
// pipeline.
type firstRow struct {
	row pgx.Row
	t   *lazyTx
}

func (r *firstRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.t.settle(); err == nil {
		err = cerr
	}
	return err
}

// failedRows are rows that report err, as pgx makes them for a batch that failed.
func failedRows(err error) pgx.Rows {
	rows, _ := pgx.FailedBatchResults(&pgx.Batch{}, err).Query()
	return rows
}
