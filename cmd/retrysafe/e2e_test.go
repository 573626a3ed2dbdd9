package main

// End-to-end tests: they build the real binary once (TestMain) and run it as a process
// against an httptest upstream, on SQLite, PostgreSQL and Redis.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
)

// binary is the retrysafe binary built by TestMain.
var binary string

// e2eRelease is the release version TestMain links into the binary, as scripts/release
// does (TestE2EVersion checks the binary states it).
const e2eRelease = "v0.1.0-e2e"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "retrysafe-e2e-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "retrysafe")
	args := []string{"build", "-o", binary, "-ldflags=-X main.releaseVersion=" + e2eRelease}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building retrysafe:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// env is the binary's environment: this process's, without RETRYSAFE_ variables (which
// would set flags), plus extra.
func env(extra ...string) []string {
	var out []string
	gorace := "atexit_sleep_ms=0" // the race runtime's default second of sleep at exit
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, "RETRYSAFE_"):
		case strings.HasPrefix(kv, "GORACE="):
			gorace += " " + strings.TrimPrefix(kv, "GORACE=")
		default:
			out = append(out, kv)
		}
	}
	return append(append(out, "GORACE="+gorace), extra...)
}

// proc is a running retrysafe gateway.
type proc struct {
	t     *testing.T
	cmd   *exec.Cmd
	addr  string // proxy base URL
	admin string // admin base URL
	exit  chan int
	mu    sync.Mutex
	lines []string
	grew  chan struct{} // closed and replaced at each line logged
}

// startGateway runs `retrysafe gateway` with args (plus free listen and admin
// addresses, JSON logs) and waits for its "listening" line.
func startGateway(t *testing.T, extraEnv []string, args ...string) *proc {
	t.Helper()
	all := append([]string{"gateway", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--log-format", "json"}, args...)
	cmd := exec.Command(binary, all...)
	cmd.Env = env(extraEnv...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, exit: make(chan int, 1), grew: make(chan struct{})}
	ready := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.lines = append(p.lines, line)
			close(p.grew)
			p.grew = make(chan struct{})
			p.mu.Unlock()
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "retrysafe gateway listening" {
				ready <- m
			}
		}
		_ = cmd.Wait()
		p.exit <- cmd.ProcessState.ExitCode()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done()
		if strings.Contains(p.log(), "DATA RACE") {
			t.Errorf("the race detector fired in the gateway")
		}
		if t.Failed() {
			t.Logf("gateway %v log:\n%s", args, p.log())
		}
	})
	select {
	case m := <-ready:
		// The listeners that serve HTTPS are named by the line's tls.
		scheme := func(listener string) string {
			if on, _ := m["tls"].(string); strings.Contains(on, listener) {
				return "https://"
			}
			return "http://"
		}
		p.addr = scheme("proxy") + m["addr"].(string)
		p.admin = scheme("admin") + m["admin"].(string)
	case code := <-p.exit:
		p.exit <- code
		t.Fatalf("gateway exited with %d before listening:\n%s", code, p.log())
	case <-time.After(20 * time.Second):
		t.Fatalf("gateway did not start:\n%s", p.log())
	}
	return p
}

// done returns a channel that yields the exit status once the process has exited
// (again and again).
func (p *proc) done() <-chan int {
	out := make(chan int, 1)
	go func() {
		code := <-p.exit
		p.exit <- code
		out <- code
	}()
	return out
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// awaitLog waits up to d for the process to log a line that match accepts.
func (p *proc) awaitLog(what string, d time.Duration, match func(line string) bool) {
	p.t.Helper()
	timeout := time.After(d)
	seen := 0
	for {
		p.mu.Lock()
		lines, grew := p.lines[seen:], p.grew
		seen = len(p.lines)
		p.mu.Unlock()
		for _, line := range lines {
			if match(line) {
				return
			}
		}
		select {
		case <-grew:
		case <-timeout:
			p.t.Fatalf("the gateway did not log %s in %v", what, d)
		}
	}
}

// requestLogged matches the line the gateway logs when it is done with a request with
// key: after the middleware has stored its answer, or held it to be stored.
func requestLogged(key string) func(string) bool {
	return func(line string) bool {
		var m map[string]any
		return json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "request" && m["key"] == key
	}
}

// wait waits up to d for the process to exit and returns its status.
func (p *proc) wait(d time.Duration) int {
	p.t.Helper()
	select {
	case code := <-p.done():
		return code
	case <-time.After(d):
		p.t.Fatalf("gateway still running after %v", d)
	}
	return -1
}

// upstream is the API behind the binary. Paths:
//
//	/pay             201, a JSON body numbering the call
//	/slow-once?ms=N  as /pay after N ms on a key's first call, as /pay after
//	/hang-once       hangs on a key's first call until the test ends, as /pay after
//	/held-once       hangs on a key's first call until release(key), as /pay after
//	/status/N        N
//	/big?bytes=N     201 with a JSON body of N bytes
//	/odd             201 with header values that are not UTF-8 and a trailer
//
// arrived says when a key's first request has reached it, so a test waits for that
// instead of polling the counts.
type upstream struct {
	*httptest.Server
	calls    atomic.Int64
	mu       sync.Mutex
	perKey   map[string]int
	gates    map[string]chan struct{}
	arrivals map[string]chan struct{} // closed at a key's first request
	stop     chan struct{}
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{perKey: map[string]int{}, gates: map[string]chan struct{}{}, arrivals: map[string]chan struct{}{},
		stop: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(func() {
		close(u.stop)
		u.Close()
	})
	return u
}

func (u *upstream) callsFor(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.perKey[key]
}

// gate returns the channel a /held-once call on key waits for; u.mu is held.
func (u *upstream) gate(key string) chan struct{} { return chanFor(u.gates, key) }

// arrived returns a channel closed once a request with key has reached the upstream.
func (u *upstream) arrived(key string) <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	return chanFor(u.arrivals, key)
}

// chanFor returns m's channel for key, made on first use; u.mu is held.
func chanFor(m map[string]chan struct{}, key string) chan struct{} {
	ch, ok := m[key]
	if !ok {
		ch = make(chan struct{})
		m[key] = ch
	}
	return ch
}

// await waits up to d for ch, the signal of what.
func await(t *testing.T, what string, d time.Duration, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// release lets the /held-once call on key answer.
func (u *upstream) release(key string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	close(u.gate(key))
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	n := u.calls.Add(1)
	key := r.Header.Get("Idempotency-Key")
	_, _ = io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	u.perKey[key]++
	nth := u.perKey[key]
	gate := u.gate(key)
	if nth == 1 {
		close(chanFor(u.arrivals, key))
	}
	u.mu.Unlock()
	ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
	switch {
	case r.URL.Path == "/slow-once" && nth == 1:
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-u.stop:
		}
	case r.URL.Path == "/hang-once" && nth == 1:
		<-u.stop
		return
	case r.URL.Path == "/held-once" && nth == 1:
		select {
		case <-gate:
		case <-u.stop:
			return
		}
	case strings.HasPrefix(r.URL.Path, "/status/"):
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/status/"))
		http.Error(w, "upstream says "+strconv.Itoa(code), code)
		return
	case r.URL.Path == "/big":
		n, _ := strconv.Atoi(r.URL.Query().Get("bytes"))
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"pad":"`+strings.Repeat("x", max(0, n-10))+`"}`)
		return
	case r.URL.Path == "/odd":
		w.Header()["X-Latin1"] = []string{"caf\xe9"}
		w.Header()["X-Bytes"] = []string{"\x80\xff", "ok"}
		w.Header().Set("Trailer", "X-Checksum")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"call":%d}`, n)
		w.Header().Set("X-Checksum", "sum-\xde\xad")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"call":%d,"key":%q,"xff":%q}`+"\n", n, key, r.Header.Get("X-Forwarded-For"))
}

type reply struct {
	status int
	header http.Header
	body   string
	err    error
}

func (r reply) problem() string {
	var p idempotency.Problem
	_ = json.Unmarshal([]byte(r.body), &p)
	return p.Type
}

func (r reply) String() string {
	if r.err != nil {
		return "error " + r.err.Error()
	}
	return fmt.Sprintf("%d %v %s", r.status, r.header, r.body)
}

// post sends POST base+path with key and body; ctx may bound it.
func post(ctx context.Context, base, path, key, body string) reply {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return reply{status: res.StatusCode, header: res.Header, body: string(b), err: err}
}

// waitFor polls cond every 20ms for up to d. It is for what only a real process can
// show and none announces: a gateway process that stops accepting, a lease that runs
// out on a store's clock, a record a broker or a store holds. What the test's own code
// can signal (the upstream, the gateway's log) is waited for on a channel instead.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // the poll interval: the process gives no signal
	}
}

// refusing reports whether nothing accepts connections at addr (host:port) any more.
func refusing(addr string) bool {
	c, err := net.Dial("tcp", addr)
	if err == nil {
		c.Close()
	}
	return err != nil
}

// storeDSNs returns an isolated store DSN of each kind (a fresh SQLite file, a schema,
// a key prefix); the services' ones are skipped when the service is absent.
var storeDSNs = []struct {
	name string
	dsn  func(t *testing.T) string
}{
	{"sqlite", func(t *testing.T) string { return "sqlite:" + filepath.Join(t.TempDir(), "keys.db") }},
	{"postgres", postgresDSN},
	{"redis", redisDSN},
}

func postgresDSN(t *testing.T) string {
	base := testenv.PostgresURL(t)
	schema := testenv.Schema(t, "e2e")
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

func redisDSN(t *testing.T) string {
	base := testenv.RedisURL(t)
	prefix := testenv.Name("e2e") + ":"
	t.Cleanup(func() {
		opt, err := redis.ParseURL(base)
		if err != nil {
			return
		}
		c := redis.NewClient(opt)
		defer c.Close()
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	return base + sep + "prefix=" + url.QueryEscape(prefix)
}

// TestE2EContract: every status of the contract through the binary, on each store.
func TestE2EContract(t *testing.T) {
	t.Parallel()
	for _, s := range storeDSNs {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			dsn := s.dsn(t)
			up := newUpstream(t)
			// The upstream and the lease from the environment, the rest as flags. The
			// upstream timeout is seconds, so that a loaded machine does not turn a
			// held request into a 504, and shorter than the lease, so that a key kept
			// after a 504 is still in progress for a while. The 409s checked are those
			// of --conflict reject (the default, wait, has a test of its own).
			const lease = 5 * time.Second
			gw := startGateway(t, []string{"RETRYSAFE_UPSTREAM=" + up.URL, "RETRYSAFE_LEASE=" + lease.String()},
				"--store", dsn, "--max-body", "1KiB", "--upstream-timeout", "3s", "--conflict", "reject")
			dead := startGateway(t, nil, "--store", dsn, "--upstream", "http://"+testenv.DeadAddr(t))
			ctx := context.Background()
			key := func(what string) string { return testenv.Name(what) }

			t.Run("201 then replay", func(t *testing.T) {
				t.Parallel()
				k := key("exec")
				first := post(ctx, gw.addr, "/pay", k, `{"a":1}`)
				again := post(ctx, gw.addr, "/pay", k, `{"a":1}`)
				if first.status != 201 || again.status != 201 || again.header.Get("Idempotent-Replayed") != "true" || again.body != first.body {
					t.Fatalf("first %v; again %v", first, again)
				}
				if !strings.Contains(first.body, `"xff":"127.0.0.1"`) || up.callsFor(k) != 1 {
					t.Fatalf("upstream: %s, %d calls", first.body, up.callsFor(k))
				}
			})
			t.Run("409 in flight", func(t *testing.T) {
				t.Parallel()
				k := key("inflight")
				done := make(chan reply, 1)
				go func() { done <- post(ctx, gw.addr, "/held-once", k, `{}`) }()
				await(t, "the first request upstream", 10*time.Second, up.arrived(k))
				dup := post(ctx, gw.addr, "/held-once", k, `{}`) // the first is held upstream
				up.release(k)
				if dup.status != 409 || dup.header.Get("Retry-After") == "" || dup.problem() != idempotency.ProblemInFlight {
					t.Fatalf("duplicate: %v", dup)
				}
				if r := <-done; r.status != 201 || up.callsFor(k) != 1 {
					t.Fatalf("first: %v", r)
				}
			})
			t.Run("422 400 413", func(t *testing.T) {
				t.Parallel()
				k := key("misc")
				post(ctx, gw.addr, "/pay", k, `{"a":1}`)
				for _, c := range []struct {
					key, body string
					status    int
					problem   string
				}{
					{k, `{"a":2}`, 422, idempotency.ProblemMismatch},
					{"", `{}`, 400, idempotency.ProblemMissingKey},
					{"two words", `{}`, 400, idempotency.ProblemInvalidKey},
					{key("large"), strings.Repeat("x", 2048), 413, idempotency.ProblemBodyTooLarge},
				} {
					if r := post(ctx, gw.addr, "/pay", c.key, c.body); r.status != c.status || r.problem() != c.problem ||
						!strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json") {
						t.Errorf("key %q: %v, want %d %s", c.key, r, c.status, c.problem)
					}
				}
			})
			t.Run("429 503 passed through and released", func(t *testing.T) {
				t.Parallel()
				for _, code := range []string{"429", "503"} {
					k := key("busy")
					for i := 1; i <= 2; i++ {
						if r := post(ctx, gw.addr, "/status/"+code, k, `{}`); strconv.Itoa(r.status) != code || r.header.Get("Idempotent-Replayed") != "" {
							t.Fatalf("%s attempt %d: %v", code, i, r)
						}
						if up.callsFor(k) != i {
							t.Fatalf("%s: attempt %d not forwarded", code, i)
						}
					}
				}
			})
			t.Run("502 upstream down, released", func(t *testing.T) {
				t.Parallel()
				k := key("down")
				for i := 0; i < 2; i++ { // released: the second attempt is no 409
					if r := post(ctx, dead.addr, "/pay", k, `{}`); r.status != 502 || r.problem() != "urn:retrysafe:problem:upstream-unreachable" {
						t.Fatalf("attempt %d: %v", i, r)
					}
				}
			})
			t.Run("504 upstream timeout, key kept until the lease ends", func(t *testing.T) {
				t.Parallel()
				k := key("timeout")
				sent := time.Now() // the key is claimed after this, its lease ends lease later at the earliest
				if r := post(ctx, gw.addr, "/slow-once?ms=60000", k, `{}`); r.status != 504 || r.problem() != "urn:retrysafe:problem:upstream-timeout" {
					t.Fatalf("first: %v", r)
				}
				// Answered before the lease could have ended: the key was in progress.
				if r := post(ctx, gw.addr, "/slow-once?ms=60000", k, `{}`); r.status != 409 && time.Since(sent) < lease {
					t.Fatalf("within the lease: %v", r)
				}
				var r reply
				waitFor(t, "the lease to end", 4*lease, func() bool {
					r = post(ctx, gw.addr, "/slow-once?ms=60000", k, `{}`)
					return r.status != 409
				})
				if r.status != 201 || up.callsFor(k) != 2 {
					t.Fatalf("after the lease: %v, %d calls", r, up.callsFor(k))
				}
			})
			t.Run("client disconnect, upstream completes, retry replays", func(t *testing.T) {
				t.Parallel()
				k := key("gone")
				// The client gives up once its request is upstream (held there), so that
				// the key is claimed and the gateway's upstream call is under way.
				cctx, cancel := context.WithCancel(ctx)
				lost := make(chan reply, 1)
				go func() { lost <- post(cctx, gw.addr, "/held-once", k, `{}`) }()
				await(t, "the request upstream", 10*time.Second, up.arrived(k))
				cancel()
				r := <-lost
				up.release(k)
				if r.err == nil {
					t.Fatalf("the client did not give up: %v", r)
				}
				gw.awaitLog("the first request done", 10*time.Second, requestLogged(k))
				r = post(ctx, gw.addr, "/held-once", k, `{}`)
				if r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" || up.callsFor(k) != 1 {
					t.Fatalf("retry: %v, %d calls", r, up.callsFor(k))
				}
			})
			t.Run("admin", func(t *testing.T) {
				t.Parallel()
				for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
					res, err := http.Get(gw.admin + path)
					if err != nil {
						t.Fatal(err)
					}
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					if res.StatusCode != 200 || path == "/metrics" && !strings.Contains(string(b), "retrysafe_gateway_store_duration_seconds") {
						t.Errorf("%s: %d %.200s", path, res.StatusCode, b)
					}
				}
			})
		})
	}
}

// TestE2EReplicasPostgres: two gateway processes on one PostgreSQL schema behave as
// one: concurrent duplicates spread over both reach the upstream once. Under
// --conflict reject, so that the duplicates are answered while the first is held
// (TestE2EWaitReplicas has them wait).
func TestE2EReplicasPostgres(t *testing.T) {
	t.Parallel()
	dsn := postgresDSN(t)
	up := newUpstream(t)
	a := startGateway(t, nil, "--store", dsn, "--upstream", up.URL, "--conflict", "reject")
	b := startGateway(t, nil, "--store", dsn, "--upstream", up.URL, "--conflict", "reject")
	for round := 0; round < 3; round++ {
		k := testenv.Name("dup")
		var wg sync.WaitGroup
		answers := make(chan reply, 12)
		for i := range cap(answers) {
			base := a.addr
			if i%2 == 1 {
				base = b.addr
			}
			wg.Go(func() { answers <- post(context.Background(), base, "/held-once", k, `{"n":1}`) })
		}
		// The request forwarded is held upstream until the 11 others have been answered,
		// so that they all come while it is in flight; a duplicate of a key in flight is
		// answered at once. Should they not come, it is let go after 30s, and the
		// statuses below say what they got.
		var replies []reply
		timeout := time.After(30 * time.Second)
	held:
		for len(replies) < cap(answers)-1 {
			select {
			case r := <-answers:
				replies = append(replies, r)
			case <-timeout:
				break held
			}
		}
		up.release(k)
		wg.Wait()
		close(answers)
		for r := range answers {
			replies = append(replies, r)
		}
		if n := up.callsFor(k); n != 1 {
			t.Fatalf("round %d: forwarded %d times", round, n)
		}
		for _, r := range replies {
			if r.status != 201 && r.status != 409 {
				t.Errorf("round %d: %v", round, r)
			}
		}
		for _, base := range []string{a.addr, b.addr} {
			if r := post(context.Background(), base, "/held-once", k, `{"n":1}`); r.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("round %d, %s: %v", round, base, r)
			}
		}
	}
}

// TestE2ESIGTERM: SIGTERM with requests in flight: they complete and are recorded, new
// connections are refused, the exit status is 0. The keys command then sees them.
func TestE2ESIGTERM(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	db := filepath.Join(t.TempDir(), "keys.db")
	gw := startGateway(t, nil, "--store", "sqlite:"+db, "--upstream", up.URL)
	const n = 5
	replies := make(chan reply, n)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = testenv.Name("term")
		go func() { replies <- post(context.Background(), gw.addr, "/held-once", keys[i], `{}`) }()
	}
	for _, k := range keys {
		await(t, "the requests upstream", 20*time.Second, up.arrived(k))
	}
	if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Stopped accepting: a new connection is refused while the others finish.
	addr := strings.TrimPrefix(gw.addr, "http://")
	waitFor(t, "the listener to close", 10*time.Second, func() bool { return refusing(addr) })
	// The upstream answers only once the gateway has stopped accepting, so the requests
	// are in flight through the shutdown.
	for _, k := range keys {
		up.release(k)
	}
	for range n {
		if r := <-replies; r.status != 201 {
			t.Errorf("in flight at SIGTERM: %v", r)
		}
	}
	if code := gw.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	out, code := runBinary(t, "keys", "list", "--store", "sqlite:"+db, "--state", "done")
	if code != 0 {
		t.Fatalf("keys list: %d %s", code, out)
	}
	for _, k := range keys {
		if !strings.Contains(out, k) {
			t.Errorf("keys list lacks %s:\n%s", k, out)
		}
	}
	if !strings.Contains(out, "(5 records)") {
		t.Errorf("keys list:\n%s", out)
	}
}

// TestE2EKill9Restart: kill -9 in the middle of a request, restart on the same SQLite
// file: the key is in progress until its lease ends, then usable.
func TestE2EKill9Restart(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	store := "sqlite:" + filepath.Join(t.TempDir(), "keys.db")
	const lease = 3 * time.Second
	// reject: a retry within the lease is answered 409 at once rather than waiting for
	// the lease to end.
	args := []string{"--store", store, "--upstream", up.URL, "--lease", lease.String(), "--conflict", "reject"}
	first := startGateway(t, nil, args...)
	k := testenv.Name("crash")
	lost := make(chan reply, 1)
	sent := time.Now() // the key is claimed after this, its lease ends lease later at the earliest
	go func() { lost <- post(context.Background(), first.addr, "/hang-once", k, `{}`) }()
	await(t, "the request upstream", 10*time.Second, up.arrived(k))
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.wait(5 * time.Second)
	if r := <-lost; r.err == nil {
		t.Fatalf("the request in flight got an answer: %v", r)
	}

	second := startGateway(t, nil, args...)
	out, code := runBinary(t, "keys", "show", "--store", store, "--key", k)
	if code != 0 || !strings.Contains(out, "in_progress") {
		t.Fatalf("keys show after the crash: %d\n%s", code, out)
	}
	// Answered before the lease could have ended (a slow machine may be past it):
	// the key was still in progress.
	r := post(context.Background(), second.addr, "/hang-once", k, `{}`)
	if r.status != 409 && time.Since(sent) < lease {
		t.Fatalf("within the lease: %v", r)
	}
	waitFor(t, "the lease to end", 4*lease, func() bool {
		r = post(context.Background(), second.addr, "/hang-once", k, `{}`)
		return r.status != 409
	})
	if r.status != 201 || up.callsFor(k) != 2 {
		t.Fatalf("after the lease: %v, %d calls", r, up.callsFor(k))
	}
	if r := post(context.Background(), second.addr, "/hang-once", k, `{}`); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %v", r)
	}
	// An operator's eviction: the next retry executes again.
	if out, code := runBinary(t, "keys", "delete", "--store", store, "--key", k); code != 0 || !strings.Contains(out, "deleted") {
		t.Fatalf("keys delete: %d %s", code, out)
	}
	if r := post(context.Background(), second.addr, "/hang-once", k, `{}`); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after delete: %v", r)
	}
}

// runBinary runs the binary to completion and returns its combined output and status.
func runBinary(t *testing.T, args ...string) (string, int) {
	t.Helper()
	return runBinaryEnv(t, nil, args...)
}

func runBinaryEnv(t *testing.T, extraEnv []string, args ...string) (string, int) {
	t.Helper()
	// A command that should exit but serves instead is killed, and fails the test.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = env(extraEnv...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%v still running after a minute:\n%s", args, out)
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatal(err)
	}
	return string(out), cmd.ProcessState.ExitCode()
}

// TestE2EBadFlags: bad flags, an unreachable store, an unparsable upstream: one line on
// stderr, exit status 2, before listening.
func TestE2EBadFlags(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = busy.Close() }) // after the parallel subtests
	dead := testenv.DeadAddr(t)
	mem := []string{"--store", "memory:"}
	cases := []struct {
		name string
		env  []string
		args []string
		want string // in the message
	}{
		{"unknown flag", nil, []string{"--upstrem", "http://x"}, "flag provided but not defined"},
		{"no upstream", nil, mem, "--upstream is required"},
		{"unparsable upstream", nil, append([]string{"--upstream", "http://[::1"}, mem...), "upstream"},
		{"upstream without scheme", nil, append([]string{"--upstream", "localhost:3000"}, mem...), "http or https"},
		{"bad size", nil, []string{"--upstream", "http://x", "--max-body", "lots"}, "invalid size"},
		{"bad size from env", []string{"RETRYSAFE_MAX_BODY=12XB"}, []string{"--upstream", "http://x"}, "RETRYSAFE_MAX_BODY"},
		{"bad duration", nil, []string{"--upstream", "http://x", "--lease", "soon"}, "invalid value"},
		{"ttl under lease", nil, []string{"--upstream", "http://x", "--ttl", "1s", "--lease", "2s"}, "--ttl"},
		{"bad log format", nil, []string{"--upstream", "http://x", "--log-format", "xml"}, "--log-format"},
		{"argument", nil, []string{"--upstream", "http://x", "extra"}, "unexpected argument"},
		{"unknown store", nil, []string{"--upstream", "http://x", "--store", "mysql://db"}, "unknown store"},
		{"postgres unreachable", nil, []string{"--upstream", "http://x", "--store", "postgres://u:secret@" + dead + "/db?sslmode=disable"}, "unreachable"},
		{"redis unreachable", nil, []string{"--upstream", "http://x", "--store", "redis://:secret@" + dead + "/0"}, "unreachable"},
		// The memory store's warning (nothing survives the process) is a log line at
		// warn level, before the listener: the error line is the only one at error level.
		{"listen address in use", nil, append([]string{"--upstream", "http://x", "--listen", busy.Addr().String(), "--log-level", "error"}, mem...), "--listen"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary, append([]string{"gateway", "--admin", "off"}, c.args...)...)
			cmd.Env = env(c.env...)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			_ = cmd.Run()
			msg := stderr.String()
			if code := cmd.ProcessState.ExitCode(); code != 2 {
				t.Errorf("exit status %d, want 2; stderr %q", code, msg)
			}
			if strings.Count(msg, "\n") != 1 || !strings.HasSuffix(msg, "\n") || !strings.Contains(msg, c.want) {
				t.Errorf("stderr is not one line with %q: %q", c.want, msg)
			}
			if strings.Contains(msg, "secret") {
				t.Errorf("the password leaks: %q", msg)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout: %q", stdout.String())
			}
		})
	}
}

// TestE2ECommands: help, version, migrate and keys on their own.
func TestE2ECommands(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"help"}, 0, "commands:"},
		{nil, 2, "usage: retrysafe"},
		{[]string{"version"}, 0, "retrysafe "},
		{[]string{"version", "--help"}, 0, "examples:"},
		{[]string{"gateway", "--help"}, 0, "examples:"},
		{[]string{"keys", "--help"}, 0, "examples:"},
		{[]string{"keys", "list", "--help"}, 0, "examples:"},
		{[]string{"migrate", "-h"}, 0, "examples:"},
		{[]string{"demo", "--help"}, 0, "examples:"},
		{[]string{"help", "keys"}, 0, "retrysafe keys list"},
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"keys"}, 2, "want list, show or delete"},
		{[]string{"keys", "show", "--store", "memory:"}, 2, "--key is required"},
		{[]string{"keys", "list", "--store", "memory:", "--state", "weird"}, 2, "in_progress or done"},
		{[]string{"keys", "show", "--store", "memory:", "--key", "k"}, 1, "no record"},
	} {
		out, code := runBinary(t, c.args...)
		if code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("retrysafe %v: %d %q, want %d and %q", c.args, code, out, c.code, c.want)
		}
	}
	// migrate creates the schema on PostgreSQL; RETRYSAFE_STORE works too.
	dsn := postgresDSN(t)
	if out, code := runBinaryEnv(t, []string{"RETRYSAFE_STORE=" + dsn}, "migrate"); code != 0 || !strings.Contains(out, "schema applied") {
		t.Fatalf("migrate: %d %s", code, out)
	}
	if out, code := runBinary(t, "keys", "list", "--store", dsn); code != 0 || !strings.Contains(out, "(0 records)") {
		t.Fatalf("keys list after migrate: %d %s", code, out)
	}
}

// TestE2EVersion: a binary linked with -X main.releaseVersion states that version, and
// the Go version and platform it was built with.
func TestE2EVersion(t *testing.T) {
	t.Parallel()
	out, code := runBinary(t, "version")
	if code != 0 {
		t.Fatalf("version: exit %d\n%s", code, out)
	}
	for _, want := range []string{
		"\n  module    github.com/retrysafe/retrysafe ",
		"\n  go        " + runtime.Version() + "\n",
		"\n  platform  " + runtime.GOOS + "/" + runtime.GOARCH + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("version printed\n%s\nwant it to contain %q", out, want)
		}
	}
	if !strings.HasPrefix(out, "retrysafe "+e2eRelease+"\n") {
		t.Errorf("version printed\n%s\nwant the release version on the first line", out)
	}
	for _, flag := range []string{"--version", "-v"} {
		if o, c := runBinary(t, flag); c != 0 || o != out {
			t.Errorf("retrysafe %s: exit %d\n%s\nwant the output of retrysafe version", flag, c, o)
		}
	}
}

// TestE2EDemo: retrysafe demo runs in process, with no services, and exits 0.
func TestE2EDemo(t *testing.T) {
	t.Parallel()
	out, code := runBinary(t, "demo", "--duration", "500ms", "--clients", "4")
	if code != 0 || !strings.Contains(out, "duplicates") {
		t.Fatalf("demo: exit %d\n%s", code, out)
	}
}
