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
// # Batching
//
// With Config.Batch, Claim and Complete calls that arrive together share one statement
// of each kind (the arrays of their parameters, unnest-ed): group commit by the
// application. A call that finds fewer than two statements of its kind in flight starts
// one at once, so a lone request waits for nothing, and a batch of one runs the single-
// key statement, so it costs what it would without batching; under load, the calls that
// arrive during a statement go together in the next (at most 128), and a second call
// on a key already in the batch runs alone at once. Each call learns its own outcome, exactly as without batching. When the server rejects a batch, each of
// its calls is run alone, so one bad request (a header value jsonb refuses) fails only
// itself. Rows are taken in (scope, key) order in every batch, so batches of several
// replicas cannot deadlock. Takeovers, Extend, Release and completions inside WithTx
// are never batched.
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
	"github.com/retrysafe/retrysafe/internal/batch"
	"github.com/retrysafe/retrysafe/internal/pgddl"
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
	// Batch makes concurrent Claim calls share one statement, and concurrent Complete
	// calls another: group commit, which under concurrent load cuts the statements and
	// WAL flushes the store costs PostgreSQL by the batch size, while a lone request
	// waits for nothing (see "Batching" in the package doc). Results, round trips per
	// request and guarantees are the same as without it. Default false.
	Batch bool
}

// Store is an idempotency.Store on PostgreSQL. It also implements idempotency.Janitor,
// idempotency.Lister and idempotency.Pinger. It is safe for concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	table string // quoted, schema-qualified
	sql   statements

	claims    *batch.Group[*claimCall]    // nil without Config.Batch
	completes *batch.Group[*completeCall] // nil without Config.Batch
}

type statements struct {
	schema, claim, takeover, complete, extend, release, get, delete, deleteExpired string
	claimBatch, completeBatch                                                      string
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

// claimableBatch is claimable for the batched claim: on the row r and the call's input
// row i.
const claimableBatch = `(r.expires_at <= i.now OR
	(r.state = 'in_progress' AND r.lease_until <= i.now AND r.fingerprint = i.fingerprint))`

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
	if !pgddl.ValidName(schema, 63) {
		return nil, fmt.Errorf("pgstore: invalid schema name %q", schema)
	}
	if !pgddl.ValidName(table, 48) {
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
		// The claim statement for many keys: parameters are arrays, one element per
		// call, sorted by (scope, key); each result row carries its call's position.
		claimBatch: r.Replace(`WITH input AS (
	SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::timestamptz[], $5::timestamptz[], $6::timestamptz[])
		WITH ORDINALITY AS i(scope, key, fingerprint, now, lease_until, expires_at, ord)
), existing AS (
	SELECT i.ord, ` + claimableBatch + ` AS claimable, ` + qualify("r", recordColumns) + `
	FROM input AS i JOIN {table} AS r ON r.scope = i.scope AND r.key = i.key
), claimed AS (
	INSERT INTO {table} (scope, key, fingerprint, state, token, created_at, lease_until, expires_at)
	SELECT i.scope, i.key, i.fingerprint, 'in_progress', nextval('{sequence}'), i.now, i.lease_until, i.expires_at
	FROM input AS i WHERE NOT EXISTS (SELECT FROM existing AS e WHERE e.ord = i.ord)
	ORDER BY i.ord
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING ` + recordColumns + `
)
SELECT i.ord, true, false, ` + qualify("c", recordColumns) + `
FROM claimed AS c JOIN input AS i ON i.scope = c.scope AND i.key = c.key
UNION ALL
SELECT e.ord, false, e.claimable, ` + qualify("e", recordColumns) + ` FROM existing AS e`),
		completeBatch: r.Replace(`UPDATE {table} AS r SET state = 'done', status = u.status,
	header = u.header::jsonb, body = u.body, body_omitted = u.body_omitted,
	completed_at = u.completed_at, expires_at = u.expires_at
FROM unnest($1::bytea[], $2::bytea[], $3::int8[], $4::int4[], $5::text[], $6::bytea[], $7::bool[], $8::timestamptz[], $9::timestamptz[])
	WITH ORDINALITY AS u(scope, key, token, status, header, body, body_omitted, completed_at, expires_at, ord)
WHERE r.scope = u.scope AND r.key = u.key AND r.token = u.token AND r.state = 'in_progress'
RETURNING u.ord`),
	}
	if cfg.Batch {
		// Duplicates of a key in a batch (a storm of retries of one request) run alone,
		// as they would without batching.
		s.claims = &batch.Group[*claimCall]{Run: s.runClaims, InFlight: batchInFlight,
			Alone: func(c *claimCall) { s.claimAlone(c.Ctx(), c) }}
		s.completes = &batch.Group[*completeCall]{Run: s.runCompletes, InFlight: batchInFlight,
			Alone: func(c *completeCall) { s.completeAlone(c.Ctx(), c) }}
	}
	return s, nil
}

// Migrate creates the schema, the token sequence, the table and its index when they do
// not exist. It is idempotent, and concurrent calls (from several replicas) are safe:
// they run one at a time under a transaction-level advisory lock.
func (s *Store) Migrate(ctx context.Context) error {
	if err := pgddl.Apply(ctx, s.pool, s.sql.schema); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	return nil
}

// Claim implements idempotency.Store in one statement (see the package doc).
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	args := s.claimArgs(req)
	for range claimTries {
		rec, claimed, claimable, err := s.claimRow(ctx, req, args)
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

func (s *Store) claimArgs(req idempotency.ClaimRequest) []any {
	return []any{[]byte(req.Scope), []byte(req.Key), []byte(req.Fingerprint), req.Now, req.LeaseUntil, req.ExpiresAt}
}

// claimRow runs the claim statement for req, alone or in a batch. err is pgx.ErrNoRows
// when the statement found no row for req.
func (s *Store) claimRow(ctx context.Context, req idempotency.ClaimRequest, args []any) (rec *idempotency.Record, claimed, claimable bool, err error) {
	if s.claims == nil {
		rec, err = scanRecord(s.pool.QueryRow(ctx, s.sql.claim, args...), &claimed, &claimable)
		return rec, claimed, claimable, err
	}
	c := &claimCall{req: req}
	if err := s.claims.Do(ctx, c); err != nil {
		return nil, false, false, err
	}
	switch {
	case c.err != nil:
		return nil, false, false, c.err
	case !c.found:
		return nil, false, false, pgx.ErrNoRows
	}
	return c.rec, c.claimed, c.claimable, nil
}

// noRows is err, or nil for pgx.ErrNoRows.
func noRows(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, c idempotency.Completion) error {
	if s.completes != nil {
		return s.completeBatched(ctx, c)
	}
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
