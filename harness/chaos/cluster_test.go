//go:build linux

package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/pgcluster"
)

// startLedger starts the disposable PostgreSQL server that holds the ledger of every
// run and the store of the postgres run (harness/pgcluster: its own data directory and
// port, run by the postgres user; stopped and removed at t's cleanup). It skips t, or
// fails it with RETRYSAFE_REQUIRE_SERVICES=1, when the PostgreSQL binaries are missing.
// fsync is on, as in production: the suite's crash is a process crash, which fsync off
// would survive too, but the commits' cost is then a real server's.
func startLedger(t *testing.T) *pgcluster.Cluster {
	t.Helper()
	return pgcluster.Start(t, pgcluster.Options{MaxConnections: 200, Settings: []string{"fsync=on", "shared_buffers=64MB"}})
}

// restartCrashed stops n the way a crash would (immediate: no checkpoint, crash recovery
// at the next start), waits pause, and starts it again. It returns how long the server
// was unreachable.
func restartCrashed(ctx context.Context, n *pgcluster.Node, pause time.Duration) (time.Duration, error) {
	down := time.Now()
	if err := n.Stop(ctx); err != nil {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(pause):
	}
	if err := n.Start(ctx); err != nil {
		return 0, fmt.Errorf("%w\n%s", err, n.LogTail())
	}
	return time.Since(down), nil
}
