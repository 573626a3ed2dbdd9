package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/redisha"
	"github.com/retrysafe/retrysafe/harness/testenv"
)

// shmDir returns a directory on /dev/shm (tmpfs), removed when t ends, or skips t.
func shmDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "retrysafe-doctor-*")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// diskDir returns a directory beside the package, on the disk the module is on, removed
// when t ends.
func diskDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(".", "doctor-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// doctorLine returns the line of out that reports check at level (OK, WARN, REFUSE), or
// "".
func doctorLine(out, level, check string) string {
	for line := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == level && f[1] == check {
			return line
		}
	}
	return ""
}

// TestE2EDoctor: retrysafe doctor prints one aligned line per finding and a summary, and
// exits 0 when every finding is OK, 1 on a warning, 2 on a refusal, a store it cannot
// open, or bad flags; --allow-store-risk (or its variable) makes a refusal a warning.
func TestE2EDoctor(t *testing.T) {
	t.Parallel()
	disk, shm := diskDir(t), shmDir(t)
	evicting := redisha.Start(t, redisha.Options{Replicas: -1, NoSentinel: true,
		Args: []string{"--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "allkeys-lru"}})
	evictingURL := "redis://" + evicting.Master().Addr + "/0"
	for _, c := range []struct {
		name  string
		env   []string
		args  []string
		code  int
		lines []string // LEVEL CHECK, each on a line of its own
		want  []string // in the output
	}{
		{"SQLite on disk", nil, []string{"--store", "sqlite:" + filepath.Join(disk, "keys.db")}, 0,
			[]string{"OK sqlite.synchronous", "OK sqlite.journal_mode", "OK sqlite.filesystem"},
			[]string{"synchronous=FULL", "0 refusals, 0 warnings, 3 ok: the setup keeps the promise that a keyed request runs once; exit 0"}},
		{"SQLite on tmpfs", nil, []string{"--store", "sqlite:" + filepath.Join(shm, "keys.db")}, 1,
			[]string{"OK sqlite.synchronous", "WARN sqlite.filesystem"},
			[]string{"on tmpfs  — a file system in memory: a reboot loses every key", "0 refusals, 1 warning, 2 ok: a keyed request runs once, except as the warnings say; exit 1"}},
		{"memory", []string{"RETRYSAFE_STORE=memory:"}, nil, 1,
			[]string{"WARN memory.persistence"}, []string{"nothing survives the process"}},
		{"evicting Redis", nil, []string{"--store", evictingURL}, 2,
			[]string{"REFUSE redis.eviction", "OK redis.persistence"},
			[]string{"maxmemory-policy=allkeys-lru", "1 refusal, 0 warnings, ", "the gateway refuses to start on this store"}},
		{"evicting Redis allowed", nil, []string{"--store", evictingURL, "--allow-store-risk", "redis.eviction"}, 1,
			[]string{"WARN redis.eviction"}, []string{"(a refusal allowed by --allow-store-risk redis.eviction)", "0 refusals, 1 warning"}},
		{"evicting Redis allowed by the environment", []string{"RETRYSAFE_ALLOW_STORE_RISK=sqlite.filesystem,redis.eviction"}, []string{"--store", evictingURL}, 1,
			[]string{"WARN redis.eviction"}, []string{"0 refusals, 1 warning"}},
		{"unknown check", nil, []string{"--store", "memory:", "--allow-store-risk", "redis.evictoin"}, 2,
			nil, []string{`unknown check "redis.evictoin"`}},
		{"unreachable", nil, []string{"--store", "redis://:secret@" + testenv.DeadAddr(t) + "/0"}, 2,
			nil, []string{"retrysafe doctor:", "unreachable"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			expectDoctor(t, c.env, c.args, c.code, c.lines, c.want, nil)
		})
	}

	// The columns are aligned: every finding's detail starts at the same place when no
	// setting is longer than the setting column (44 characters), as none of the Redis's.
	out, _ := runBinary(t, "doctor", "--store", evictingURL)
	at := -1
	for line := range strings.SplitSeq(out, "\n") {
		if i := strings.Index(line, " — "); i >= 0 {
			if at >= 0 && i != at {
				t.Errorf("details start at %d and %d:\n%s", at, i, out)
			}
			at = i
		}
	}
	if out, code := runBinary(t, "doctor", "--help"); code != 0 || !strings.Contains(out, "--allow-store-risk CHECK,…") || !strings.Contains(out, "exit status: 0 every finding is OK") {
		t.Errorf("doctor --help: %d\n%s", code, out)
	}
	if out, code := runBinary(t, "help"); code != 0 || !strings.Contains(out, "doctor    say what the store's setup guarantees") {
		t.Errorf("help does not list doctor: %d\n%s", code, out)
	}
}

// gatewayExit runs `retrysafe gateway` with args, expecting it to exit before it
// listens, and returns its status, stdout and stderr.
func gatewayExit(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, append([]string{"gateway", "--admin", "off", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1"}, args...)...)
	cmd.Env = env()
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	_ = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("the gateway %v did not exit:\n%s", args, stderr.String())
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// storeWarnings returns the gateway's WARN lines about store settings, by check.
func storeWarnings(t *testing.T, p *proc) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for line := range strings.SplitSeq(p.log(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["level"] == "WARN" &&
			m["msg"] == "store setting narrows the promise that a keyed request runs once" {
			check, _ := m["check"].(string)
			if _, dup := out[check]; dup {
				t.Errorf("%s logged twice", check)
			}
			out[check] = m
		}
	}
	return out
}

// TestE2EGatewayStoreChecks: the gateway runs the doctor's checks as it starts: a
// setting that narrows the promise is a WARN line with its check, setting and detail;
// a refusal is one line on stderr and exit status 2, before listening; an allowed
// refusal is a warning, logged once.
func TestE2EGatewayStoreChecks(t *testing.T) {
	t.Parallel()
	shm := shmDir(t)

	p := startGateway(t, nil, "--upstream", "http://127.0.0.1:1", "--store", "sqlite:"+filepath.Join(shm, "keys.db"))
	warned := storeWarnings(t, p)
	if w := warned["sqlite.filesystem"]; w == nil || !strings.Contains(w["setting"].(string), "on tmpfs") ||
		!strings.Contains(w["detail"].(string), "a reboot loses every key") || !strings.Contains(w["store"].(string), "sqlite:") {
		t.Errorf("no WARN line for the tmpfs file: %v\n%s", warned, p.log())
	}
	if len(warned) != 1 {
		t.Errorf("warnings %v, want sqlite.filesystem only", warned)
	}

	g := redisha.Start(t, redisha.Options{NoSentinel: true,
		Args: []string{"--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "volatile-lru"}})
	replica := "redis://" + g.Replicas()[0].Addr + "/0"
	master := "redis://" + g.Master().Addr + "/0"

	// The replica is refused, on one line naming the check; the eviction is allowed.
	code, stdout, stderr := gatewayExit(t, "--store", replica, "--allow-store-risk", "redis.eviction", "--log-format", "json")
	var refusals []string
	for line := range strings.SplitSeq(strings.TrimSpace(stderr), "\n") {
		if strings.HasPrefix(line, "retrysafe gateway: store refused: ") {
			refusals = append(refusals, line)
		}
	}
	if code != 2 || len(refusals) != 1 || !strings.Contains(refusals[0], "redis.role role=slave of 127.0.0.1:") ||
		!strings.Contains(refusals[0], "--allow-store-risk redis.role") || stdout != "" {
		t.Errorf("gateway on a replica: exit %d, refusals %q, stdout %q; want 2 and one line for redis.role\n%s", code, refusals, stdout, stderr)
	}
	// The evicting master without an allowance is refused as it opens.
	if code, _, stderr := gatewayExit(t, "--store", master); code != 2 || strings.Count(stderr, "\n") != 1 ||
		!strings.Contains(stderr, "maxmemory-policy is volatile-lru") || !strings.Contains(stderr, "--allow-store-risk redis.eviction") {
		t.Errorf("gateway on an evicting Redis: exit %d\n%s", code, stderr)
	}
	// Allowed, it runs, with one warning for the eviction and one per asynchronous
	// replica.
	for _, allow := range [][]string{{"--allow-store-risk", "redis.eviction"}, {"--allow-evicting-store"}} {
		p := startGateway(t, nil, append([]string{"--upstream", "http://127.0.0.1:1", "--store", master}, allow...)...)
		warned := storeWarnings(t, p)
		if w := warned["redis.replication"]; w == nil || !strings.Contains(w["detail"].(string), "asynchronous replica") {
			t.Errorf("%v: no WARN line for the asynchronous replica: %v", allow, warned)
		}
		if n := strings.Count(p.log(), "volatile-lru"); n != 1 {
			t.Errorf("%v: the allowed eviction is in %d lines, want one:\n%s", allow, n, p.log())
		}
	}
}

// expectDoctor runs retrysafe doctor with args and env and checks its exit status, that it
// printed a line for each "LEVEL check" of lines, each of want and none of not, and that
// no password shows.
func expectDoctor(t *testing.T, env, args []string, wantCode int, lines, want, not []string) {
	t.Helper()
	out, code := runBinaryEnv(t, env, append([]string{"doctor"}, args...)...)
	if code != wantCode {
		t.Errorf("exit status %d, want %d", code, wantCode)
	}
	for _, l := range lines {
		level, check, _ := strings.Cut(l, " ")
		if doctorLine(out, level, check) == "" {
			t.Errorf("no %s line", l)
		}
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("no %q in the output", w)
		}
	}
	for _, w := range not {
		if strings.Contains(out, w) {
			t.Errorf("%q in the output", w)
		}
	}
	if strings.Contains(out, "secret") || strings.Contains(out, "guest:guest") {
		t.Error("the password leaks")
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}
