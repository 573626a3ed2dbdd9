package fence_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/retrysafe/retrysafe/fence"
	"github.com/retrysafe/retrysafe/harness/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// contention is how long TestCompetingHolders runs: 5 s, or the 20 s with
// RETRYSAFE_LONG=1.
func contention() time.Duration {
	if os.Getenv("RETRYSAFE_LONG") == "1" {
		return 20 * time.Second
	}
	return 5 * time.Second
}

// newPool returns a pool of at most maxConns connections on the test database, closed
// when t ends.
func newPool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newSchema returns a fresh schema name, dropped with everything in it when t ends.
func newSchema(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	schema := testenv.Name("fence")
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return schema
}

// newStore returns a migrated store in a fresh schema, and the schema. cfg's Pool and
// Schema are set.
func newStore(t *testing.T, pool *pgxpool.Pool, cfg fence.Config) (*fence.Store, string) {
	t.Helper()
	schema := newSchema(t, pool)
	cfg.Pool, cfg.Schema = pool, schema
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	st, err := fence.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return st, schema
}

// sameTable returns a second store on the table of an existing one (another replica,
// or another configuration).
func sameTable(t *testing.T, pool *pgxpool.Pool, schema string, cfg fence.Config) *fence.Store {
	t.Helper()
	cfg.Pool, cfg.Schema = pool, schema
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	st, err := fence.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// quiet discards the stores' logs (lost leases are the point of several tests).
var quiet = slog.New(slog.DiscardHandler)

// release releases l when t ends, ignoring ErrLeaseLost (the test may have lost it on
// purpose).
func release(t *testing.T, l *fence.Lease) {
	t.Cleanup(func() { _ = l.Release(context.Background()) })
}

// waitDone waits at most d for ctx to end and returns its cause, or fails t.
func waitDone(t *testing.T, ctx context.Context, d time.Duration) error {
	t.Helper()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(d):
		t.Fatalf("context not done after %s", d)
		return nil
	}
}
