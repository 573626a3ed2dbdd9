//go:build linux

// Package pgcluster starts disposable replicated PostgreSQL clusters for tests: a
// primary and streaming standbys, each its own server in a temporary directory on a free
// loopback port, which a test may stop as a crash would, start again, promote, and cut
// off from each other. Nothing of the machine's shared PostgreSQL is touched.
//
// # Set-up
//
// The primary is initdb (trust authentication, fsync off: a test cluster survives
// process crashes, which is all a test does to it, without flushing to disk), then each
// standby is pg_basebackup -R -X stream of it. A standby streams from the primary
// through a TCP proxy of its own (harness/tcpproxy), its replication link, which the
// test cuts (Node.Link) to lose the standby without stopping it. With Options.Sync the
// primary's synchronous_standby_names names the first standby's application_name, so a
// commit on the primary returns only once that standby has flushed it; a standby never
// waits for standbys of its own, so a promoted standby commits alone.
//
// # Use
//
//	c := pgcluster.Start(t, pgcluster.Options{Standbys: 1, Sync: true})
//	url := c.MultiHostURL(nil) // the primary first, then the standbys; read-write sessions
//	...
//	c.Standbys[0].Stop(ctx)       // the synchronous standby lost: commits wait
//	c.Primary.Stop(ctx)           // the primary lost (pg_ctl stop -m immediate)
//	c.Standbys[0].Start(ctx)      // back, in recovery still
//	c.Standbys[0].Promote(ctx)    // now the primary
//
// PostgreSQL refuses to run as root: as root, every program runs as the postgres user
// (which must exist), in directories that user owns. The binaries are found in
// RETRYSAFE_PG_BIN, else the newest /usr/lib/postgresql/*/bin, else $PATH. When they or
// the user are missing, Start skips the test, or fails it with
// RETRYSAFE_REQUIRE_SERVICES=1. Everything is stopped and removed at the test's cleanup.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/harness/tcpproxy"
	"github.com/retrysafe/retrysafe/harness/testenv"
)

// Options configure a cluster. The zero value is a lone primary.
type Options struct {
	// Standbys is how many streaming standbys to start. Default 0.
	Standbys int
	// Sync makes the first standby synchronous: the primary's
	// synchronous_standby_names names it, so a commit returns once it has flushed the
	// commit's WAL (synchronous_commit on). Default false: every standby asynchronous.
	Sync bool
	// MaxConnections is every server's max_connections. Default 100.
	MaxConnections int
	// Settings are more settings of every server, "name=value" as postgres -c takes
	// them.
	Settings []string
}

// Cluster is a running cluster. Make one with Start.
type Cluster struct {
	// Primary is the server that was started as the primary (a promotion does not
	// change it).
	Primary *Node
	// Standbys are the standbys, in the order they were started: standby1, standby2…
	Standbys []*Node

	t    testing.TB
	bin  string
	cred *syscall.Credential // nil: run as the current (non-root) user
	dir  string
}

// Node is one server of a cluster.
type Node struct {
	c       *Cluster
	name    string // also the application_name of a standby's walreceiver
	dir     string // the node's directory: its data, log and socket
	data    string
	logFile string
	port    int
	link    *tcpproxy.Proxy // a standby's replication link; nil for the primary

	mu      sync.Mutex
	running bool
}

// Start creates and starts a cluster, stopped and removed at t's cleanup.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	begin := time.Now()
	c := &Cluster{t: t}
	c.setUp()
	opts.MaxConnections = max(opts.MaxConnections, 0)
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 100
	}

	c.Primary = c.newNode("primary")
	if out, err := c.run(ctx, "initdb", "-D", c.Primary.data, "-U", "postgres", "--auth=trust", "--encoding=UTF8",
		"--locale=C", "--no-instructions", "--no-sync"); err != nil {
		t.Fatalf("pgcluster: initdb: %v\n%s", err, out)
	}
	settings := []string{
		"listen_addresses = '127.0.0.1'",
		"max_connections = " + strconv.Itoa(opts.MaxConnections),
		"fsync = off", // a process crash loses nothing; the machine does not crash in a test
		"shared_buffers = '16MB'",
		"wal_level = replica",
		"max_wal_senders = 10",
		"wal_keep_size = '64MB'",
		"hot_standby = on",
		"wal_receiver_status_interval = '1s'",
		"wal_retrieve_retry_interval = '100ms'", // a standby reconnects soon after a cut heals
		"log_min_messages = warning",
		"log_line_prefix = '%m [%p] %a '",
	}
	for _, s := range opts.Settings {
		name, value, ok := strings.Cut(s, "=")
		if !ok {
			t.Fatalf("pgcluster: setting %q is not name=value", s)
		}
		settings = append(settings, strings.TrimSpace(name)+" = '"+strings.ReplaceAll(strings.TrimSpace(value), "'", "''")+"'")
	}
	c.appendConf(c.Primary, "postgresql.conf", settings...)
	if opts.Sync && opts.Standbys > 0 {
		c.appendConf(c.Primary, "postgresql.auto.conf", "synchronous_standby_names = 'standby1'")
	}
	c.startFirst(ctx, c.Primary)

	for i := range opts.Standbys {
		s := c.newNode("standby" + strconv.Itoa(i+1))
		link, err := tcpproxy.New(c.Primary.Addr())
		if err != nil {
			t.Fatalf("pgcluster: replication link: %v", err)
		}
		t.Cleanup(func() { _ = link.Close() })
		s.link = link
		if out, err := c.run(ctx, "pg_basebackup", "-D", s.data, "-h", "127.0.0.1", "-p", strconv.Itoa(c.Primary.port),
			"-U", "postgres", "-R", "-X", "stream", "--no-sync", "-c", "fast"); err != nil {
			t.Fatalf("pgcluster: pg_basebackup for %s: %v\n%s", s.name, err, out)
		}
		// The copy has the primary's files; later lines win. A standby never waits for
		// standbys of its own, so that promoted it commits alone.
		c.appendConf(s, "postgresql.auto.conf",
			"synchronous_standby_names = ''",
			fmt.Sprintf("primary_conninfo = 'host=127.0.0.1 port=%s user=postgres application_name=%s connect_timeout=2'",
				portOf(link.Addr()), s.name))
		c.startFirst(ctx, s)
		c.Standbys = append(c.Standbys, s)
	}
	for i, s := range c.Standbys {
		want := "async"
		if opts.Sync && i == 0 {
			want = "sync"
		}
		if err := c.AwaitStreaming(ctx, s, want); err != nil {
			t.Fatalf("pgcluster: %v", err)
		}
	}
	t.Logf("pgcluster: primary on %s, %d standby(s) (sync %v), ready in %s", c.Primary.Addr(), len(c.Standbys), opts.Sync,
		time.Since(begin).Round(time.Millisecond))
	return c
}

// setUp finds the binaries and the user to run them as, and makes the cluster's
// directory; it skips or fails t when it cannot.
func (c *Cluster) setUp() {
	t := c.t
	t.Helper()
	missing := func(msg string) {
		t.Helper()
		if testenv.Required() {
			t.Fatal("pgcluster: " + msg + " [RETRYSAFE_REQUIRE_SERVICES=1]")
		}
		t.Skip("pgcluster: " + msg)
	}
	bin, err := findBin()
	if err != nil {
		missing(err.Error())
	}
	c.bin = bin
	uid, gid := -1, -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			missing("running as root and there is no postgres user to run the servers as (" + err.Error() + ")")
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	}
	// Not t.TempDir: its parent is root's and closed to the postgres user.
	c.dir, err = os.MkdirTemp("", "retrysafe-pgcluster-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(c.dir); err != nil {
			t.Errorf("pgcluster: removing %s: %v", c.dir, err)
		}
	})
	if c.cred != nil {
		if err := os.Chown(c.dir, uid, gid); err != nil {
			t.Fatalf("pgcluster: chown %s: %v", c.dir, err)
		}
	}
}

// newNode makes a node's directory (its data directory is made by initdb or
// pg_basebackup).
func (c *Cluster) newNode(name string) *Node {
	n := &Node{c: c, name: name, dir: filepath.Join(c.dir, name)}
	n.data = filepath.Join(n.dir, "data")
	n.logFile = filepath.Join(n.dir, "postgres.log")
	if err := os.Mkdir(n.dir, 0o700); err != nil {
		c.t.Fatal(err)
	}
	if c.cred != nil {
		if err := os.Chown(n.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			c.t.Fatal(err)
		}
	}
	return n
}

// appendConf appends lines to the node's configuration file name (in its data
// directory).
func (c *Cluster) appendConf(n *Node, name string, lines ...string) {
	f, err := os.OpenFile(filepath.Join(n.data, name), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		c.t.Fatalf("pgcluster: %v", err)
	}
	defer f.Close()
	if _, err := f.WriteString("\n" + strings.Join(lines, "\n") + "\n"); err != nil {
		c.t.Fatalf("pgcluster: %v", err)
	}
}

// startFirst starts n on a free port (another process may take a free port meanwhile,
// so it tries a few) and stops it at cleanup.
func (c *Cluster) startFirst(ctx context.Context, n *Node) {
	t := c.t
	t.Helper()
	var err error
	for range 4 {
		n.port = testenv.FreePort(t)
		if err = n.Start(ctx); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("pgcluster: starting %s: %v\n%s", n.name, err, n.LogTail())
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.Stop(sctx); err != nil {
			t.Errorf("pgcluster: stopping %s: %v", n.name, err)
		}
		if t.Failed() {
			t.Logf("pgcluster: %s log:\n%s", n.name, n.LogTail())
		}
	})
}

// Nodes returns the primary and the standbys.
func (c *Cluster) Nodes() []*Node {
	return append([]*Node{c.Primary}, c.Standbys...)
}

// MultiHostURL returns a URL naming every node, the primary first, with
// target_session_attrs=read-write: a client connects to whichever node accepts writes,
// so that it follows a promotion. params, when not nil, are added to the query.
func (c *Cluster) MultiHostURL(params url.Values) string {
	hosts := make([]string, 0, len(c.Standbys)+1)
	for _, n := range c.Nodes() {
		hosts = append(hosts, n.Addr())
	}
	q := url.Values{"sslmode": {"disable"}, "target_session_attrs": {"read-write"}, "connect_timeout": {"2"}}
	for k, v := range params {
		q[k] = v
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/postgres?" + q.Encode()
}

// AwaitStreaming waits until the primary reports standby s streaming with the sync state
// want ("sync" or "async"), or ctx ends.
func (c *Cluster) AwaitStreaming(ctx context.Context, s *Node, want string) error {
	var state, sync string
	var err error
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		err = c.Primary.QueryRow(ctx, `SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1`,
			[]any{s.name}, &state, &sync)
		if err == nil && state == "streaming" && sync == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not streaming (%s) to the primary: state %q %q, %v", s.name, want, state, sync, err)
		case <-time.After(delay): // the server announces nothing: poll
		}
	}
}

// AwaitReplayed waits until standby s has replayed everything the primary had written
// when it was called (an asynchronous standby lags behind the primary's
// acknowledgements), or ctx ends.
func (c *Cluster) AwaitReplayed(ctx context.Context, s *Node) error {
	var lsn string
	if err := c.Primary.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`, nil, &lsn); err != nil {
		return err
	}
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		var done bool
		err := s.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, []any{lsn}, &done)
		if err == nil && done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s has not replayed the primary's WAL up to %s: %v", s.name, lsn, err)
		case <-time.After(delay): // the server announces nothing: poll
		}
	}
}

// Name is the node's name: "primary", "standby1"…; a standby's is the
// application_name it streams under.
func (n *Node) Name() string { return n.name }

// Addr is the node's host:port.
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

// URL is the node's URL: user postgres (superuser, trust), database postgres.
func (n *Node) URL() string {
	return "postgres://postgres@" + n.Addr() + "/postgres?sslmode=disable&connect_timeout=5"
}

// Link is a standby's replication link (a TCP proxy between it and the primary) which
// the test may cut or stall; nil for the primary.
func (n *Node) Link() *tcpproxy.Proxy { return n.link }

// Running reports whether the node was started and not stopped since.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.running
}

// Start starts the node (again), on its port, and waits until it accepts connections.
func (n *Node) Start(ctx context.Context) error {
	opts := strings.Join([]string{"-p", strconv.Itoa(n.port), "-c", "unix_socket_directories=" + n.dir}, " ")
	if out, err := n.c.run(ctx, "pg_ctl", "start", "-D", n.data, "-l", n.logFile, "-w", "-t", "60", "-o", opts); err != nil {
		return fmt.Errorf("pg_ctl start %s: %w: %s", n.name, err, out)
	}
	n.mu.Lock()
	n.running = true
	n.mu.Unlock()
	return nil
}

// Stop stops the node as a crash would (pg_ctl stop -m immediate: no checkpoint, and
// what its standbys have not received is lost with it). Stopping a stopped node does
// nothing.
func (n *Node) Stop(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.running {
		return nil
	}
	if out, err := n.c.run(ctx, "pg_ctl", "stop", "-D", n.data, "-m", "immediate", "-w", "-t", "30"); err != nil {
		return fmt.Errorf("pg_ctl stop %s: %w: %s", n.name, err, out)
	}
	n.running = false
	return nil
}

// Promote promotes a standby and waits until it accepts writes.
func (n *Node) Promote(ctx context.Context) error {
	if out, err := n.c.run(ctx, "pg_ctl", "promote", "-D", n.data, "-w", "-t", "60"); err != nil {
		return fmt.Errorf("pg_ctl promote %s: %w: %s", n.name, err, out)
	}
	return nil
}

// Exec runs sql on a connection of its own to the node, as the superuser.
func (n *Node) Exec(ctx context.Context, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, n.URL())
	if err != nil {
		return fmt.Errorf("%s: %w", n.name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("%s: %w", n.name, err)
	}
	return nil
}

// QueryRow runs sql with args on a connection of its own to the node, as the
// superuser, and scans its one row into dest.
func (n *Node) QueryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, n.URL())
	if err != nil {
		return fmt.Errorf("%s: %w", n.name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		return fmt.Errorf("%s: %w", n.name, err)
	}
	return nil
}

// Set sets a server setting with ALTER SYSTEM and reloads the configuration (for
// settings that take effect on reload, such as synchronous_standby_names).
func (n *Node) Set(ctx context.Context, name, value string) error {
	if err := n.Exec(ctx, "ALTER SYSTEM SET "+pgx.Identifier{name}.Sanitize()+" = '"+strings.ReplaceAll(value, "'", "''")+"'"); err != nil {
		return err
	}
	return n.Exec(ctx, "SELECT pg_reload_conf()")
}

// LogTail returns the end of the node's server log.
func (n *Node) LogTail() string {
	b, err := os.ReadFile(n.logFile)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

// run runs one of the PostgreSQL programs as the cluster's user.
func (c *Cluster) run(ctx context.Context, prog string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, prog), args...)
	cmd.Dir = c.dir // a directory the postgres user can enter
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGCONNECT_TIMEOUT=5")
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	// pg_ctl start leaves the server running with its output in the log file; should
	// it ever hold the pipe, do not wait for it.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w", prog, err)
	}
	return string(out), nil
}

// findBin returns the directory of the PostgreSQL programs: RETRYSAFE_PG_BIN when set,
// else the newest /usr/lib/postgresql/*/bin that has them, else the PATH's.
func findBin() (string, error) {
	progs := []string{"initdb", "pg_ctl", "pg_basebackup"}
	has := func(dir string) bool {
		for _, p := range progs {
			st, err := os.Stat(filepath.Join(dir, p))
			if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	if d := os.Getenv("RETRYSAFE_PG_BIN"); d != "" {
		if has(d) {
			return d, nil
		}
		return "", fmt.Errorf("initdb, pg_ctl and pg_basebackup not found in RETRYSAFE_PG_BIN=%s", d)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(bin string) int { v, _ := strconv.Atoi(filepath.Base(filepath.Dir(bin))); return v }
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", errors.New("initdb, pg_ctl and pg_basebackup not found (looked in /usr/lib/postgresql/*/bin and $PATH): install the PostgreSQL server binaries, or set RETRYSAFE_PG_BIN to their directory")
}

func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}
