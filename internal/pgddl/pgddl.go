// Package pgddl is how the PostgreSQL-backed packages (pgstore, fence, pgbox) apply
// their embedded DDL. The rule their configurable names follow is package sqlname's.
package pgddl

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Beginner is a pool or a connection.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Apply runs ddl, several statements, in one transaction. The DDL takes its own
// transaction-level advisory lock and is idempotent, so replicas starting together may
// all apply it.
func Apply(ctx context.Context, db Beginner, ddl string) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, ddl) // no arguments: simple protocol, several statements
		return err
	})
}
