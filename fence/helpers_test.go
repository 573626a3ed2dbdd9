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

// contention is how long TestCompetingHolders runs: 5 s, or 20 s (the long soak) with
// RETRYSAFE_LONG=1.
func contention() time.Duration {
	if os.Getenv("RETRYSAFE_LONG") == "1" {
		return 20 * time.Second
	}
	return 5 * time.Second
}

// newEnv returns a pool of at most maxConns connections on the test database and a
// fresh schema name, dropped with everything in it when t ends. The schema is named
// first, so the pool is closed before the schema is dropped.
func newEnv(t *testing.T, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	schema := testenv.Schema(t, "fence")
	return testenv.PostgresPool(t, maxConns), schema
}

// newStore returns a migrated store in schema. cfg's Pool and Schema are set.
func newStore(t *testing.T, pool *pgxpool.Pool, schema string, cfg fence.Config) *fence.Store {
	t.Helper()
	st := sameTable(t, pool, schema, cfg)
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return st
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

// waitExpired waits until the database's clock has passed l's expiry, as l last learnt
// it. The database decides expiry, so the test asks it instead of sleeping for a TTL.
func waitExpired(t *testing.T, pool *pgxpool.Pool, l *fence.Lease) {
	t.Helper()
	until := l.Expires()
	testenv.Eventually(t, l.TTL()+10*time.Second, func() bool {
		var past bool
		if err := pool.QueryRow(t.Context(), "SELECT clock_timestamp() > $1", until).Scan(&past); err != nil {
			t.Fatal(err)
		}
		return past
	}, "the database's clock to pass the expiry of %q, %s", l.Name(), until.Format(time.RFC3339Nano))
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
