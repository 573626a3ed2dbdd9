// Package inbox holds what redeliver's two inboxes, pgbox's on PostgreSQL and
// sqlitebox's on SQLite, share beyond their SQL: they keep one contract on two drivers.
package inbox

import (
	"context"

	"github.com/retrysafe/retrysafe/redeliver"
)

// DefaultDeleteBatch is how many expired ids one DeleteExpired call deletes when it is
// given no positive batch.
const DefaultDeleteBatch = 1000

// Handler returns the redeliver.Handler that runs fn through do, an inbox's Do: fn runs
// in the transaction that records the message id, so once per id as far as the
// database's commits go, and a duplicate is acknowledged without running it.
func Handler[Tx any](
	do func(context.Context, *redeliver.Message, func(context.Context, Tx) error) (bool, error),
	fn func(context.Context, Tx, *redeliver.Message) error,
) redeliver.Handler {
	return func(ctx context.Context, m *redeliver.Message) error {
		_, err := do(ctx, m, func(ctx context.Context, tx Tx) error { return fn(ctx, tx, m) })
		return err
	}
}
