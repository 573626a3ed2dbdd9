package sqlitestore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/headercodec"
)

// The common write transaction, new keys' claims and the completions of claims that
// still hold their records, runs on the driver's connection directly (conn.Raw), with
// statements prepared there once. Through database/sql the same transaction pays for a
// goroutine that watches its context until it ends, one more the driver starts for
// COMMIT, a Stmt made for the transaction for every statement, and each argument's
// conversion, which together cost a new key about a sixth of this store's CPU. BEGIN
// still runs under the callers' context, so that a wait for another process's write
// lock ends with their deadlines; the statements after it wait for nothing.

// errNotRaw: a batch the driver-level path does not decide (see rawBatch); it runs
// through database/sql instead, from its start.
var errNotRaw = errors.New("sqlitestore: batch needs database/sql")

// rawStmts are the statements of a batch's common case, prepared on the write pool's
// one driver connection, conn.
type rawStmts struct {
	conn                                   any
	begin, commit, rollback                driver.Stmt
	lastToken, nextToken, insert, complete driver.Stmt
}

func (r *rawStmts) close() error {
	var errs []error
	for _, st := range []driver.Stmt{r.begin, r.commit, r.rollback, r.lastToken, r.nextToken, r.insert, r.complete} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

// rawable reports whether rawBatch decides every op of a batch: claims of keys with no
// record read (absent), and completions.
func rawable(ops []*writeOp) bool {
	for _, op := range ops {
		if op.claim != nil && !op.absent {
			return false
		}
	}
	return true
}

// rawStatements returns the statements prepared on dc, preparing them first when dc is
// not the connection they were prepared on.
func (s *Store) rawStatements(ctx context.Context, dc any) (*rawStmts, error) {
	if s.raw != nil && s.raw.conn == dc {
		return s.raw, nil
	}
	if s.closed.Load() {
		return nil, idempotency.ErrClosed
	}
	p, ok := dc.(driver.ConnPrepareContext)
	if !ok {
		return nil, errNotRaw
	}
	r := &rawStmts{conn: dc}
	t := `"` + s.table + `"`
	tokens := `"` + s.table + `_token"`
	for _, q := range []struct {
		dst   *driver.Stmt
		query string
	}{
		{&r.begin, `BEGIN IMMEDIATE`},
		{&r.commit, `COMMIT`},
		{&r.rollback, `ROLLBACK`},
		{&r.lastToken, lastTokenSQL(tokens)},
		{&r.nextToken, reserveTokensSQL(tokens)},
		{&r.insert, insertSQL(t)},
		{&r.complete, completeSQL(t)},
	} {
		st, err := p.PrepareContext(ctx, q.query)
		if err != nil {
			_ = r.close()
			return nil, fmt.Errorf("sqlitestore: prepare: %w", err)
		}
		*q.dst = st
		_, execs := st.(driver.StmtExecContext)
		_, queries := st.(driver.StmtQueryContext)
		if !execs || !queries {
			_ = r.close()
			return nil, errNotRaw
		}
	}
	s.raw = r
	return r, nil
}

// rawBatch runs ops, all rawable, in one transaction on the driver connection dc, held.
// A claim that finds a record or a completion that changes nothing is decided by
// database/sql's path: rawBatch rolls back and returns errNotRaw. Tokens it took from
// the Store's reserve are then never issued, which tokens allow (they skip values).
func (s *Store) rawBatch(ctx context.Context, dc any, ops []*writeOp) (err error) {
	r, err := s.rawStatements(ctx, dc)
	if err != nil {
		return err
	}
	run := context.WithoutCancel(ctx)
	if _, err := execRaw(ctx, r.begin); err != nil {
		err = fmt.Errorf("sqlitestore: begin: %w", err)
		if ctx.Err() == nil {
			return err
		}
		// The driver can report the callers' deadline as BEGIN takes the lock: end the
		// transaction it may have begun. With none begun, ROLLBACK fails with
		// SQLITE_ERROR (no transaction is active).
		if _, rerr := execRaw(run, r.rollback); rerr != nil && !noTransaction(rerr) {
			return s.discardRaw(r, err, rerr)
		}
		return err
	}
	defer func() {
		if err == nil {
			return
		}
		if _, rerr := execRaw(run, r.rollback); rerr != nil {
			err = s.discardRaw(r, err, rerr)
		}
	}()
	tokens := batchTokens(ops)
	for _, op := range ops {
		if op.claim != nil {
			req := *op.claim
			now := s.clock()
			token, err := s.takeToken(run, rawTokens{r}, tokens)
			if err != nil {
				return err
			}
			n, err := execRaw(run, r.insert, req.Scope, req.Key, req.Fingerprint, token,
				now.UnixMilli(), now.Add(req.Lease).UnixMilli(), now.Add(req.TTL).UnixMilli(), req.Route, req.ID)
			if err != nil {
				return fmt.Errorf("sqlitestore: claim: %w", err)
			}
			if n != 1 {
				return errNotRaw
			}
			op.res, op.err = idempotency.ClaimResult{Claimed: true, Token: token, Now: now}, nil
			continue
		}
		c := *op.complete
		n, err := execRaw(run, r.complete, int64(c.Response.Status), headercodec.Encode(c.Response.Header, c.Response.Trailer),
			c.Response.Body, c.Response.BodyOmitted, s.clock().Add(c.TTL).UnixMilli(), c.Scope, c.Key, c.Token)
		if err != nil {
			return fmt.Errorf("sqlitestore: complete: %w", err)
		}
		if n != 1 {
			return errNotRaw
		}
		op.err = nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sqlitestore: commit: %w", err)
	}
	if _, err := execRaw(run, r.commit); err != nil {
		return fmt.Errorf("sqlitestore: commit: %w", err)
	}
	s.committed(tokens)
	return nil
}

// discardRaw closes r, whose connection a failed ROLLBACK (rerr) may have left in a
// transaction, and returns err with driver.ErrBadConn, for database/sql to discard the
// connection once it is released.
func (s *Store) discardRaw(r *rawStmts, err, rerr error) error {
	_ = r.close()
	s.raw = nil
	return errors.Join(err, fmt.Errorf("sqlitestore: rollback: %w", rerr), driver.ErrBadConn)
}

// noTransaction reports whether err is SQLite's SQLITE_ERROR, which ROLLBACK returns
// when no transaction is active.
func noTransaction(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_ERROR
}

// execRaw runs st with args and returns the rows it changed.
func execRaw(ctx context.Context, st driver.Stmt, args ...any) (int64, error) {
	var nv [10]driver.NamedValue
	named := nv[:0]
	for i, a := range args {
		named = append(named, driver.NamedValue{Ordinal: i + 1, Value: a})
	}
	res, err := st.(driver.StmtExecContext).ExecContext(ctx, named)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// queryRaw runs st with args and returns the one int64 its one row holds.
func queryRaw(ctx context.Context, st driver.Stmt, args ...any) (int64, error) {
	named := make([]driver.NamedValue, len(args))
	for i, a := range args {
		named[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
	}
	rows, err := st.(driver.StmtQueryContext).QueryContext(ctx, named)
	if err != nil {
		return 0, err
	}
	defer func() { _ = rows.Close() }()
	dest := make([]driver.Value, 1)
	if err := rows.Next(dest); err != nil {
		if errors.Is(err, io.EOF) {
			return 0, sql.ErrNoRows
		}
		return 0, err
	}
	v, ok := dest[0].(int64)
	if !ok {
		return 0, fmt.Errorf("sqlitestore: token row holds %T", dest[0])
	}
	return v, nil
}

// rawTokens is the token row, through r's statements.
type rawTokens struct{ r *rawStmts }

func (t rawTokens) last(ctx context.Context) (int64, error) { return queryRaw(ctx, t.r.lastToken) }

func (t rawTokens) reserve(ctx context.Context, n int64) (int64, error) {
	return queryRaw(ctx, t.r.nextToken, n)
}

// writeRaw runs ops, all rawable, in one transaction on the write pool's connection,
// through the driver (rawBatch).
func (s *Store) writeRaw(ctx context.Context, ops []*writeOp) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	conn, err := s.write.Conn(ctx)
	if err != nil {
		return fmt.Errorf("sqlitestore: begin: %w", err)
	}
	defer func() { _ = conn.Close() }()
	return conn.Raw(func(dc any) error {
		err := s.rawBatch(ctx, dc, ops)
		s.keepRawIfValid(dc)
		return err
	})
}

// keepRawIfValid closes the statements prepared on dc when dc is no longer valid (the
// driver's answer for a connection SQLite was interrupted on, as when the callers'
// deadline cut BEGIN's wait for the lock): database/sql closes such a connection when
// it is released, and SQLite keeps a closed connection, its page cache included, for as
// long as one of its statements is open.
func (s *Store) keepRawIfValid(dc any) {
	v, ok := dc.(driver.Validator)
	if !ok || v.IsValid() || s.raw == nil || s.raw.conn != dc {
		return
	}
	_ = s.raw.close()
	s.raw = nil
}

// closeRaw closes the statements rawStatements prepared, on the connection they were
// prepared on, once it is free (a batch running holds it). Those of a connection
// database/sql gave up were closed before it did (discardRaw, keepRawIfValid).
func (s *Store) closeRaw() error {
	conn, err := s.write.Conn(context.Background())
	if err != nil {
		return nil
	}
	defer func() { _ = conn.Close() }()
	return conn.Raw(func(dc any) error {
		if s.raw == nil || s.raw.conn != dc {
			return nil
		}
		err := s.raw.close()
		s.raw = nil
		return err
	})
}
