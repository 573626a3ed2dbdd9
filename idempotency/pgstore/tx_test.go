package pgstore_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// The transaction WithTx gives the handler begins with the handler's first statement,
// in one round trip, and commits with the completion, in another: a handler of one
// statement costs two round trips. Whatever the handler runs (rows, a row with none, a
// batch, statements with query options, the connection itself, a savepoint) runs in
// the transaction; a handler that rolls it back commits nothing, and one that tries to
// commit it is refused.
func TestWithTxStatements(t *testing.T) {
	t.Parallel()
	var n counter
	pool := newPool(t, testenv.PostgresURL(t), func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1 // one connection, whose statements the first case prepares
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		dial := cfg.ConnConfig.DialFunc
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{conn, &n}, nil
		}
	})
	st, schema := newStore(t, pool)
	ledger := pgx.Identifier{schema, "ledger"}.Sanitize()
	if _, err := pool.Exec(t.Context(), "CREATE TABLE "+ledger+" (name text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	ok := idempotency.Response{Status: 201, Body: []byte("ok")}
	// run claims key and runs fn through WithTx with the claim, and returns the key's
	// record, the round trips WithTx took and its error.
	run := func(t *testing.T, key string, fn func(ctx context.Context, tx pgx.Tx) error) (*idempotency.Record, int64, error) {
		t.Helper()
		res, err := st.Claim(t.Context(), idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "f", Lease: time.Minute, TTL: time.Hour})
		if err != nil || !res.Claimed {
			t.Fatalf("Claim: %+v, %v", res, err)
		}
		ctx := idempotency.NewContext(t.Context(), idempotency.NewClaim("s", key, "f", res.Token, time.Hour))
		n.reset()
		_, err = st.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error) {
			return ok, fn(ctx, tx)
		})
		_, trips := n.reset()
		rec, gerr := st.Get(t.Context(), "s", key)
		if gerr != nil {
			t.Fatal(gerr)
		}
		return rec, trips, err
	}
	insert := func(ctx context.Context, tx pgx.Tx, name string) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+ledger+" VALUES ($1)", name)
		return err
	}
	booked := func(t *testing.T, name string) bool {
		t.Helper()
		var found bool
		if err := pool.QueryRow(t.Context(), "SELECT EXISTS (SELECT FROM "+ledger+" WHERE name = $1)", name).Scan(&found); err != nil {
			t.Fatal(err)
		}
		return found
	}
	done := func(t *testing.T, what string, err error, rec *idempotency.Record) {
		t.Helper()
		if err != nil || rec.State != idempotency.StateDone || rec.Response == nil || string(rec.Response.Body) != "ok" {
			t.Errorf("%s: WithTx error %v, record %+v; want done with the response", what, err, rec)
		}
	}

	// The first run prepares the statements (a round trip each, once per connection).
	rec, _, err := run(t, "warm-up", func(ctx context.Context, tx pgx.Tx) error { return insert(ctx, tx, "warm-up") })
	done(t, "warm-up", err, rec)

	rec, trips, err := run(t, "exec", func(ctx context.Context, tx pgx.Tx) error { return insert(ctx, tx, "exec") })
	done(t, "one statement", err, rec)
	if trips != 2 || !booked(t, "exec") {
		t.Errorf("one statement: %d round trips, booked %t; want 2 and booked", trips, booked(t, "exec"))
	}

	rec, trips, err = run(t, "none", func(context.Context, pgx.Tx) error { return nil })
	done(t, "no statement", err, rec)
	if trips != 1 {
		t.Errorf("no statement: %d round trips, want 1 (BEGIN, completion and COMMIT together)", trips)
	}

	rec, _, err = run(t, "rows", func(ctx context.Context, tx pgx.Tx) error {
		var missing string
		if err := tx.QueryRow(ctx, "SELECT name FROM "+ledger+" WHERE name = 'nobody'").Scan(&missing); !errors.Is(err, pgx.ErrNoRows) {
			return errors.Join(errors.New("a row that is not there"), err)
		}
		rows, err := tx.Query(ctx, "SELECT generate_series(1, 3)")
		if err != nil {
			return err
		}
		sum, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil || len(sum) != 3 {
			return errors.Join(errors.New("rows"), err)
		}
		if err := insert(ctx, tx, "rows"); err != nil {
			return err
		}
		var in bool // the connection is in the transaction: it sees the row
		if err := tx.Conn().QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+ledger+" WHERE name = 'rows')").Scan(&in); err != nil || !in {
			return errors.Join(errors.New("the connection does not see the transaction's row"), err)
		}
		return nil
	})
	done(t, "rows", err, rec)

	rec, _, err = run(t, "options", func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+ledger+" VALUES ($1)", pgx.QueryExecModeSimpleProtocol, "options"); err != nil {
			return err
		}
		var b pgx.Batch
		b.Queue("INSERT INTO "+ledger+" VALUES ($1)", "options-batch")
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx) // a savepoint, rolled back
		if err != nil {
			return err
		}
		if err := insert(ctx, sp, "options-savepoint"); err != nil {
			return err
		}
		return sp.Rollback(ctx)
	})
	done(t, "query options, a batch and a savepoint", err, rec)
	if !booked(t, "options") || !booked(t, "options-batch") || booked(t, "options-savepoint") {
		t.Errorf("booked: with options %t, batch %t, savepoint rolled back %t; want true, true, false",
			booked(t, "options"), booked(t, "options-batch"), booked(t, "options-savepoint"))
	}

	rec, _, err = run(t, "rolled-back", func(ctx context.Context, tx pgx.Tx) error {
		if err := insert(ctx, tx, "rolled-back"); err != nil {
			return err
		}
		return tx.Rollback(ctx)
	})
	if err == nil || rec.State != idempotency.StateInProgress || booked(t, "rolled-back") {
		t.Errorf("handler that rolls back: WithTx error %v, record %s, booked %t; want an error, in progress, not booked",
			err, rec.State, booked(t, "rolled-back"))
	}

	rec, _, err = run(t, "committed", func(ctx context.Context, tx pgx.Tx) error {
		if err := insert(ctx, tx, "committed"); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err == nil {
			return errors.New("the handler's Commit was accepted")
		}
		return nil
	})
	done(t, "handler that tries to commit", err, rec)
	if !booked(t, "committed") {
		t.Error("handler that tries to commit: its write is not booked with the completion")
	}

	rec, _, err = run(t, "failed", func(ctx context.Context, tx pgx.Tx) error {
		if err := insert(ctx, tx, "exec"); err == nil { // taken: the transaction fails
			return errors.New("a duplicate row was accepted")
		}
		return nil // the handler ignores the failure; the completion cannot commit
	})
	if err == nil || errors.Is(err, pgstore.ErrCommitUnknown) || rec.State != idempotency.StateInProgress {
		t.Errorf("handler that ignores a failed statement: WithTx error %v, record %s; want the server's error, in progress", err, rec.State)
	}

	// The connection always went back to the pool out of any transaction: the pool
	// never had to discard it.
	if made := pool.Stat().NewConnsCount(); made != 1 {
		t.Errorf("the pool made %d connections, want 1", made)
	}
}
