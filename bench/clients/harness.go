package clients

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Clients are the real clients the harness drives.
var Clients = []string{"axios", "stripe", "requests"}

// Options of one run.
type Options struct {
	Client   string   // axios, stripe or requests
	Binary   string   // the retrysafe binary
	Root     string   // the repository's root (bench/clients/node and python below it)
	Python   string   // an interpreter that imports requests (for requests)
	Gateway  []string // flags beside --upstream, --listen, --admin and --store (none: the defaults)
	Logical  int      // logical POSTs (default 100)
	Seed     uint64   // which answers are lost
	LossRate float64  // share of answers lost (default 0.3)
	// Concurrency is how many logical requests the client has in flight (default 4).
	Concurrency int
}

// Result is what one run came to.
type Result struct {
	Client   string
	Gateway  string // the flags beside the required ones, "defaults" for none
	Logical  int
	Attempts int // requests the proxy forwarded to the gateway
	// AnswersLost are the answers the proxy dropped.
	AnswersLost int
	Executions  int // the upstream's executions
	// Duplicates are logical requests the upstream executed more than once.
	Duplicates int
	// Lost are logical requests whose client ended without the upstream's answer: a
	// network error or a 5xx at the end, or a success the upstream never executed.
	Lost int
	// Final counts the clients' final statuses; 0 is an error without an answer.
	Final map[int]int
	// Replayed is how many final answers carried Idempotent-Replayed: true (axios,
	// requests).
	Replayed int
	// Keys is how many distinct Idempotency-Keys reached the upstream, over all
	// logical requests.
	Keys int
	// Held counts why the held first executions went on.
	Held     map[Release]int
	Duration time.Duration
}

// Conflicts409 is how many logical requests ended with a 409.
func (r Result) Conflicts409() int { return r.Final[http.StatusConflict] }

// clientLine is one line of a client's output.
type clientLine struct {
	LID      string `json:"lid"`
	Key      string `json:"key"`
	Status   int    `json:"status"`
	Error    string `json:"error"`
	Replayed bool   `json:"replayed"`
}

// Run runs one client through the proxy into a gateway started for it.
func Run(ctx context.Context, o Options) (Result, error) {
	o.Logical = cmpOr(o.Logical, 100)
	o.Concurrency = cmpOr(o.Concurrency, 4)
	if o.LossRate == 0 {
		o.LossRate = 0.3
	}
	res := Result{Client: o.Client, Gateway: "defaults", Logical: o.Logical, Final: map[int]int{}}
	if len(o.Gateway) > 0 {
		res.Gateway = strings.Join(o.Gateway, " ")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var proxy *Proxy
	var gw *Gateway
	ready := make(chan struct{})
	up := NewUpstream(func(lid string, attempt int) Release {
		<-ready
		lost, retried := proxy.Lost(lid, attempt)
		if !lost {
			return ""
		}
		return hold(ctx, retried, gw.AdminURL)
	})
	defer up.Close()
	dir, err := os.MkdirTemp("", "retrysafe-clients-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	gw, err = StartGateway(ctx, o.Binary, append([]string{"--upstream", up.URL(), "--listen", "127.0.0.1:0",
		"--admin", "127.0.0.1:0", "--store", "sqlite:" + filepath.Join(dir, "keys.db")}, o.Gateway...))
	if err != nil {
		return res, err
	}
	defer gw.Stop()
	if proxy, err = NewProxy(gw.Addr, o.Seed, o.LossRate); err != nil {
		return res, err
	}
	close(ready)
	defer proxy.Close()

	// The logical ids are the client's alone, so that the proxy loses the same answers
	// of the same requests whatever the gateway's flags, until their outcomes differ.
	prefix := "rslid_" + regexp.MustCompile(`[^a-z0-9_]`).ReplaceAllString(strings.ToLower(o.Client), "")
	cmd, err := clientCommand(ctx, o, proxy.URL(), prefix)
	if err != nil {
		return res, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	res.Duration = time.Since(start)
	if err != nil {
		return res, fmt.Errorf("%s: %w\n%s", o.Client, err, stderr.Bytes())
	}
	var lines []clientLine
	for line := range strings.Lines(string(out)) {
		var l clientLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			return res, fmt.Errorf("%s printed %q: %w", o.Client, line, err)
		}
		lines = append(lines, l)
	}
	if len(lines) != o.Logical {
		return res, fmt.Errorf("%s answered %d logical requests of %d\n%s", o.Client, len(lines), o.Logical, stderr.Bytes())
	}
	execs, keys, held := up.Executions()
	res.Held = held
	for _, l := range lines {
		n := execs[l.LID]
		res.Executions += n
		res.Keys += keys[l.LID]
		if n > 1 {
			res.Duplicates++
		}
		res.Final[l.Status]++
		ok := l.Status >= 200 && l.Status < 300
		if l.Status == 0 || l.Status >= 500 || ok && n == 0 {
			res.Lost++
		}
		if l.Replayed {
			res.Replayed++
		}
	}
	for _, a := range proxy.Attempts() {
		res.Attempts += a[0]
		res.AnswersLost += a[1]
	}
	return res, nil
}

// hold returns once the gateway answered a retry (retried closes), or has a duplicate
// waiting (its requests_waiting gauge, polled: the process gives no other signal), or
// HoldBound has passed.
func hold(ctx context.Context, retried <-chan struct{}, admin string) Release {
	bound := time.NewTimer(HoldBound)
	defer bound.Stop()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-retried:
			return ReleaseRetryAnswered
		case <-bound.C:
			return ReleaseBound
		case <-ctx.Done():
			return ReleaseBound
		case <-poll.C:
			if n, err := waiting(ctx, admin); err == nil && n > 0 {
				return ReleaseRetryWaiting
			}
		}
	}
}

// waiting reads retrysafe_gateway_requests_waiting from the gateway's /metrics.
func waiting(ctx context.Context, admin string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, admin+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "retrysafe_gateway_requests_waiting "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(f), err
		}
	}
	return 0, errors.New("no retrysafe_gateway_requests_waiting in /metrics")
}

func cmpOr(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// clientCommand is the command that runs client o.Client against base.
func clientCommand(ctx context.Context, o Options, base, prefix string) (*exec.Cmd, error) {
	args := []string{base, strconv.Itoa(o.Logical), prefix, strconv.Itoa(o.Concurrency)}
	switch o.Client {
	case "axios", "stripe":
		cmd := exec.CommandContext(ctx, "node", append([]string{"client.js", o.Client}, args...)...)
		cmd.Dir = NodeDir(o.Root)
		return cmd, nil
	case "requests":
		if o.Python == "" {
			return nil, errors.New("requests: no Python interpreter that imports requests")
		}
		return exec.CommandContext(ctx, o.Python, append([]string{filepath.Join(o.Root, "bench", "clients", "python", "requests_client.py")}, args...)...), nil
	}
	return nil, fmt.Errorf("unknown client %q: want one of %s", o.Client, strings.Join(Clients, ", "))
}

// NodeDir is the node clients' directory under the repository's root.
func NodeDir(root string) string { return filepath.Join(root, "bench", "clients", "node") }

// Root returns the repository's root: the first directory from dir up that holds
// cmd/retrysafe.
func Root(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if fi, err := os.Stat(filepath.Join(dir, "cmd", "retrysafe")); err == nil && fi.IsDir() {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no cmd/retrysafe in this directory or above it")
		}
		dir = parent
	}
}

// BuildGateway builds the retrysafe binary of the repository at root into dir.
func BuildGateway(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "retrysafe")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/retrysafe")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/retrysafe: %w\n%s", err, out)
	}
	return bin, nil
}

// Python returns the first of python3 on PATH and /usr/bin/python3 that imports
// requests and urllib3's Retry, or "".
func Python(ctx context.Context) string {
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.CommandContext(ctx, p, "-c", "import requests, urllib3.util.retry").Run() == nil {
			return p
		}
	}
	return ""
}

// NodeMissing says what the node clients lack (node, npm), or "".
func NodeMissing() string {
	var missing []string
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	return strings.Join(missing, " and ")
}

// InstallNode installs the node clients' packages (npm ci, as package-lock.json pins
// them) unless node_modules already holds what the lock file names.
func InstallNode(ctx context.Context, root string) error {
	dir := NodeDir(root)
	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		return err
	}
	sum := sha256.Sum256(lock)
	stamp := filepath.Join(dir, "node_modules", ".retrysafe-lock-sha256")
	if b, err := os.ReadFile(stamp); err == nil && string(b) == hex.EncodeToString(sum[:]) {
		return nil
	}
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel", "error")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm ci in %s: %w\n%s", dir, err, out)
	}
	return os.WriteFile(stamp, []byte(hex.EncodeToString(sum[:])), 0o644)
}

// Gateway is a retrysafe gateway process.
type Gateway struct {
	Addr     string // host:port of the proxy listener
	AdminURL string
	cmd      *exec.Cmd
	done     chan struct{}
	mu       sync.Mutex
	log      bytes.Buffer
}

var listening = regexp.MustCompile(`msg="retrysafe gateway listening" addr=(\S+) admin=(\S+)`)

// StartGateway starts `retrysafe gateway` with args and returns once it listens.
func StartGateway(ctx context.Context, bin string, args []string) (*Gateway, error) {
	g := &Gateway{cmd: exec.Command(bin, append([]string{"gateway"}, args...)...), done: make(chan struct{})}
	stderr, err := g.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := g.cmd.Start(); err != nil {
		return nil, err
	}
	up := make(chan [2]string, 1)
	go func() {
		defer close(g.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			g.mu.Lock()
			g.log.WriteString(sc.Text() + "\n")
			g.mu.Unlock()
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				up <- [2]string{m[1], m[2]}
			}
		}
		_ = g.cmd.Wait()
	}()
	select {
	case a := <-up:
		g.Addr, g.AdminURL = a[0], "http://"+a[1]
		return g, nil
	case <-g.done:
		return nil, fmt.Errorf("retrysafe gateway exited before it listened:\n%s", g.Log())
	case <-ctx.Done():
		g.Stop()
		return nil, ctx.Err()
	}
}

// Log is what the gateway wrote to stderr.
func (g *Gateway) Log() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.log.String()
}

// Stop sends SIGTERM and waits for the process to end (SIGKILL after 10s).
func (g *Gateway) Stop() {
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(10 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
	}
}

// Table writes results as a Markdown table.
func Table(w io.Writer, results []Result) {
	fmt.Fprintln(w, "| client | gateway flags | logical | attempts | answers lost | executions | duplicates | lost | final 409 | final statuses | held: retry answered / waiting / bound | time |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|")
	for _, r := range results {
		var statuses []string
		for _, s := range slices.Sorted(maps.Keys(r.Final)) {
			name := strconv.Itoa(s)
			if s == 0 {
				name = "error"
			}
			statuses = append(statuses, fmt.Sprintf("%s×%d", name, r.Final[s]))
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %d | %d | %d | %s | %d / %d / %d | %.1fs |\n",
			r.Client, r.Gateway, r.Logical, r.Attempts, r.AnswersLost, r.Executions, r.Duplicates, r.Lost, r.Conflicts409(),
			strings.Join(statuses, ", "), r.Held[ReleaseRetryAnswered], r.Held[ReleaseRetryWaiting], r.Held[ReleaseBound], r.Duration.Seconds())
	}
}
