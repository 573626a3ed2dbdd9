// Package pgddl holds what the PostgreSQL-backed packages (pgstore, fence, pgbox) share
// about their schemas: the rule their configurable names follow, and how their embedded
// DDL is applied.
package pgddl

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// ValidName reports whether s is a lowercase SQL identifier of at most maxLen bytes:
// letters, digits and underscores, not starting with a digit. Such a name needs no
// quoting to mean what it says, and maxLen leaves room for the names derived from it
// within PostgreSQL's 63-byte limit.
func ValidName(s string, maxLen int) bool {
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
