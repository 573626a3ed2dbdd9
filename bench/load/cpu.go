package load

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// DefaultClockTicks is the unit of the CPU times in /proc/PID/stat on Linux
// (sysconf(_SC_CLK_TCK), `getconf CLK_TCK`): 100 on every common architecture. Go has
// no portable way to ask for it without cgo, so a caller on another kernel passes its
// own in Config.ClockTicks.
const DefaultClockTicks = 100

// Process names a process whose processor time a run measures. The figure is that of
// the process and all its descendants (nginx's workers, a PostgreSQL cluster's
// backends, node's cluster workers), including the descendants that exited during the
// window: their time is in their parent's cutime and cstime once reaped.
//
// With Match set, the figure is instead that of PID's live descendants whose command
// line (/proc/PID/cmdline, which a PostgreSQL backend rewrites to "postgres: …: USER
// DATABASE HOST(PORT) STATE") holds Match: the backends of one database role, say, on
// a cluster other work shares. A matching process that exits during the window loses
// what it used since the first sample (its time goes to its parent, which does not
// match), so Match suits long-lived processes such as a pool's connections.
type Process struct {
	Name  string
	PID   int
	Match string
}

// CPU is the processor time (user + system) one process tree used in the measured
// window.
type CPU struct {
	Seconds float64 `json:"seconds"`
	// USPerRequest is Seconds in microseconds divided by the responses of the window
	// (0 when there were none).
	USPerRequest float64 `json:"us_per_request,omitempty"`
	// Processes is how many processes the tree held at the end of the window.
	Processes int `json:"processes"`
}

// procStat is what a CPU figure needs of one /proc/PID/stat line.
type procStat struct {
	ppid  int
	ticks uint64 // utime + stime + cutime + cstime
}

// cmdlineHolds reports whether the command line of pid under root holds match (its
// NUL-separated arguments read as one space-separated string).
func cmdlineHolds(root string, pid int, match string) bool {
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	return bytes.Contains(bytes.ReplaceAll(b, []byte{0}, []byte{' '}), []byte(match))
}

// parseStat reads the parent and the CPU times of one /proc/PID/stat line. The second
// field, the command name in parentheses, may itself hold spaces and parentheses, so
// the fields are counted from the last ')'.
func parseStat(b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, errors.New("no ')' after the command name")
	}
	// After ")": state(3) ppid(4) pgrp(5) session(6) tty_nr(7) tpgid(8) flags(9)
	// minflt(10) cminflt(11) majflt(12) cmajflt(13) utime(14) stime(15) cutime(16)
	// cstime(17), numbered as in proc(5).
	f := bytes.Fields(b[i+1:])
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("%d fields after the command name, want at least 15", len(f))
	}
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return procStat{}, fmt.Errorf("ppid: %w", err)
	}
	var st procStat
	st.ppid = ppid
	for _, s := range f[11:15] {
		// cutime and cstime are signed in the kernel's format; they are never negative.
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil || n < 0 {
			return procStat{}, fmt.Errorf("CPU time %q: want a non-negative integer", s)
		}
		st.ticks += uint64(n)
	}
	return st, nil
}

// readProcs reads every process's stat under root (/proc). Processes that end while it
// reads are skipped: they are in their parent's children's times from then on, or
// were not part of any tree measured.
func readProcs(root string) (map[int]procStat, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("load: reading %s: %w", root, err)
	}
	procs := make(map[int]procStat, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, e.Name(), "stat"))
		if err != nil {
			continue
		}
		st, err := parseStat(b)
		if err != nil {
			return nil, fmt.Errorf("load: %s/%d/stat: %w", root, pid, err)
		}
		procs[pid] = st
	}
	return procs, nil
}

// treeTicks sums the ticks of pid and all its live descendants in procs, and counts
// them. A live descendant's own time is in nobody's children's times yet, and a reaped
// one's only in its parent's, so nothing is counted twice.
func treeTicks(procs map[int]procStat, children map[int][]int, pid int) (ticks uint64, n int, ok bool) {
	if _, ok := procs[pid]; !ok {
		return 0, 0, false
	}
	stack := []int{pid}
	for len(stack) > 0 {
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		ticks += procs[p].ticks
		n++
		stack = append(stack, children[p]...)
	}
	return ticks, n, true
}

// matchTicks is the ticks of each of p.PID's descendants whose command line holds
// p.Match.
func matchTicks(root string, procs map[int]procStat, children map[int][]int, p Process) map[int]uint64 {
	out := map[int]uint64{}
	stack := slices.Clone(children[p.PID])
	for len(stack) > 0 {
		q := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		stack = append(stack, children[q]...)
		if cmdlineHolds(root, q, p.Match) {
			out[q] = procs[q].ticks
		}
	}
	return out
}

// cpuSample is the ticks and process count of each process tree at one instant, and
// for a Process with Match the ticks of each matching process: the set changes
// while the window runs, so its delta is taken process by process.
type cpuSample struct {
	ticks   []uint64
	n       []int
	matched []map[int]uint64
}

// sampleCPU reads every tree of ps at one instant from the /proc under root.
func sampleCPU(root string, ps []Process) (cpuSample, error) {
	procs, err := readProcs(root)
	if err != nil {
		return cpuSample{}, err
	}
	children := make(map[int][]int, len(procs))
	for pid, st := range procs {
		children[st.ppid] = append(children[st.ppid], pid)
	}
	s := cpuSample{ticks: make([]uint64, len(ps)), n: make([]int, len(ps)), matched: make([]map[int]uint64, len(ps))}
	for i, p := range ps {
		if _, ok := procs[p.PID]; !ok {
			return cpuSample{}, fmt.Errorf("load: process %s (pid %d) not found", p.Name, p.PID)
		}
		if p.Match != "" {
			m := matchTicks(root, procs, children, p)
			s.matched[i], s.n[i] = m, len(m)
			for _, t := range m {
				s.ticks[i] += t
			}
			continue
		}
		s.ticks[i], s.n[i], _ = treeTicks(procs, children, p.PID)
	}
	return s, nil
}

// cpuDelta is the CPU of each tree between two samples. A tree whose total went down
// (a descendant that exited and was not reaped by a process of the tree) counts 0. For
// a Process with Match it is the sum over the processes matching at the end of what
// each used since the first sample, or since it started if it was not there then; a
// process that matched at the start and exited adds nothing (what it used in the
// window is lost, rather than its whole life subtracted).
func cpuDelta(ps []Process, before, after cpuSample, clockTicks int, responses int64) map[string]CPU {
	out := make(map[string]CPU, len(ps))
	for i, p := range ps {
		var d uint64
		switch {
		case p.Match != "" && after.matched != nil && before.matched != nil:
			for pid, t := range after.matched[i] {
				if b, ok := before.matched[i][pid]; !ok {
					d += t
				} else if t > b {
					d += t - b
				}
			}
		case after.ticks[i] > before.ticks[i]:
			d = after.ticks[i] - before.ticks[i]
		}
		c := CPU{Seconds: float64(d) / float64(clockTicks), Processes: after.n[i]}
		if responses > 0 {
			c.USPerRequest = c.Seconds * 1e6 / float64(responses)
		}
		out[p.Name] = c
	}
	return out
}

// checkProcesses checks a list of processes to measure.
func checkProcesses(ps []Process) error {
	seen := map[string]bool{}
	for _, p := range ps {
		switch {
		case p.Name == "":
			return errors.New("load: a CPU process without a name")
		case p.PID <= 0:
			return fmt.Errorf("load: CPU process %s: pid %d", p.Name, p.PID)
		case seen[p.Name]:
			return fmt.Errorf("load: CPU process %s named twice", p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}

// IdleConfig configures MeasureIdle.
type IdleConfig struct {
	// CPU is the processes to measure. Required.
	CPU []Process
	// Duration is the window. Default 1s.
	Duration time.Duration
	// ClockTicks is the unit of /proc's CPU times. Default DefaultClockTicks.
	ClockTicks int
	// ProcRoot is where the proc file system is. Default /proc.
	ProcRoot string
	// Tags are copied into the Result.
	Tags map[string]string
}

// MeasureIdle measures the processor time of cfg.CPU over cfg.Duration while sending
// nothing: the background rate of a server that other work shares, to subtract from
// or to set beside what a run measured on it. The Result has no requests; its CPU and
// ElapsedS are set.
func MeasureIdle(ctx context.Context, cfg IdleConfig) (*Result, error) {
	if len(cfg.CPU) == 0 {
		return nil, errors.New("load: MeasureIdle without processes")
	}
	if err := checkProcesses(cfg.CPU); err != nil {
		return nil, err
	}
	if cfg.Duration < 0 || cfg.ClockTicks < 0 {
		return nil, errors.New("load: negative Duration or ClockTicks")
	}
	if cfg.Duration == 0 {
		cfg.Duration = time.Second
	}
	if cfg.ClockTicks == 0 {
		cfg.ClockTicks = DefaultClockTicks
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	before, err := sampleCPU(cfg.ProcRoot, cfg.CPU)
	if err != nil {
		return nil, err
	}
	began := time.Now()
	t := time.NewTimer(cfg.Duration)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
	}
	end := time.Now()
	after, err := sampleCPU(cfg.ProcRoot, cfg.CPU)
	if err != nil {
		return nil, err
	}
	el := end.Sub(began).Seconds()
	return &Result{
		Tags: cfg.Tags, Keys: KeyNone.String(), Start: began.UTC(), ElapsedS: el, CPUWindowS: el,
		Status: map[string]int64{}, ByStatus: map[string]Summary{},
		CPU: cpuDelta(cfg.CPU, before, after, cfg.ClockTicks, 0),
	}, nil
}
