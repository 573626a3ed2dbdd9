// Package natscluster runs a disposable 3-node NATS JetStream cluster for tests: three
// nats-server processes (the real binary), named n1, n2 and n3, each on free loopback
// client, cluster and monitoring ports, with its JetStream store in a temporary
// directory of its own. It never touches a shared NATS server.
//
// Kill loses a node at once (SIGKILL); Restart starts it again on its ports and store,
// as an operator's restart would. StreamLeader and ConsumerLeader name the node that
// leads a stream or a consumer, so a test can kill exactly that one.
//
// Nothing here sleeps for a fixed time: each wait polls a server's answer (the
// monitoring endpoint /jsz, a JetStream API reply) until it says what is awaited, bounded
// by a generous deadline.
//
// Start skips the test when nats-server is not installed, or fails it when
// RETRYSAFE_REQUIRE_SERVICES=1 (CI) asks for every service.
package natscluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/retrysafe/retrysafe/harness/testenv"
)

// Size is the number of nodes of a cluster.
const Size = 3

// ClusterName is the cluster's name (every node's --cluster_name).
const ClusterName = "retrysafe"

// awaitTimeout bounds each wait: for a node to serve, the cluster to elect a meta
// leader, a stream or consumer to have a leader.
const awaitTimeout = 60 * time.Second

// binary is where the nats-server binary is looked for first; then $PATH.
const binary = "/usr/sbin/nats-server"

// Cluster is a running 3-node JetStream cluster.
type Cluster struct {
	t     testing.TB
	bin   string
	nodes []*Node
	mu    sync.Mutex
	nc    *nats.Conn // the harness's own client, lazily dialled
}

// Node is one nats-server of the cluster.
type Node struct {
	// Name is the server name: n1, n2 or n3.
	Name string
	// ClientAddr, ClusterAddr and MonitorAddr are its loopback host:port.
	ClientAddr, ClusterAddr, MonitorAddr string
	// StoreDir is its JetStream store.
	StoreDir string

	t      testing.TB
	args   []string
	logMu  sync.Mutex
	lines  []string
	cmd    *exec.Cmd
	exited chan struct{}
}

// URL is the node's client URL.
func (n *Node) URL() string { return "nats://" + n.ClientAddr }

// Log returns what the node has logged, all its runs.
func (n *Node) Log() string {
	n.logMu.Lock()
	defer n.logMu.Unlock()
	return strings.Join(n.lines, "\n")
}

// Running reports whether the node's process runs (it was not killed, or was restarted).
func (n *Node) Running() bool {
	n.logMu.Lock()
	defer n.logMu.Unlock()
	return n.cmd != nil
}

// Start starts the three nodes and returns once every one serves clients and agrees on
// a meta leader, so streams can be created. They are killed when t ends.
func Start(t testing.TB) *Cluster {
	t.Helper()
	bin, err := exec.LookPath(binary)
	if err != nil {
		if bin, err = exec.LookPath("nats-server"); err != nil {
			msg := "nats-server not installed (" + err.Error() + "): the JetStream cluster tests need it"
			if testenv.Required() {
				t.Fatal(msg + " [RETRYSAFE_REQUIRE_SERVICES=1]")
			}
			t.Skip(msg)
		}
	}
	c := &Cluster{t: t, bin: bin}
	for i := range Size {
		c.nodes = append(c.nodes, &Node{
			Name:        fmt.Sprintf("n%d", i+1),
			ClientAddr:  testenv.DeadAddr(t),
			ClusterAddr: testenv.DeadAddr(t),
			MonitorAddr: testenv.DeadAddr(t),
			StoreDir:    t.TempDir(),
			t:           t,
		})
	}
	routes := make([]string, 0, Size)
	for _, n := range c.nodes {
		routes = append(routes, "nats://"+n.ClusterAddr)
	}
	for _, n := range c.nodes {
		host, port, _ := net.SplitHostPort(n.ClientAddr)
		_, mport, _ := net.SplitHostPort(n.MonitorAddr)
		n.args = []string{
			"--addr", host, "--port", port, "--server_name", n.Name,
			"--http_port", mport,
			"--jetstream", "--store_dir", n.StoreDir,
			"--cluster_name", ClusterName, "--cluster", "nats://" + n.ClusterAddr,
			"--routes", strings.Join(routes, ","),
		}
		n.run(bin)
	}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.nc != nil {
			c.nc.Close()
		}
	})
	c.AwaitMetaLeader()
	return c
}

// Nodes returns the three nodes.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns the node named name (n1, n2, n3), or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// URLs returns the client URLs of all nodes, comma-separated, for a client that
// reconnects to whichever node serves.
func (c *Cluster) URLs() string {
	urls := make([]string, 0, len(c.nodes))
	for _, n := range c.nodes {
		urls = append(urls, n.URL())
	}
	return strings.Join(urls, ",")
}

// Kill kills node i (0-based) with SIGKILL and waits until the process is gone.
func (c *Cluster) Kill(i int) {
	c.t.Helper()
	c.nodes[i].kill()
}

// Freeze stops node i's process (SIGSTOP) without killing it: its connections stay
// open and what clients send it waits unanswered, as with a node that hangs. Kill then
// loses it with whatever it was sent meanwhile.
func (c *Cluster) Freeze(i int) {
	c.t.Helper()
	n := c.nodes[i]
	n.logMu.Lock()
	cmd := n.cmd
	n.logMu.Unlock()
	if cmd == nil {
		c.t.Fatalf("natscluster: Freeze of %s, which does not run", n.Name)
	}
	if err := freeze(cmd.Process); err != nil {
		c.t.Fatalf("natscluster: freezing %s: %v", n.Name, err)
	}
}

// Restart starts the killed node i again, on its ports and store, and waits until the
// cluster has a meta leader the node agrees on.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	n := c.nodes[i]
	if n.Running() {
		c.t.Fatalf("natscluster: Restart of %s, which runs", n.Name)
	}
	n.run(c.bin)
	c.AwaitMetaLeader()
}

// jsz is the part of a node's /jsz answer the harness reads.
type jsz struct {
	Meta *struct {
		Leader      string `json:"leader"`
		ClusterSize int    `json:"cluster_size"`
	} `json:"meta_cluster"`
}

// MetaLeader asks node n's monitoring endpoint which node leads the meta group ("" for
// none known).
func (n *Node) MetaLeader(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.MonitorAddr+"/jsz", nil)
	if err != nil {
		return "", err
	}
	// No keep-alive: a test that checks for leaked goroutines finds no idle connection.
	client := http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var j jsz
	if err := json.NewDecoder(resp.Body).Decode(&j); err != nil {
		return "", fmt.Errorf("natscluster: %s /jsz: %w", n.Name, err)
	}
	if j.Meta == nil {
		return "", nil
	}
	return j.Meta.Leader, nil
}

// AwaitMetaLeader waits until every running node names the same, running, meta leader,
// and returns its name.
func (c *Cluster) AwaitMetaLeader() string {
	c.t.Helper()
	var leader string
	testenv.Eventually(c.t, awaitTimeout, func() bool {
		leader = ""
		for _, n := range c.nodes {
			if !n.Running() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			l, err := n.MetaLeader(ctx)
			cancel()
			if err != nil || l == "" || (leader != "" && l != leader) {
				return false
			}
			leader = l
		}
		ln := c.Node(leader)
		return ln != nil && ln.Running()
	}, "the running nodes of the JetStream cluster to agree on a meta leader")
	return leader
}

// Conn returns a client connection of the harness to the cluster (every node's URL,
// reconnecting forever), closed when the test ends.
func (c *Cluster) Conn() *nats.Conn {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nc == nil {
		nc, err := nats.Connect(c.URLs(), nats.Name("natscluster harness"), nats.MaxReconnects(-1),
			nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
		if err != nil {
			c.t.Fatalf("natscluster: connecting: %v", err)
		}
		c.nc = nc
	}
	return c.nc
}

// StreamLeader returns the index of the node leading stream, waiting (bounded) until it
// has a leader on a running node.
func (c *Cluster) StreamLeader(stream string) int {
	c.t.Helper()
	return c.awaitLeader("stream "+stream, func(ctx context.Context, j js.JetStream) (*js.ClusterInfo, error) {
		s, err := j.Stream(ctx, stream)
		if err != nil {
			return nil, err
		}
		return s.CachedInfo().Cluster, nil
	})
}

// ConsumerLeader returns the index of the node leading consumer of stream, waiting
// (bounded) until it has a leader on a running node.
func (c *Cluster) ConsumerLeader(stream, consumer string) int {
	c.t.Helper()
	return c.awaitLeader("consumer "+stream+" > "+consumer, func(ctx context.Context, j js.JetStream) (*js.ClusterInfo, error) {
		cons, err := j.Consumer(ctx, stream, consumer)
		if err != nil {
			return nil, err
		}
		return cons.CachedInfo().Cluster, nil
	})
}

func (c *Cluster) awaitLeader(what string, info func(context.Context, js.JetStream) (*js.ClusterInfo, error)) int {
	c.t.Helper()
	j, err := js.New(c.Conn())
	if err != nil {
		c.t.Fatal(err)
	}
	idx := -1
	var last error
	testenv.Eventually(c.t, awaitTimeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ci, err := info(ctx, j)
		if err != nil {
			last = err
			return false
		}
		if ci == nil || ci.Leader == "" {
			last = errors.New("no leader")
			return false
		}
		for i, n := range c.nodes {
			if n.Name == ci.Leader && n.Running() {
				idx = i
				return true
			}
		}
		last = fmt.Errorf("leader %s is not running", ci.Leader)
		return false
	}, "a leader of %s (last: %v)", what, &lastErr{&last})
	return idx
}

// lastErr formats the error it points at when the message is built.
type lastErr struct{ err *error }

func (l *lastErr) String() string { return fmt.Sprint(*l.err) }

// run starts the node's process; its log is read as it comes. The node serves once its
// monitoring endpoint answers.
func (n *Node) run(bin string) {
	n.t.Helper()
	cmd := exec.Command(bin, n.args...)
	setDeathSignal(cmd)
	out, err := cmd.StderrPipe()
	if err != nil {
		n.t.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("natscluster: starting %s: %v", n.Name, err)
	}
	exited := make(chan struct{})
	n.logMu.Lock()
	n.cmd, n.exited = cmd, exited
	n.lines = append(n.lines, fmt.Sprintf("--- %s %s", n.Name, strings.Join(n.args, " ")))
	n.logMu.Unlock()
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			n.logMu.Lock()
			n.lines = append(n.lines, sc.Text())
			n.logMu.Unlock()
		}
		_ = cmd.Wait()
	}()
	n.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if n.t.Failed() {
			n.t.Logf("natscluster: %s log (last lines):\n%s", n.Name, tail(n.Log(), 60))
		}
	})
	testenv.Eventually(n.t, awaitTimeout, func() bool {
		select {
		case <-exited:
			n.t.Fatalf("natscluster: %s exited at start:\n%s", n.Name, tail(n.Log(), 60))
		default:
		}
		conn, err := net.DialTimeout("tcp", n.ClientAddr, time.Second)
		if err != nil {
			return false
		}
		_ = conn.Close()
		return true
	}, "%s to accept client connections", n.Name)
}

func (n *Node) kill() {
	n.t.Helper()
	n.logMu.Lock()
	cmd, exited := n.cmd, n.exited
	n.cmd = nil
	n.logMu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// tail returns the last k lines of s.
func tail(s string, k int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > k {
		lines = lines[len(lines)-k:]
	}
	return strings.Join(lines, "\n")
}
