//go:build linux

// Package rabbitnode runs a disposable RabbitMQ node for tests: the real rabbitmq-server,
// a child process of the test, with a node name of its own (rs-test-<random>@localhost),
// its AMQP and distribution ports free loopback ports, and its database, logs,
// configuration and plugin list in temporary directories. The management plugin and
// every other plugin are off. The machine's shared broker (port 5672, node
// rabbit@<host>) is never touched: nothing here names it, and a node is stopped only
// through its own process.
//
// Kill ends the node as a crash does (SIGKILL of the Erlang VM); Stop shuts it down
// cleanly (rabbitmqctl stop); Restart starts it again on the same ports and directories,
// so durable queues and their persistent messages survive. Each start waits until the
// node accepts an AMQP connection, within StartTimeout. A node boots in 5–10 s on this
// kind of machine (2 cores), and restarts in about as long.
//
// StartCluster starts several such nodes, in parallel, and joins them into one
// cluster (rabbitmqctl join_cluster): three nodes form a cluster in about 25 s, each
// a Node to Kill, Stop and Restart.
//
// The node shares the machine's Erlang cookie (a copy of
// /var/lib/rabbitmq/.erlang.cookie in its own HOME, when that file is readable) so that
// rabbitmqctl -n NODE reaches it as it reaches the shared node; otherwise Erlang makes
// a cookie in that HOME, and Ctl still works.
//
// Start skips the test when rabbitmq-server is not installed, or fails it when
// RETRYSAFE_REQUIRE_SERVICES=1 (CI) asks for every service.
package rabbitnode

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/retrysafe/retrysafe/harness/testenv"
)

// StartTimeout bounds each start of a node (first start or restart) until it accepts
// an AMQP connection. A node boots in about 10 s on an idle machine; a busy one takes
// several times that.
const StartTimeout = 3 * time.Minute

// machineCookie is where the Debian package keeps the Erlang cookie the shared node
// and rabbitmqctl use.
const machineCookie = "/var/lib/rabbitmq/.erlang.cookie"

// Node is one disposable RabbitMQ node.
type Node struct {
	// Name is the Erlang node name, rs-test-<random>@localhost.
	Name string
	// Port is the AMQP port on 127.0.0.1.
	Port int

	t      testing.TB
	dir    string
	server string // the rabbitmq-server script
	ctl    string // the rabbitmqctl script
	env    []string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	started []time.Duration
}

// Start starts a node and waits until it accepts AMQP connections. It is killed when
// the test ends.
func Start(t testing.TB) *Node {
	t.Helper()
	n := prepare(t, cookie(t), Options{})
	n.run()
	return n
}

// Options configure the nodes of StartClusterWith.
type Options struct {
	// Advanced is the nodes' advanced.config: Erlang terms, for the settings
	// rabbitmq.conf does not take, e.g.
	// "[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}].". Default
	// none.
	Advanced string
}

// Cluster is a RabbitMQ cluster of disposable nodes on this host.
type Cluster struct {
	// Nodes are the members; the first is the one the others joined.
	Nodes []*Node
}

// StartCluster starts size nodes (at least 1) with one Erlang cookie, joins every node
// after the first to the first (rabbitmqctl stop_app, join_cluster, start_app) and
// returns once each accepts AMQP connections. The nodes boot in parallel.
func StartCluster(t testing.TB, size int) *Cluster {
	t.Helper()
	return StartClusterWith(t, size, Options{})
}

// StartClusterWith is StartCluster with nodes configured by o.
func StartClusterWith(t testing.TB, size int, o Options) *Cluster {
	t.Helper()
	c := &Cluster{}
	ck := cookie(t)
	for range max(size, 1) {
		c.Nodes = append(c.Nodes, prepare(t, ck, o))
	}
	errs := make(chan error, len(c.Nodes))
	for _, n := range c.Nodes {
		go func() { errs <- n.start() }()
	}
	var failed []string
	for range c.Nodes {
		if err := <-errs; err != nil {
			failed = append(failed, err.Error())
		}
	}
	if len(failed) > 0 {
		t.Fatal(strings.Join(failed, "\n"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	for _, n := range c.Nodes[1:] {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", c.Nodes[0].Name}, {"start_app"}} {
			if out, err := n.Ctl(ctx, args...); err != nil {
				t.Fatalf("rabbitnode: rabbitmqctl -n %s %s: %v\n%s", n.Name, strings.Join(args, " "), err, out)
			}
		}
		if err := n.awaitAMQP(time.Now(), n.exitedChan()); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// URLs returns the AMQP URLs of the nodes, in order.
func (c *Cluster) URLs() []string {
	var u []string
	for _, n := range c.Nodes {
		u = append(u, n.URL())
	}
	return u
}

// cookie returns the Erlang cookie the nodes use: the machine's, when readable (so
// that the machine's rabbitmqctl reaches them too), else a new random one.
func cookie(t testing.TB) []byte {
	if b, err := os.ReadFile(machineCookie); err == nil {
		return b
	}
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = 'A' + b[i]%26
	}
	return b
}

// prepare makes a node's directories and environment; it starts nothing.
func prepare(t testing.TB, cookie []byte, o Options) *Node {
	t.Helper()
	server, ctl := binaries()
	if server == "" || ctl == "" {
		msg := "rabbitmq-server or rabbitmqctl not installed: the disposable RabbitMQ tests need them"
		if testenv.Required() {
			t.Fatal(msg + " [RETRYSAFE_REQUIRE_SERVICES=1]")
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	for _, d := range []string{home, filepath.Join(dir, "mnesia"), filepath.Join(dir, "log")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(home, ".erlang.cookie"), cookie, 0o400); err != nil {
		t.Fatal(err)
	}
	port, dist := testenv.FreePort(t), testenv.FreePort(t)
	conf := fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n", port)
	files := map[string]string{
		"rabbitmq.conf":     conf,
		"enabled_plugins":   "[].\n",
		"rabbitmq-env.conf": "# the node's settings come from the environment\n",
	}
	if o.Advanced != "" {
		files["advanced.config"] = o.Advanced + "\n"
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n := &Node{Name: "rs-test-" + random() + "@localhost", Port: port, t: t, dir: dir, server: server, ctl: ctl}
	n.env = append(cleanEnv(),
		"HOME="+home,
		"RABBITMQ_NODENAME="+n.Name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_LOGS=-",
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "rabbitmq.pid"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
	)
	t.Cleanup(func() {
		n.Kill()
		if t.Failed() {
			t.Logf("rabbitnode: %s output (tail):\n%s", n.Name, n.tail(60))
		}
	})
	return n
}

// binaries finds rabbitmq-server and rabbitmqctl. The Debian package's /usr/sbin
// scripts re-run themselves as the rabbitmq user through su, which would take the node
// out of the test's process tree; its /usr/lib/rabbitmq/bin scripts run as the caller.
func binaries() (server, ctl string) {
	const lib = "/usr/lib/rabbitmq/bin/"
	if _, err := os.Stat(lib + "rabbitmq-server"); err == nil {
		return lib + "rabbitmq-server", lib + "rabbitmqctl"
	}
	server, _ = exec.LookPath("rabbitmq-server")
	ctl, _ = exec.LookPath("rabbitmqctl")
	return server, ctl
}

// cleanEnv is the test's environment without the RABBITMQ_* variables and HOME, which
// the node sets itself.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "RABBITMQ_") || strings.HasPrefix(kv, "HOME=") || strings.HasPrefix(kv, "ERL_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// URL is the node's AMQP URL (user guest).
func (n *Node) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.Port) }

// StartTimes returns how long each start took, from launching rabbitmq-server to the
// first AMQP connection it accepted.
func (n *Node) StartTimes() []time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]time.Duration(nil), n.started...)
}

// Running reports whether the node's process runs.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// run launches rabbitmq-server and waits until an AMQP connection succeeds.
func (n *Node) run() {
	n.t.Helper()
	if err := n.start(); err != nil {
		n.t.Fatal(err)
	}
}

// start launches rabbitmq-server and waits until an AMQP connection succeeds; it
// may be called from any goroutine.
func (n *Node) start() error {
	if n.Running() {
		return fmt.Errorf("rabbitnode: %s already runs", n.Name)
	}
	_ = os.Remove(filepath.Join(n.dir, "rabbitmq.pid"))
	out, err := os.OpenFile(filepath.Join(n.dir, "server.out"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "--- start %s\n", time.Now().UTC().Format(time.RFC3339Nano))
	begin := time.Now()
	cmd := exec.Command(n.server)
	cmd.Dir = n.dir
	cmd.Env = n.env
	cmd.Stdout, cmd.Stderr = out, out
	// A process group of its own, so that Kill reaches every process the script
	// started; and the kernel kills it if the test binary dies before its cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return fmt.Errorf("rabbitnode: starting %s: %w", n.server, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = out.Close(); close(exited) }()
	n.mu.Lock()
	n.cmd, n.exited = cmd, exited
	n.mu.Unlock()
	if err := n.awaitAMQP(begin, exited); err != nil {
		return err
	}
	n.mu.Lock()
	n.started = append(n.started, time.Since(begin))
	n.mu.Unlock()
	return nil
}

func (n *Node) exitedChan() chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exited
}

// awaitAMQP waits until an AMQP connection to the node succeeds, within StartTimeout
// of begin, or the process exits.
func (n *Node) awaitAMQP(begin time.Time, exited chan struct{}) error {
	deadline := time.NewTimer(time.Until(begin.Add(StartTimeout)))
	defer deadline.Stop()
	for {
		if c, err := amqp.DialConfig(n.URL(), amqp.Config{Dial: amqp.DefaultDial(time.Second)}); err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("rabbitnode: %s exited before accepting connections:\n%s", n.Name, n.tail(60))
		case <-deadline.C:
			return fmt.Errorf("rabbitnode: %s did not accept an AMQP connection within %v:\n%s", n.Name, StartTimeout, n.tail(60))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Restart starts a node that was killed or stopped, with the same name, ports and
// directories, and waits until it accepts AMQP connections.
func (n *Node) Restart() {
	n.t.Helper()
	n.run()
}

// Pid returns the operating-system pid of the node's Erlang VM, from its pid file.
func (n *Node) Pid() (int, error) {
	b, err := os.ReadFile(filepath.Join(n.dir, "rabbitmq.pid"))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("rabbitnode: pid file holds %q", b)
	}
	return pid, nil
}

// Kill ends the node at once, as a crash does: SIGKILL of the Erlang VM (and of the
// rest of its process group), then waits until the process is gone. A node not running
// is left alone.
//
// RabbitMQ 3.10 registers a quorum queue's Raft server in a table it writes to disk
// lazily (every few minutes and at a clean stop): a quorum queue declared shortly
// before a Kill may be unknown to the restarted node (its clients then wait for a
// leader that never comes). Tests that restart a node holding fresh quorum queues use
// Stop, which saves that table.
func (n *Node) Kill() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	if pid, err := n.Pid(); err == nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-exited:
	case <-time.After(time.Minute):
		n.t.Errorf("rabbitnode: %s did not exit after SIGKILL", n.Name)
	}
}

// Stop shuts the node down cleanly (rabbitmqctl -n NODE stop) and waits until its
// process is gone; it kills the node if that fails.
func (n *Node) Stop() {
	n.t.Helper()
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	if !n.Running() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := n.Ctl(ctx, "stop"); err != nil {
		n.t.Logf("rabbitnode: rabbitmqctl stop: %v\n%s", err, out)
		n.Kill()
		return
	}
	select {
	case <-exited:
	case <-ctx.Done():
		n.Kill()
	}
}

// Ctl runs rabbitmqctl -n NODE args… with the node's environment and returns its
// combined output.
func (n *Node) Ctl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, n.ctl, append([]string{"-n", n.Name}, args...)...)
	cmd.Dir = n.dir
	cmd.Env = n.env
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

// Log returns what the node has written to its standard output and error (its log,
// RABBITMQ_LOGS=-), every start included.
func (n *Node) Log() string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "server.out"))
	return string(b)
}

func (n *Node) tail(lines int) string {
	l := strings.Split(strings.TrimRight(n.Log(), "\n"), "\n")
	return strings.Join(l[max(0, len(l)-lines):], "\n")
}

func random() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
