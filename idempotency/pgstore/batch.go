package pgstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/batch"
	"github.com/retrysafe/retrysafe/internal/headercodec"
)

// Batching (Config.Batch, on internal/batch): claims that arrive together are made by
// one statement, and completions that arrive together are written by another, each
// committed once. Under load PostgreSQL parses, plans, locks and flushes the WAL once
// per batch instead of once per request: in pgbench a claim of eight keys costs the
// server about what a claim of one does.
//
// Each call still learns its own outcome, decided on its own clock reading (the
// server's clock, statement_timestamp(), when it is NULL). A batch is one autocommit
// statement, so its claims (or completions) commit together or not at all; when the
// server rejects a batch (a PgError, such as a constraint violation), each of its calls
// is retried alone, so that one bad request cannot fail the others. Rows are locked in
// (scope, key) order, the same in every batch, so concurrent batches (of several
// replicas) do not deadlock.

// batchInFlight is the most statements of one kind in flight per Store. One: under load
// the server is what the calls wait for, and a second statement running beside the
// first would only split the calls that wait between two batches, each parsed,
// planned, committed and flushed; with one slot they all go in the next, and batches
// grow with the load. At 32 concurrent requests one slot costs PostgreSQL about a
// quarter less CPU per claim and completion than two, at the same throughput
// (bench/README.md, "PostgreSQL CPU per new key").
const batchInFlight = 1

// DefaultGather is Config.Gather's default: under concurrent load, the longest a batch
// waits for more calls (see "Batching" in the package doc). A batch waits only for
// half the store's open requests, which come within a few milliseconds when the
// database is what they wait for; the window bounds the wait when some of them are
// held elsewhere (a slow upstream). bench/README.md gives what it saved.
const DefaultGather = 5 * time.Millisecond

// The batched statements join their arrays to the table, and PostgreSQL plans a
// prepared statement once for all its executions (a generic plan) after its first
// few: the join it then chose stays, however the table changes, until the table's
// statistics change (ANALYZE, by autovacuum). On a small table that plan is a hash join
// over a scan of the whole table (measured: up to 2,000–4,000 records of a fresh
// table with small answers), and it then runs on every batch while the table grows:
// measured, a quarter less throughput through the gateway at 40,000 records with
// autovacuum off, and 1.3–1.7× the PostgreSQL CPU per new key in a new table's first
// ten seconds (autovacuum analyzes a table once a minute at most). Planning at every
// execution instead costs more than the scans did at the benchmarks' sizes (the
// claim's statement is long). So each connection prepares its batched statements
// again, so that the new plan is made for the table as it is then (its size read from
// the file when statistics are missing), index lookups once it has grown past a few
// pages:
//   - once they are replanAfter old, for the records other writers add and remove;
//   - once this store has created, since they were prepared, at least as many records
//     as it had before and replanGrowth or more: while a new table grows, its plans
//     follow it after 256, 768, 1,792... records, a handful of prepares for any size.
const (
	replanAfter  = 10 * time.Second
	replanGrowth = 256
)

// plansKey is the key, in PgConn.CustomData, of when the connection prepared each
// batched statement, by name (a map[string]plan).
const plansKey = "github.com/retrysafe/retrysafe/idempotency/pgstore.plans"

// plan is when a connection prepared a batched statement.
type plan struct {
	at      time.Time
	created int64 // the records the store had created (Store.created)
}

// batchPrefix begins the names of the batched statements prepared on a connection.
const batchPrefix = "retrysafe_batch_"

// batchName is the prepared statement's name for the batched statement sql: the
// statements of stores on other tables have other names.
func batchName(kind, sql string) string {
	h := fnv.New64a()
	h.Write([]byte(sql))
	return batchPrefix + kind + "_" + strconv.FormatUint(h.Sum64(), 16)
}

// prepared returns name, the batched statement sql prepared on conn: prepared when
// the connection has not, and prepared again (so planned afresh) when the connection
// prepared it more than the store's replan interval ago or before the table grew (see
// replanAfter).
func (s *Store) prepared(ctx context.Context, conn *pgx.Conn, name, sql string) (string, error) {
	data := conn.PgConn().CustomData()
	plans, _ := data[plansKey].(map[string]plan)
	if plans == nil {
		plans = make(map[string]plan, 2)
		data[plansKey] = plans
	}
	now, created := time.Now(), s.created.Load()
	p, ok := plans[name]
	if ok && now.Sub(p.at) < time.Duration(s.replan.Load()) && created-p.created < max(p.created, replanGrowth) {
		return name, nil
	}
	if ok {
		delete(plans, name)
		if err := conn.Deallocate(ctx, name); err != nil {
			return "", err
		}
	}
	if _, err := conn.Prepare(ctx, name, sql); err != nil {
		return "", err
	}
	plans[name] = plan{at: now, created: created}
	return name, nil
}

// waitTaken returns err, the error of batch.Group.Do for c, unless it is the end of
// the caller's context after c was taken into a batch: then it waits for the batch's
// statement to finish, and returns nil, c's result being set. The statement's context
// ends with its callers' (batch.Context), and the server's answer to the cancel request
// that pgx then sends (see ConfigurePool) says whether the call was applied and durable
// — above all that its commit is on the primary alone (ErrNotDurable), which its caller
// would otherwise take for a mere timeout. pgx gives the connection up after
// CancelGrace when the server does not answer.
func waitTaken(c *batch.Call, err error) error {
	if err == nil || !c.Taken() {
		return err
	}
	t := time.NewTimer(CancelGrace + time.Second)
	defer t.Stop()
	select {
	case <-c.Done():
		return nil
	case <-t.C:
		return err
	}
}

// rejected reports whether the server refused a batch's statement, so that each call
// is worth trying alone.
func rejected(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}

// claimCall is one Claim's claim statement, alone or batched.
type claimCall struct {
	batch.Call
	req idempotency.ClaimRequest
	now *time.Time // the Config.Clock reading; nil for the server's clock
	// route is req.Route as the statement's parameter: NULL when empty. It goes by
	// pointer, which pgx encodes without boxing or reflection, so that the route costs
	// the claim no allocation.
	route pgtype.Text
	// id is req.ID as the statement's parameter, NULL when empty, like route.
	id pgtype.Text
	// The result: found is false when the statement returned no row for the call (a
	// concurrent insert after its snapshot); own is true when the record is the claim's
	// own (claimed before under its ID); at is the instant of the decision.
	found, claimed, claimable, own bool
	at                             time.Time
	rec                            *idempotency.Record
	err                            error
}

func (c *claimCall) ID() string { return batch.RowID(c.req.Scope, c.req.Key) }

// newClaimCall returns the claim statement's call for req at now.
func newClaimCall(req idempotency.ClaimRequest, now *time.Time) *claimCall {
	return &claimCall{req: req, now: now, route: pgtype.Text{String: req.Route, Valid: req.Route != ""},
		id: pgtype.Text{String: req.ID, Valid: req.ID != ""}}
}

// args are the parameters of the single-key claim statement (and the first nine of
// the takeover).
func (c *claimCall) args() []any {
	r := c.req
	return []any{[]byte(r.Scope), []byte(r.Key), []byte(r.Fingerprint), c.now, r.Lease, r.TTL, r.TakeoverLimit(), &c.route, &c.id}
}

// reset clears c's result before its statement runs (again).
func (c *claimCall) reset() {
	c.found, c.claimed, c.claimable, c.own, c.rec, c.err = false, false, false, false, nil, nil
}

// runClaims runs the batched claim statement for calls, sorted by row.
func (s *Store) runClaims(calls []*claimCall) {
	ctx, cancel := batch.Context(calls)
	defer cancel()
	if len(calls) == 1 { // the single statement is the cheaper one
		s.claimAlone(ctx, calls[0])
		return
	}
	n := len(calls)
	scopes, keys, fps := make([][]byte, n), make([][]byte, n), make([][]byte, n)
	nows, leases, ttls, limits := make([]*time.Time, n), make([]time.Duration, n), make([]time.Duration, n), make([]time.Time, n)
	routes, ids := make([]string, n), make([]string, n)
	for i, c := range calls {
		scopes[i], keys[i], fps[i] = []byte(c.req.Scope), []byte(c.req.Key), []byte(c.req.Fingerprint)
		nows[i], leases[i], ttls[i], limits[i], routes[i], ids[i] = c.now, c.req.Lease, c.req.TTL, c.req.TakeoverLimit(), c.req.Route, c.req.ID
	}
	err := s.do(ctx, func(conn *pgx.Conn) error {
		for _, c := range calls {
			c.reset()
		}
		stmt, err := s.prepared(ctx, conn, s.names.claimBatch, s.sql.claimBatch)
		if err != nil {
			return err
		}
		rows, err := conn.Query(ctx, stmt, scopes, keys, fps, nows, leases, ttls, limits, routes, ids)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var ord int64
			var claimed, claimable, own bool
			var at time.Time
			rec, err := scanRecord(rows, &ord, &claimed, &claimable, &own, &at)
			if err != nil {
				return err
			}
			if ord < 1 || ord > int64(n) {
				return fmt.Errorf("batched claim returned row %d of %d", ord, n)
			}
			c := calls[ord-1]
			c.found, c.claimed, c.claimable, c.own, c.at, c.rec = true, claimed, claimable, own, at, rec
		}
		return rows.Err()
	})
	if err == nil {
		return
	}
	if rejected(err) {
		for _, c := range calls {
			s.claimAlone(ctx, c)
		}
		return
	}
	for _, c := range calls {
		c.found, c.err = false, err
	}
}

// claimAlone runs the single-key claim statement for c.
func (s *Store) claimAlone(ctx context.Context, c *claimCall) {
	c.reset()
	err := s.do(ctx, func(conn *pgx.Conn) error {
		rec, err := scanRecord(conn.QueryRow(ctx, s.sql.claim, c.args()...), &c.claimed, &c.claimable, &c.own, &c.at)
		c.rec = rec
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		c.rec = nil
	case err != nil:
		c.err, c.rec = err, nil
	default:
		c.found = true
	}
}

// completeCall is one Complete, batched.
type completeCall struct {
	batch.Call
	c       idempotency.Completion
	headers []byte     // the response's header and trailer, encoded
	now     *time.Time // the Config.Clock reading; nil for the server's clock
	wrote   bool       // the result: the row was completed
	err     error
}

func (c *completeCall) ID() string { return batch.RowID(c.c.Scope, c.c.Key) }

// completeBatched completes c through the completion group.
func (s *Store) completeBatched(ctx context.Context, c idempotency.Completion) error {
	cc := &completeCall{c: c, headers: headercodec.Encode(c.Response.Header, c.Response.Trailer), now: s.now()}
	if err := waitTaken(&cc.Call, s.completes.Do(ctx, cc)); err != nil {
		return fmt.Errorf("pgstore: complete: %w", err)
	}
	switch {
	case cc.err != nil:
		return fmt.Errorf("pgstore: complete: %w", cc.err)
	case !cc.wrote:
		return s.completeAgain(ctx, c.Scope, c.Key, c.Token)
	}
	return nil
}

// runCompletes runs the batched completion statement for calls, sorted by row.
func (s *Store) runCompletes(calls []*completeCall) {
	ctx, cancel := batch.Context(calls)
	defer cancel()
	if len(calls) == 1 { // the single statement is the cheaper one
		s.completeAlone(ctx, calls[0])
		return
	}
	n := len(calls)
	scopes, keys, headers, bodies := make([][]byte, n), make([][]byte, n), make([][]byte, n), make([][]byte, n)
	tokens, statuses, omitted := make([]int64, n), make([]int32, n), make([]bool, n)
	nows, ttls := make([]*time.Time, n), make([]time.Duration, n)
	for i, cc := range calls {
		c := cc.c
		scopes[i], keys[i], tokens[i] = []byte(c.Scope), []byte(c.Key), c.Token
		statuses[i], headers[i], bodies[i], omitted[i] = int32(c.Response.Status), cc.headers, c.Response.Body, c.Response.BodyOmitted
		nows[i], ttls[i] = cc.now, c.TTL
	}
	err := s.do(ctx, func(conn *pgx.Conn) error {
		for _, cc := range calls {
			cc.wrote, cc.err = false, nil
		}
		stmt, err := s.prepared(ctx, conn, s.names.completeBatch, s.sql.completeBatch)
		if err != nil {
			return err
		}
		rows, err := conn.Query(ctx, stmt, scopes, keys, tokens, statuses, headers, bodies, omitted, nows, ttls)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var ord int64
			if err := rows.Scan(&ord); err != nil {
				return err
			}
			if ord < 1 || ord > int64(n) {
				return fmt.Errorf("batched completion returned row %d of %d", ord, n)
			}
			calls[ord-1].wrote = true
		}
		return rows.Err()
	})
	if err == nil {
		return
	}
	if rejected(err) {
		for _, cc := range calls {
			s.completeAlone(ctx, cc)
		}
		return
	}
	for _, cc := range calls {
		cc.wrote, cc.err = false, err
	}
}

// completeAlone runs the completion statement for cc alone.
func (s *Store) completeAlone(ctx context.Context, cc *completeCall) {
	var n int64
	err := s.do(ctx, func(conn *pgx.Conn) error {
		tag, err := conn.Exec(ctx, s.sql.complete, completeArgs(cc.c, cc.headers, cc.now)...)
		n = tag.RowsAffected()
		return err
	})
	cc.wrote, cc.err = err == nil && n > 0, err
}

// qualify prefixes each of the comma-separated columns with alias and a dot.
func qualify(alias, columns string) string {
	cols := strings.Split(columns, ",")
	for i, c := range cols {
		cols[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}
