package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

// node is a disposable RabbitMQ node in a temporary directory, on its own ports, that a
// test may stop and start again (the machine's shared broker is never restarted).
type node struct {
	t       testing.TB
	dir     string
	name    string
	port    int
	env     []string
	cmd     *exec.Cmd
	exited  chan struct{}
	started time.Duration
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// newNode prepares (does not start) a node. It skips when rabbitmq-server is missing.
func newNode(t testing.TB) *node {
	t.Helper()
	if _, err := exec.LookPath("rabbitmq-server"); err != nil {
		t.Skip("rabbitmq-server not installed")
	}
	dir, err := os.MkdirTemp("", "retrysafe-rmq-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// rabbitmq-server run by root drops to the rabbitmq user, which must own the dir.
	if os.Geteuid() == 0 {
		if u, err := user.Lookup("rabbitmq"); err == nil {
			uid, _ := strconv.Atoi(u.Uid)
			gid, _ := strconv.Atoi(u.Gid)
			_ = os.Chmod(dir, 0o755)
			if err := os.Chown(dir, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	n := &node{t: t, dir: dir, name: testenv.Name("rstest") + "@localhost", port: freePort(t)}
	n.env = append(os.Environ(),
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_PORT="+strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(freePort(t)),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "none"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "rabbitmq.pid"),
	)
	t.Cleanup(n.kill)
	return n
}

func (n *node) url() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port) }

// start boots the node and waits until it accepts AMQP connections.
func (n *node) start() {
	n.t.Helper()
	begin := time.Now()
	cmd := exec.Command("rabbitmq-server")
	cmd.Dir = n.dir
	cmd.Env = n.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	log, err := os.OpenFile(filepath.Join(n.dir, "server.out"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.cmd, n.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); _ = log.Close(); close(n.exited) }()
	for {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(n.port), time.Second); err == nil {
			_ = c.Close()
			break
		}
		select {
		case <-n.exited:
			out, _ := os.ReadFile(filepath.Join(n.dir, "server.out"))
			n.t.Fatalf("rabbitmq-server exited:\n%s", out)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Since(begin) > 2*time.Minute {
			n.t.Fatal("rabbitmq-server did not start in 2 minutes")
		}
	}
	n.started = time.Since(begin)
}

// stop shuts the node down cleanly, as a broker restart does.
func (n *node) stop() {
	n.t.Helper()
	out, err := exec.Command("rabbitmqctl", "-n", n.name, "stop").CombinedOutput()
	if err != nil {
		n.t.Logf("rabbitmqctl stop: %v\n%s", err, out)
		n.kill()
		return
	}
	select {
	case <-n.exited:
	case <-time.After(30 * time.Second):
		n.kill()
	}
}

// kill ends the node, if it runs. rabbitmq-server started by root switches to the
// rabbitmq user in a new session, so the process group of cmd does not reach the Erlang
// VM: its pid comes from RABBITMQ_PID_FILE.
func (n *node) kill() {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	select {
	case <-n.exited:
		return
	default:
	}
	if b, err := os.ReadFile(filepath.Join(n.dir, "rabbitmq.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-n.exited:
	case <-time.After(30 * time.Second):
		n.t.Errorf("rabbitmq node %s did not exit; stop it with: rabbitmqctl -n %s stop", n.name, n.name)
	}
}

// TestBrokerRestart restarts a disposable RabbitMQ node while a consumer runs and a
// producer publishes: the consumer reconnects and no message is lost. Booting a node
// takes 5–20 s here, twice, so it runs only with RETRYSAFE_LONG=1.
func TestBrokerRestart(t *testing.T) {
	if os.Getenv("RETRYSAFE_LONG") != "1" {
		t.Skip("boots a disposable RabbitMQ node twice; set RETRYSAFE_LONG=1")
	}
	n := newNode(t)
	n.start()
	t.Logf("node booted in %v", n.started)
	d := newDB(t)
	queue := testenv.Name("restart")
	cfg := Config{URL: n.url(), Queue: queue, Delays: testDelays, Logger: quiet(),
		Reconnect: retry.Policy{Base: 100 * time.Millisecond, Cap: time.Second}}
	// After the first messages (some of them retried through the delay queues), the
	// handlers wait in their transactions until the node is stopping: a backlog is
	// still there, and in flight, when the broker stops.
	const flowing = 30
	stopping := make(chan struct{})
	var writes, started atomic.Int32
	src, stopConsumer := consume(t, cfg, redeliver.Config{Policy: testPolicy(5), Concurrency: 2,
		Handler: d.inbox.Handler(func(ctx context.Context, tx pgx.Tx, m *redeliver.Message) error {
			writes.Add(1)
			if started.Add(1) > flowing {
				select {
				case <-stopping:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if m.Attempt == 1 && m.ID[len(m.ID)-1] == '3' {
				return errors.New("blip") // some go through the delay queues across the restart
			}
			return d.write(ctx, tx, m)
		})})
	pub, err := NewPublisher(t.Context(), PublisherConfig{URL: n.url()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	const total = 200
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			m := &redeliver.Message{ID: "m" + strconv.Itoa(i), Body: []byte("x")}
			// At least once: retry until confirmed, while the publisher reconnects.
			eventually(t, 30*time.Second, "a confirmed publish of "+m.ID, func() bool { return pub.Publish(t.Context(), queue, m) == nil })
		}
	}
	// Half before the restart, stopped while they are being processed and retried, …
	publish(0, total/2)
	eventually(t, 30*time.Second, "both handlers held", func() bool { return started.Load() >= flowing+2 })
	n.stop()
	close(stopping)
	t.Logf("node stopped; %d rows so far", func() int { r, _ := d.rows(t); return r }())
	n.start()
	t.Logf("node restarted in %v", n.started)
	// … half after it.
	publish(total/2, total)
	eventually(t, 60*time.Second, "every message", func() bool { rows, _ := d.rows(t); return rows == total })
	stopConsumer()
	if rows, distinct := d.rows(t); rows != total || distinct != total {
		t.Errorf("business rows %d (%d ids), want %d", rows, distinct, total)
	}
	if c := src.Connects(); c < 2 {
		t.Errorf("%d connects, want a reconnect", c)
	}
	t.Logf("%d handler runs, %d connects", writes.Load(), src.Connects())
}
