//go:build linux

package storedsn_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/harness/pgcluster"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/storedsn"
)

// TestPostgresConnectionsAtRest: on a server with max_connections=10 (7 slots for
// roles that are not superusers), two stores opened with the default pool settings,
// each after a burst of concurrent requests, give their connections back once idle, so
// that another client gets every slot.
func TestPostgresConnectionsAtRest(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{MaxConnections: 10})
	if err := c.Primary.Exec(ctx, "CREATE ROLE other LOGIN"); err != nil {
		t.Fatal(err)
	}
	const app = "gateways"
	for i := range 2 {
		u, err := url.Parse(c.Primary.URL())
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("schema", fmt.Sprintf("gw%d", i))
		q.Set("batch", "false") // every claim on a connection of its own: the burst fills the pool
		q.Set("application_name", app)
		u.RawQuery = q.Encode()
		o, err := storedsn.Open(ctx, u.String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		if err := o.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				for k := range 8 {
					req := idempotency.ClaimRequest{Key: fmt.Sprintf("k-%d-%d", g, k), Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
					if _, err := o.Store.Claim(ctx, req); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
	}
	held := func() int {
		var n int
		if err := c.Primary.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", []any{app}, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return held() == 0 }, "the idle stores to close their connections (%d held)", held())

	u, err := url.Parse(c.Primary.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("other")
	for i := range 7 {
		conn, err := pgx.Connect(ctx, u.String())
		if err != nil {
			t.Fatalf("another client's connection %d: %v", i+1, err)
		}
		defer conn.Close(context.Background())
	}
}
