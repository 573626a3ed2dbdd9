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
//	retrysafe_idempotency               one row per (scope, key): fingerprint, state,
//	                                    token, abandoned, created_at, lease_until and
//	                                    expires_at (unix milliseconds), and once done the
//	                                    response: status, headers (BLOB: header and
//	                                    trailer, byte for byte), body (BLOB),
//	                                    body_omitted, and header (the header as JSON text);
//	                                    route, what it was claimed under (NULL: none);
//	                                    claim_id, the ID of the claim that holds it
//	                                    (ClaimRequest.ID; NULL: none)
//	retrysafe_idempotency_expires_at    index for DeleteExpired
//	retrysafe_idempotency_token         one row: the last fencing token issued
//	retrysafe_idempotency_earlier_write trigger: see Migration
//
// Tokens are reserved from the token row in ranges: a write transaction that needs one
// and has none raises the row by as many as it holds claims plus 1,024, and the Store
// issues the rest of the range in its later transactions without writing the row again.
// Each of those transactions first reads the row under the write lock: a range is
// issued from only while the row still holds its end, that is while no other process
// (or Store) has reserved since. A range is issued from only once the transaction that
// reserved it has committed, so after a crash or a restart the row is past every token
// issued. Tokens therefore grow strictly across the whole table, in the order they are
// issued, and are never reused, after Delete and expiry included. They skip values: a
// claim that loses leaves its token unissued, and what a process had reserved and not
// issued when it stops is never issued.
//
// # Migration
//
// Migrate (which Open and New run) upgrades in place, live records included, a table of
// version 1 of the schema, whose only header column is header (JSON text, which cannot
// hold a header value that is not UTF-8, and no trailers). In one transaction it adds
// the columns the table lacks, found with pragma table_info: headers BLOB (NULL),
// abandoned INTEGER NOT NULL DEFAULT 0, route TEXT (NULL) and claim_id TEXT (NULL), the
// last two the ones a table of version 2 lacks; then it creates what is missing of the schema. Records
// written before read with no route. A binary that predates route leaves the column as
// it was when it claims over a record that had one (a takeover, or an expired record
// replaced), so during a rolling upgrade such a record may show the route of the one
// it replaced (for a takeover, its own). Nothing is rewritten: a record whose headers is
// NULL is read from header. A completion writes headers alone and leaves header NULL (as
// every claim sets it): every released binary (0.1.0 on) reads headers, and writing the
// header a second time, as JSON, with the trigger that write fires, would cost a new key
// some 9% of this store's CPU. A binary that knows only version 1, which no release had,
// would replay such a record's status and body without its header. Such a binary writes
// header and leaves the other columns alone; the trigger then clears headers and
// abandoned on the rows it wrote, so that this store reads them from header, not from
// what the row held before. Migrating is idempotent, and safe against another process
// doing it at the same time (the transaction takes the write lock first).
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
// Under FULL, the connection that commits opens the file through internal/walvfs, a VFS
// that hands a transaction's WAL frames to the kernel in one write at the sync that ends
// the commit, instead of SQLite's two writes per page (a batch of 16 writes is some 20
// pages: 40 system calls, one with it). What reaches the disk, and when, is unchanged:
// the frames are in the file before the fsync, and the fsync before the commit returns
// and before other connections can see the frames; a process that dies with frames in
// the buffer dies in a transaction that had not committed. Under NORMAL a commit ends
// without a sync, so its frames could not wait for one: NORMAL uses SQLite's own VFS.
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
// Store.Inspect (idempotency.Inspector, behind `retrysafe doctor` and the gateway's
// checks at start) reports synchronous and journal_mode as the committing connection
// has them, and the file's file system: a network one (NFS, SMB, 9p…) is refused, FUSE
// and tmpfs are warned about.
//
// # Time
//
// Lease and expiry instants come from the store's clock, Config.Clock, which is the
// process clock (time.Now) unless a test sets another: SQLite is a one-host store (see
// Concurrency), so every process sharing a file reads the same clock, and callers pass
// durations. Times are kept in whole milliseconds: the clock is truncated to the
// millisecond before every decision and write.
//
// # Concurrency
//
// A Store is safe for any number of goroutines. SQLite admits one writer at a time, so
// Open keeps two connection pools on the file: a write pool of exactly one connection,
// which serialises the process's writes in Go instead of making them spin in SQLite's
// busy handler (measurably faster under contention, and never SQLITE_BUSY within one
// process), and a read pool for Get, List and the first step of a claim of a key met
// before. WAL readers never wait for the writer, so a retry's replay, 409 or 422 is
// answered from a consistent snapshot without the write lock, in one statement. A claim
// that may win writes, in a BEGIN IMMEDIATE transaction (the DSN's _txlock=immediate)
// that takes the write lock before it reads or inserts the record it decides on, so that
// of any number of concurrent claims exactly one wins. A claim reads the stored response
// only when it is a replay (the record is done and has the claim's fingerprint): its
// statement selects the response columns under that condition, so a 409 or a 422 never
// reads the body's overflow pages. Every statement is prepared once per connection.
//
// Which comes first, the lock-free read or the write, is decided by a hint: the Store
// remembers recent keys its claims met (65,536 slots of hashes, 512 KiB), and reads
// first only for those. A key it does not remember is almost always a new one, for which
// the read finds nothing and costs as much as the insert; its claim goes straight to the
// write transaction and inserts the record unless one exists, in one statement. Only
// when one exists (a key this Store has forgotten or never met: claimed by another
// process, before a restart, or long ago) is it read and decided under the lock, with
// the outcome the read would have given; such a replay then waits for the write lock,
// and its key is remembered, so that the client's next retry does not.
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
// lock-free read, when it runs one) share one BEGIN IMMEDIATE transaction and one
// commit: group commit, on internal/batch. With Synchronous FULL every commit is an
// fsync, which is what limits a SQLite store's write rate; under load a batch pays one
// for all its calls. A call that finds the writer idle starts a transaction (at once,
// unless it gathers under load, below), so a lone request waits for nothing. Each call
// is decided and answered as without batching, on the clock read when its own statement
// runs. When a statement of the batch fails (other than a completion that finds its
// claim gone) or its commit does, the transaction is rolled back and each call runs
// again alone. Extend, Abandon, Release and WithTx are never batched. A Store made by
// Open runs a transaction of new keys' claims and completions (the common one) through
// the driver, on its one write connection, rather than through database/sql: about a
// sixth less CPU per new key (raw.go). Anything else, and every transaction on a
// database given to New, runs through database/sql.
//
// Under a load of several concurrent requests a transaction also waits, up to
// Config.Gather (DefaultGather), for more writes before it begins, and begins as soon
// as 16 are waiting, or half the store's requests in flight (claimed, or claiming, and
// not yet completed, released or abandoned; internal/inflight): the writer otherwise
// takes what arrived during the previous commit, and about three transactions in ten
// held a single write at 32 clients through the gateway, each with its own fsync; and
// fewer requests than 16 could never fill the transaction, and would wait out the
// window at every write. A lone request, one write after another, never waits (see
// internal/batch).
//
// # Transaction mode
//
// WithTx runs a function in a write transaction and, when the context carries the
// request's idempotency.Claim, completes the record in that same transaction, so that a
// business write and its stored response commit together or not at all. The completed
// record expires the claim's TTL after the store's clock at the completion.
package sqlitestore

import (
	"cmp"
	"context"
	"database/sql"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/batch"
	"github.com/retrysafe/retrysafe/internal/headercodec"
	"github.com/retrysafe/retrysafe/internal/inflight"
	"github.com/retrysafe/retrysafe/internal/listcursor"
	"github.com/retrysafe/retrysafe/internal/sqlname"
	"github.com/retrysafe/retrysafe/internal/walvfs"
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
	// Gather is the longest a transaction waits for more writes before it begins,
	// while writes come from several requests at once (see "Batching" in the package
	// doc). Zero: DefaultGather; negative: a transaction begins at once with what is
	// pending. Only with Batch.
	Gather time.Duration
	// Clock is the clock of every lease and expiry decision and instant: ClaimResult.Now,
	// LeaseUntil, ExpiresAt, and what DeleteExpired deletes. Default (nil) time.Now, the
	// process clock. SQLite is a one-host store, so the processes sharing a file read one
	// clock; a Clock set to anything else must be the same in all of them. Tests set it
	// to move time on.
	Clock func() time.Time
}

// Store is a SQLite idempotency.Store. Make one with Open or New.
type Store struct {
	write, read *sql.DB // the same *sql.DB when made by New
	owned       bool    // Close closes the pools
	closed      atomic.Bool
	schema      string
	st          statements
	writes      *batch.Group[*writeOp] // nil without Config.Batch
	inflight    inflight.Claims        // what the batches gather for
	now         func() time.Time       // Config.Clock
	table       string
	seen        *seenKeys // the keys Claim met recently: where a claim reads first
	reserve     tokenRange
	raw         *rawStmts // a batch's statements on the write connection; used only while holding it
}

// tokenReserve is how many tokens a reservation takes beyond what its transaction needs,
// for the Store's later transactions (see the package doc): one write of the token row,
// and its page, for about that many claims instead of one for every transaction.
const tokenReserve = 1024

// tokenRange is the committed range of tokens a Store reserved and has not issued.
type tokenRange struct {
	mu         sync.Mutex
	next, last int64 // next through last (none while next is 0 or past last); last is the row's value when reserved
}

// take issues the next token of r, if it has one.
func (r *tokenRange) take() (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next == 0 || r.next > r.last {
		return 0, false
	}
	r.next++
	return r.next - 1, true
}

// endsAt reports whether r was reserved up to last, the token row's value: read under
// the write lock, it shows that no one has reserved since r was.
func (r *tokenRange) endsAt(last int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last == last
}

// replace makes next through last r, unless r ends later: it was reserved after them.
func (r *tokenRange) replace(next, last int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if last > r.last {
		r.next, r.last = next, last
	}
}

// statements are the store's SQL, each prepared on the pool that runs it.
type statements struct {
	all                   []*sql.Stmt // for Close
	get, lean, list, ping *sql.Stmt   // read pool
	// write pool
	lockedLean, lastToken, nextToken, insert, claim, extend, abandon, complete, release, delete, deleteExpired, owner *sql.Stmt
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
	name := dsn(path, cfg.BusyTimeout, synchronous, "")
	writeName := name
	if synchronous == "FULL" {
		// Under FULL every commit ends with a sync of the WAL, which is what lets its
		// frames be handed to the kernel in one write instead of two per page.
		vfs, err := walvfs.Register()
		if err != nil {
			return nil, fmt.Errorf("sqlitestore: %w", err)
		}
		writeName = dsn(path, cfg.BusyTimeout, synchronous, vfs)
	}
	write, err := sql.Open("sqlite", writeName)
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
	s := &Store{write: write, read: read, owned: true, now: cfg.Clock}
	if err := write.PingContext(ctx); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	if err := s.init(ctx, table, cfg.Batch, cfg.Gather); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// dsn returns the modernc.org/sqlite DSN for the file at the absolute path, opened with
// the VFS named vfs ("": SQLite's default).
func dsn(path string, busy time.Duration, synchronous, vfs string) string {
	// SQLite decodes %HH in a file: URI and ends the path at '?' or '#'.
	path = strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	q := url.Values{}
	q.Add("_pragma", "busy_timeout("+strconv.FormatInt(busy.Milliseconds(), 10)+")")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous("+synchronous+")")
	q.Set("_txlock", "immediate")
	if vfs != "" {
		q.Set("vfs", vfs)
	}
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
	s := &Store{write: db, read: db, now: cfg.Clock}
	if err := s.init(ctx, table, cfg.Batch, cfg.Gather); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// tableName is Config.Table or its default, checked by sqlname's rule for SQLite. SQLite
// bounds no name's length, so neither does the store.
func tableName(table string) (string, error) {
	if table == "" {
		return defaultTable, nil
	}
	if !sqlname.ValidAnyCase(table, math.MaxInt) {
		return "", fmt.Errorf("sqlitestore: invalid Config.Table %q: use letters, digits and underscores, not starting with a digit", table)
	}
	return table, nil
}

// init applies the schema for table, prepares the statements and, when batched, sets up
// the batching of writes, gathering for up to gather (Config.Gather).
func (s *Store) init(ctx context.Context, table string, batched bool, gather time.Duration) error {
	if s.now == nil {
		s.now = time.Now
	}
	s.seen = newSeenKeys()
	if batched {
		// Negative: none (batch.Group.Gather).
		s.writes = &batch.Group[*writeOp]{Run: s.runWrites, InFlight: 1, Alone: s.writeAlone,
			Gather: cmp.Or(gather, DefaultGather), Callers: s.inflight.Count}
	}
	s.table = table
	s.schema = strings.ReplaceAll(schema, defaultTable, table)
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	t := `"` + table + `"`
	tokens := `"` + table + `_token"`
	owned := ` WHERE scope = ? AND key = ? AND state = 'in_progress' AND token = ?`
	get := `SELECT ` + recordColumns + ` FROM ` + t + ` WHERE scope = ? AND key = ?`
	lean := `SELECT ` + leanColumns + ` FROM ` + t + ` WHERE scope = ?1 AND key = ?2`
	for _, p := range []struct {
		dst   **sql.Stmt
		db    *sql.DB
		query string
	}{
		{&s.st.get, s.read, get},
		{&s.st.lean, s.read, lean},
		{&s.st.list, s.read, `SELECT ` + recordColumns + ` FROM ` + t + `
			WHERE (?1 = '' OR scope = ?1) AND (?2 = '' OR state = ?2) AND (NOT ?3 OR (scope, key) > (?4, ?5))
				AND (?7 = '' OR route = ?7)
			ORDER BY scope, key LIMIT ?6`},
		{&s.st.ping, s.read, lastTokenSQL(tokens)},
		{&s.st.lockedLean, s.write, lean},
		{&s.st.lastToken, s.write, lastTokenSQL(tokens)},
		{&s.st.nextToken, s.write, reserveTokensSQL(tokens)},
		{&s.st.insert, s.write, insertSQL(t)},
		// A takeover writes the route again: the record is filed under the route the
		// request now runs under.
		{&s.st.claim, s.write, `INSERT INTO ` + t + ` (scope, key, fingerprint, state, token, created_at,
				lease_until, expires_at, status, header, headers, body, body_omitted, abandoned, route, claim_id)
			VALUES (?, ?, ?, 'in_progress', ?, ?, ?, ?, NULL, NULL, NULL, NULL, 0, 0, nullif(?, ''), nullif(?, ''))
			ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint,
				state = excluded.state, token = excluded.token, created_at = excluded.created_at,
				lease_until = excluded.lease_until, expires_at = excluded.expires_at,
				status = NULL, header = NULL, headers = NULL, body = NULL, body_omitted = 0, abandoned = 0,
				route = excluded.route, claim_id = excluded.claim_id`},
		// The lease moves to now+lease, and the expiry with it when that is later, so
		// that a record never expires while its owner renews it.
		{&s.st.extend, s.write, `UPDATE ` + t + ` SET lease_until = ?, expires_at = max(expires_at, ?)` + owned},
		{&s.st.abandon, s.write, `UPDATE ` + t + ` SET abandoned = 1` + owned},
		{&s.st.complete, s.write, completeSQL(t)},
		{&s.st.release, s.write, `DELETE FROM ` + t + owned},
		{&s.st.delete, s.write, `DELETE FROM ` + t + ` WHERE scope = ? AND key = ?`},
		// Who holds a record, when a write conditioned on a token changed nothing.
		{&s.st.owner, s.write, `SELECT token, state FROM ` + t + ` WHERE scope = ? AND key = ?`},
		// An in-progress record whose lease runs is never deleted: its owner may still
		// complete it, and a claim must find it.
		{&s.st.deleteExpired, s.write, `DELETE FROM ` + t + ` WHERE rowid IN
			(SELECT rowid FROM ` + t + ` WHERE expires_at <= ?1 AND (state = 'done' OR lease_until <= ?1) LIMIT ?2)`},
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

// lastTokenSQL reads the token row of the token table tokens (quoted): the last token
// reserved.
func lastTokenSQL(tokens string) string { return `SELECT last FROM ` + tokens + ` WHERE id = 1` }

// reserveTokensSQL raises the token row of tokens (quoted) by its parameter and returns
// its new value.
func reserveTokensSQL(tokens string) string {
	return `UPDATE ` + tokens + ` SET last = last + ? WHERE id = 1 RETURNING last`
}

// insertSQL is a new key's claim on the table t (quoted): the record, unless one
// exists (then nothing changes).
func insertSQL(t string) string {
	return `INSERT INTO ` + t + ` (scope, key, fingerprint, state, token, created_at,
				lease_until, expires_at, status, header, headers, body, body_omitted, abandoned, route, claim_id)
			VALUES (?, ?, ?, 'in_progress', ?, ?, ?, ?, NULL, NULL, NULL, NULL, 0, 0, nullif(?, ''), nullif(?, ''))
			ON CONFLICT (scope, key) DO NOTHING`
}

// completeSQL is a completion on the table t (quoted): status, headers, body,
// body_omitted and expires_at, then scope, key and the claim's token.
func completeSQL(t string) string {
	return `UPDATE ` + t + ` SET state = 'done', status = ?, headers = ?,
			body = ?, body_omitted = ?, abandoned = 0, expires_at = ?
			WHERE scope = ? AND key = ? AND state = 'in_progress' AND token = ?`
}

// Migrate brings the store's schema up to date: it adds the columns a table of version 1
// of the schema lacks, then creates the tables, index and trigger that do not exist
// (see Migration in the package doc). Open and New call it; calling it again changes
// nothing.
func (s *Store) Migrate(ctx context.Context) error {
	if s.closed.Load() {
		return idempotency.ErrClosed
	}
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := addColumns(ctx, tx, s.table); err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	if _, err := tx.ExecContext(ctx, s.schema); err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	return nil
}

// addedColumns are the columns schema.sql has that earlier versions of the schema lack
// (version 1 all of them, version 2 route and claim_id, version 3 claim_id), in the
// order schema.sql declares them (last), with their definitions there.
var addedColumns = [...]struct{ name, definition string }{
	{"headers", "BLOB"},
	{"abandoned", "INTEGER NOT NULL DEFAULT 0"},
	{"route", "TEXT"},
	{"claim_id", "TEXT"},
}

// addColumns adds addedColumns to table, when it exists, as ALTER TABLE ADD COLUMN,
// which has no IF NOT EXISTS: it adds only those pragma table_info does not list. A
// missing table is left to schema.sql, which creates it whole.
func addColumns(ctx context.Context, tx *sql.Tx, table string) error {
	rows, err := tx.QueryContext(ctx, `SELECT name FROM pragma_table_info(?)`, table)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			_ = rows.Close()
			return err
		}
		have[name] = true
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	if len(have) == 0 {
		return nil
	}
	for _, c := range addedColumns {
		if have[c.name] {
			continue
		}
		if _, err := tx.ExecContext(ctx, `ALTER TABLE "`+table+`" ADD COLUMN `+c.name+` `+c.definition); err != nil {
			return fmt.Errorf("add column %s: %w", c.name, err)
		}
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
		errs = append(errs, s.closeRaw())
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

// Claim implements idempotency.Store.
//
// A claim of a key the Store has met recently (seenKeys) first reads the record without
// the write lock: a record that blocks the claim (a replay, a request in flight, a
// mismatch) is answered from that consistent snapshot, in one statement that reads the
// stored response only for a replay. That keeps a client's retries off the write lock.
// Any other key is almost always a new one, and goes straight to the write transaction,
// as does a claim whose read found no record: there, on the clock read then, the record
// is inserted unless one exists, in one statement. Only when one does (a key this Store
// has forgotten or never met, or one written since the read) is it read under the lock
// and the claim decided as by the read above, and the record written with a new token
// in the same transaction. The hint chooses only which read comes first: every claim is
// decided on a snapshot or under the write lock, as without it.
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (res idempotency.ClaimResult, err error) {
	defer s.inflight.Begin()()
	defer func() {
		if err == nil && res.Claimed {
			s.inflight.Claimed(res.Token, req.Lease)
		}
	}()
	if err := s.check(ctx); err != nil {
		return idempotency.ClaimResult{}, err
	}
	absent := true // no record was read: the write inserts first
	if s.seen.met(req.Scope, req.Key) {
		now := s.clock()
		rec, err := s.lean(ctx, s.st.lean, req)
		if err != nil {
			return idempotency.ClaimResult{}, err
		}
		if res, done := decided(rec, req, now); done {
			return res, nil
		}
		absent = rec == nil
	} else {
		s.seen.add(req.Scope, req.Key)
	}

	if s.writes != nil {
		op := &writeOp{claim: &req, absent: absent}
		if err := s.writes.Do(ctx, op); err != nil {
			return idempotency.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
		}
		return op.res, op.err
	}
	return s.claimWrite(ctx, req, absent)
}

// claimWrite is Claim's write: in a transaction of its own.
func (s *Store) claimWrite(ctx context.Context, req idempotency.ClaimRequest, absent bool) (idempotency.ClaimResult, error) {
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return idempotency.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	// Under the lock, the statements run under a context nothing cancels (see
	// writeBatch).
	tokens := &tokenBlock{want: 1}
	res, err := s.claimTx(context.WithoutCancel(ctx), tx, req, absent, tokens)
	if err != nil || !res.Claimed {
		return res, err
	}
	if err := tx.Commit(); err != nil {
		return idempotency.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
	}
	s.committed(tokens)
	return res, nil
}

// claimTx decides a claim under the write lock of tx and writes it, with a token from
// tokens. absent: Claim read no record, so the record is inserted if there still is
// none, and read and decided only if there is.
func (s *Store) claimTx(ctx context.Context, tx *sql.Tx, req idempotency.ClaimRequest, absent bool, tokens *tokenBlock) (idempotency.ClaimResult, error) {
	now := s.clock()
	var token int64
	if absent {
		var err error
		if token, err = s.takeToken(ctx, txTokens{s, tx}, tokens); err != nil {
			return idempotency.ClaimResult{}, err
		}
		res, err := tx.StmtContext(ctx, s.st.insert).ExecContext(ctx, req.Scope, req.Key, req.Fingerprint, token,
			now.UnixMilli(), now.Add(req.Lease).UnixMilli(), now.Add(req.TTL).UnixMilli(), req.Route, req.ID)
		if err != nil {
			return idempotency.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return idempotency.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
		}
		if n == 1 {
			return idempotency.ClaimResult{Claimed: true, Token: token, Now: now}, nil
		}
	}
	rec, err := s.lean(ctx, tx.StmtContext(ctx, s.st.lockedLean), req)
	if err != nil {
		return idempotency.ClaimResult{}, err
	}
	if res, done := decided(rec, req, now); done {
		return res, nil
	}
	// A record that does not block is done and expired (a fresh claim replaces it), or in
	// progress with its lease run out: taken over while it is retained, else replaced.
	takeover := rec != nil && rec.State == idempotency.StateInProgress && rec.ExpiresAt.After(now)
	created := now
	if takeover {
		created = rec.CreatedAt
	}
	if token == 0 {
		if token, err = s.takeToken(ctx, txTokens{s, tx}, tokens); err != nil {
			return idempotency.ClaimResult{}, err
		}
	}
	if _, err := tx.StmtContext(ctx, s.st.claim).ExecContext(ctx, req.Scope, req.Key, req.Fingerprint, token,
		created.UnixMilli(), now.Add(req.Lease).UnixMilli(), now.Add(req.TTL).UnixMilli(), req.Route, req.ID); err != nil {
		return idempotency.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
	}
	return idempotency.ClaimResult{Claimed: true, Token: token, TookOver: takeover, Now: now}, nil
}

// tokenBlock hands out the fencing tokens of one write transaction's claims: from the
// Store's reserve while the token row shows that no one has reserved since, else from a
// range the transaction reserves, which becomes the Store's reserve once the transaction
// commits (see the package doc). A claim takes at most one, and one it does not use (it
// lost) is never issued: tokens grow strictly across the table and are never reused,
// with gaps.
type tokenBlock struct {
	want       int64 // how many claims the transaction holds: its reservation takes as many, and tokenReserve more
	checked    bool  // the token row was read in this transaction
	shared     bool  // the Store's reserve is valid in this transaction: take from it
	next, last int64 // reserved by this transaction and not taken: next through last (none while next is 0 or past last)
}

// tokenRow reads and reserves from the token row, in a write transaction.
type tokenRow interface {
	// last returns the row's value.
	last(ctx context.Context) (int64, error)
	// reserve adds n to the row and returns its new value.
	reserve(ctx context.Context, n int64) (int64, error)
}

// txTokens is the token row in tx.
type txTokens struct {
	s  *Store
	tx *sql.Tx
}

func (t txTokens) last(ctx context.Context) (int64, error) {
	var last int64
	err := t.tx.StmtContext(ctx, t.s.st.lastToken).QueryRowContext(ctx).Scan(&last)
	return last, err
}

func (t txTokens) reserve(ctx context.Context, n int64) (int64, error) {
	var last int64
	err := t.tx.StmtContext(ctx, t.s.st.nextToken).QueryRowContext(ctx, n).Scan(&last)
	return last, err
}

// takeToken takes the next token for b's transaction, whose token row is row.
func (s *Store) takeToken(ctx context.Context, row tokenRow, b *tokenBlock) (int64, error) {
	if !b.checked {
		b.checked = true
		last, err := row.last(ctx)
		if err != nil {
			return 0, fmt.Errorf("sqlitestore: claim: %w", err)
		}
		b.shared = s.reserve.endsAt(last)
	}
	if b.shared {
		if token, ok := s.reserve.take(); ok {
			return token, nil
		}
		b.shared = false
	}
	if b.next == 0 || b.next > b.last {
		n := max(b.want, 1) + tokenReserve
		b.want = 0
		last, err := row.reserve(ctx, n)
		if err != nil {
			return 0, fmt.Errorf("sqlitestore: claim: %w", err)
		}
		b.next, b.last = last-n+1, last
	}
	b.next++
	return b.next - 1, nil
}

// committed makes what b's transaction reserved and did not issue the Store's reserve,
// once that transaction has committed.
func (s *Store) committed(b *tokenBlock) {
	if b.last != 0 {
		s.reserve.replace(b.next, b.last)
	}
}

// lean reads the record req would claim as a lost claim returns it (see leanColumns),
// or nil when there is none. A record the claim req made (its ID) comes back with
// Route "own" and nothing else to tell it by: see decided.
func (s *Store) lean(ctx context.Context, stmt *sql.Stmt, req idempotency.ClaimRequest) (*idempotency.Record, error) {
	rec, err := scanRecord(stmt.QueryRowContext(ctx, req.Scope, req.Key, req.Fingerprint, req.ID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: claim: %w", err)
	}
	return rec, nil
}

// decided returns the claim's result when the record rec (nil: none), read by lean,
// decides it without a write: the claimer's own in-progress record (claimed under
// req.ID), granted again, or a record that blocks the claim.
func decided(rec *idempotency.Record, req idempotency.ClaimRequest, now time.Time) (idempotency.ClaimResult, bool) {
	switch {
	case rec == nil:
		return idempotency.ClaimResult{}, false
	case rec.Route == ownClaim:
		return idempotency.ClaimResult{Claimed: true, Token: rec.Token, Now: now}, true
	case blocks(rec, req, now):
		return idempotency.ClaimResult{Existing: rec, Now: now}, true
	}
	return idempotency.ClaimResult{}, false
}

// blocks reports whether rec prevents the claim req at now, by the rules of
// idempotency.Store.Claim: a done record blocks until it expires; an in-progress one
// while its lease runs, and after that when req must not take it over, or when it is
// still retained and was claimed with another fingerprint.
func blocks(rec *idempotency.Record, req idempotency.ClaimRequest, now time.Time) bool {
	expired := !rec.ExpiresAt.After(now)
	if rec.State != idempotency.StateInProgress {
		return !expired
	}
	if rec.LeaseUntil.After(now) || !req.MayTakeOver(now) {
		return true
	}
	return !expired && rec.Fingerprint != req.Fingerprint
}

// clock returns the store's clock, truncated to the millisecond, the resolution the
// table keeps: decisions compare instants as stored.
func (s *Store) clock() time.Time { return time.UnixMilli(s.now().UnixMilli()).UTC() }

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error {
	s.inflight.Extended(token, lease)
	until := s.clock().Add(lease).UnixMilli()
	return s.owned1(ctx, "extend", nil, s.st.extend, false, scope, key, token, until, until)
}

// Abandon implements idempotency.Store: it sets the record's abandoned column and leaves
// its lease as it is.
func (s *Store) Abandon(ctx context.Context, scope, key string, token int64) error {
	defer s.inflight.Settled(token)
	return s.owned1(ctx, "abandon", nil, s.st.abandon, false, scope, key, token)
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, c idempotency.Completion) error {
	defer s.inflight.Settled(c.Token)
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
	return s.complete(ctx, nil, c, true)
}

// complete runs the completion statement for c, on the store's clock, on the write pool
// (tx nil) or in tx. With again, a completion sent again, that finds its record done
// under its token, returns nil: the write it repeats was durable when it returned (see
// Durability), on the one host that holds the file. Without it (the completion in a
// handler's transaction), that is ErrLeaseLost, so that the transaction, whose business
// write would be done twice, does not commit.
func (s *Store) complete(ctx context.Context, tx *sql.Tx, c idempotency.Completion, again bool) error {
	// headers holds the header and trailer, byte for byte; header, version 1's JSON
	// column, stays NULL (see Migration).
	headers := headercodec.Encode(c.Response.Header, c.Response.Trailer)
	return s.owned1(ctx, "complete", tx, s.st.complete, again, c.Scope, c.Key, c.Token, c.Response.Status,
		headers, c.Response.Body, c.Response.BodyOmitted, s.clock().Add(c.TTL).UnixMilli())
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	defer s.inflight.Settled(token)
	return s.owned1(ctx, "release", nil, s.st.release, false, scope, key, token)
}

// owned1 runs stmt, a statement that changes the in-progress record (scope, key) owned by
// token, on the write pool (tx nil) or in tx, with args and then scope, key and token as
// its parameters. When it changed no row, it returns ErrRecordGone for a missing record,
// nil for a record done under token when again is set, and ErrLeaseLost otherwise.
func (s *Store) owned1(ctx context.Context, op string, tx *sql.Tx, stmt *sql.Stmt, again bool, scope, key string, token int64, args ...any) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if tx != nil {
		stmt = tx.StmtContext(ctx, stmt)
	}
	res, err := stmt.ExecContext(ctx, append(args, scope, key, token)...)
	if err != nil {
		return fmt.Errorf("sqlitestore: %s: %w", op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("sqlitestore: %s: %w", op, err)
	}
	if n > 0 {
		return nil
	}
	owner := s.st.owner
	if tx != nil {
		owner = tx.StmtContext(ctx, owner)
	}
	var held int64
	var state string
	switch err := owner.QueryRowContext(ctx, scope, key).Scan(&held, &state); {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("sqlitestore: %s: %w", op, idempotency.ErrRecordGone)
	case err != nil:
		return fmt.Errorf("sqlitestore: %s: %w", op, err)
	case again && held == token && state == string(idempotency.StateDone):
		return nil
	}
	return fmt.Errorf("sqlitestore: %s: %w", op, idempotency.ErrLeaseLost)
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

// DeleteExpired implements idempotency.Janitor, on the store's clock. It deletes in one
// statement; keep limit small (hundreds), since it holds the write lock while it runs.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	res, err := s.st.deleteExpired.ExecContext(ctx, s.clock().UnixMilli(), limit)
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
		if afterScope, afterKey, err = listcursor.Decode(f.After); err != nil {
			return idempotency.ListPage{}, fmt.Errorf("sqlitestore: %w", err)
		}
	}
	rows, err := s.st.list.QueryContext(ctx, f.Scope, string(f.State),
		f.After != "", afterScope, afterKey, limit+1, f.Route)
	if err != nil {
		return idempotency.ListPage{}, fmt.Errorf("sqlitestore: list: %w", err)
	}
	defer func() { _ = rows.Close() }()
	page, err := listcursor.Page(rows, limit, func(r *sql.Rows) (*idempotency.Record, error) { return scanRecord(r) })
	if err != nil {
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
// With a claim in ctx, the transaction and fn run on idempotency.Detach(ctx): the
// caller's cancellation and deadline do not reach them (a client that gives up does not
// roll back the work whose answer the middleware stores for its retry), but the loss of
// the claim's lease to another request does.
//
// The transaction holds the database's write lock until fn returns: keep fn short, and
// do every write in it through tx (the Store's own write methods would wait for it).
func (s *Store) WithTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) (idempotency.Response, error)) (idempotency.Response, error) {
	claim, _ := idempotency.ClaimFromContext(ctx)
	// The client's retry will want this work's answer: a client that leaves must not
	// roll it back. The work still ends if another request takes the key over.
	ctx, cancel := idempotency.Detach(ctx)
	defer cancel()
	resp, err := s.withTx(ctx, claim, fn)
	if err != nil {
		if claim != nil {
			claim.Release()
		}
		return idempotency.Response{}, err
	}
	if claim != nil {
		claim.MarkCompleted()
		s.inflight.Settled(claim.Token)
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
		if err := s.complete(ctx, tx, claim.Completion(resp), false); err != nil {
			return idempotency.Response{}, fmt.Errorf("sqlitestore: complete in transaction: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return idempotency.Response{}, fmt.Errorf("sqlitestore: commit: %w", err)
	}
	return resp, nil
}

// recordColumns are the columns scanRecord reads: a whole record, in the order the table
// stores them, so that SQLite reads a large body's overflow pages once (a column stored
// after the body, read before it, would make it walk their chain twice).
const recordColumns = `scope, key, fingerprint, state, token, created_at, lease_until, expires_at,
	status, header, body, body_omitted, headers, abandoned, coalesce(route, '')`

// leanColumns are recordColumns as a lost claim reads them, with its fingerprint as
// parameter ?3: the response only for a replay (a done record with that fingerprint),
// NULL otherwise, so that a 409 or a 422 does not read a stored body. SQLite evaluates
// a CASE branch only when its condition holds, and reads a column only when it is
// evaluated; abandoned, stored after the body, is read only while the record is in
// progress, when the body is NULL. The route is not read (a claim does not use it): its
// place holds whether the record is the claimer's own (ownClaim).
const leanColumns = `scope, key, fingerprint, state, token, created_at, lease_until, expires_at,
	CASE WHEN ` + replay + ` THEN status END, CASE WHEN ` + replay + ` THEN header END,
	CASE WHEN ` + replay + ` THEN body END, CASE WHEN ` + replay + ` THEN body_omitted ELSE 0 END,
	CASE WHEN ` + replay + ` THEN headers END, CASE WHEN state = 'in_progress' THEN abandoned ELSE 0 END,
	CASE WHEN state = 'in_progress' AND ?4 <> '' AND claim_id = ?4 THEN '` + ownClaim + `' ELSE '' END`

// ownClaim is what leanColumns read into Record.Route, which a claim does not use, for
// the claimer's own in-progress record: claimed under the claim's ID, parameter ?4.
const ownClaim = "own"

const replay = `state = 'done' AND fingerprint = ?3`

// scanRecord scans recordColumns or leanColumns. A done record has a Response when its
// status was read: always with recordColumns, only for a replay with leanColumns.
func scanRecord(row interface{ Scan(...any) error }) (*idempotency.Record, error) {
	var (
		r                         idempotency.Record
		state                     string
		created, lease, expires   int64
		status                    sql.NullInt64
		jsonHeader, headers, body []byte
		omitted                   bool
	)
	if err := row.Scan(&r.Scope, &r.Key, &r.Fingerprint, &state, &r.Token, &created, &lease, &expires,
		&status, &jsonHeader, &body, &omitted, &headers, &r.Abandoned, &r.Route); err != nil {
		return nil, err
	}
	r.State = idempotency.State(state)
	r.CreatedAt = time.UnixMilli(created).UTC()
	r.LeaseUntil = time.UnixMilli(lease).UTC()
	r.ExpiresAt = time.UnixMilli(expires).UTC()
	if r.State == idempotency.StateDone && status.Valid {
		resp := &idempotency.Response{Status: int(status.Int64), Body: body, BodyOmitted: omitted}
		var err error
		if headers != nil {
			resp.Header, resp.Trailer, err = headercodec.Decode(headers)
		} else {
			// Written by a binary that knows only version 1: the header as JSON text, no
			// trailers.
			err = json.Unmarshal(jsonHeader, &resp.Header)
		}
		if err != nil {
			return nil, fmt.Errorf("record %q/%q: header: %w", r.Scope, r.Key, err)
		}
		if resp.Header == nil {
			resp.Header = http.Header{}
		}
		r.Response = resp
	}
	return &r, nil
}
