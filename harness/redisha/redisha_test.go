package redisha_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/harness/redisha"
)

// TestFailoverLosesWhatTheStalledLinkHeldBack: a write replicated before the link
// stalls survives the failover, one written after it does not, and a failover client
// given the group's URL follows the Sentinel to the promoted replica.
func TestFailoverLosesWhatTheStalledLinkHeldBack(t *testing.T) {
	t.Parallel()
	g := redisha.Start(t, redisha.Options{})
	ctx := context.Background()
	opts, err := redis.ParseFailoverURL(g.URL())
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewFailoverClient(opts)
	t.Cleanup(func() { _ = client.Close() })

	if err := client.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	g.AwaitCaughtUp(ctx)
	replica := g.Replicas()[0]
	replica.Link().Stall()
	// WAIT counts the replicas that have the connection's own last write: one
	// connection for both.
	conn := g.Master().Client().Conn()
	t.Cleanup(func() { _ = conn.Close() })
	if err := conn.Set(ctx, "after", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Wait(ctx, 1, 100*time.Millisecond).Result(); err != nil || n != 0 {
		t.Fatalf("WAIT 1 with the link stalled = %d, %v; want 0 replicas", n, err)
	}
	old := g.Master()
	if promoted := g.Failover(); promoted != replica || g.Master() != replica || old == replica {
		t.Fatalf("promoted %s, want %s", promoted.Name, replica.Name)
	}
	if v, err := client.Get(ctx, "before").Result(); err != nil || v != "1" {
		t.Errorf("the write replicated before the stall, read through the failover client: %q, %v", v, err)
	}
	if _, err := client.Get(ctx, "after").Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("the write held back by the stall survived the failover: %v", err)
	}
	if info, err := replica.Info(ctx, "replication"); err != nil || info["role"] != "master" {
		t.Errorf("the promoted replica's role: %v, %v", info["role"], err)
	}
	// A replica added to the new master synchronises with it.
	r2 := g.AddReplica()
	if v, err := r2.Client().Get(ctx, "before").Result(); err != nil || v != "1" {
		t.Errorf("the new replica: %q, %v", v, err)
	}
}
