//go:build linux

package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// buildBinary builds cmd/retrysafe into a temporary directory, as cmd/retrysafe's
// end-to-end tests do (with -race when the tests run with it), and returns its path.
func buildBinary(ctx context.Context, t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "retrysafe")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", append(args, "github.com/retrysafe/retrysafe/cmd/retrysafe")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("chaos: building retrysafe: %v\n%s", err, out)
	}
	t.Logf("chaos: built %s in %s (race %v)", bin, time.Since(start).Round(time.Millisecond), raceEnabled)
	return bin
}

// gatewayEnv is the binary's environment: this process's without RETRYSAFE_ variables
// (the gateway reads its flags from them).
func gatewayEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RETRYSAFE_") {
			out = append(out, kv)
		}
	}
	return out
}

// replica is one gateway replica: a `retrysafe gateway` process, killed and restarted
// with the same flags on the same address.
type replica struct {
	name string
	bin  string
	args []string // the gateway flags but --listen

	mu         sync.Mutex
	addr       string // host:port, fixed by the first start
	cur        *proc
	outcomes   map[string]int64         // per-request outcomes from the logs of every process
	keyLines   map[string][]GatewayLine // per key, the request lines of every process
	procs      []*proc                  // every process started, in order
	warnings   int64                    // WARN and ERROR lines
	tail       []string                 // the last lines of the logs, for failure reports
	unexpected []string                 // exits nobody asked for
	starts     int
	failed     int // starts that exited before listening
}

// proc is one process of a replica.
type proc struct {
	cmd      *exec.Cmd
	pid      int
	started  time.Time
	expected atomic.Bool   // set before a kill or a SIGTERM: the exit is the test's doing
	killedAt atomic.Int64  // UnixNano of the suite's SIGKILL; 0: not killed
	ended    time.Time     // when it was seen to exit; valid after exited
	serving  atomic.Bool   // it logged that it listens
	exited   chan struct{} // closed once the process has been waited for
	code     int           // exit status; -1 when killed by a signal; valid after exited
	state    string
}

func newReplica(name, bin string, args ...string) *replica {
	return &replica{name: name, bin: bin, args: args, outcomes: map[string]int64{}, keyLines: map[string][]GatewayLine{}}
}

// start runs the gateway and waits for its "listening" line. The first start listens on
// a free port; the following ones on the same address. A process that exits before
// listening (the store unreachable during a PostgreSQL restart, the port not yet free)
// is started again, until ctx ends or 30s have passed.
func (r *replica) start(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for attempt := 1; ; attempt++ {
		err := r.startOnce(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("%s: %d starts failed, the last: %w", r.name, attempt, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(min(attempt, 5)) * 100 * time.Millisecond):
		}
	}
}

func (r *replica) startOnce(ctx context.Context) error {
	r.mu.Lock()
	listen := r.addr
	r.mu.Unlock()
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	args := append([]string{"gateway", "--listen", listen, "--admin", "off", "--log-format", "json", "--log-level", "info"}, r.args...)
	cmd := exec.Command(r.bin, args...)
	cmd.Env = gatewayEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("stderr pipe: %w", err)
	}
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, started: started, exited: make(chan struct{})}
	r.mu.Lock()
	r.cur = p
	r.procs = append(r.procs, p)
	r.starts++
	r.mu.Unlock()

	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			r.line(sc.Text(), p, ready)
		}
		_ = cmd.Wait()
		p.ended = time.Now()
		p.code = cmd.ProcessState.ExitCode()
		p.state = cmd.ProcessState.String()
		if p.serving.Load() && !p.expected.Load() {
			r.mu.Lock()
			r.unexpected = append(r.unexpected, fmt.Sprintf("pid %d: %s", p.pid, p.state))
			r.mu.Unlock()
		}
		close(p.exited)
	}()

	select {
	case addr := <-ready:
		r.mu.Lock()
		r.addr = addr
		r.mu.Unlock()
		return nil
	case <-p.exited:
		r.mu.Lock()
		r.failed++
		tail := r.tailLocked(3)
		r.mu.Unlock()
		return fmt.Errorf("exited before listening (%s): %s", p.state, tail)
	case <-time.After(20 * time.Second):
		r.killProc(p)
		return errors.New("not listening after 20s")
	case <-ctx.Done():
		r.killProc(p)
		return ctx.Err()
	}
}

func (r *replica) line(s string, p *proc, ready chan<- string) {
	level, msg, key, gl, attrs := parseLine(s, r.name, p.pid)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case msg == "request":
		if gl.Outcome != "" {
			r.outcomes[gl.Outcome]++
		}
		if key != "" {
			r.keyLines[key] = append(r.keyLines[key], gl)
		}
		if level == "INFO" || level == "DEBUG" {
			return // too many to keep in the tail
		}
	case msg == "retrysafe gateway listening":
		p.serving.Store(true)
		addr, _ := attrs["addr"].(string)
		select {
		case ready <- addr:
		default:
		}
	}
	if level == "WARN" || level == "ERROR" {
		r.warnings++
	}
	r.tail = append(r.tail, s)
	if len(r.tail) > 200 {
		r.tail = r.tail[len(r.tail)-100:]
	}
}

func (r *replica) tailLocked(n int) string {
	return strings.Join(r.tail[max(0, len(r.tail)-n):], "\n")
}

// Tail returns the last n lines worth keeping of the replica's logs.
func (r *replica) Tail(n int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tailLocked(n)
}

// Addr returns the address the replica listens on.
func (r *replica) Addr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addr
}

func (r *replica) current() *proc {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// kill sends SIGKILL to the running process and waits for it to be gone. It reports
// false when the process had already exited.
func (r *replica) kill() bool {
	p := r.current()
	if p == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
	}
	r.killProc(p)
	return true
}

func (r *replica) killProc(p *proc) {
	p.expected.Store(true)
	p.killedAt.CompareAndSwap(0, time.Now().UnixNano())
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// stop sends SIGTERM (graceful: the requests in flight finish and are recorded) and
// returns the exit status, or an error when the process did not exit within d (it is
// then killed).
func (r *replica) stop(d time.Duration) (int, error) {
	p := r.current()
	if p == nil {
		return 0, errors.New("never started")
	}
	p.expected.Store(true)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.code, nil
	case <-time.After(d):
		r.killProc(p)
		return p.code, fmt.Errorf("%s: still running %s after SIGTERM: killed", r.name, d)
	}
}

// Outcomes returns a copy of the per-request outcome counts, and the WARN/ERROR lines.
func (r *replica) Outcomes() (map[string]int64, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int64, len(r.outcomes))
	for k, v := range r.outcomes {
		out[k] = v
	}
	return out, r.warnings
}

// Lines returns the request lines the replica's processes logged, by key.
func (r *replica) Lines() map[string][]GatewayLine {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string][]GatewayLine, len(r.keyLines))
	for k, ls := range r.keyLines {
		out[k] = append([]GatewayLine(nil), ls...)
	}
	return out
}

// Processes returns the lifetimes of the replica's processes. A process killed by the
// suite ends at its SIGKILL; one still running has a zero End.
func (r *replica) Processes() []Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Process
	for _, p := range r.procs {
		pr := Process{Replica: r.name, PID: p.pid, Start: p.started}
		select {
		case <-p.exited:
			pr.End = p.ended
		default:
		}
		if k := p.killedAt.Load(); k != 0 {
			pr.Killed, pr.End = true, time.Unix(0, k)
		}
		out = append(out, pr)
	}
	return out
}

// Unexpected returns the exits nobody asked for.
func (r *replica) Unexpected() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.unexpected...)
}

// Starts returns how many processes were started and how many of them exited before
// listening.
func (r *replica) Starts() (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts, r.failed
}
