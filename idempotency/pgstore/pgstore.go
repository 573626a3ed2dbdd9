// Package pgstore is an idempotency.Store on PostgreSQL, through pgx v5 (pgxpool).
//
// # Schema
//
// One table, by default public.retrysafe_idempotency, holds one row per (scope, key),
// its primary key:
//
//	scope, key, fingerprint   bytea: the Go strings byte for byte (NUL included), in Go's order
//	state                     'in_progress' or 'done'
//	token                     the owner's fencing token (bigint)
//	attempts                  1 + the takeovers of the current claim
//	created_at, lease_until, expires_at, completed_at   timestamptz (microseconds)
//	status, header, body, body_omitted                  the stored response, once done
//
// header is jsonb (a JSON object of arrays, multi-valued headers intact), so header
// values are text: bytes that are not UTF-8 would be stored as U+FFFD, and a NUL (which
// net/http never sends) fails the completion. A sequence,
// <table>_token_seq, issues the fencing tokens, and an index on expires_at serves the
// janitor. The DDL is embedded (schema.sql) and applied by Store.Migrate, idempotently
// and under a transaction-level advisory lock, so replicas may all migrate as they
// start. Migrate needs a role that may create the schema and the table; the serving
// role needs only SELECT, INSERT, UPDATE and DELETE on the table and USAGE on the
// sequence.
//
// # Claim in one statement
//
// Claim is a single statement, so one round trip:
//
//	WITH existing AS (SELECT … WHERE scope = $1 AND key = $2),
//	     claimed  AS (INSERT … SELECT …, nextval(seq), … WHERE NOT EXISTS (SELECT FROM existing)
//	                  ON CONFLICT (scope, key) DO NOTHING RETURNING …)
//	SELECT <claimed row> UNION ALL SELECT <existing row, and whether it is claimable>
//
// The primary key makes exactly one of any number of concurrent claims win. When the key
// exists, nothing is inserted, locked or written: a replay, a 409 or a 422 is a plain
// read, so duplicates of one key never queue behind each other or behind a transaction
// that holds the record, and cost no WAL flush. Under READ COMMITTED a row inserted by
// another transaction after the statement's snapshot makes the statement return no row;
// Claim then runs it again (at most 10 times).
//
// Only when the existing record is claimable (expired, or in progress with its lease run
// out and the same fingerprint) does a second statement replace it: an UPDATE
// conditioned on the token that was read, which PostgreSQL re-checks on the latest row
// after taking its lock, so of concurrent takeovers exactly one wins. Tokens come from
// the sequence, for fresh claims and takeovers alike, so they are never reused, and a
// takeover's token, drawn after the row lock, is greater than the token it replaces.
// (The fence package issues lease tokens by the same rule.)
//
// # Round trips
//
// Statements are prepared once per connection (pgx's default
// QueryExecModeCacheStatement) and each method runs one: a first execution costs two
// round trips (Claim, Complete), a replay one (Claim). pgxpool itself pings a
// connection that sat idle for more than a second before handing it out; set
// pgxpool.Config.ShouldPing to change that.
//
// # Transaction mode
//
// Store.WithTx runs a handler's business writes and the completion of its key in one
// transaction, so "work done, result not stored" cannot happen: both commit or neither
// does. A completion with a stale token (the key was taken over) rolls the business
// write back too. When the connection fails during COMMIT, WithTx reads the record to
// learn whether the transaction committed; see WithTx.
//
// # Janitor and durability
//
// Records stay after expires_at until Store.DeleteExpired removes them, in batches
// (Claim treats them as absent meanwhile); run it periodically. Records are as durable
// as the database: under PostgreSQL's default synchronous_commit a claim or completion
// that returned survives a crash.
package pgstore

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/idempotency"
)

//go:embed schema.sql
var schemaSQL string

// claimTries bounds the re-runs of the claim statement when a concurrent transaction
// changed the row after the statement's snapshot.
const claimTries = 10

// Config configures a Store. The zero value of each field but Pool means its default.
type Config struct {
	// Pool is the connection pool. Required; the Store never closes it.
	Pool *pgxpool.Pool
	// Schema is the schema of the table and its sequence. Default "public".
	Schema string
	// Table is the name of the records table. Default "retrysafe_idempotency".
	Table string
}

// Store is an idempotency.Store on PostgreSQL. It also implements idempotency.Janitor,
// idempotency.Lister and idempotency.Pinger. It is safe for concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	table string // quoted, schema-qualified
	sql   statements
}

type statements struct {
	schema, claim, takeover, complete, extend, release, get, delete, deleteExpired string
}

var (
	_ idempotency.Store   = (*Store)(nil)
	_ idempotency.Janitor = (*Store)(nil)
	_ idempotency.Lister  = (*Store)(nil)
	_ idempotency.Pinger  = (*Store)(nil)
)

const recordColumns = `scope, key, fingerprint, state, token, created_at, lease_until, expires_at,
	status, header, body, body_omitted`

// claimable is the claim condition, on the row r and the parameters $3 (fingerprint)
// and $4 (now).
const claimable = `(r.expires_at <= $4 OR
	(r.state = 'in_progress' AND r.lease_until <= $4 AND r.fingerprint = $3))`

// New returns a Store on cfg.Pool. Schema and Table must be lowercase SQL identifiers
// (letters, digits and underscores, not starting with a digit), the schema at most 63
// bytes and the table at most 48, so that the names derived from it fit PostgreSQL's
// limit. New does no I/O; call Migrate to create the table.
func New(cfg Config) (*Store, error) {
	if cfg.Pool == nil {
		return nil, errors.New("pgstore: Config.Pool is nil")
	}
	schema := cmp.Or(cfg.Schema, "public")
	table := cmp.Or(cfg.Table, "retrysafe_idempotency")
	if !validName(schema, 63) {
		return nil, fmt.Errorf("pgstore: invalid schema name %q", schema)
	}
	if !validName(table, 48) {
		return nil, fmt.Errorf("pgstore: invalid table name %q", table)
	}
	s := &Store{pool: cfg.Pool, table: pgx.Identifier{schema, table}.Sanitize()}
	r := strings.NewReplacer(
		"{schema}", pgx.Identifier{schema}.Sanitize(),
		"{table}", s.table,
		"{sequence}", pgx.Identifier{schema, table + "_token_seq"}.Sanitize(),
		"{index}", pgx.Identifier{table + "_expires_at_idx"}.Sanitize(),
	)
	s.sql = statements{
		schema: r.Replace(schemaSQL),
		// A replay, a 409 or a 422 is answered by this one statement without locking or
		// writing anything: the INSERT runs only when the snapshot has no row.
		claim: r.Replace(`WITH existing AS (
	SELECT ` + recordColumns + ` FROM {table} WHERE scope = $1 AND key = $2
), claimed AS (
	INSERT INTO {table} (scope, key, fingerprint, state, token, created_at, lease_until, expires_at)
	SELECT $1, $2, $3, 'in_progress', nextval('{sequence}'), $4, $5, $6
	WHERE NOT EXISTS (SELECT FROM existing)
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING ` + recordColumns + `
)
SELECT true, false, ` + recordColumns + ` FROM claimed
UNION ALL
SELECT false, ` + claimable + `, ` + recordColumns + ` FROM existing AS r`),
		// Replaces a claimable record seen with token $7. Under READ COMMITTED the WHERE
		// is re-checked on the latest row after its lock, so of concurrent takeovers one
		// wins, and its token, drawn after the lock, exceeds the one it replaces.
		takeover: r.Replace(`UPDATE {table} AS r SET
	fingerprint = $3, state = 'in_progress', token = nextval('{sequence}'),
	attempts = CASE WHEN r.expires_at <= $4 THEN 1 ELSE r.attempts + 1 END,
	created_at = CASE WHEN r.expires_at <= $4 THEN $4 ELSE r.created_at END,
	lease_until = $5, expires_at = $6, completed_at = NULL,
	status = NULL, header = NULL, body = NULL, body_omitted = false
WHERE scope = $1 AND key = $2 AND token = $7 AND ` + claimable + `
RETURNING token, attempts > 1`),
		complete: r.Replace(`UPDATE {table} SET state = 'done', status = $4, header = $5, body = $6,
	body_omitted = $7, completed_at = $8, expires_at = $9
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'`),
		extend: r.Replace(`UPDATE {table} SET lease_until = $4
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'`),
		release: r.Replace(`DELETE FROM {table}
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'`),
		get:    r.Replace(`SELECT ` + recordColumns + ` FROM {table} WHERE scope = $1 AND key = $2`),
		delete: r.Replace(`DELETE FROM {table} WHERE scope = $1 AND key = $2`),
		// SKIP LOCKED: janitors never wait for each other nor for a claim holding a row.
		deleteExpired: r.Replace(`DELETE FROM {table} WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM {table} WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED))`),
	}
	return s, nil
}

func validName(s string, maxLen int) bool {
	if s == "" || len(s) > maxLen || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Migrate creates the schema, the token sequence, the table and its index when they do
// not exist. It is idempotent, and concurrent calls (from several replicas) are safe:
// they run one at a time under a transaction-level advisory lock.
func (s *Store) Migrate(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, s.sql.schema) // no arguments: simple protocol, several statements
		return err
	})
	if err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	return nil
}

// Claim implements idempotency.Store in one statement (see the package doc).
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	args := []any{[]byte(req.Scope), []byte(req.Key), []byte(req.Fingerprint), req.Now, req.LeaseUntil, req.ExpiresAt}
	for range claimTries {
		var claimed, claimable bool
		rec, err := scanRecord(s.pool.QueryRow(ctx, s.sql.claim, args...), &claimed, &claimable)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // inserted by another transaction after this statement's snapshot
		case err != nil:
			return idempotency.ClaimResult{}, fmt.Errorf("pgstore: claim: %w", err)
		case claimed:
			return idempotency.ClaimResult{Claimed: true, Token: rec.Token}, nil
		case !claimable:
			return idempotency.ClaimResult{Existing: rec}, nil
		}
		// Expired, or in progress with its lease run out: replace it, unless another
		// claim got there first (then look again).
		var res idempotency.ClaimResult
		err = s.pool.QueryRow(ctx, s.sql.takeover, append(args, rec.Token)...).Scan(&res.Token, &res.TookOver)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue
		case err != nil:
			return idempotency.ClaimResult{}, fmt.Errorf("pgstore: claim: %w", err)
		}
		res.Claimed = true
		return res, nil
	}
	return idempotency.ClaimResult{}, fmt.Errorf("pgstore: claim: the record kept changing under %d attempts", claimTries)
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, c idempotency.Completion) error {
	return s.complete(ctx, s.pool, c)
}

// execer is a pool, a connection or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func (s *Store) complete(ctx context.Context, db execer, c idempotency.Completion) error {
	var header []byte
	if c.Response.Header != nil {
		var err error
		if header, err = json.Marshal(c.Response.Header); err != nil {
			return fmt.Errorf("pgstore: complete: encoding header: %w", err)
		}
	}
	return fenced(ctx, db, "complete", s.sql.complete, []byte(c.Scope), []byte(c.Key), c.Token,
		c.Response.Status, header, c.Response.Body, c.Response.BodyOmitted, c.Now, c.ExpiresAt)
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, scope, key string, token int64, leaseUntil time.Time) error {
	return fenced(ctx, s.pool, "extend", s.sql.extend, []byte(scope), []byte(key), token, leaseUntil)
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	return fenced(ctx, s.pool, "release", s.sql.release, []byte(scope), []byte(key), token)
}

// fenced runs a statement conditioned on the caller's token; no row means the caller
// lost the lease.
func fenced(ctx context.Context, db execer, op, sql string, args ...any) error {
	tag, err := db.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("pgstore: %s: %w", op, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: %s: %w", op, idempotency.ErrLeaseLost)
	}
	return nil
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	rec, err := scanRecord(s.pool.QueryRow(ctx, s.sql.get, []byte(scope), []byte(key)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, idempotency.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("pgstore: get: %w", err)
	}
	return rec, nil
}

// Delete implements idempotency.Store.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if _, err := s.pool.Exec(ctx, s.sql.delete, []byte(scope), []byte(key)); err != nil {
		return fmt.Errorf("pgstore: delete: %w", err)
	}
	return nil
}

// DeleteExpired implements idempotency.Janitor: it deletes at most limit records with
// expires_at <= now, skipping rows other transactions hold locked (the next call gets
// them). A limit of zero deletes nothing; a negative limit is an error.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("pgstore: delete expired: negative limit %d", limit)
	}
	if limit == 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, s.sql.deleteExpired, now, limit)
	if err != nil {
		return 0, fmt.Errorf("pgstore: delete expired: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// List implements idempotency.Lister: pages in (scope, key) order (bytewise, as Go
// compares strings), by keyset pagination on the primary key.
func (s *Store) List(ctx context.Context, f idempotency.ListFilter) (idempotency.ListPage, error) {
	limit := cmp.Or(f.Limit, 100)
	if limit < 0 {
		return idempotency.ListPage{}, fmt.Errorf("pgstore: list: negative limit %d", f.Limit)
	}
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if f.Scope != "" {
		where = append(where, "scope = "+arg([]byte(f.Scope)))
	}
	if f.State != "" {
		where = append(where, "state = "+arg(string(f.State)))
	}
	if f.After != "" {
		scope, key, err := decodeCursor(f.After)
		if err != nil {
			return idempotency.ListPage{}, fmt.Errorf("pgstore: list: %w", err)
		}
		where = append(where, "(scope, key) > ("+arg(scope)+", "+arg(key)+")")
	}
	q := "SELECT " + recordColumns + " FROM " + s.table
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY scope, key LIMIT " + arg(limit+1)

	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return idempotency.ListPage{}, fmt.Errorf("pgstore: list: %w", err)
	}
	defer rows.Close()
	var page idempotency.ListPage
	for rows.Next() {
		if len(page.Records) == limit {
			last := page.Records[limit-1]
			page.Next = encodeCursor(last.Scope, last.Key)
			break
		}
		rec, err := scanRecord(rows)
		if err != nil {
			return idempotency.ListPage{}, fmt.Errorf("pgstore: list: %w", err)
		}
		page.Records = append(page.Records, *rec)
	}
	if err := rows.Err(); err != nil {
		return idempotency.ListPage{}, fmt.Errorf("pgstore: list: %w", err)
	}
	return page, nil
}

// Ping implements idempotency.Pinger.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("pgstore: ping: %w", err)
	}
	return nil
}

// encodeCursor returns the opaque cursor after (scope, key): base64url of the scope's
// length, the scope and the key.
func encodeCursor(scope, key string) string {
	b := binary.AppendUvarint(nil, uint64(len(scope)))
	return base64.RawURLEncoding.EncodeToString(append(append(b, scope...), key...))
}

func decodeCursor(cursor string) (scope, key []byte, err error) {
	b, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return nil, nil, fmt.Errorf("invalid cursor: %w", err)
	}
	n, size := binary.Uvarint(b)
	if size <= 0 || n > uint64(len(b)-size) {
		return nil, nil, errors.New("invalid cursor")
	}
	b = b[size:]
	return b[:n], b[n:], nil
}

// scanRecord scans lead, then recordColumns.
func scanRecord(row pgx.Row, lead ...any) (*idempotency.Record, error) {
	var (
		r                       idempotency.Record
		scope, key, fingerprint []byte
		state                   string
		status                  *int32
		header, body            []byte
		omitted                 bool
	)
	dest := append(lead, &scope, &key, &fingerprint, &state, &r.Token,
		&r.CreatedAt, &r.LeaseUntil, &r.ExpiresAt, &status, &header, &body, &omitted)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	r.Scope, r.Key, r.Fingerprint = string(scope), string(key), string(fingerprint)
	r.State = idempotency.State(state)
	if r.State == idempotency.StateDone {
		resp := &idempotency.Response{Body: body, BodyOmitted: omitted}
		if status != nil {
			resp.Status = int(*status)
		}
		if header != nil {
			if err := json.Unmarshal(header, &resp.Header); err != nil {
				return nil, fmt.Errorf("decoding header of %q/%q: %w", r.Scope, r.Key, err)
			}
		}
		r.Response = resp
	}
	return &r, nil
}
