package redisstore

import (
	"bufio"
	"context"
	"net"
	"os/exec"
	"strings"
	"sync"
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
// joins them into one cluster of n masters, and stops them when t ends. It waits for
// what each server logs: that it accepts connections, then that its cluster state is ok.
func startCluster(t *testing.T, n int) []string {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not in PATH: %v", bin, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var addrs []string
	var nodes []*redisNode
	for range n {
		port, busPort := freePort(t), freePort(t)
		node := startRedisNode(t, "--bind", "127.0.0.1", "--port", port,
			"--cluster-enabled", "yes", "--cluster-port", busPort, "--cluster-config-file", "nodes.conf",
			"--dir", t.TempDir(), "--save", "", "--appendonly", "no")
		nodes = append(nodes, node)
		addrs = append(addrs, "127.0.0.1:"+port)
	}
	for i, node := range nodes {
		node.await(t, ctx, node.ready, "accept connections at "+addrs[i])
	}
	out, err := exec.CommandContext(ctx, "redis-cli", append([]string{"--cluster", "create"},
		append(addrs, "--cluster-replicas", "0", "--cluster-yes")...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for i, node := range nodes {
		node.await(t, ctx, node.clusterOK, "report cluster state ok at "+addrs[i])
	}
	return addrs
}

// redisNode is a redis-server process; its log (its standard output) is read as it comes.
type redisNode struct {
	ready     chan struct{} // closed when it logs that it accepts connections
	clusterOK chan struct{} // closed when it logs that its cluster state is ok
	exited    chan struct{} // closed when its log ends: the process is gone

	mu  sync.Mutex
	log strings.Builder
}

func startRedisNode(t *testing.T, args ...string) *redisNode {
	t.Helper()
	node := &redisNode{ready: make(chan struct{}), clusterOK: make(chan struct{}), exited: make(chan struct{})}
	cmd := exec.Command("redis-server", args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(node.exited)
		var ready, ok bool
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			node.mu.Lock()
			node.log.WriteString(line + "\n")
			node.mu.Unlock()
			switch {
			case !ready && strings.Contains(line, "Ready to accept connections"):
				ready = true
				close(node.ready)
			case !ok && strings.Contains(line, "Cluster state changed: ok"):
				ok = true
				close(node.clusterOK)
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-node.exited // every read of the pipe done before Wait closes it
		_ = cmd.Wait()
	})
	return node
}

// await waits for ch, failing t when the process exits first or ctx ends.
func (n *redisNode) await(t *testing.T, ctx context.Context, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		return
	case <-n.exited:
	case <-ctx.Done():
	}
	select {
	case <-ch: // logged, then exited or timed out at once
		return
	default:
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	t.Fatalf("redis-server did not %s:\n%s", what, n.log.String())
}

func freePort(t *testing.T) string {
	t.Helper()
	_, port, err := net.SplitHostPort(testenv.DeadAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	return port
}
