//go:build linux

package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/testenv"
)

// pgCluster is a disposable PostgreSQL cluster: its own data directory in a temporary
// directory, its own port, run by the postgres user (PostgreSQL refuses root). Nothing
// of the machine's shared cluster is touched; restarting this one disturbs no other test.
type pgCluster struct {
	bin     string // directory of initdb, pg_ctl
	dir     string // owned by the cluster's user; removed at cleanup
	data    string
	logFile string
	port    int
	cred    *syscall.Credential // nil: run as the current (non-root) user
}

// URL returns the cluster's connection URL (database postgres, trust authentication).
func (c *pgCluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// findPGBin returns the directory holding initdb and pg_ctl: RETRYSAFE_PG_BIN when set,
// else the newest /usr/lib/postgresql/*/bin that has both, else the PATH's.
func findPGBin() (string, error) {
	if d := os.Getenv("RETRYSAFE_PG_BIN"); d != "" {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "pg_ctl")) {
			return d, nil
		}
		return "", fmt.Errorf("initdb and pg_ctl not found in RETRYSAFE_PG_BIN=%s", d)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "pg_ctl")) {
			return d, nil
		}
	}
	initdb, err1 := exec.LookPath("initdb")
	pgctl, err2 := exec.LookPath("pg_ctl")
	if err1 == nil && err2 == nil && filepath.Dir(initdb) == filepath.Dir(pgctl) {
		return filepath.Dir(initdb), nil
	}
	return "", errors.New("initdb and pg_ctl not found (looked in /usr/lib/postgresql/*/bin and $PATH): install the PostgreSQL server binaries, or set RETRYSAFE_PG_BIN to their directory")
}

func pgVersion(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func isExec(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// startCluster creates and starts a disposable cluster, stopped (immediate) and removed
// at t's cleanup. It skips t (fails it with RETRYSAFE_REQUIRE_SERVICES=1) when the
// PostgreSQL binaries or, as root, the postgres user are missing.
func startCluster(ctx context.Context, t *testing.T) *pgCluster {
	t.Helper()
	missing := func(msg string) {
		t.Helper()
		if testenv.Required() {
			t.Fatal("chaos: " + msg + " [RETRYSAFE_REQUIRE_SERVICES=1]")
		}
		t.Skip("chaos: " + msg)
	}
	bin, err := findPGBin()
	if err != nil {
		missing(err.Error())
	}
	c := &pgCluster{bin: bin}
	uid, gid := -1, -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			missing("running as root and there is no postgres user to run a disposable cluster as (" + err.Error() + ")")
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	}
	// Not t.TempDir: its parent is root's and closed to the postgres user.
	c.dir, err = os.MkdirTemp("", "retrysafe-chaos-pg-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(c.dir); err != nil {
			t.Errorf("chaos: removing the cluster's directory: %v", err)
		}
	})
	if c.cred != nil {
		if err := os.Chown(c.dir, uid, gid); err != nil {
			t.Fatalf("chaos: chown %s to postgres: %v", c.dir, err)
		}
	}
	c.data = filepath.Join(c.dir, "data")
	c.logFile = filepath.Join(c.dir, "postgres.log")

	start := time.Now()
	if out, err := c.run(ctx, "initdb", "-D", c.data, "-U", "postgres", "--auth=trust", "--encoding=UTF8",
		"--no-instructions", "--no-sync"); err != nil {
		t.Fatalf("chaos: initdb: %v\n%s", err, out)
	}
	// A port that was free a moment ago; another process may take it meanwhile, so try a
	// few.
	for attempt := 0; ; attempt++ {
		c.port = freePort(t)
		err = c.start(ctx)
		if err == nil {
			break
		}
		if attempt == 3 {
			t.Fatalf("chaos: starting PostgreSQL: %v\n%s", err, c.logTail())
		}
	}
	t.Cleanup(func() {
		// Immediate: nothing of this cluster is worth a checkpoint.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if out, err := c.run(sctx, "pg_ctl", "stop", "-D", c.data, "-m", "immediate", "-w"); err != nil {
			t.Errorf("chaos: stopping the disposable cluster: %v\n%s", err, out)
		}
	})
	t.Logf("chaos: disposable PostgreSQL cluster %s on 127.0.0.1:%d (%s, fsync on), ready in %s",
		c.data, c.port, bin, time.Since(start).Round(time.Millisecond))
	return c
}

// start starts the server and waits until it accepts connections.
func (c *pgCluster) start(ctx context.Context) error {
	opts := strings.Join([]string{
		"-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + c.dir,
		"-c", "fsync=on",
		"-c", "synchronous_commit=on",
		"-c", "full_page_writes=on",
		"-c", "max_connections=200",
		"-c", "shared_buffers=64MB",
	}, " ")
	out, err := c.run(ctx, "pg_ctl", "start", "-D", c.data, "-l", c.logFile, "-w", "-t", "60", "-o", opts)
	if err != nil {
		return fmt.Errorf("pg_ctl start: %w: %s", err, out)
	}
	return nil
}

// restart stops the server the way a crash would (immediate: no checkpoint, crash
// recovery at the next start), waits pause, and starts it again. It returns how long the
// server was unreachable.
func (c *pgCluster) restart(ctx context.Context, pause time.Duration) (time.Duration, error) {
	down := time.Now()
	if out, err := c.run(ctx, "pg_ctl", "stop", "-D", c.data, "-m", "immediate", "-w"); err != nil {
		return 0, fmt.Errorf("pg_ctl stop: %w: %s", err, out)
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(pause):
	}
	if err := c.start(ctx); err != nil {
		return 0, err
	}
	return time.Since(down), nil
}

// run runs one of the cluster's programs as the cluster's user.
func (c *pgCluster) run(ctx context.Context, prog string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, prog), args...)
	cmd.Dir = c.dir // a directory the postgres user can enter
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	// pg_ctl start leaves the server running with its output in the log file; should it
	// ever hold our pipe, do not wait for it.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w", prog, err)
	}
	return string(out), nil
}

// logTail returns the end of the server's log.
func (c *pgCluster) logTail() string {
	b, err := os.ReadFile(c.logFile)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
