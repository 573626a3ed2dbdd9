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
//	route                     what the claim was filed under (ClaimRequest.Route); NULL: none
//	abandoned                 the owner gave up without knowing the outcome (Store.Abandon)
//	claim_id                  '<token>:<ID>' of the claim that holds it (ClaimRequest.ID); NULL: none
//	created_at, lease_until, expires_at, completed_at   timestamptz (microseconds)
//	kept_until                a done record's expiry, when it differs from expires_at
//	status, headers, body, body_omitted                 the stored response, once done
//	header                    jsonb, read for records written by stores without headers
//
// headers is bytea: the response's header and trailer as internal/headercodec encodes
// them, so values are kept byte for byte (not UTF-8, NUL included) and multi-valued
// headers intact. A sequence, <table>_token_seq, issues the fencing tokens, and an index
// on expires_at serves the janitor.
//
// A completion writes no indexed column, so that PostgreSQL can make it a HOT update
// (the new row version on the same page, no index entry added, the old one pruned in
// place): it costs about half the index work a claim-then-update would otherwise cost,
// and leaves no dead index entries for vacuum. The completion's expiry goes in
// kept_until, which no index covers, and expires_at keeps the claim's: a completed
// record expires at kept_until (see expiry), and the janitor finds it once expires_at
// has passed too. The table's fillfactor (50) leaves each page the
// room its records' completions take. The DDL is embedded (schema.sql) and applied by
// Store.Migrate, idempotently and under a transaction-level advisory lock, so replicas
// may all migrate as they start.
//
// # Privileges
//
// Migrate first reads the catalogs, which every role may: when the schema, the
// sequence, the table with every column and the index are there, it creates nothing, so
// it needs no privilege to create anything. Run it once as a role that may create them
// (the schema's owner; retrysafe migrate), then serve as a role with only USAGE on the
// schema, SELECT, INSERT, UPDATE and DELETE on the table and USAGE on the sequence:
// its Migrate, as a replica starts, checks those privileges and changes nothing. When
// something is missing and the role may not create it, or a privilege is missing,
// Migrate returns a *SchemaError that names them.
//
// # Migration from a jsonb header column
//
// A table of version 1 of the schema, without the headers and abandoned columns, keeps
// the response header as JSON text in header (jsonb), which turns bytes that are not
// UTF-8 into U+FFFD and has no trailer. Migrate adds headers (bytea, NULL) and abandoned
// (boolean, default false) in place: neither rewrites the table, and once they exist
// Migrate takes no lock on the table at all, so a replica starting beside running ones
// waits for nothing. The header column stays, nullable. Records already in the table
// (they live as long as their TTL) read as they were written: a completion writes the
// headers column and JSON null into header, and a record is read from headers when
// header holds that JSON null, and from header otherwise. So a store that knows only
// version 1, run against a migrated table (during a rolling upgrade or after a
// rollback), still reads these records' status and body (with no header: JSON null
// decodes to none), and a record it completes is read from its header column, never
// from stale bytes in headers.
//
// The route column (text, NULL) is added in place the same way, to tables of either
// version; records written before it read with no route. A store that predates it
// leaves it as it was when it takes a record over or replaces an expired one, so during
// a rolling upgrade such a record may show the route of the claim before (for a
// takeover, the same request's). The claim_id column (text, NULL) is added in place
// too; a store that predates it leaves it as it was when it takes a record over, which
// is why it holds the token with the claim's ID: a record taken over so has another
// token, and is no longer the first claim's own.
//
// # Time
//
// Leases and expiry are decided on the database server's clock: every statement reads
// statement_timestamp() and adds the request's durations to it, so replicas whose
// clocks disagree still agree on when a lease ends and a record expires. Config.Clock
// replaces that clock (tests drive time with it); it reaches the same statements as a
// parameter, coalesce($n, statement_timestamp()), which is NULL without it.
//
// # Claim in one statement
//
// Claim is a single statement, so one round trip:
//
//	WITH clock    AS (SELECT coalesce($4, statement_timestamp()) AS now),
//	     existing AS (SELECT <lean record>, <claimable> FROM … WHERE scope = $1 AND key = $2),
//	     claimed  AS (INSERT … SELECT …, nextval(seq), … WHERE NOT EXISTS (SELECT FROM existing)
//	                  ON CONFLICT (scope, key) DO NOTHING RETURNING …)
//	SELECT <claimed row> UNION ALL SELECT <existing row, and whether it is claimable>
//
// The primary key makes exactly one of any number of concurrent claims win. When the key
// exists, nothing is inserted, locked or written: a replay, a 409 or a 422 is a plain
// read, so duplicates of one key never queue behind each other or behind a transaction
// that holds the record, and cost no WAL flush. The existing record is lean: its status,
// headers and body are selected under CASE WHEN the record is a replay (done, not
// expired, same fingerprint), and PostgreSQL does not read (detoast) a column that a
// CASE does not evaluate, so a 409 or a 422 never reads a stored body, however large.
// Under READ COMMITTED a row inserted by another transaction after the statement's
// snapshot makes the statement return no row; Claim then runs it again (at most 10
// times).
//
// A claim with an ID (idempotency.ClaimRequest.ID) writes it with the record, and one
// that finds an in-progress record holding its ID and token is the claimer's own
// earlier attempt, whose answer was lost: it is granted again, by a second statement
// that writes the record without changing it, so that the grant, like any claim, rests
// on an acknowledged write (see "Durability and replication") rather than on a read.
//
// A record is claimable when it is done and expired, or in progress with its lease run
// out, when the request may take it over at the statement's instant (its NoTakeover and
// TakeoverBy, as one limit: idempotency.ClaimRequest.TakeoverLimit), and with the same
// fingerprint or expired
// (then it is replaced as by a fresh claim). An in-progress record whose lease runs is
// never claimable, whatever its expiry. Only for a claimable record does a second
// statement replace it: an UPDATE conditioned on the token that was read and on the
// same rule, which PostgreSQL re-checks on the latest row after taking its lock, so of
// concurrent takeovers exactly one wins, and a renewal (Extend) that commits first
// keeps the record. Tokens come from the sequence, for fresh claims and takeovers
// alike, so they are never reused, and a takeover's token, drawn after the row lock, is
// greater than the token it replaces. (The fence package issues lease tokens by the
// same rule.)
//
// # Round trips
//
// Statements are prepared once per connection (pgx's default
// QueryExecModeCacheStatement; the batched ones are prepared again as the
// table grows, see replanAfter), and each method runs one: a first execution costs two
// round trips (Claim, Complete), a replay one (Claim). A fenced write (Extend, Abandon,
// Complete, Release) that changes no row runs a second statement to say why (no record:
// idempotency.ErrRecordGone; another token or done: ErrLeaseLost; a completion sent
// again: written again). pgxpool itself pings a connection that sat idle for more than
// a second before handing it out; set pgxpool.Config.ShouldPing to change that.
//
// A call whose connection broke (the server went away, a failover, a reset) while its
// context still runs is made once more on a fresh connection, after pgxpool.Pool.Reset
// closed the pool's idle ones: a failover breaks them all, and those used in the last
// second are handed out without a ping. Sending any of the store's statements again is
// safe: a claim with its ID finds its own record (without an ID, a claim whose first
// attempt was applied finds the record in flight, which the error it replaces would
// have left too), a completion sent again is confirmed, Extend and Abandon repeat
// themselves, and a release sent again reports ErrRecordGone.
//
// # Batching
//
// With Config.Batch, Claim and Complete calls that arrive together share one statement
// of each kind (the arrays of their parameters, unnest-ed): group commit by the
// application. A call that finds no statement of its kind in flight starts one (at
// once, unless it gathers under load, below), so a lone request waits for nothing, and
// a batch of one runs the single-key statement, so it costs what it would without
// batching; under load, the calls that arrive during a statement go together in the
// next (at most 128), so that batches grow with the load, and a second call on a key
// already in the batch runs alone at once. Each call learns its own outcome, exactly as
// without batching: the batched statements apply the same rules, each call with its own
// clock reading (NULL, the server's clock, without Config.Clock). When the server
// rejects a batch, each of its calls is run alone, so one bad request fails only
// itself. Rows are taken in (scope, key) order in every batch, so batches of several
// replicas cannot deadlock.
// Takeovers, Extend, Abandon, Release and completions inside WithTx are never batched.
//
// Under a load of several concurrent requests a batch also waits, up to Config.Gather
// (DefaultGather), for more calls before it is sent, and is sent as soon as half the
// store's open requests (claimed, or claiming, and not yet completed, released or
// abandoned), or 16, are waiting: fewer requests cannot fill a batch of 16, and would
// otherwise wait the whole window at each call. With one batch of each kind in flight,
// batches otherwise come as fast as the
// server turns them round, holding what arrived meanwhile: at 32 clients through the
// gateway, about 5 calls on average, and three in ten batches held a single call. Each
// costs PostgreSQL a round trip, an executor start, a commit and a WAL flush, so fewer,
// larger batches cost it less per request; on a server that the load keeps busy they
// also answer sooner, since its CPU is what every call waits for. A lone request, one
// call after another, never waits (see internal/batch); on a server with CPU to spare a
// call under load can wait up to Gather longer.
// The batched statements are planned at each execution from the table's statistics, so
// the table must be analyzed (autovacuum, PostgreSQL's default, does it): one that never
// was is scanned whole by every completion batch.
//
// # Transaction mode
//
// Store.WithTx runs a handler's business writes and the completion of its key in one
// transaction, so "work done, result not stored" cannot happen: both commit or neither
// does. A completion with a stale token (the key was taken over) rolls the business
// write back too. BEGIN goes to the server with the handler's first statement and the
// completion with COMMIT, so a handler of one statement costs two round trips (and the
// claim before it one). When the outcome of COMMIT is unknown, WithTx settles it by a
// write (the completion sent again), never by reading the record; see WithTx.
//
// # Janitor
//
// Records stay after they expire until Store.DeleteExpired removes them, in batches
// (Claim treats them as described above meanwhile); run it periodically. It never
// deletes an in-progress record whose lease runs, and re-checks that on the latest row,
// so a renewal that commits first keeps the record.
//
// # Durability and replication
//
// A claim or a completion counts once its commit is acknowledged: records are as
// durable as that acknowledgement. On one server, under PostgreSQL's default
// synchronous_commit (on), a claim or completion that returned survives a crash.
//
// With a synchronous standby (synchronous_standby_names naming it), a commit returns
// only once the standby has flushed it, so a standby promoted after the primary is lost
// has every claim and completion that returned: a key never runs twice across the
// failover. Writes whose outcome is unknown are errors, never taken as stored: a
// connection lost during the commit; a call whose deadline ended; and a commit whose
// wait for the standby was cancelled (by the cancel request pgx sends when the call's
// deadline ends, pg_cancel_backend, a fast shutdown), which PostgreSQL reports as a
// success with a warning that the transaction is committed on the primary but perhaps
// on no standby: on a pool prepared by ConfigurePool (or made by NewPool) the store
// catches that warning and returns an error wrapping idempotency.ErrNotDurable, so that
// a write that timed out waiting for a lost standby says so. A completion sent again after such an error finds the
// record done under its token, and writes it again, unchanged: that write waits for the
// standby like any other, so its acknowledgement confirms the first; a claim sent again
// with its ID is granted its own record the same way. Nothing is confirmed by reading a
// record back from a primary that may be lost.
//
// While the synchronous standby is away, every write waits. Ping makes a write (a
// transactional message in the WAL, which needs no privilege) and reports
// idempotency.ErrNotDurable when it is not acknowledged within Config.ProbeTimeout while
// the server answers; the middleware then fails new claims at once with 503, and a
// gateway's /readyz answers 503, until the standby is back. The backends of writes whose
// deadline ended while they waited do not pile up: the cancel request ends the
// server's wait.
//
// With asynchronous standbys only, a commit returns before any standby has it: a
// failover may lose the claims and completions acknowledged last, and their keys may
// run again (a completed key executes a second time, an in-flight one beside its
// owner). That is the window of asynchronous replication; use a synchronous standby to
// close it.
//
// Give the store's pool every node, with target_session_attrs=read-write
// (postgres://u@primary:5432,standby:5432/db?target_session_attrs=read-write): after a
// promotion new connections reach the new primary, and a call whose connection the
// failover broke runs once more on one of them (see "Round trips").
//
// # Inspecting the setup
//
// Store.Inspect (idempotency.Inspector, behind `retrysafe doctor` and the gateway's
// checks at start) reads, without writing, what the server's settings mean for that
// promise: whether it is a standby (refused: it takes no writes), fsync,
// synchronous_commit, synchronous_standby_names and each standby's sync_state (an
// asynchronous standby can lose the last completed keys to a failover), and a
// synchronous standby named but not connected (commits wait). A role without
// pg_read_all_stats (or pg_monitor) cannot see the standbys' sync_state; it gets a
// warning naming the grant, not an error.
package pgstore

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/batch"
	"github.com/retrysafe/retrysafe/internal/headercodec"
	"github.com/retrysafe/retrysafe/internal/inflight"
	"github.com/retrysafe/retrysafe/internal/listcursor"
	"github.com/retrysafe/retrysafe/internal/pgddl"
	"github.com/retrysafe/retrysafe/internal/sqlname"
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
	// Gather is the longest a batch waits for more calls before it is sent, while
	// calls come from several requests at once (see "Batching" in the package doc).
	// Zero: DefaultGather; negative: a batch is sent at once with what is pending. Only
	// with Batch.
	Gather time.Duration
	// Clock, when set, is the clock of every lease and expiry decision, read once per
	// call and sent with the statement. Nil (the default) means the database server's
	// clock (statement_timestamp()), the same for every process that shares the
	// database. Replicas must leave it nil: processes whose clocks disagree would
	// otherwise disagree on when a lease ends, and take over a live owner's key. Tests
	// set it to move time.
	Clock func() time.Time
	// ProbeTimeout is how long Ping waits for its write to be acknowledged before it
	// reports the store not durable (idempotency.ErrNotDurable): with synchronous
	// replication, a commit waits for the synchronous standby. Negative: Ping does not
	// write, it only checks that the server answers. Default DefaultProbeTimeout.
	ProbeTimeout time.Duration
}

// Store is an idempotency.Store on PostgreSQL. It also implements idempotency.Janitor,
// idempotency.Lister and idempotency.Pinger. It is safe for concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	table string // quoted, schema-qualified
	clock func() time.Time
	probe time.Duration // Config.ProbeTimeout
	names struct {
		schema, table, sequence, index string
		claimBatch, completeBatch      string // the batched statements' prepared names
	}
	replan  atomic.Int64 // time.Duration: the batched statements are prepared again when older
	created atomic.Int64 // records created by claims, which the batched statements' plans follow
	sql     statements

	claims    *batch.Group[*claimCall]    // nil without Config.Batch
	completes *batch.Group[*completeCall] // nil without Config.Batch
	inflight  inflight.Claims             // what the batches gather for
}

type statements struct {
	schema, claim, takeover, reclaim, complete, completeTx, extend, abandon, release, exists, again string
	get, delete, deleteExpired, claimBatch, completeBatch                                           string
}

var (
	_ idempotency.Store   = (*Store)(nil)
	_ idempotency.Janitor = (*Store)(nil)
	_ idempotency.Lister  = (*Store)(nil)
	_ idempotency.Pinger  = (*Store)(nil)
)

// recordColumns are the columns scanRecord reads, in its order.
const recordColumns = `scope, key, fingerprint, state, token, abandoned, created_at, lease_until, expires_at,
	status, header, headers, body, body_omitted`

// countedColumns are the columns scanCounted reads: Get's and List's.
const countedColumns = `attempts, route, ` + storedColumns

// storedColumns are recordColumns read from the table: the record's expiry is
// kept_until when a completion set it (see expiry).
const storedColumns = `scope, key, fingerprint, state, token, abandoned, created_at, lease_until,
	(CASE WHEN kept_until >= completed_at THEN kept_until ELSE expires_at END) AS expires_at,
	status, header, headers, body, body_omitted`

// expiry is the instant the record with the given alias (or none: "") expires: the
// completion's kept_until, when the current completion wrote it, else expires_at. A
// completion leaves expires_at, which is indexed, as the claim wrote it, so that its
// update can be HOT; the janitor finds candidates by expires_at. A kept_until earlier
// than completed_at is not the current completion's: a store of the schema without
// kept_until, taking over an expired record and completing it during a rolling
// upgrade, writes completed_at and expires_at and leaves the kept_until of the record
// it replaced, which passed before that takeover.
func expiry(alias string) string {
	if alias != "" {
		alias += "."
	}
	return "(CASE WHEN " + alias + "kept_until >= " + alias + "completed_at THEN " + alias + "kept_until ELSE " + alias + "expires_at END)"
}

// headerMarker is what a completion writes into the jsonb header column: JSON null,
// which says that the header is in headers, and which stores of the schema without
// headers decode as no header.
const headerMarker = `'null'::jsonb`

// clockParam is the decision instant of a statement whose parameter $n is the
// Config.Clock reading, or NULL for the server's clock.
func clockParam(n int) string {
	return "coalesce($" + strconv.Itoa(n) + "::timestamptz, statement_timestamp())"
}

// claimable is the rule by which a claim replaces the record r (see Store.Claim), at
// instant now, for a request with fingerprint fp whose takeover limit is limit.
func claimable(now, fp, limit string) string {
	return `((r.state = 'done' AND ` + expiry("r") + ` <= ` + now + `) OR
	(r.state = 'in_progress' AND r.lease_until <= ` + now + ` AND ` + now + ` <= ` + limit + `
		AND (` + expiry("r") + ` <= ` + now + ` OR r.fingerprint = ` + fp + `)))`
}

// leanColumns are recordColumns of the row r as a lost claim reads them: the stored
// response only when the claim replays it (done, not expired, same fingerprint). A
// CASE that does not evaluate a column does not read it, so a 409 or a 422 never
// detoasts a stored body.
func leanColumns(now, fp string) string {
	replay := `r.state = 'done' AND ` + expiry("r") + ` > ` + now + ` AND r.fingerprint = ` + fp
	cols := `r.scope, r.key, r.fingerprint, r.state, r.token, r.abandoned, r.created_at, r.lease_until, ` + expiry("r") + ` AS expires_at`
	for _, c := range []string{"status", "header", "headers", "body"} {
		cols += ",\n\tCASE WHEN " + replay + " THEN r." + c + " END AS " + c
	}
	return cols + ", r.body_omitted"
}

// gone is the janitor's rule on the row r at instant now: expired, and not in progress
// with its lease running; expires_at, which the index holds, passed too.
func gone(now string) string {
	return `(r.expires_at <= ` + now + ` AND ` + expiry("r") + ` <= ` + now + ` AND (r.state = 'done' OR r.lease_until <= ` + now + `))`
}

// claimMark is what the claim_id column holds for a record claimed by the claim with
// ID id under token: '<token>:<ID>', or NULL for a claim without an ID. The token is
// part of it so that a record taken over by a store that predates the column, which
// leaves the column as it was, is not the first claim's own any more.
func claimMark(token, id string) string {
	return `(` + token + ` || ':' || ` + id + `)`
}

// ownClaim is whether the row r is the own record of the claim with ID id (NULL: none):
// in progress, and claimed by that claim under its current token.
func ownClaim(id string) string {
	return `((r.state = 'in_progress' AND r.claim_id = ` + claimMark("r.token", id) + `) IS TRUE)`
}

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
	if !sqlname.Valid(schema, 63) {
		return nil, fmt.Errorf("pgstore: invalid schema name %q", schema)
	}
	if !sqlname.Valid(table, 48) {
		return nil, fmt.Errorf("pgstore: invalid table name %q", table)
	}
	s := &Store{pool: cfg.Pool, table: pgx.Identifier{schema, table}.Sanitize(), clock: cfg.Clock,
		probe: cmp.Or(cfg.ProbeTimeout, DefaultProbeTimeout)}
	s.names.schema, s.names.table, s.names.sequence, s.names.index = schema, table, table+"_token_seq", table+"_expires_at_idx"
	r := strings.NewReplacer(
		"{schema}", pgx.Identifier{schema}.Sanitize(),
		"{table}", s.table,
		"{sequence}", pgx.Identifier{schema, table + "_token_seq"}.Sanitize(),
		"{index}", pgx.Identifier{table + "_expires_at_idx"}.Sanitize(),
	)
	now4 := clockParam(4)
	s.sql = statements{
		schema: r.Replace(schemaSQL),
		// $1 scope, $2 key, $3 fingerprint, $4 clock, $5 lease, $6 TTL, $7 takeover limit,
		// $8 route, $9 claim ID (NULL: none). A replay, a 409 or a 422 is answered by this
		// one statement without locking or writing anything: the INSERT runs only when the
		// snapshot has no row. The route is written, never read back: only Get and List
		// read it. own is whether the record is the claimer's: in progress, held under the
		// claim's ID and with the token it was claimed under (see claimMark).
		claim: r.Replace(`WITH clock AS (
	SELECT ` + now4 + ` AS now
), existing AS (
	SELECT ` + claimable("c.now", "$3", "$7::timestamptz") + ` AS claimable,
	` + ownClaim("$9::text") + ` AS own,
	` + leanColumns("c.now", "$3") + `
	FROM {table} AS r, clock AS c WHERE r.scope = $1 AND r.key = $2
), claimed AS (
	INSERT INTO {table} (scope, key, fingerprint, state, token, created_at, lease_until, expires_at, route, claim_id)
	SELECT $1, $2, $3, 'in_progress', n.token, c.now, c.now + $5::interval, c.now + $6::interval, $8::text,
		` + claimMark("n.token", "$9::text") + `
	FROM clock AS c, (SELECT nextval('{sequence}') AS token) AS n
	WHERE NOT EXISTS (SELECT FROM existing)
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING ` + recordColumns + `
)
SELECT true, false, false, c.now, ` + qualify("k", recordColumns) + ` FROM claimed AS k, clock AS c
UNION ALL
SELECT false, e.claimable AND NOT e.own, e.own, c.now, ` + qualify("e", recordColumns) + ` FROM existing AS e, clock AS c`),
		// The claim's parameters and $10, the token of the claimable record it read.
		// Under READ COMMITTED the WHERE is re-checked on the latest row after its lock,
		// so of concurrent takeovers one wins, and a renewal that committed first keeps
		// the record. The new token, drawn from the sequence after the record was read,
		// exceeds the one it replaces, which was drawn before. The route is written
		// again: the record is filed under the route the request now runs under.
		takeover: r.Replace(`WITH n AS (SELECT nextval('{sequence}') AS token)
UPDATE {table} AS r SET
	fingerprint = $3, state = 'in_progress', token = n.token, abandoned = false, route = $8::text,
	claim_id = ` + claimMark("n.token", "$9::text") + `,
	attempts = CASE WHEN ` + expiry("r") + ` <= ` + now4 + ` THEN 1 ELSE r.attempts + 1 END,
	created_at = CASE WHEN ` + expiry("r") + ` <= ` + now4 + ` THEN ` + now4 + ` ELSE r.created_at END,
	lease_until = ` + now4 + ` + $5::interval, expires_at = ` + now4 + ` + $6::interval, kept_until = NULL, completed_at = NULL,
	status = NULL, header = NULL, headers = NULL, body = NULL, body_omitted = false
FROM n
WHERE r.scope = $1 AND r.key = $2 AND r.token = $10 AND ` + claimable(now4, "$3", "$7::timestamptz") + `
RETURNING r.token, r.attempts > 1, ` + now4),
		// The claimer's own record found again (a claim sent again): a write that changes
		// nothing, so that the grant is acknowledged as a write is (see Durability), never
		// read from a server that may be lost. $3 is the record's token, $4 the claim ID.
		reclaim: r.Replace(`UPDATE {table} AS r SET claim_id = r.claim_id
WHERE r.scope = $1 AND r.key = $2 AND r.token = $3 AND ` + ownClaim("$4::text") + `
RETURNING ` + clockParam(5)),
		// $4 status, $5 headers, $6 body, $7 body omitted, $8 clock, $9 TTL. No indexed
		// column changes (the expiry goes in kept_until), so that the update can be HOT.
		complete: r.Replace(`UPDATE {table} SET state = 'done', abandoned = false, status = $4,
	header = ` + headerMarker + `, headers = $5, body = $6, body_omitted = $7,
	completed_at = ` + clockParam(8) + `, kept_until = ` + clockParam(8) + ` + $9::interval
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'`),
		// $4 lease, $5 clock. The record's expiry moves with the lease when that is
		// later, so that a record never expires while its owner renews it.
		extend: r.Replace(`UPDATE {table} SET lease_until = ` + clockParam(5) + ` + $4::interval,
	expires_at = greatest(expires_at, ` + clockParam(5) + ` + $4::interval)
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'`),
		abandon: r.Replace(`UPDATE {table} SET abandoned = true
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'`),
		release: r.Replace(`DELETE FROM {table}
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'`),
		// A fenced write that changed nothing: is there a record at all? (ErrRecordGone
		// or ErrLeaseLost.)
		exists: r.Replace(`SELECT EXISTS (SELECT FROM {table} WHERE scope = $1 AND key = $2)`),
		// A completion that changed nothing: when the record is done under its token (the
		// completion sent again), write it again, changing nothing, so that this write's
		// acknowledgement confirms the first; and say whether there is a record at all.
		again: r.Replace(`WITH again AS (
	UPDATE {table} SET state = 'done' WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'done' RETURNING 1
)
SELECT EXISTS (SELECT FROM again), EXISTS (SELECT FROM {table} WHERE scope = $1 AND key = $2)`),
		get:    r.Replace(`SELECT ` + countedColumns + ` FROM {table} WHERE scope = $1 AND key = $2`),
		delete: r.Replace(`DELETE FROM {table} WHERE scope = $1 AND key = $2`),
		// $1 clock, $2 limit. SKIP LOCKED: janitors never wait for each other nor for a
		// claim, renewal or transaction holding a row. Under READ COMMITTED, FOR UPDATE
		// re-checks the rule on the latest version of a row that changed after the
		// statement's snapshot (a renewal that committed) and skips it when it no longer
		// holds; the DELETE, by ctid, removes only the rows so locked.
		deleteExpired: r.Replace(`DELETE FROM {table} WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM {table} AS r WHERE ` + gone(clockParam(1)) + ` LIMIT $2 FOR UPDATE SKIP LOCKED))`),
		// The claim statement for many keys: parameters are arrays, one element per
		// call, sorted by (scope, key); each result row carries its call's position.
		// Each call has its own clock reading (NULL: the server's clock).
		claimBatch: r.Replace(`WITH input AS (
	SELECT i.ord, i.scope, i.key, i.fingerprint, coalesce(i.now, statement_timestamp()) AS now,
		i.lease, i.ttl, i.takeover_limit, nullif(i.route, '') AS route, nullif(i.id, '') AS id
	FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::timestamptz[], $5::interval[], $6::interval[], $7::timestamptz[],
		$8::text[], $9::text[])
		WITH ORDINALITY AS i(scope, key, fingerprint, now, lease, ttl, takeover_limit, route, id, ord)
), existing AS (
	SELECT i.ord, i.now, ` + claimable("i.now", "i.fingerprint", "i.takeover_limit") + ` AS claimable,
	` + ownClaim("i.id") + ` AS own,
	` + leanColumns("i.now", "i.fingerprint") + `
	FROM input AS i JOIN {table} AS r ON r.scope = i.scope AND r.key = i.key
), claimed AS (
	INSERT INTO {table} (scope, key, fingerprint, state, token, created_at, lease_until, expires_at, route, claim_id)
	SELECT n.scope, n.key, n.fingerprint, 'in_progress', n.token, n.now, n.now + n.lease, n.now + n.ttl, n.route,
		` + claimMark("n.token", "n.id") + `
	FROM (SELECT i.*, nextval('{sequence}') AS token FROM input AS i
		WHERE NOT EXISTS (SELECT FROM existing AS e WHERE e.ord = i.ord)) AS n
	ORDER BY n.ord
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING ` + recordColumns + `
)
SELECT i.ord, true, false, false, i.now, ` + qualify("c", recordColumns) + `
FROM claimed AS c JOIN input AS i ON i.scope = c.scope AND i.key = c.key
UNION ALL
SELECT e.ord, false, e.claimable AND NOT e.own, e.own, e.now, ` + qualify("e", recordColumns) + ` FROM existing AS e`),
		completeBatch: r.Replace(`UPDATE {table} AS r SET state = 'done', abandoned = false, status = u.status,
	header = ` + headerMarker + `, headers = u.headers, body = u.body, body_omitted = u.body_omitted,
	completed_at = coalesce(u.now, statement_timestamp()), kept_until = coalesce(u.now, statement_timestamp()) + u.ttl
FROM unnest($1::bytea[], $2::bytea[], $3::int8[], $4::int4[], $5::bytea[], $6::bytea[], $7::bool[], $8::timestamptz[], $9::interval[])
	WITH ORDINALITY AS u(scope, key, token, status, headers, body, body_omitted, now, ttl, ord)
WHERE r.scope = u.scope AND r.key = u.key AND r.token = u.token AND r.state = 'in_progress'
RETURNING u.ord`),
	}
	// The completion inside WithTx, which COMMIT follows in the same round trip: when it
	// completes no row it divides by zero, so that the transaction does not commit.
	s.sql.completeTx = `WITH u AS (` + s.sql.complete + ` RETURNING 1) SELECT 1 / count(*)::int FROM u`
	s.names.claimBatch, s.names.completeBatch = batchName("claim", s.sql.claimBatch), batchName("complete", s.sql.completeBatch)
	s.replan.Store(int64(replanAfter))
	if cfg.Batch {
		gather := cmp.Or(cfg.Gather, DefaultGather) // negative: none (batch.Group.Gather)
		// Duplicates of a key in a batch (a storm of retries of one request) run alone,
		// as they would without batching.
		s.claims = &batch.Group[*claimCall]{Run: s.runClaims, InFlight: batchInFlight, Gather: gather, Callers: s.inflight.Count,
			Alone: func(c *claimCall) { s.claimAlone(c.Ctx(), c) }}
		s.completes = &batch.Group[*completeCall]{Run: s.runCompletes, InFlight: batchInFlight, Gather: gather, Callers: s.inflight.Count,
			Alone: func(c *completeCall) { s.completeAlone(c.Ctx(), c) }}
	}
	return s, nil
}

// Migrate creates the schema, the token sequence, the table and its index when they do
// not exist, and adds the columns a table created without them lacks (see "Migration"
// in the package doc). It first reads the catalogs: when nothing is missing it changes
// nothing and needs no privilege to create anything, so that a role with only the
// privileges the store serves with (see "Privileges" in the package doc) may call it as
// it starts, once the schema's owner has migrated; it then checks that the role has those
// privileges. Its errors that say the schema is not ready are a *SchemaError. It is
// idempotent, and concurrent calls (from several replicas) are safe: the DDL runs one at
// a time under a transaction-level advisory lock.
func (s *Store) Migrate(ctx context.Context) error {
	missing, denied, err := s.inspect(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: migrate: reading the catalogs: %w", err)
	}
	if len(missing) > 0 {
		if err := s.apply(ctx); err != nil {
			return &SchemaError{Missing: missing, Err: err}
		}
		if missing, denied, err = s.inspect(ctx); err != nil {
			return fmt.Errorf("pgstore: migrate: reading the catalogs: %w", err)
		}
		if len(missing) > 0 {
			return fmt.Errorf("pgstore: migrate: the schema still lacks %s after it was applied", list(missing))
		}
	}
	if len(denied) > 0 {
		return &SchemaError{Denied: denied}
	}
	return nil
}

// apply applies the schema. Its ALTER TABLE steps give up a lock they would wait for
// (lock_timeout), rather than hold up every claim queued behind them while a long
// transaction runs; apply then tries again, until ctx ends.
func (s *Store) apply(ctx context.Context) error {
	wait := 100 * time.Millisecond
	for {
		err := pgddl.Apply(ctx, s.pool, s.sql.schema)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" { // lock_not_available
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (waiting for the table's lock: %w)", err, context.Cause(ctx))
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// now is the clock parameter of a statement: the Config.Clock reading, or nil (SQL
// NULL) for the server's clock.
func (s *Store) now() *time.Time {
	if s.clock == nil {
		return nil
	}
	t := s.clock()
	return &t
}

// Claim implements idempotency.Store in one statement (see the package doc). The clock
// is read once, so a takeover decides on the instant the claim statement did.
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (res idempotency.ClaimResult, err error) {
	defer s.inflight.Begin()()
	defer func() {
		if err == nil && res.Claimed {
			s.inflight.Claimed(res.Token, req.Lease)
		}
	}()
	now := s.now()
	for range claimTries {
		c := newClaimCall(req, now)
		if err := s.claimRow(ctx, c); err != nil {
			return idempotency.ClaimResult{}, fmt.Errorf("pgstore: claim: %w", err)
		}
		switch {
		case !c.found:
			continue // inserted by another transaction after this statement's snapshot
		case c.claimed:
			s.created.Add(1)
			return idempotency.ClaimResult{Claimed: true, Token: c.rec.Token, Now: c.at}, nil
		case c.own:
			res, err := s.reclaim(ctx, c)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				continue // changed since the claim statement read it
			case err != nil:
				return idempotency.ClaimResult{}, fmt.Errorf("pgstore: claim: %w", err)
			}
			return res, nil
		case !c.claimable:
			return idempotency.ClaimResult{Existing: c.rec, Now: c.at}, nil
		}
		// Expired, or in progress with its lease run out: replace it, unless another
		// claim or a renewal got there first (then look again).
		res := idempotency.ClaimResult{Claimed: true}
		err := s.do(ctx, func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx, s.sql.takeover, append(c.args(), c.rec.Token)...).Scan(&res.Token, &res.TookOver, &res.Now)
		})
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue
		case err != nil:
			return idempotency.ClaimResult{}, fmt.Errorf("pgstore: claim: %w", err)
		}
		return res, nil
	}
	return idempotency.ClaimResult{}, fmt.Errorf("pgstore: claim: the record kept changing under %d attempts", claimTries)
}

// reclaim grants c its own record, which the claim statement found (c.own), by a write
// that changes nothing: its acknowledgement, not the read, is what the grant rests on.
// pgx.ErrNoRows: the record is no longer the claim's own.
func (s *Store) reclaim(ctx context.Context, c *claimCall) (idempotency.ClaimResult, error) {
	res := idempotency.ClaimResult{Claimed: true, Token: c.rec.Token}
	err := s.do(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, s.sql.reclaim, []byte(c.req.Scope), []byte(c.req.Key), c.rec.Token, c.req.ID, c.now).Scan(&res.Now)
	})
	return res, err
}

// claimRow runs the claim statement for c, alone or in a batch, and leaves its result
// in c.
func (s *Store) claimRow(ctx context.Context, c *claimCall) error {
	if s.claims == nil {
		s.claimAlone(ctx, c)
		return c.err
	}
	if err := waitTaken(&c.Call, s.claims.Do(ctx, c)); err != nil {
		return err
	}
	return c.err
}

// Complete implements idempotency.Store. A completion that changes no row (the record
// is not in progress under its token) is looked at again by a second statement: done
// under its token (the completion sent again), it is written again, so that this
// write's acknowledgement confirms the first, and Complete returns nil; otherwise
// ErrRecordGone or ErrLeaseLost.
func (s *Store) Complete(ctx context.Context, c idempotency.Completion) error {
	defer s.inflight.Settled(c.Token)
	if s.completes != nil {
		return s.completeBatched(ctx, c)
	}
	headers := headercodec.Encode(c.Response.Header, c.Response.Trailer)
	var n int64
	err := s.do(ctx, func(conn *pgx.Conn) error {
		tag, err := conn.Exec(ctx, s.sql.complete, completeArgs(c, headers, s.now())...)
		n = tag.RowsAffected()
		return err
	})
	switch {
	case err != nil:
		return fmt.Errorf("pgstore: complete: %w", err)
	case n == 0:
		return s.completeAgain(ctx, c.Scope, c.Key, c.Token)
	}
	return nil
}

// completeAgain is the second statement of a completion that changed no row (see
// Complete).
func (s *Store) completeAgain(ctx context.Context, scope, key string, token int64) error {
	var again, exists bool
	err := s.do(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, s.sql.again, []byte(scope), []byte(key), token).Scan(&again, &exists)
	})
	switch {
	case err != nil:
		return fmt.Errorf("pgstore: complete: %w", err)
	case again:
		return nil
	case exists:
		return fmt.Errorf("pgstore: complete: %w", idempotency.ErrLeaseLost)
	}
	return fmt.Errorf("pgstore: complete: %w", idempotency.ErrRecordGone)
}

// completeArgs are the completion statement's parameters: headers is the encoded
// header and trailer, now the clock parameter.
func completeArgs(c idempotency.Completion, headers []byte, now *time.Time) []any {
	return []any{[]byte(c.Scope), []byte(c.Key), c.Token, int32(c.Response.Status),
		headers, c.Response.Body, c.Response.BodyOmitted, now, c.TTL}
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error {
	s.inflight.Extended(token, lease)
	return s.fenced(ctx, "extend", s.sql.extend, []byte(scope), []byte(key), token, lease, s.now())
}

// Abandon implements idempotency.Store.
func (s *Store) Abandon(ctx context.Context, scope, key string, token int64) error {
	defer s.inflight.Settled(token)
	return s.fenced(ctx, "abandon", s.sql.abandon, []byte(scope), []byte(key), token)
}

// Release implements idempotency.Store. A release sent again on a fresh connection,
// after its first attempt deleted the record and the connection broke before the
// answer, reports ErrRecordGone.
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	defer s.inflight.Settled(token)
	return s.fenced(ctx, "release", s.sql.release, []byte(scope), []byte(key), token)
}

// fenced runs a statement conditioned on the caller's token, whose first parameters are
// the scope and the key. When it changes no row, a second statement tells a missing
// record (ErrRecordGone) from one that is done or another token's (ErrLeaseLost).
func (s *Store) fenced(ctx context.Context, op, sql string, args ...any) error {
	var n int64
	err := s.do(ctx, func(conn *pgx.Conn) error {
		tag, err := conn.Exec(ctx, sql, args...)
		n = tag.RowsAffected()
		return err
	})
	switch {
	case err != nil:
		return fmt.Errorf("pgstore: %s: %w", op, err)
	case n > 0:
		return nil
	}
	var exists bool
	if err := s.do(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, s.sql.exists, args[0], args[1]).Scan(&exists)
	}); err != nil {
		return fmt.Errorf("pgstore: %s: %w", op, err)
	}
	if exists {
		return fmt.Errorf("pgstore: %s: %w", op, idempotency.ErrLeaseLost)
	}
	return fmt.Errorf("pgstore: %s: %w", op, idempotency.ErrRecordGone)
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	var rec *idempotency.Record
	err := s.do(ctx, func(conn *pgx.Conn) error {
		var err error
		rec, err = scanCounted(conn.QueryRow(ctx, s.sql.get, []byte(scope), []byte(key)))
		return err
	})
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
	if err := s.do(ctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, s.sql.delete, []byte(scope), []byte(key))
		return err
	}); err != nil {
		return fmt.Errorf("pgstore: delete: %w", err)
	}
	return nil
}

// DeleteExpired implements idempotency.Janitor: it deletes at most limit records
// expired on the store's clock (both expires_at and kept_until passed), except in-progress records whose lease still
// runs, skipping rows other transactions hold locked (the next call gets them). A limit
// of zero deletes nothing; a negative limit is an error.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("pgstore: delete expired: negative limit %d", limit)
	}
	if limit == 0 {
		return 0, nil
	}
	var n int64
	if err := s.do(ctx, func(conn *pgx.Conn) error {
		tag, err := conn.Exec(ctx, s.sql.deleteExpired, s.now(), limit)
		n = tag.RowsAffected()
		return err
	}); err != nil {
		return 0, fmt.Errorf("pgstore: delete expired: %w", err)
	}
	return int(n), nil
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
	if f.Route != "" {
		where = append(where, "route = "+arg(f.Route))
	}
	if f.After != "" {
		scope, key, err := listcursor.Decode(f.After)
		if err != nil {
			return idempotency.ListPage{}, fmt.Errorf("pgstore: list: %w", err)
		}
		where = append(where, "(scope, key) > ("+arg([]byte(scope))+", "+arg([]byte(key))+")")
	}
	q := "SELECT " + countedColumns + " FROM " + s.table
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY scope, key LIMIT " + arg(limit+1)

	var page idempotency.ListPage
	err := s.do(ctx, func(conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		page, err = listcursor.Page(rows, limit, func(r pgx.Rows) (*idempotency.Record, error) { return scanCounted(r) })
		return err
	})
	if err != nil {
		return idempotency.ListPage{}, fmt.Errorf("pgstore: list: %w", err)
	}
	return page, nil
}

// scanCounted scans countedColumns: the operators' reads, with the attempts and the
// route, which the claims' statements leave out.
func scanCounted(row pgx.Row) (*idempotency.Record, error) {
	var attempts int32
	var route *string
	r, err := scanRecord(row, &attempts, &route)
	if err != nil {
		return nil, err
	}
	r.Attempts = int(attempts)
	if route != nil {
		r.Route = *route
	}
	return r, nil
}

// scanRecord scans lead, then recordColumns. A done record gets its Response when its
// status was read (a lost claim that is no replay reads none).
func scanRecord(row pgx.Row, lead ...any) (*idempotency.Record, error) {
	var (
		r                       idempotency.Record
		scope, key, fingerprint []byte
		state                   string
		status                  *int32
		header, headers, body   []byte
		omitted                 bool
	)
	dest := append(lead, &scope, &key, &fingerprint, &state, &r.Token, &r.Abandoned,
		&r.CreatedAt, &r.LeaseUntil, &r.ExpiresAt, &status, &header, &headers, &body, &omitted)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	r.Scope, r.Key, r.Fingerprint = string(scope), string(key), string(fingerprint)
	r.State = idempotency.State(state)
	if r.State == idempotency.StateDone && status != nil {
		resp := &idempotency.Response{Status: int(*status), Body: body, BodyOmitted: omitted}
		var err error
		switch {
		case string(header) == "null": // written by this store: headers holds them
			if headers != nil {
				resp.Header, resp.Trailer, err = headercodec.Decode(headers)
			}
		case header != nil: // written by a store of the schema without headers
			err = json.Unmarshal(header, &resp.Header)
		}
		if err != nil {
			return nil, fmt.Errorf("decoding header of %q/%q: %w", r.Scope, r.Key, err)
		}
		r.Response = resp
	}
	return &r, nil
}
