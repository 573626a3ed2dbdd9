package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/retrysafe/idempotency"
)

// Batching (Config.Batch): claims that arrive together are made by one statement, and
// completions that arrive together are written by another, each committed once. It is
// group commit done by the application: under load PostgreSQL parses, plans, locks and
// flushes the WAL once per batch instead of once per request, and a batch of eight
// claims costs the server about what one claim does (bench/README.md). Nothing waits
// for a batch to fill: a call that finds fewer than batchInFlight statements of its
// kind in flight starts one at once with whatever is pending, so a lone request pays
// no delay; calls that arrive while every slot is busy join the next statement.
//
// Each call still learns its own outcome. A batch is one autocommit statement, so its
// claims (or completions) commit together or not at all; when the server rejects a
// batch (a PgError, such as a header jsonb refuses), each of its calls is retried
// alone, so that one bad request cannot fail the others. Rows are locked in (scope,
// key) order, the same in every batch, so concurrent batches (of several replicas) do
// not deadlock.

const (
	batchMax      = 128 // calls per statement
	batchInFlight = 2   // statements of one kind in flight per Store
)

// call is what every batched call has: its caller's context and a channel closed when
// its result is set.
type call struct {
	ctx  context.Context
	done chan struct{}
}

func (c *call) base() *call { return c }

type batchable interface {
	base() *call
	// id is the row the call writes: a batch never holds two calls on one row.
	id() string
}

// group batches calls of one kind. run does the I/O for a batch and sets each call's
// result; group closes the calls' done channels after it.
type group[C batchable] struct {
	run func(calls []C)

	mu       sync.Mutex
	pending  []C
	inFlight int
}

// do waits for c's batch to run, or for c's context to end (then c's result, if its
// statement ran, is lost; as when a single statement's context ends after the server
// executed it).
func (g *group[C]) do(c C) error {
	b := c.base()
	b.done = make(chan struct{})
	g.mu.Lock()
	g.pending = append(g.pending, c)
	lead := g.inFlight < batchInFlight
	if lead {
		g.inFlight++
	}
	g.mu.Unlock()
	if lead {
		g.lead()
	}
	select {
	case <-b.done:
		return nil
	case <-b.ctx.Done():
		return b.ctx.Err()
	}
}

// lead runs one batch in a slot held by the caller, then hands the slot to a new
// goroutine when calls are waiting, or gives it back.
func (g *group[C]) lead() {
	g.mu.Lock()
	batch := g.take()
	g.mu.Unlock()
	if len(batch) > 0 {
		g.run(batch)
		for _, c := range batch {
			close(c.base().done)
		}
	}
	g.mu.Lock()
	if len(g.pending) > 0 {
		g.mu.Unlock()
		go g.lead()
		return
	}
	g.inFlight--
	g.mu.Unlock()
}

// take removes from pending up to batchMax calls on distinct rows, in (scope, key)
// order, and drops calls whose context has ended. g.mu is held.
func (g *group[C]) take() []C {
	var batch []C
	seen := make(map[string]bool)
	rest := g.pending[:0]
	for _, c := range g.pending {
		switch id := c.id(); {
		case c.base().ctx.Err() != nil: // its caller has gone
		case len(batch) == batchMax || seen[id]:
			rest = append(rest, c)
		default:
			seen[id] = true
			batch = append(batch, c)
		}
	}
	clear(g.pending[len(rest):])
	g.pending = rest
	slices.SortFunc(batch, func(a, b C) int { return strings.Compare(a.id(), b.id()) })
	return batch
}

// batchContext is the context of a batch's statement: it keeps the values of the
// first call's context, is cancelled by none of them, and has the latest of their
// deadlines, or none when one of them has none.
func batchContext[C batchable](calls []C) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range calls {
		d, ok := c.base().ctx.Deadline()
		if !ok {
			return context.WithCancel(context.WithoutCancel(calls[0].base().ctx))
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(calls[0].base().ctx), latest)
}

// rowID is a call's row as one string that sorts as (scope, key) does.
func rowID(scope, key string) string {
	return fmt.Sprintf("%08x%s%s", len(scope), scope, key)
}

// rejected reports whether the server refused a batch's statement, so that each call
// is worth trying alone.
func rejected(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}

// claimCall is one Claim's first statement, batched.
type claimCall struct {
	call
	req idempotency.ClaimRequest
	// The result: found is false when the statement returned no row for the call (a
	// concurrent insert after its snapshot).
	found, claimed, claimable bool
	rec                       *idempotency.Record
	err                       error
}

func (c *claimCall) id() string { return rowID(c.req.Scope, c.req.Key) }

// runClaims runs the batched claim statement for calls, sorted by row.
func (s *Store) runClaims(calls []*claimCall) {
	ctx, cancel := batchContext(calls)
	defer cancel()
	n := len(calls)
	scopes, keys, fps := make([][]byte, n), make([][]byte, n), make([][]byte, n)
	nows, leases, expires := make([]time.Time, n), make([]time.Time, n), make([]time.Time, n)
	for i, c := range calls {
		scopes[i], keys[i], fps[i] = []byte(c.req.Scope), []byte(c.req.Key), []byte(c.req.Fingerprint)
		nows[i], leases[i], expires[i] = c.req.Now, c.req.LeaseUntil, c.req.ExpiresAt
	}
	err := func() error {
		rows, err := s.pool.Query(ctx, s.sql.claimBatch, scopes, keys, fps, nows, leases, expires)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var ord int64
			var claimed, claimable bool
			rec, err := scanRecord(rows, &ord, &claimed, &claimable)
			if err != nil {
				return err
			}
			if ord < 1 || ord > int64(n) {
				return fmt.Errorf("batched claim returned row %d of %d", ord, n)
			}
			c := calls[ord-1]
			c.found, c.claimed, c.claimable, c.rec = true, claimed, claimable, rec
		}
		return rows.Err()
	}()
	if err == nil {
		return
	}
	if rejected(err) && n > 1 {
		for _, c := range calls {
			c.found, c.claimed, c.claimable, c.rec, c.err = false, false, false, nil, nil
			rec, err := scanRecord(s.pool.QueryRow(ctx, s.sql.claim, s.claimArgs(c.req)...), &c.claimed, &c.claimable)
			c.found, c.rec, c.err = err == nil, rec, noRows(err)
		}
		return
	}
	for _, c := range calls {
		c.found, c.err = false, err
	}
}

// completeCall is one Complete, batched.
type completeCall struct {
	call
	c      idempotency.Completion
	header *string // JSON of the response header; nil for a nil header
	wrote  bool    // the result: the row was completed
	err    error
}

func (c *completeCall) id() string { return rowID(c.c.Scope, c.c.Key) }

// completeBatched completes c through the completion group.
func (s *Store) completeBatched(ctx context.Context, c idempotency.Completion) error {
	cc := &completeCall{call: call{ctx: ctx}, c: c}
	if c.Response.Header != nil {
		h, err := json.Marshal(c.Response.Header)
		if err != nil {
			return fmt.Errorf("pgstore: complete: encoding header: %w", err)
		}
		hs := string(h)
		cc.header = &hs
	}
	if err := s.completes.do(cc); err != nil {
		return fmt.Errorf("pgstore: complete: %w", err)
	}
	switch {
	case cc.err != nil:
		return fmt.Errorf("pgstore: complete: %w", cc.err)
	case !cc.wrote:
		return fmt.Errorf("pgstore: complete: %w", idempotency.ErrLeaseLost)
	}
	return nil
}

// runCompletes runs the batched completion statement for calls, sorted by row.
func (s *Store) runCompletes(calls []*completeCall) {
	ctx, cancel := batchContext(calls)
	defer cancel()
	n := len(calls)
	scopes, keys, bodies := make([][]byte, n), make([][]byte, n), make([][]byte, n)
	tokens, statuses := make([]int64, n), make([]int32, n)
	headers, omitted := make([]*string, n), make([]bool, n)
	nows, expires := make([]time.Time, n), make([]time.Time, n)
	for i, cc := range calls {
		c := cc.c
		scopes[i], keys[i], tokens[i] = []byte(c.Scope), []byte(c.Key), c.Token
		statuses[i], headers[i], bodies[i], omitted[i] = int32(c.Response.Status), cc.header, c.Response.Body, c.Response.BodyOmitted
		nows[i], expires[i] = c.Now, c.ExpiresAt
	}
	err := func() error {
		rows, err := s.pool.Query(ctx, s.sql.completeBatch, scopes, keys, tokens, statuses, headers, bodies, omitted, nows, expires)
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
	}()
	if err == nil {
		return
	}
	if rejected(err) && n > 1 {
		for _, cc := range calls {
			var header []byte
			if cc.header != nil {
				header = []byte(*cc.header)
			}
			c := cc.c
			tag, err := s.pool.Exec(ctx, s.sql.complete, []byte(c.Scope), []byte(c.Key), c.Token,
				c.Response.Status, header, c.Response.Body, c.Response.BodyOmitted, c.Now, c.ExpiresAt)
			cc.wrote, cc.err = err == nil && tag.RowsAffected() > 0, err
		}
		return
	}
	for _, cc := range calls {
		cc.wrote, cc.err = false, err
	}
}

// qualify prefixes each of the comma-separated columns with alias and a dot.
func qualify(alias, columns string) string {
	cols := strings.Split(columns, ",")
	for i, c := range cols {
		cols[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}
