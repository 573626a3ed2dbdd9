package fence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/fence"
)

// These examples need PostgreSQL (RETRYSAFE_POSTGRES_URL), so they are compiled but not
// run by go test.

func databaseURL() string {
	if u := os.Getenv("RETRYSAFE_POSTGRES_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// One replica at a time runs the job; its writes carry the lease's token, so a replica
// that paused past its lease cannot overwrite the next one's work.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	leases, err := fence.New(fence.Config{Pool: pool})
	if err != nil {
		log.Fatal(err)
	}
	if err := leases.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	lease, err := leases.Acquire(ctx, "invoice-run", "replica-1", 30*time.Second)
	if errors.Is(err, fence.ErrHeld) {
		fmt.Println("another replica runs it:", err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = lease.Release(context.WithoutCancel(ctx)) }()

	work := lease.Context() // cancelled if the lease is lost
	err = pgx.BeginFunc(work, pool, func(tx pgx.Tx) error {
		if err := lease.Check(work, tx); err != nil {
			return err // fence.ErrStaleToken: someone else holds it now; nothing is written
		}
		_, err := tx.Exec(work, "UPDATE invoices SET sent = true WHERE due < now()")
		return err
	})
	fmt.Println("token", lease.Token(), "err", err)
}

// A per-row fence: the row keeps the last token that wrote it, and an older token is
// refused even without reading the lease.
func ExampleTable_UpdateFenced() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL,
	//                        last_fence bigint NOT NULL DEFAULT 0);
	accounts := fence.Table{Name: "accounts"}
	var token int64 = 34 // lease.Token()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return accounts.UpdateFenced(ctx, tx, "acct-1", token, map[string]any{"balance": 100})
	})
	if errors.Is(err, fence.ErrStaleToken) {
		fmt.Println("a newer holder wrote this row; nothing written")
	}
}

// A compare-and-swap: read the row and its version, write only if no one else did in
// between, retry on ErrConflict.
func ExampleTable_UpdateVersioned() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// CREATE TABLE carts (id bigint PRIMARY KEY, items text[] NOT NULL,
	//                     version bigint NOT NULL DEFAULT 0);
	carts := fence.Table{Name: "carts"}
	for {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var items []string
			var version int64
			if err := tx.QueryRow(ctx, "SELECT items, version FROM carts WHERE id = 1").Scan(&items, &version); err != nil {
				return err
			}
			_, err := carts.UpdateVersioned(ctx, tx, 1, version, map[string]any{"items": append(items, "book")})
			return err
		})
		if errors.Is(err, fence.ErrConflict) {
			continue // another writer won: read again
		}
		fmt.Println(err)
		return
	}
}
