package fence

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/internal/clock"
	"github.com/retrysafe/retrysafe/internal/pgddl"
	"github.com/retrysafe/retrysafe/internal/sqlname"
	"github.com/retrysafe/retrysafe/retry"
)

//go:embed schema.sql
var schemaSQL string

// Errors. Each is matched with errors.Is; the returned errors wrap them with details.
var (
	// ErrHeld: Acquire found the lease held, unexpired, by another acquisition. The
	// error is a *HeldError.
	ErrHeld = errors.New("fence: lease held by another holder")
	// ErrLeaseLost: the lease expired or was taken over. Renew and Release return it,
	// and it is the cause (context.Cause) of a Lease's Context when a renewal finds the
	// lease gone or the TTL passed without a successful renewal.
	ErrLeaseLost = errors.New("fence: lease lost")
	// ErrReleased is the cause of a Lease's Context after Release.
	ErrReleased = errors.New("fence: lease released")
	// ErrStaleToken: a conditional write carried a fencing token older than the
	// lease's current one, or than the token that last wrote the row; or the lease it
	// names has expired. Nothing was written.
	ErrStaleToken = errors.New("fence: stale fencing token")
	// ErrConflict: a compare-and-swap lost: the row's version is no longer the one the
	// writer read. Nothing was written; read the row again and retry.
	ErrConflict = errors.New("fence: version conflict")
	// ErrNotFound: a conditional write found no row with the given key.
	ErrNotFound = errors.New("fence: row not found")
)

// HeldError is returned by Acquire when the lease is held. It matches ErrHeld. Holder
// and Expires come from the read that found the lease held; they are informational,
// and empty when the lease was taken concurrently by an acquisition the read did not
// see.
type HeldError struct {
	Name    string
	Holder  string
	Token   int64
	Expires time.Time // by the database's clock
}

func (e *HeldError) Error() string {
	if e.Holder == "" && e.Expires.IsZero() {
		return fmt.Sprintf("fence: lease %q held by another holder", e.Name)
	}
	return fmt.Sprintf("fence: lease %q held by %q (token %d) until %s",
		e.Name, e.Holder, e.Token, e.Expires.Format(time.RFC3339Nano))
}

// Unwrap returns ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }

// MinTTL is the shortest TTL Acquire accepts.
const MinTTL = time.Millisecond

// Config configures a Store. The zero value of each field but Pool means its default.
type Config struct {
	// Pool is the connection pool. Required; the Store never closes it.
	Pool *pgxpool.Pool
	// Schema is the schema of the leases table and its token sequence. Default "public".
	Schema string
	// Table is the name of the leases table. Default "retrysafe_leases". The token
	// sequence is <Table>_token_seq.
	Table string
	// ManualRenew turns the heartbeat off: a lease is renewed only by Lease.Renew, and
	// its Context ends (cause ErrLeaseLost) once its TTL has passed since the last
	// successful renewal was sent. Default false: every lease is renewed every TTL/3
	// until it is released.
	ManualRenew bool
	// Clock is the application's clock. It only schedules renewals and measures how long
	// a lease is certainly still valid (the TTL since the last successful acquisition or
	// renewal was sent); expiry itself is decided by the database's clock. Default the
	// real clock.
	Clock retry.Clock
	// Logger receives failed renewals and lost leases. Default slog.Default().
	Logger *slog.Logger
}

// Store grants leases on one PostgreSQL table. It is safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	clock  retry.Clock
	logger *slog.Logger
	manual bool
	sql    statements
}

type statements struct {
	schema, acquire, renew, release, check string
}

// New returns a Store on cfg.Pool. Schema and Table must be lowercase SQL identifiers
// (letters, digits and underscores, not starting with a digit), the schema at most 63
// bytes and the table at most 53, so that the sequence's name fits PostgreSQL's limit.
// New does no I/O; call Migrate to create the table.
func New(cfg Config) (*Store, error) {
	if cfg.Pool == nil {
		return nil, errors.New("fence: Config.Pool is nil")
	}
	schema := cmp.Or(cfg.Schema, "public")
	table := cmp.Or(cfg.Table, "retrysafe_leases")
	if !sqlname.Valid(schema, 63) {
		return nil, fmt.Errorf("fence: invalid schema name %q", schema)
	}
	if !sqlname.Valid(table, 53) {
		return nil, fmt.Errorf("fence: invalid table name %q", table)
	}
	s := &Store{pool: cfg.Pool, clock: cfg.Clock, logger: cfg.Logger, manual: cfg.ManualRenew}
	if s.clock == nil {
		s.clock = clock.Real{}
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	r := strings.NewReplacer(
		"{schema}", pgx.Identifier{schema}.Sanitize(),
		"{table}", pgx.Identifier{schema, table}.Sanitize(),
		"{sequence}", pgx.Identifier{schema, table + "_token_seq"}.Sanitize(),
	)
	const ttl = `$3::bigint * interval '1 microsecond'`
	s.sql = statements{
		schema: r.Replace(schemaSQL),
		// cur reads the lease first: when it is held (by this statement's snapshot), the
		// INSERT gets no row and the statement takes no lock and writes nothing. (ON
		// CONFLICT DO UPDATE locks the conflicting row before it evaluates its WHERE, so
		// without the pre-check every refused acquisition would be a write transaction:
		// a row lock, a transaction id and a WAL flush.) Otherwise the upsert decides,
		// on the latest version of the row. The token of a takeover is drawn in DO
		// UPDATE, after the row is locked, so it is greater than the token of the
		// acquisition it replaces (drawn before that one committed). The expiry is
		// compared with clock_timestamp(), the database's time when the row is
		// examined, not now() (the transaction's start).
		acquire: r.Replace(`WITH cur AS (
	SELECT holder, token, expires_at, holder IS NOT NULL AND expires_at > clock_timestamp() AS held
	FROM {table} WHERE name = $1
), acquired AS (
	INSERT INTO {table} AS l (name, holder, token, acquired_at, expires_at)
	SELECT $1, $2, nextval('{sequence}'), clock_timestamp(), clock_timestamp() + ` + ttl + `
	WHERE NOT EXISTS (SELECT FROM cur WHERE held)
	ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, token = nextval('{sequence}'),
		acquired_at = clock_timestamp(), expires_at = clock_timestamp() + ` + ttl + `
	WHERE l.holder IS NULL OR l.expires_at <= clock_timestamp()
	RETURNING l.token, l.acquired_at, l.expires_at
)
SELECT true, '', token, acquired_at, expires_at FROM acquired
UNION ALL
SELECT false, coalesce(holder, ''), token, expires_at, expires_at FROM cur
WHERE NOT EXISTS (SELECT FROM acquired)`),
		renew: r.Replace(`UPDATE {table} SET expires_at = clock_timestamp() + ` + ttl + `
WHERE name = $1 AND token = $2 AND holder IS NOT NULL AND expires_at > clock_timestamp()
RETURNING expires_at`),
		// Returns the end of the tenure (the release time, or the expiry if that came
		// first) and whether the lease was still valid.
		release: r.Replace(`WITH held AS (
	SELECT expires_at FROM {table} WHERE name = $1 AND token = $2 AND holder IS NOT NULL FOR UPDATE
)
UPDATE {table} AS l SET holder = NULL, expires_at = least(held.expires_at, clock_timestamp())
FROM held WHERE l.name = $1
RETURNING l.expires_at, l.expires_at < held.expires_at`),
		// FOR SHARE, not FOR KEY SHARE: it conflicts with the UPDATE of an acquisition
		// or renewal, so no one takes the lease over until the caller's transaction ends.
		check: r.Replace(`SELECT token, holder IS NOT NULL AND expires_at > clock_timestamp()
FROM {table} WHERE name = $1 FOR SHARE`),
	}
	return s, nil
}

// Migrate creates the schema, the token sequence and the leases table when they do not
// exist. It is idempotent, and concurrent calls (from several replicas) are safe: they
// run one at a time under a transaction-level advisory lock.
func (s *Store) Migrate(ctx context.Context) error {
	if err := pgddl.Apply(ctx, s.pool, s.sql.schema); err != nil {
		return fmt.Errorf("fence: migrate: %w", err)
	}
	return nil
}

// Acquire takes the lease called name for holder, for ttl, when it is free (never
// taken, or released) or expired by the database's clock, in one statement. Otherwise
// it returns a *HeldError, which matches ErrHeld; it never waits for the lease.
//
// The returned Lease carries a fencing token strictly greater than every token issued
// before for name (by this table: tokens come from one sequence, so they have gaps).
// holder names the owner in the table and in errors (a host name, a process); it
// carries no authority: the same holder acquiring a held lease gets ErrHeld too.
//
// ctx bounds the acquisition and the life of the lease: the Lease's Context is derived
// from it, and the heartbeat stops when it ends. The lease then expires after its TTL
// unless released. Always call Release, as with a context's cancel function: the
// heartbeat runs until then.
//
// ttl must be at least MinTTL. If the statement succeeded but its answer was lost, the
// lease stays held until ttl passes.
func (s *Store) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (*Lease, error) {
	if name == "" {
		return nil, errors.New("fence: acquire: empty lease name")
	}
	if ttl < MinTTL {
		return nil, fmt.Errorf("fence: acquire %q: ttl %s is shorter than %s", name, ttl, MinTTL)
	}
	sent := s.clock.Now()
	var (
		acquired          bool
		current           string
		token             int64
		acquiredAt, until time.Time
	)
	err := s.pool.QueryRow(ctx, s.sql.acquire, name, holder, ttl.Microseconds()).
		Scan(&acquired, &current, &token, &acquiredAt, &until)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Taken by an acquisition after this statement's snapshot.
		return nil, &HeldError{Name: name}
	case err != nil:
		return nil, fmt.Errorf("fence: acquire %q: %w", name, err)
	case !acquired:
		return nil, &HeldError{Name: name, Holder: current, Token: token, Expires: until}
	}
	return s.newLease(ctx, name, holder, ttl, token, acquiredAt, until, sent), nil
}

// Check verifies, inside the caller's transaction tx, that token is the current token
// of the lease called name and that the lease is held and unexpired by the database's
// clock; otherwise it returns an error wrapping ErrStaleToken. It locks the lease row
// (SELECT … FOR SHARE) until tx ends, so the lease cannot be taken over, nor renewed,
// before the caller's writes commit: a write made after a successful Check commits
// only while its token is current. Return Check's error from the transaction so that
// it rolls back.
//
// Keep such transactions shorter than the TTL: the lock also holds back the lease's own
// renewals, so a holder whose transaction outlives the TTL loses the lease (its Context
// is cancelled) even though no one could take it over meanwhile.
//
// Under REPEATABLE READ or SERIALIZABLE, a lease changed since the transaction's
// snapshot makes Check fail with a serialization error (SQLSTATE 40001): retry the
// transaction.
func (s *Store) Check(ctx context.Context, tx pgx.Tx, name string, token int64) error {
	var current int64
	var valid bool
	err := tx.QueryRow(ctx, s.sql.check, name).Scan(&current, &valid)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("fence: check %q token %d: no such lease: %w", name, token, ErrStaleToken)
	case err != nil:
		return fmt.Errorf("fence: check %q: %w", name, err)
	case current != token:
		return fmt.Errorf("fence: check %q token %d: current token is %d: %w", name, token, current, ErrStaleToken)
	case !valid:
		return fmt.Errorf("fence: check %q token %d: lease expired or released: %w", name, token, ErrStaleToken)
	}
	return nil
}
