package load

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	t.Parallel()
	// Field numbers as in proc(5): utime 14, stime 15, cutime 16, cstime 17.
	line := "4242 (post gres: a) b) S 7 4242 4242 0 -1 4194560 100 0 0 0 250 50 30 20 20 0 1 0 99 0 0\n"
	st, err := parseStat([]byte(line))
	if err != nil || st.ppid != 7 || st.ticks != 350 {
		t.Errorf("parseStat: %+v, %v; want ppid 7, 350 ticks", st, err)
	}
	for _, bad := range []string{
		"",
		"1 (x S 1 1",
		"1 (x) S 1 1 1 0 -1 0 0 0 0 0 1 2",
		"1 (x) S one 1 1 0 -1 0 0 0 0 0 1 2 3 4 0",
		"1 (x) S 1 1 1 0 -1 0 0 0 0 0 1 -2 3 4 0",
		"1 (x) S 1 1 1 0 -1 0 0 0 0 0 1 2 3 x 0",
	} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
}

// fakeProc writes a /proc with one stat per process: pid → {ppid, utime, stime,
// cutime, cstime}.
func fakeProc(t *testing.T, root string, procs map[int][5]int) {
	t.Helper()
	for pid, p := range procs {
		dir := filepath.Join(root, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf("%d (cmd %d) S %d 1 1 0 -1 0 0 0 0 0 %d %d %d %d 20 0 1 0 1 0 0\n", pid, pid, p[0], p[1], p[2], p[3], p[4])
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSampleCPUSumsTrees(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	// 10 is a master with workers 11 and 12 (12 has a child 13); 20 is alone; 30 is
	// an unrelated process. "self" and "net" are not processes and are skipped.
	fakeProc(t, root, map[int][5]int{
		10: {1, 5, 5, 100, 50}, 11: {10, 10, 0, 0, 0}, 12: {10, 1, 1, 0, 0}, 13: {12, 2, 2, 0, 0},
		20: {1, 7, 3, 0, 0}, 30: {1, 1000, 1000, 0, 0},
	})
	for _, d := range []string{"self", "net"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ps := []Process{{Name: "nginx", PID: 10}, {Name: "app", PID: 20}, {Name: "worker", PID: 12}}
	s, err := sampleCPU(root, ps)
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint64{176, 10, 6}; fmt.Sprint(s.ticks) != fmt.Sprint(want) || fmt.Sprint(s.n) != "[4 1 2]" {
		t.Errorf("ticks %v, processes %v; want %v, [4 1 2]", s.ticks, s.n, want)
	}
	if _, err := sampleCPU(root, []Process{{Name: "gone", PID: 99}}); err == nil || !strings.Contains(err.Error(), "gone") {
		t.Errorf("a missing process: %v", err)
	}

	// A worker that exited and was reaped moves into its parent's children's times:
	// the tree's total does not change.
	after := t.TempDir()
	fakeProc(t, after, map[int][5]int{10: {1, 5, 5, 110, 50}, 12: {10, 1, 1, 0, 0}, 13: {12, 2, 2, 0, 0}, 20: {1, 9, 3, 0, 0}})
	s2, err := sampleCPU(after, ps[:2])
	if err != nil {
		t.Fatal(err)
	}
	got := cpuDelta(ps[:2], cpuSample{ticks: s.ticks[:2], n: s.n[:2]}, s2, 100, 4)
	if got["nginx"].Seconds != 0 || got["nginx"].Processes != 3 || got["app"].Seconds != 0.02 || got["app"].USPerRequest != 5000 {
		t.Errorf("delta %+v", got)
	}
}

func TestSampleCPUMatches(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	// A postmaster (2) with two backends of role rsb (3, 5), one of another role (4)
	// and a background process (6).
	fakeProc(t, root, map[int][5]int{2: {1, 100, 100, 500, 500}, 3: {2, 10, 5, 0, 0}, 4: {2, 70, 30, 0, 0}, 5: {2, 1, 1, 0, 0}, 6: {2, 9, 9, 0, 0}})
	for pid, title := range map[int]string{2: "/usr/lib/postgresql/15/bin/postgres\x00-D\x00/var/lib",
		3: "postgres: 15/main: rsb test 127.0.0.1(1) idle", 4: "postgres: 15/main: other test 127.0.0.1(2) idle",
		5: "postgres: 15/main: rsb test 127.0.0.1(3) INSERT", 6: "postgres: 15/main: walwriter "} {
		if err := os.WriteFile(filepath.Join(root, fmt.Sprint(pid), "cmdline"), []byte(strings.ReplaceAll(title, `\x00`, "\x00")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := sampleCPU(root, []Process{{Name: "ours", PID: 2, Match: ": rsb "}, {Name: "aux", PID: 2, Match: "walwriter"}, {Name: "all", PID: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(s.ticks) != "[17 18 1335]" || fmt.Sprint(s.n) != "[2 1 5]" {
		t.Errorf("ticks %v, processes %v; want [17 18 1335], [2 1 5]", s.ticks, s.n)
	}

	// Then backend 3 exits (after 15 ticks of life), 5 uses 4 ticks more and a new
	// backend 7 starts and uses 6: the window's figure is 10, not 10 − 15.
	ps := []Process{{Name: "ours", PID: 2, Match: ": rsb "}}
	before, err := sampleCPU(root, ps)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(root, "3")); err != nil {
		t.Fatal(err)
	}
	fakeProc(t, root, map[int][5]int{5: {2, 3, 3, 0, 0}, 7: {2, 6, 0, 0, 0}})
	if err := os.WriteFile(filepath.Join(root, "7", "cmdline"), []byte("postgres: 15/main: rsb test 127.0.0.1(4) idle"), 0o644); err != nil {
		t.Fatal(err)
	}
	after, err := sampleCPU(root, ps)
	if err != nil {
		t.Fatal(err)
	}
	if got := cpuDelta(ps, before, after, 100, 0)["ours"]; got.Seconds != 0.1 || got.Processes != 2 {
		t.Errorf("delta %+v, want 0.1 s over 2 processes", got)
	}
}

func TestRunMeasuresCPU(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer ts.Close()
	self := os.Getpid()
	res, err := Run(context.Background(), Config{URL: ts.URL, Clients: 2, Requests: 200, Warmup: 10 * time.Millisecond,
		CPU: []Process{{Name: "self", PID: self}}})
	if err != nil {
		t.Fatal(err)
	}
	c, ok := res.CPU["self"]
	if !ok || res.CPUError != "" || c.Processes < 1 || c.Seconds < 0 || res.CPUWindowS <= 0 {
		t.Fatalf("CPU %+v, window %v, error %q", res.CPU, res.CPUWindowS, res.CPUError)
	}
	if c.Seconds > 0 && c.USPerRequest != c.Seconds*1e6/float64(res.Responses) {
		t.Errorf("µs/response %v for %v s over %d responses", c.USPerRequest, c.Seconds, res.Responses)
	}
	var b strings.Builder
	if err := res.WriteText(&b); err != nil || !strings.Contains(b.String(), "cpu self") {
		t.Errorf("text: %v\n%s", err, b.String())
	}
	if _, err := Run(context.Background(), Config{URL: ts.URL, Requests: 1, CPU: []Process{{Name: "x", PID: self}, {Name: "x", PID: self}}}); err == nil {
		t.Error("a name twice: no error")
	}
	if _, err := Run(context.Background(), Config{URL: ts.URL, Requests: 1, CPU: []Process{{Name: "x", PID: -1}}}); err == nil {
		t.Error("pid -1: no error")
	}
}

func TestMeasureIdle(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	fakeProc(t, root, map[int][5]int{5: {1, 3, 4, 0, 0}})
	res, err := MeasureIdle(context.Background(), IdleConfig{CPU: []Process{{Name: "pg", PID: 5}}, Duration: time.Millisecond,
		ProcRoot: root, Tags: map[string]string{"kind": "idle"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Tags["kind"] != "idle" || res.ElapsedS <= 0 || res.CPU["pg"].Processes != 1 || res.Requests != 0 {
		t.Errorf("%+v", res)
	}
	if _, err := MeasureIdle(context.Background(), IdleConfig{}); err == nil {
		t.Error("no processes: no error")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := MeasureIdle(ctx, IdleConfig{CPU: []Process{{Name: "pg", PID: 5}}, ProcRoot: root}); err == nil {
		t.Error("a cancelled context: no error")
	}
}
