package natscluster_test

import (
	"context"
	"testing"
	"time"

	js "github.com/nats-io/nats.go/jetstream"

	"github.com/retrysafe/retrysafe/harness/natscluster"
)

// TestClusterKillRestart starts the cluster, creates an R3 stream, kills its leader and
// sees another node take over and the stream keep its messages; the killed node comes
// back on its store.
func TestClusterKillRestart(t *testing.T) {
	c := natscluster.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	j, err := js.New(c.Conn())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.CreateStream(ctx, js.StreamConfig{Name: "S", Subjects: []string{"s"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Publish(ctx, "s", []byte("one")); err != nil {
		t.Fatal(err)
	}
	old := c.StreamLeader("S")
	c.Kill(old)
	if c.Nodes()[old].Running() {
		t.Fatal("a killed node runs")
	}
	now := c.StreamLeader("S")
	if now == old {
		t.Fatalf("the killed node %d still leads the stream", old)
	}
	s, err := j.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().State.Msgs; got != 1 {
		t.Fatalf("stream holds %d messages after the leader's death, want 1", got)
	}
	c.Restart(old)
	if !c.Nodes()[old].Running() {
		t.Fatal("a restarted node does not run")
	}
	if _, err := j.Publish(ctx, "s", []byte("two")); err != nil {
		t.Fatal(err)
	}
	if _, err := j.CreateOrUpdateConsumer(ctx, "S", js.ConsumerConfig{Durable: "C", AckPolicy: js.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if l := c.ConsumerLeader("S", "C"); l < 0 || l >= natscluster.Size {
		t.Fatalf("consumer leader index %d", l)
	}
}
