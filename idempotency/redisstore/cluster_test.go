package redisstore

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
)

// TestCluster runs the conformance suite on a disposable three-master Redis Cluster, so a
// script touching keys of two slots (CROSSSLOT) or a List that misses a master fails.
// It needs redis-server and redis-cli in PATH.
func TestCluster(t *testing.T) {
	addrs := startCluster(t, 3)
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T, clock func() time.Time) idempotency.Store {
			client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
			t.Cleanup(func() { _ = client.Close() })
			s, err := New(Config{Client: client, Prefix: testenv.Name("rs") + ":", Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}

// startCluster starts n redis-server processes in cluster mode on free loopback ports,
// joins them into one cluster of n masters, and stops them when t ends.
func startCluster(t *testing.T, n int) []string {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not in PATH: %v", bin, err)
		}
	}
	var addrs []string
	for range n {
		port, busPort := freePort(t), freePort(t)
		cmd := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", port,
			"--cluster-enabled", "yes", "--cluster-port", busPort, "--cluster-config-file", "nodes.conf",
			"--dir", t.TempDir(), "--save", "", "--appendonly", "no")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		addrs = append(addrs, "127.0.0.1:"+port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for c.Ping(ctx).Err() != nil {
			if ctx.Err() != nil {
				t.Fatalf("redis-server at %s did not start", a)
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = c.Close()
	}
	out, err := exec.CommandContext(ctx, "redis-cli", append([]string{"--cluster", "create"},
		append(addrs, "--cluster-replicas", "0", "--cluster-yes")...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, _ := c.ClusterInfo(ctx).Result()
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("cluster node %s not ready: %s", a, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Close()
	}
	return addrs
}

func freePort(t *testing.T) string {
	t.Helper()
	_, port, err := net.SplitHostPort(testenv.DeadAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	return port
}
