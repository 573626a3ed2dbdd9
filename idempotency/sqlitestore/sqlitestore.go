// Package sqlitestore is an idempotency.Store on SQLite, through the pure-Go driver
// modernc.org/sqlite (no cgo). It is the embedded default store: one file, no server.
//
// # File layout
//
// Open creates (or reopens) the database file at Config.Path, next to which SQLite keeps
// its write-ahead log (PATH-wal) and shared-memory index (PATH-shm); the three files
// belong together. Migrate applies the embedded schema.sql, with every name derived from
// Config.Table (default "retrysafe_idempotency"):
//
//	retrysafe_idempotency             one row per (scope, key): fingerprint, state, token,
//	                                  created_at, lease_until and expires_at (unix
//	                                  milliseconds), and once done the response: status,
//	                                  header (JSON text), body (BLOB), body_omitted
//	retrysafe_idempotency_expires_at  index for DeleteExpired
//	retrysafe_idempotency_token       one row: the last fencing token issued
//
// Every claim and takeover increments the token row in the transaction that writes the
// record, so tokens grow strictly across the whole table and are never reused, after
// Delete and expiry included.
//
// # Durability
//
// Every connection runs PRAGMA busy_timeout=Config.BusyTimeout, journal_mode=WAL and
// synchronous=FULL. In WAL mode a commit appends its pages to PATH-wal; with
// synchronous=FULL the WAL is fsynced before the commit returns, so a claim is on disk
// before the handler it guards runs, and a completed record survives a process crash, an
// OS crash and a power loss alike. Checkpoints copy the WAL back into the database file
// automatically (and fsync it) every 1000 pages.
//
// Config.Synchronous "NORMAL", the usual WAL choice, fsyncs only at checkpoints. A
// process crash still loses nothing, because every commit has been written to the WAL
// and so is in the OS's page cache, but an OS crash or power loss can roll back the
// commits since the last checkpoint. A claim or completion lost that way leaves a
// request whose handler already ran with no record, or with an in-progress one whose
// lease will expire, and a retry runs it again. NORMAL buys several times the write
// throughput (a claim and its completion cost two fsyncs under FULL); choose it only
// where running a request twice after a power loss is acceptable.
//
// Times are stored in whole milliseconds; Claim compares them with the request's Now
// truncated to the millisecond.
//
// # Concurrency
//
// A Store is safe for any number of goroutines. SQLite admits one writer at a time, so
// Open keeps two connection pools on the file: a write pool of exactly one connection,
// which serialises the process's writes in Go instead of making them spin in SQLite's
// busy handler (measurably faster under contention, and never SQLITE_BUSY within one
// process), and a read pool for Get, List and the first step of Claim. WAL readers never
// wait for the writer, so a replay or a 409 is answered from a consistent snapshot
// without the write lock; only a claim that may win writes, in a BEGIN IMMEDIATE
// transaction (the DSN's _txlock=immediate) that takes the write lock before it reads
// the record it decides on, so that of any number of concurrent claims exactly one wins.
// Every statement is prepared once per connection.
//
// Several processes on one host may share the file (a restarted gateway sees the records
// of the one before it); across processes the writers queue on SQLite's file lock, each
// waiting up to Config.BusyTimeout. Never put the file on a network filesystem (NFS,
// SMB): WAL needs memory shared between the processes, which those do not provide, and
// their locks are unreliable.
//
// # Batching
//
// With Config.Batch, the writes of concurrent Claim and Complete calls (after Claim's
// lock-free read) share one BEGIN IMMEDIATE transaction and one commit: group commit,
// on internal/batch. With Synchronous FULL every commit is an fsync, which is what
// limits a SQLite store's write rate; under load a batch pays one for all its calls. A
// call that finds the writer idle starts a transaction at once, so a lone request waits
// for nothing. Each call is decided and answered as without batching. When a statement
// of the batch fails (other than a completion that finds its claim gone) or its commit
// does, the transaction is rolled back and each call runs again alone. Extend, Release
// and WithTx are never batched.
//
// # Transaction mode
//
// WithTx runs a function in a write transaction and, when the context carries the
// request's idempotency.Claim, completes the record in that same transaction, so that a
// business write and its stored response commit together or not at all.
package sqlitestore

import (
	"context"
	"database/sql"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/batch"
)

//go:embed schema.sql
var schema string

// defaultTable is the table name schema.sql is written with.
const defaultTable = "retrysafe_idempotency"

// Config configures a Store. The zero value is not usable: Path is required by Open.
type Config struct {
	// Path is the database file, created when missing (its directory must exist). It is
	// a filesystem path, not a DSN; relative paths are resolved against the working
	// directory. ":memory:" is rejected: an in-memory database would lose every key on
	// restart and could not be shared by the pool's connections (use memstore for that).
	// New ignores Path.
	Path string
	// Table is the name of the records table; the index and the token table are named
	// after it. Letters, digits and underscores, not starting with a digit. Default
	// "retrysafe_idempotency".
	Table string
	// BusyTimeout is how long a write waits for another process's write lock before
	// failing with SQLITE_BUSY. New ignores it (it is part of the caller's DSN).
	// Default 5s.
	BusyTimeout time.Duration
	// Synchronous is SQLite's synchronous setting, case-insensitive: "FULL" fsyncs every
	// commit; "NORMAL" fsyncs only at checkpoints, for several times the write
	// throughput, and can lose the last commits to an OS crash or power loss (see the
	// package doc). New ignores it. Default "FULL".
	Synchronous string
	// Batch makes the writes of concurrent Claim and Complete calls share one
	// transaction, committed (and, with Synchronous FULL, fsynced) once: group commit.
	// A lone call waits for nothing; under load the calls that arrive during a commit go
	// together in the next (see "Batching" in the package doc). Results and guarantees
	// are the same as without it. Default false.
	Batch bool
}

// Store is a SQLite idempotency.Store. Make one with Open or New.
type Store struct {
	write, read *sql.DB // the same *sql.DB when made by New
	owned       bool    // Close closes the pools
	closed      atomic.Bool
	schema      string
	st          statements
	writes      *batch.Group[*writeOp] // nil without Config.Batch
}

// statements are the store's SQL, each prepared on the pool that runs it.
type statements struct {
	all             []*sql.Stmt // for Close
	get, list, ping *sql.Stmt   // read pool
	// write pool
	lockedGet, nextToken, claim, extend, complete, release, delete, deleteExpired *sql.Stmt
}

var (
	_ idempotency.Store   = (*Store)(nil)
	_ idempotency.Janitor = (*Store)(nil)
	_ idempotency.Lister  = (*Store)(nil)
	_ idempotency.Pinger  = (*Store)(nil)
)

// Open opens (creating if needed) the database file at cfg.Path, applies the schema and
// returns a Store that owns its connections: Close closes them.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	switch cfg.Path {
	case "":
		return nil, errors.New("sqlitestore: Config.Path is required")
	case ":memory:":
		return nil, errors.New("sqlitestore: Config.Path \":memory:\" is not supported: the store must persist (use memstore for an in-memory store)")
	}
	if cfg.BusyTimeout < 0 {
		return nil, fmt.Errorf("sqlitestore: negative Config.BusyTimeout %v", cfg.BusyTimeout)
	}
	if cfg.BusyTimeout == 0 {
		cfg.BusyTimeout = 5 * time.Second
	}
	synchronous := strings.ToUpper(cfg.Synchronous)
	switch synchronous {
	case "":
		synchronous = "FULL"
	case "FULL", "NORMAL":
	default:
		return nil, fmt.Errorf("sqlitestore: Config.Synchronous %q: want FULL or NORMAL", cfg.Synchronous)
	}
	table, err := tableName(cfg.Table)
	if err != nil {
		return nil, err
	}
	path, err := filepath.Abs(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: path %q: %w", cfg.Path, err)
	}
	name := dsn(path, cfg.BusyTimeout, synchronous)
	write, err := sql.Open("sqlite", name)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	write.SetMaxOpenConns(1)
	write.SetMaxIdleConns(1)
	read, err := sql.Open("sqlite", name)
	if err != nil {
		_ = write.Close()
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	read.SetMaxOpenConns(n)
	read.SetMaxIdleConns(n)
	s := &Store{write: write, read: read, owned: true}
	if err := write.PingContext(ctx); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	if err := s.init(ctx, table, cfg.Batch); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// dsn returns the modernc.org/sqlite DSN for the file at the absolute path.
func dsn(path string, busy time.Duration, synchronous string) string {
	// SQLite decodes %HH in a file: URI and ends the path at '?' or '#'.
	path = strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	q := url.Values{}
	q.Add("_pragma", "busy_timeout("+strconv.FormatInt(busy.Milliseconds(), 10)+")")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous("+synchronous+")")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

// New returns a Store on a database the caller opened and owns, for applications that
// keep their own tables in the same file and use WithTx. It applies the schema
// (Migrate) and prepares the store's statements. Close does not close db.
//
// The Store uses db for reads and writes alike. Open db with WAL, a busy timeout and
// immediate transactions, and for many concurrent writers limit it to one connection
// (db.SetMaxOpenConns(1)) so that writers queue in Go rather than in SQLite's busy
// handler:
//
//	file:/var/lib/app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_txlock=immediate
func New(ctx context.Context, db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlitestore: New with a nil *sql.DB")
	}
	table, err := tableName(cfg.Table)
	if err != nil {
		return nil, err
	}
	s := &Store{write: db, read: db}
	if err := s.init(ctx, table, cfg.Batch); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

func tableName(table string) (string, error) {
	if table == "" {
		return defaultTable, nil
	}
	for i, c := range table {
		if c != '_' && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (i == 0 || c < '0' || c > '9') {
			return "", fmt.Errorf("sqlitestore: invalid Config.Table %q: use letters, digits and underscores, not starting with a digit", table)
		}
	}
	return table, nil
}

// init applies the schema for table, prepares the statements and, when batched, sets up
// the batching of writes.
func (s *Store) init(ctx context.Context, table string, batched bool) error {
	if batched {
		s.writes = &batch.Group[*writeOp]{Run: s.runWrites, InFlight: 1, Alone: s.writeAlone}
	}
	s.schema = strings.ReplaceAll(schema, defaultTable, table)
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	t := `"` + table + `"`
	tokens := `"` + table + `_token"`
	owned := ` WHERE scope = ? AND key = ? AND state = 'in_progress' AND token = ?`
	get := `SELECT ` + recordColumns + ` FROM ` + t + ` WHERE scope = ? AND key = ?`
	for _, p := range []struct {
		dst   **sql.Stmt
		db    *sql.DB
		query string
	}{
		{&s.st.get, s.read, get},
		{&s.st.list, s.read, `SELECT ` + recordColumns + ` FROM ` + t + `
			WHERE (?1 = '' OR scope = ?1) AND (?2 = '' OR state = ?2) AND (NOT ?3 OR (scope, key) > (?4, ?5))
			ORDER BY scope, key LIMIT ?6`},
		{&s.st.ping, s.read, `SELECT last FROM ` + tokens + ` WHERE id = 1`},
		{&s.st.lockedGet, s.write, get},
		{&s.st.nextToken, s.write, `UPDATE ` + tokens + ` SET last = last + 1 WHERE id = 1 RETURNING last`},
		{&s.st.claim, s.write, `INSERT INTO ` + t + ` (scope, key, fingerprint, state, token, created_at,
				lease_until, expires_at, status, header, body, body_omitted)
			VALUES (?, ?, ?, 'in_progress', ?, ?, ?, ?, NULL, NULL, NULL, 0)
			ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint,
				state = excluded.state, token = excluded.token, created_at = excluded.created_at,
				lease_until = excluded.lease_until, expires_at = excluded.expires_at,
				status = NULL, header = NULL, body = NULL, body_omitted = 0`},
		{&s.st.extend, s.write, `UPDATE ` + t + ` SET lease_until = ?` + owned},
		{&s.st.complete, s.write, `UPDATE ` + t + ` SET state = 'done', status = ?, header = ?, body = ?,
			body_omitted = ?, expires_at = ?` + owned},
		{&s.st.release, s.write, `DELETE FROM ` + t + owned},
		{&s.st.delete, s.write, `DELETE FROM ` + t + ` WHERE scope = ? AND key = ?`},
		{&s.st.deleteExpired, s.write, `DELETE FROM ` + t + ` WHERE rowid IN
			(SELECT rowid FROM ` + t + ` WHERE expires_at <= ? LIMIT ?)`},
	} {
		st, err := p.db.PrepareContext(ctx, p.query)
		if err != nil {
			return fmt.Errorf("sqlitestore: prepare: %w", err)
		}
		*p.dst = st
		s.st.all = append(s.st.all, st)
	}
	return nil
}

// Migrate creates the store's tables and index if they do not exist. Open calls it.
func (s *Store) Migrate(ctx context.Context) error {
	if s.closed.Load() {
		return idempotency.ErrClosed
	}
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, s.schema); err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	return nil
}

// Close makes every later call fail with idempotency.ErrClosed and, for a Store made by
// Open, closes the database. Calls in flight may fail with database/sql's error instead.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	var errs []error
	for _, st := range s.st.all {
		errs = append(errs, st.Close())
	}
	if s.owned {
		errs = append(errs, s.read.Close(), s.write.Close())
	}
	return errors.Join(errs...)
}

func (s *Store) check(ctx context.Context) error {
	if s.closed.Load() {
		return idempotency.ErrClosed
	}
	return ctx.Err()
}

// Claim implements idempotency.Store. It first reads the record without the write lock:
// a record that blocks the claim (a replay, a request in flight, a mismatch) is answered
// from that consistent snapshot. Otherwise it decides again under BEGIN IMMEDIATE and
// writes the record with a new token in the same transaction.
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := s.check(ctx); err != nil {
		return idempotency.ClaimResult{}, err
	}
	now := time.UnixMilli(req.Now.UnixMilli())
	rec, err := s.get(ctx, s.st.get, req.Scope, req.Key)
	if err != nil && !errors.Is(err, idempotency.ErrNotFound) {
		return idempotency.ClaimResult{}, err
	}
	if rec != nil && blocks(rec, req.Fingerprint, now) {
		return idempotency.ClaimResult{Existing: rec}, nil
	}

	if s.writes != nil {
		op := &writeOp{claim: &req}
		if err := s.writes.Do(ctx, op); err != nil {
			return idempotency.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
		}
		return op.res, op.err
	}
	return s.claimWrite(ctx, req)
}

// claimWrite is Claim's write: in a transaction of its own.
func (s *Store) claimWrite(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return idempotency.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := s.claimTx(ctx, tx, req)
	if err != nil || !res.Claimed {
		return res, err
	}
	if err := tx.Commit(); err != nil {
		return idempotency.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
	}
	return res, nil
}

// claimTx decides a claim again under the write lock of tx and writes it.
func (s *Store) claimTx(ctx context.Context, tx *sql.Tx, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	now := time.UnixMilli(req.Now.UnixMilli())
	rec, err := s.get(ctx, tx.StmtContext(ctx, s.st.lockedGet), req.Scope, req.Key)
	if err != nil && !errors.Is(err, idempotency.ErrNotFound) {
		return idempotency.ClaimResult{}, err
	}
	if rec != nil && blocks(rec, req.Fingerprint, now) {
		return idempotency.ClaimResult{Existing: rec}, nil
	}
	takeover := rec != nil && rec.ExpiresAt.After(now) // not expired, so a dead owner's lease
	created := req.Now
	if takeover {
		created = rec.CreatedAt
	}
	var token int64
	if err := tx.StmtContext(ctx, s.st.nextToken).QueryRowContext(ctx).Scan(&token); err != nil {
		return idempotency.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
	}
	if _, err := tx.StmtContext(ctx, s.st.claim).ExecContext(ctx, req.Scope, req.Key, req.Fingerprint, token,
		created.UnixMilli(), req.LeaseUntil.UnixMilli(), req.ExpiresAt.UnixMilli()); err != nil {
		return idempotency.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
	}
	return idempotency.ClaimResult{Claimed: true, Token: token, TookOver: takeover}, nil
}

// blocks reports whether rec prevents a claim with fingerprint at now: it is live and
// neither done nor an in-progress record of the same request whose lease expired.
func blocks(rec *idempotency.Record, fingerprint string, now time.Time) bool {
	if !rec.ExpiresAt.After(now) {
		return false
	}
	return rec.State != idempotency.StateInProgress || rec.LeaseUntil.After(now) || rec.Fingerprint != fingerprint
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, scope, key string, token int64, leaseUntil time.Time) error {
	return s.owned1(ctx, "extend", s.st.extend, leaseUntil.UnixMilli(), scope, key, token)
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, c idempotency.Completion) error {
	if s.writes != nil {
		if err := s.check(ctx); err != nil {
			return err
		}
		op := &writeOp{complete: &c}
		if err := s.writes.Do(ctx, op); err != nil {
			return fmt.Errorf("sqlitestore: complete: %w", err)
		}
		return op.err
	}
	return s.complete(ctx, s.st.complete, c)
}

func (s *Store) complete(ctx context.Context, stmt *sql.Stmt, c idempotency.Completion) error {
	header, err := json.Marshal(c.Response.Header)
	if err != nil {
		return fmt.Errorf("sqlitestore: complete: header: %w", err)
	}
	return s.owned1(ctx, "complete", stmt, c.Response.Status, string(header), c.Response.Body,
		c.Response.BodyOmitted, c.ExpiresAt.UnixMilli(), c.Scope, c.Key, c.Token)
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	return s.owned1(ctx, "release", s.st.release, scope, key, token)
}

// owned1 runs a statement that changes the in-progress record owned by a token, and
// returns ErrLeaseLost when it changed no row.
func (s *Store) owned1(ctx context.Context, op string, stmt *sql.Stmt, args ...any) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	res, err := stmt.ExecContext(ctx, args...)
	if err != nil {
		return fmt.Errorf("sqlitestore: %s: %w", op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("sqlitestore: %s: %w", op, err)
	}
	if n == 0 {
		return idempotency.ErrLeaseLost
	}
	return nil
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	return s.get(ctx, s.st.get, scope, key)
}

func (s *Store) get(ctx context.Context, stmt *sql.Stmt, scope, key string) (*idempotency.Record, error) {
	rec, err := scanRecord(stmt.QueryRowContext(ctx, scope, key))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, idempotency.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: get: %w", err)
	}
	return rec, nil
}

// Delete implements idempotency.Store.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if _, err := s.st.delete.ExecContext(ctx, scope, key); err != nil {
		return fmt.Errorf("sqlitestore: delete: %w", err)
	}
	return nil
}

// DeleteExpired implements idempotency.Janitor. It deletes in one statement; keep limit
// small (hundreds), since it holds the write lock while it runs.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	res, err := s.st.deleteExpired.ExecContext(ctx, now.UnixMilli(), limit)
	if err != nil {
		return 0, fmt.Errorf("sqlitestore: delete expired: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("sqlitestore: delete expired: %w", err)
	}
	return int(n), nil
}

// List implements idempotency.Lister, in (scope, key) order (bytewise, as Go compares
// strings). The cursor is the last record's scope and key.
func (s *Store) List(ctx context.Context, f idempotency.ListFilter) (idempotency.ListPage, error) {
	if err := s.check(ctx); err != nil {
		return idempotency.ListPage{}, err
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	var afterScope, afterKey string
	if f.After != "" {
		var err error
		if afterScope, afterKey, err = decodeCursor(f.After); err != nil {
			return idempotency.ListPage{}, err
		}
	}
	rows, err := s.st.list.QueryContext(ctx, f.Scope, string(f.State),
		f.After != "", afterScope, afterKey, limit+1)
	if err != nil {
		return idempotency.ListPage{}, fmt.Errorf("sqlitestore: list: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var page idempotency.ListPage
	for rows.Next() {
		if len(page.Records) == limit {
			last := page.Records[limit-1]
			page.Next = encodeCursor(last.Scope, last.Key)
			break
		}
		rec, err := scanRecord(rows)
		if err != nil {
			return idempotency.ListPage{}, fmt.Errorf("sqlitestore: list: %w", err)
		}
		page.Records = append(page.Records, *rec)
	}
	if err := rows.Err(); err != nil {
		return idempotency.ListPage{}, fmt.Errorf("sqlitestore: list: %w", err)
	}
	return page, nil
}

// Ping implements idempotency.Pinger: it reads the token table.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	var last int64
	if err := s.st.ping.QueryRowContext(ctx).Scan(&last); err != nil {
		return fmt.Errorf("sqlitestore: ping: %w", err)
	}
	return nil
}

// WithTx runs fn in a write transaction on the store's database and commits it. When ctx
// carries an idempotency.Claim (the middleware's request context), the record is
// completed with fn's response in the same transaction before the commit, and the claim
// is marked completed, so the middleware does not store the response again. If fn fails,
// the record is no longer the claim's (the error wraps idempotency.ErrLeaseLost), or the
// commit fails, the transaction is rolled back, the claim is released (a retry runs
// again), and WithTx returns the error with a zero Response.
//
// The transaction holds the database's write lock until fn returns: keep fn short, and
// do every write in it through tx (the Store's own write methods would wait for it).
func (s *Store) WithTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) (idempotency.Response, error)) (idempotency.Response, error) {
	claim, _ := idempotency.ClaimFromContext(ctx)
	resp, err := s.withTx(ctx, claim, fn)
	if err != nil {
		if claim != nil {
			claim.Release()
		}
		return idempotency.Response{}, err
	}
	if claim != nil {
		claim.MarkCompleted()
	}
	return resp, nil
}

func (s *Store) withTx(ctx context.Context, claim *idempotency.Claim, fn func(ctx context.Context, tx *sql.Tx) (idempotency.Response, error)) (idempotency.Response, error) {
	if err := s.check(ctx); err != nil {
		return idempotency.Response{}, err
	}
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return idempotency.Response{}, fmt.Errorf("sqlitestore: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	resp, err := fn(ctx, tx)
	if err != nil {
		return idempotency.Response{}, err
	}
	if claim != nil {
		if err := s.complete(ctx, tx.StmtContext(ctx, s.st.complete), claim.Completion(resp)); err != nil {
			return idempotency.Response{}, fmt.Errorf("sqlitestore: complete in transaction: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return idempotency.Response{}, fmt.Errorf("sqlitestore: commit: %w", err)
	}
	return resp, nil
}

// recordColumns are the columns scanRecord reads, in order.
const recordColumns = `scope, key, fingerprint, state, token, created_at, lease_until, expires_at,
	status, header, body, body_omitted`

func scanRecord(row interface{ Scan(...any) error }) (*idempotency.Record, error) {
	var (
		r                       idempotency.Record
		state                   string
		created, lease, expires int64
		status                  sql.NullInt64
		header, body            []byte
		omitted                 bool
	)
	if err := row.Scan(&r.Scope, &r.Key, &r.Fingerprint, &state, &r.Token, &created, &lease, &expires,
		&status, &header, &body, &omitted); err != nil {
		return nil, err
	}
	r.State = idempotency.State(state)
	r.CreatedAt = time.UnixMilli(created).UTC()
	r.LeaseUntil = time.UnixMilli(lease).UTC()
	r.ExpiresAt = time.UnixMilli(expires).UTC()
	if r.State == idempotency.StateDone {
		resp := &idempotency.Response{Status: int(status.Int64), Body: body, BodyOmitted: omitted}
		if err := json.Unmarshal(header, &resp.Header); err != nil {
			return nil, fmt.Errorf("record %q/%q: header: %w", r.Scope, r.Key, err)
		}
		if resp.Header == nil {
			resp.Header = http.Header{}
		}
		r.Response = resp
	}
	return &r, nil
}

func encodeCursor(scope, key string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(scope)) + "." + base64.RawURLEncoding.EncodeToString([]byte(key))
}

func decodeCursor(c string) (scope, key string, err error) {
	a, b, ok := strings.Cut(c, ".")
	s, err1 := base64.RawURLEncoding.DecodeString(a)
	k, err2 := base64.RawURLEncoding.DecodeString(b)
	if !ok || err1 != nil || err2 != nil {
		return "", "", fmt.Errorf("sqlitestore: invalid list cursor %q", c)
	}
	return string(s), string(k), nil
}
