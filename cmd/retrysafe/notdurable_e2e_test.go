//go:build linux

package main

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/pgcluster"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
)

// TestE2EPostgresSyncStandbyDown: while the synchronous standby is away, no write can be
// acknowledged: /readyz answers 503, and new keys get 503 store-not-durable without
// being forwarded (the first after the store timeout, the next at once); their claims,
// which may have committed on the primary, block nothing once the standby is back: the
// key is served at once, not after a lease.
func TestE2EPostgresSyncStandbyDown(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{Standbys: 1, Sync: true})
	standby := c.Standbys[0]
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", clusterDSN(c, "e2e_down"), "--upstream", up.URL)
	ready := func() int {
		res, err := http.Get(gw.admin + "/readyz")
		if err != nil {
			return 0
		}
		res.Body.Close()
		return res.StatusCode
	}
	if r := post(ctx, gw.addr, "/pay", testenv.Name("up"), `{}`); r.status != 201 {
		t.Fatal(r)
	}
	standby.Link().Cut()
	waitFor(t, "/readyz to say 503", 15*time.Second, func() bool { return ready() == 503 })
	// The first new key's claim waits for the standby until the store timeout, whose
	// cancel request the server answers with "committed on the primary alone": the store
	// says it cannot make writes durable, and the keys after it are refused at once.
	var keys []string
	for i := range 3 {
		k := testenv.Name("down")
		start := time.Now()
		r := post(ctx, gw.addr, "/pay", k, `{}`)
		took := time.Since(start)
		if r.status != 503 || r.problem() != idempotency.ProblemStoreNotDurable {
			t.Errorf("new key %d with the synchronous standby away: %v; want 503 store-not-durable", i+1, r)
		}
		if i > 0 && took >= idempotency.DefaultStoreTimeout {
			t.Errorf("new key %d with the synchronous standby away answered after %v, want at once (before the store timeout)", i+1, took)
		}
		keys = append(keys, k)
	}
	if n := up.calls.Load(); n != 1 {
		t.Errorf("%d requests forwarded, want 1 (before the standby went away)", n)
	}
	standby.Link().Restore()
	if err := c.AwaitStreaming(ctx, standby, "sync"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "/readyz to say 200", 15*time.Second, func() bool { return ready() == 200 })
	for _, k := range keys {
		var r reply
		waitFor(t, "the key served once the standby is back", 10*time.Second, func() bool {
			r = post(ctx, gw.addr, "/pay", k, `{}`)
			return r.status == 201
		})
		if n := up.callsFor(k); n != 1 {
			t.Errorf("%d executions of %s, want 1", n, k)
		}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Error("the test ran out of time")
	}
}
