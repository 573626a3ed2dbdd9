// Package redisha runs a disposable, replicated Redis for tests: a master, replicas
// (redis-server --replicaof) and a Sentinel (redis-server sentinel.conf --sentinel,
// quorum 1, down-after-milliseconds 1000), each a process of its own on a free loopback
// port, with its data in a temporary directory. It never touches a shared Redis.
//
// Every replica replicates through a TCP proxy of its own (Server.Link), so a test can
// stall or cut one replication link — the replica then lacks the master's last writes
// while the master still takes them — and heal it. Kill loses a server at once
// (SIGKILL); Failover kills the master and waits for the Sentinel to promote a replica.
// Everything started is stopped when the test ends.
//
// Nothing here sleeps for a fixed time: each wait is for a signal — a line the server
// logs (ready, synchronised with its master, a Sentinel's +slave and +switch-master), or
// an answer to INFO replication or SENTINEL get-master-addr-by-name that changes.
//
// Start skips the test when redis-server is not installed, or fails it when
// RETRYSAFE_REQUIRE_SERVICES=1 (CI) asks for every service.
package redisha

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/harness/tcpproxy"
	"github.com/retrysafe/retrysafe/harness/testenv"
)

// DefaultMasterName is the name the Sentinel monitors the master under, when
// Options.MasterName is empty.
const DefaultMasterName = "retrysafe"

// startTimeout bounds each wait of Start and of the helpers: for a server to be ready,
// a replica to synchronise, a Sentinel to see a replica or switch masters.
const startTimeout = 30 * time.Second

// Options configure Start.
type Options struct {
	// Replicas is the number of replicas. Default 1; -1 for none.
	Replicas int
	// NoSentinel starts no Sentinel.
	NoSentinel bool
	// MasterName is the name the Sentinel monitors the master under. Default
	// DefaultMasterName.
	MasterName string
	// Args are added to the command line of every data server (the master and the
	// replicas), e.g. "--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru". Each
	// server starts with no persistence ("--save", "", "--appendonly", "no"), which Args
	// may change.
	Args []string
}

// Group is a running master, its replicas and its Sentinel.
type Group struct {
	t          testing.TB
	name       string
	args       []string
	mu         sync.Mutex
	master     *Server
	replicas   []*Server
	sentinel   *Server // nil with Options.NoSentinel
	everything []*Server
}

// Start starts the servers opt describes and returns once every replica has
// synchronised with the master and the Sentinel (if any) monitors the master and knows
// every replica. They are killed when t ends.
func Start(t testing.TB, opt Options) *Group {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		msg := "redis-server not installed (" + err.Error() + "): the replicated Redis tests need it"
		if testenv.Required() {
			t.Fatal(msg + " [RETRYSAFE_REQUIRE_SERVICES=1]")
		}
		t.Skip(msg)
	}
	replicas := opt.Replicas
	switch {
	case replicas == 0:
		replicas = 1
	case replicas < 0:
		replicas = 0
	}
	g := &Group{t: t, name: opt.MasterName, args: opt.Args}
	if g.name == "" {
		g.name = DefaultMasterName
	}
	g.master = g.start(bin, "master", nil)
	for i := range replicas {
		g.replicas = append(g.replicas, g.startReplica(bin, fmt.Sprintf("replica%d", i+1), g.master))
	}
	if !opt.NoSentinel {
		g.startSentinel(bin)
	}
	return g
}

// Master returns the server the group's master is now: the first one, or the replica
// a Failover or AwaitSwitch saw promoted.
func (g *Group) Master() *Server {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.master
}

// Replicas returns the replicas started (by Start and AddReplica), the promoted ones
// included.
func (g *Group) Replicas() []*Server {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.replicas)
}

// Sentinel returns the Sentinel, or nil with Options.NoSentinel.
func (g *Group) Sentinel() *Server { return g.sentinel }

// MasterName is the name the Sentinel monitors the master under.
func (g *Group) MasterName() string { return g.name }

// URL is the go-redis failover URL of the group: the Sentinel's address, database 0,
// master_name, then the query parameters given as pairs ("wait", "1", ...), e.g.
// redis://127.0.0.1:41234/0?master_name=retrysafe&wait=1.
func (g *Group) URL(params ...string) string {
	if g.sentinel == nil {
		g.t.Fatal("redisha: URL of a group without a Sentinel")
	}
	q := url.Values{"master_name": {g.name}}
	for i := 0; i+1 < len(params); i += 2 {
		q.Add(params[i], params[i+1])
	}
	return "redis://" + g.sentinel.Addr + "/0?" + q.Encode()
}

// Server is one redis-server process: a master, a replica or a Sentinel.
type Server struct {
	// Addr is its host:port on the loopback interface.
	Addr string
	// Name says what it was started as: master, replica1, …, sentinel.
	Name string

	t      testing.TB
	bin    string
	args   []string
	link   *tcpproxy.Proxy // a replica's link to its master; nil otherwise
	logMu  sync.Mutex
	lines  []string
	grew   chan struct{} // closed and replaced at each line
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process is gone and its log read
	client *redis.Client
}

// URL is the redis:// URL of the server itself, database 0.
func (s *Server) URL() string { return "redis://" + s.Addr + "/0" }

// Link is the TCP proxy a replica replicates through (Stall, Cut and Restore it to
// take the replication link away); nil for a master started as one and for the
// Sentinel.
func (s *Server) Link() *tcpproxy.Proxy { return s.link }

// Client returns a client of the server (closed when the test ends).
func (s *Server) Client() *redis.Client {
	if s.client == nil {
		s.client = redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: time.Second})
		c := s.client
		s.t.Cleanup(func() { _ = c.Close() })
	}
	return s.client
}

// Log returns what the server has logged.
func (s *Server) Log() string {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	return strings.Join(s.lines, "\n")
}

// Kill kills the server (SIGKILL) and waits until the process is gone.
func (s *Server) Kill() {
	s.t.Helper()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart starts a killed server again, on its address with its arguments (a replica
// still replicates through its link), and waits until it accepts connections. A master
// the Sentinel replaced meanwhile is turned into a replica by the Sentinel, in its own
// time.
func (s *Server) Restart() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatalf("redisha: Restart of %s, which runs", s.Name)
	}
	s.run(s.args)
	s.awaitLog("accept connections", 0, func(l string) bool { return strings.Contains(l, "Ready to accept connections") })
}

// Info returns the fields of INFO section (replication, memory, ...) of the server.
func (s *Server) Info(ctx context.Context, section string) (map[string]string, error) {
	text, err := s.Client().Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// Offset returns the server's replication offset: master_repl_offset of a master, the
// offset a replica has processed.
func (s *Server) Offset(ctx context.Context) (int64, error) {
	info, err := s.Info(ctx, "replication")
	if err != nil {
		return 0, err
	}
	field := "master_repl_offset"
	if info["role"] == "slave" {
		field = "slave_repl_offset"
	}
	return strconv.ParseInt(info[field], 10, 64)
}

// AwaitCaughtUp waits until every replica that the master lists as online has
// acknowledged the master's replication offset as it is now.
func (g *Group) AwaitCaughtUp(ctx context.Context) {
	g.t.Helper()
	m := g.Master()
	want, err := m.Offset(ctx)
	if err != nil {
		g.t.Fatalf("redisha: offset of %s: %v", m.Name, err)
	}
	testenv.Eventually(g.t, startTimeout, func() bool {
		info, err := m.Info(ctx, "replication")
		if err != nil {
			return false
		}
		for k, v := range info {
			if !strings.HasPrefix(k, "slave") || !strings.Contains(v, "state=online") {
				continue
			}
			for f := range strings.SplitSeq(v, ",") {
				if o, ok := strings.CutPrefix(f, "offset="); ok {
					if n, _ := strconv.ParseInt(o, 10, 64); n < want {
						return false
					}
				}
			}
		}
		return true
	}, "the replicas of %s to acknowledge offset %d", m.Name, want)
}

// Failover kills the master and waits for the Sentinel to promote a replica, which it
// returns (as Master will from now on).
func (g *Group) Failover() *Server {
	g.t.Helper()
	old := g.Master()
	old.Kill()
	return g.AwaitSwitch(old)
}

// AwaitSwitch waits until the Sentinel has switched the group's master away from old
// (its +switch-master, and SENTINEL get-master-addr-by-name agreeing), and returns the
// new master.
func (g *Group) AwaitSwitch(old *Server) *Server {
	g.t.Helper()
	if g.sentinel == nil {
		g.t.Fatal("redisha: AwaitSwitch in a group without a Sentinel")
	}
	g.sentinel.awaitLog("+switch-master away from "+old.Addr, startTimeout, func(l string) bool {
		f := strings.Fields(l[strings.Index(l, "+switch-master")+len("+switch-master"):])
		return len(f) == 5 && f[0] == g.name && net.JoinHostPort(f[1], f[2]) == old.Addr
	})
	sc := redis.NewSentinelClient(&redis.Options{Addr: g.sentinel.Addr})
	defer sc.Close()
	var addr string
	testenv.Eventually(g.t, startTimeout, func() bool {
		a, err := sc.GetMasterAddrByName(context.Background(), g.name).Result()
		if err != nil || len(a) != 2 {
			return false
		}
		addr = net.JoinHostPort(a[0], a[1])
		return addr != old.Addr
	}, "SENTINEL get-master-addr-by-name %s to name another master than %s", g.name, old.Addr)
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range g.everything {
		if s.Addr == addr {
			g.master = s
			return s
		}
	}
	g.t.Fatalf("redisha: the Sentinel promoted %s, which the group did not start", addr)
	return nil
}

// AddReplica starts a new replica of the current master, through a link of its own,
// and waits until it has synchronised. The Sentinel learns of it from the master's INFO,
// which it reads every ten seconds: AwaitSentinelSees waits for that.
func (g *Group) AddReplica() *Server {
	g.t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		g.t.Fatal(err)
	}
	g.mu.Lock()
	name := fmt.Sprintf("replica%d", len(g.replicas)+1)
	g.mu.Unlock()
	r := g.startReplica(bin, name, g.Master())
	g.mu.Lock()
	g.replicas = append(g.replicas, r)
	g.mu.Unlock()
	return r
}

// start starts a redis-server process named name with the group's arguments and extra,
// on a free port, and waits until it accepts connections.
func (g *Group) start(bin, name string, extra []string) *Server {
	g.t.Helper()
	port := strconv.Itoa(testenv.FreePort(g.t))
	args := append([]string{"--bind", "127.0.0.1", "--port", port, "--dir", g.t.TempDir(),
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--repl-diskless-sync-delay", "0"}, g.args...)
	args = append(args, extra...)
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", port), Name: name, t: g.t, bin: bin, args: args}
	s.run(args)
	g.mu.Lock()
	g.everything = append(g.everything, s)
	g.mu.Unlock()
	s.awaitLog("accept connections", 0, func(l string) bool { return strings.Contains(l, "Ready to accept connections") })
	return s
}

// startReplica starts a replica of master through a TCP proxy of its own and waits
// until it has synchronised and the master lists it online.
func (g *Group) startReplica(bin, name string, master *Server) *Server {
	g.t.Helper()
	link, err := tcpproxy.New(master.Addr)
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { _ = link.Close() })
	host, port, _ := net.SplitHostPort(link.Addr())
	r := g.start(bin, name, []string{"--replicaof", host, port})
	r.link = link
	r.awaitLog("synchronised with its master", 0, func(l string) bool {
		return strings.Contains(l, "MASTER <-> REPLICA sync: Finished with success")
	})
	// The master counts a replica in WAIT only once it has put it online, at the
	// replica's first acknowledgement after the synchronisation.
	_, rport, _ := net.SplitHostPort(r.Addr)
	testenv.Eventually(g.t, startTimeout, func() bool {
		info, err := master.Info(context.Background(), "replication")
		if err != nil {
			return false
		}
		for k, v := range info {
			if strings.HasPrefix(k, "slave") && strings.Contains(v, ",port="+rport+",") && strings.Contains(v, "state=online") {
				return true
			}
		}
		return false
	}, "%s to list %s online", master.Name, r.Name)
	return r
}

// startSentinel writes a Sentinel configuration monitoring the master and starts the
// Sentinel, then waits until it monitors the master and knows every replica.
func (g *Group) startSentinel(bin string) {
	g.t.Helper()
	dir := g.t.TempDir()
	port := strconv.Itoa(testenv.FreePort(g.t))
	host, mport, _ := net.SplitHostPort(g.master.Addr)
	conf := strings.Join([]string{
		"bind 127.0.0.1",
		"port " + port,
		"dir " + dir,
		"protected-mode no",
		fmt.Sprintf("sentinel monitor %s %s %s 1", g.name, host, mport),
		fmt.Sprintf("sentinel down-after-milliseconds %s 1000", g.name),
		// The Sentinel points a replica that replicates from another address than the
		// master's (here every replica: through its link proxy) straight at the master
		// once failover-timeout has passed since it last reconfigured it
		// (+fix-slave-config), which would take the replica around its link and make a
		// stall hold nothing back. Far longer than a test, it never does.
		fmt.Sprintf("sentinel failover-timeout %s 600000", g.name),
		fmt.Sprintf("sentinel parallel-syncs %s 1", g.name),
		"",
	}, "\n")
	path := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		g.t.Fatal(err)
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", port), Name: "sentinel", t: g.t, bin: bin,
		args: []string{path, "--sentinel"}}
	s.run(s.args)
	g.sentinel = s
	s.awaitLog("+monitor", 0, func(l string) bool { return strings.Contains(l, "+monitor master "+g.name) })
	for _, r := range g.Replicas() {
		g.AwaitSentinelSees(r)
	}
}

// AwaitSentinelSees waits until the Sentinel has discovered replica r (its +slave line),
// without which it cannot promote r. A Sentinel learns the replicas from the master's
// INFO, which it reads at once when it connects and every ten seconds after.
func (g *Group) AwaitSentinelSees(r *Server) {
	g.t.Helper()
	g.sentinel.awaitLog("+slave "+r.Addr, 0, func(l string) bool { return strings.Contains(l, "+slave slave "+r.Addr+" ") })
}

// run starts the process with args; its standard output (the log) is read as it comes.
func (s *Server) run(args []string) {
	s.t.Helper()
	cmd := exec.Command(s.bin, args...)
	setDeathSignal(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("redisha: starting %s: %v", s.Name, err)
	}
	exited := make(chan struct{})
	s.logMu.Lock()
	s.cmd, s.exited = cmd, exited
	if s.grew == nil {
		s.grew = make(chan struct{})
	}
	s.lines = append(s.lines, fmt.Sprintf("--- %s %s", s.Name, strings.Join(args, " ")))
	s.logMu.Unlock()
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			s.logMu.Lock()
			s.lines = append(s.lines, sc.Text())
			close(s.grew)
			s.grew = make(chan struct{})
			s.logMu.Unlock()
		}
		_ = cmd.Wait()
	}()
	s.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if s.t.Failed() {
			s.t.Logf("redisha: %s log:\n%s", s.Name, s.Log())
		}
	})
}

// awaitLog waits up to d (0: startTimeout) for a line of the log that match accepts,
// among all the lines logged since the process last started, and fails the test when
// the process exits first.
func (s *Server) awaitLog(what string, d time.Duration, match func(string) bool) {
	s.t.Helper()
	if d == 0 {
		d = startTimeout
	}
	timeout := time.After(d)
	s.logMu.Lock()
	seen := 0
	for i, l := range s.lines {
		if strings.HasPrefix(l, "--- "+s.Name+" ") {
			seen = i // the last start
		}
	}
	exited := s.exited
	s.logMu.Unlock()
	for {
		s.logMu.Lock()
		lines, grew := s.lines[seen:], s.grew
		seen = len(s.lines)
		s.logMu.Unlock()
		if slices.ContainsFunc(lines, match) {
			return
		}
		select {
		case <-grew:
		case <-exited:
			s.t.Fatalf("redisha: %s exited before it logged %s:\n%s", s.Name, what, s.Log())
		case <-timeout:
			s.t.Fatalf("redisha: %s did not log %s in %v:\n%s", s.Name, what, d, s.Log())
		}
	}
}

// AwaitLog waits up to d for a line containing substr among those the server logged
// since it last started, and fails the test when it does not come, or the server exits
// first.
func (s *Server) AwaitLog(substr string, d time.Duration) {
	s.t.Helper()
	s.awaitLog(fmt.Sprintf("%q", substr), d, func(l string) bool { return strings.Contains(l, substr) })
}
