package sqlitestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/batch"
)

// DefaultGather is Config.Gather's default: under concurrent load, the longest a write
// transaction waits for more writes before it begins (see "Batching" in the package
// doc).
const DefaultGather = 2 * time.Millisecond

// writeOp is the write of one Claim or one Complete, batched (Config.Batch).
type writeOp struct {
	batch.Call
	claim    *idempotency.ClaimRequest // one of claim and complete is set
	complete *idempotency.Completion
	absent   bool // a claim's: Claim read no record (see claimTx)

	res idempotency.ClaimResult // a claim's result
	err error
}

func (o *writeOp) ID() string {
	if o.claim != nil {
		return batch.RowID(o.claim.Scope, o.claim.Key)
	}
	return batch.RowID(o.complete.Scope, o.complete.Key)
}

// runWrites runs ops in one write transaction and commits it once: through the driver
// when it can (writeRaw), else through database/sql (writeBatch). When a statement fails
// (other than a completion that finds its claim gone) or the commit does, the
// transaction is rolled back and each op of a batch of several runs again alone, so
// that one bad op cannot fail the others and no op is left half done.
func (s *Store) runWrites(ops []*writeOp) {
	ctx, cancel := batch.Context(ops)
	defer cancel()
	s.writeOps(ctx, ops)
}

// writeOps is runWrites under ctx.
func (s *Store) writeOps(ctx context.Context, ops []*writeOp) {
	err := errNotRaw
	if s.owned && rawable(ops) {
		err = s.writeRaw(ctx, ops)
	}
	if errors.Is(err, errNotRaw) && len(ops) > 1 {
		err = s.writeBatch(ctx, ops)
	}
	switch {
	case err == nil:
		return
	case len(ops) == 1 && !errors.Is(err, errNotRaw):
		ops[0].res, ops[0].err = idempotency.ClaimResult{}, err
		return
	}
	for _, op := range ops {
		s.writeOne(ctx, op)
	}
}

// writeAlone runs op in a transaction of its own, under its caller's context: a
// duplicate of a key in a batch (batch.Group.Alone).
func (s *Store) writeAlone(op *writeOp) { s.writeOne(op.Ctx(), op) }

// writeOne runs op in a transaction of its own.
func (s *Store) writeOne(ctx context.Context, op *writeOp) {
	if op.claim != nil {
		op.res, op.err = s.claimWrite(ctx, *op.claim, op.absent)
	} else {
		op.err = s.complete(ctx, nil, *op.complete, true)
	}
}

// batchTokens is the tokenBlock of a transaction of ops: it reserves, when it must, a
// token for each of their claims.
func batchTokens(ops []*writeOp) *tokenBlock {
	b := &tokenBlock{}
	for _, op := range ops {
		if op.claim != nil {
			b.want++
		}
	}
	return b
}

// writeBatch runs ops in one transaction and commits it.
//
// BEGIN takes the write lock under ctx, so that a wait for another process's lock ends
// when no caller can use the result any more; COMMIT runs under it too. The statements
// between them run under a context that nothing cancels (with ctx's values): they wait
// for nothing, and the driver watches a context that can end with a goroutine for
// every statement, so that it can interrupt SQLite, which cost a new key 3–12% of its
// CPU in this store.
func (s *Store) writeBatch(ctx context.Context, ops []*writeOp) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlitestore: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	ctx = context.WithoutCancel(ctx)
	tokens := batchTokens(ops)
	for _, op := range ops {
		if op.claim != nil {
			op.res, op.err = s.claimTx(ctx, tx, *op.claim, op.absent, tokens)
		} else {
			op.err = s.complete(ctx, tx, *op.complete, true)
		}
		if op.err != nil && !errors.Is(op.err, idempotency.ErrLeaseLost) {
			return op.err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: commit: %w", err)
	}
	s.committed(tokens)
	return nil
}
