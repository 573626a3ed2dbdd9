// Package e2e runs a Caddy built with the idempotency module, as a user runs it: the
// binary from ../cmd/caddy, a Caddyfile, caddy run, an upstream that counts what it
// executes and never deduplicates.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/testenv"
)

// caddyBin is the Caddy binary TestMain builds, once for every test.
var caddyBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "retrysafe-caddy-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	caddyBin = filepath.Join(dir, "caddy")
	build := exec.Command("go", "build", "-o", caddyBin, "./cmd/caddy")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building Caddy: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// upstream is a service that executes every request it receives whole (its body read to
// the end), counting executions by path, and answers with the count.
type upstream struct {
	*httptest.Server
	mu    sync.Mutex
	execs map[string]int
	// drop, when set, is called for each execution; true hangs up without an answer,
	// after the request was executed.
	drop func(r *http.Request) bool
	// hold, when set, is called for each execution before it is answered.
	hold func(r *http.Request)
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{execs: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return // an incomplete request is not executed
		}
		u.mu.Lock()
		u.execs[r.URL.Path]++
		n := u.execs[r.URL.Path]
		u.mu.Unlock()
		if u.hold != nil {
			u.hold(r)
		}
		if u.drop != nil && u.drop(r) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "%s %s execution %d body %q", r.Method, r.URL.Path, n, body)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.execs[path]
}

// freePort returns a port nothing listens on at the moment.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// caddyProc is a Caddy process a test started.
type caddyProc struct {
	base   string // the site's base URL
	config func(site string) string
	path   string // the Caddyfile
	admin  string // the admin endpoint's address
	log    *syncWriter
	stop   func() // stops Caddy (SIGINT) and waits for it to exit; again does nothing
	kill   func() // kills Caddy (SIGKILL) and waits for it to exit
}

// startCaddy runs Caddy with the site block site (%s in it is the site's address), under
// global options that give it an admin endpoint on a free port and put idempotency
// before reverse_proxy, and returns it once the site answers.
func startCaddy(t *testing.T, site string) *caddyProc {
	t.Helper()
	return startCaddyEnv(t, site, nil)
}

// startCaddyEnv is startCaddy, with env added to Caddy's environment.
func startCaddyEnv(t *testing.T, site string, env []string) *caddyProc {
	t.Helper()
	dir := t.TempDir()
	port, admin := freePort(t), freePort(t)
	p := &caddyProc{base: fmt.Sprintf("http://127.0.0.1:%d", port), admin: fmt.Sprintf("127.0.0.1:%d", admin),
		path: filepath.Join(dir, "Caddyfile"), log: &syncWriter{w: &bytes.Buffer{}}}
	p.config = func(site string) string {
		return fmt.Sprintf("{\n\tadmin %s\n\tauto_https off\n\torder idempotency before reverse_proxy\n}\n", p.admin) +
			fmt.Sprintf(site, p.base)
	}
	cf := p.config(site)
	path := p.path
	if err := os.WriteFile(path, []byte(cf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(caddyBin, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir), env...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var once sync.Once
	p.stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		})
	}
	p.kill = func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("Caddyfile:\n%s\nCaddy's log:\n%s", cf, p.log)
		}
	})
	testenv.Eventually(t, 60*time.Second, func() bool {
		select {
		case <-exited:
			t.Fatalf("Caddy exited:\n%s", p.log)
		default:
		}
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}, "Caddy to listen on %d", port)
	return p
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.(*bytes.Buffer).String()
}

type answer struct {
	status int
	header http.Header
	body   string
}

func send(t *testing.T, method, url, key, body string) answer {
	t.Helper()
	a, err := do(method, url, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// sendAsync sends the request in a goroutine of its own; the channel has its answer,
// or one with status 0 and the error as body.
func sendAsync(method, url, key, body string) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		a, err := do(method, url, key, body)
		if err != nil {
			a.body = err.Error()
		}
		ch <- a
	}()
	return ch
}

func do(method, url, key, body string) (answer, error) {
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	c := &http.Client{Timeout: 30 * time.Second}
	res, err := c.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{res.StatusCode, res.Header, string(b)}, nil
}

// minimal is the Caddyfile of the package doc, with the test's store and upstream.
const minimal = `%%s {
	idempotency {
		store sqlite:%s
	}
	reverse_proxy %s
}
`

// TestMinimal: the minimal Caddyfile protects POST: a retry of a key is answered from
// the store without reaching the upstream, the key reused with another body is 422, a
// POST without a key is 400, one whose Connection header lists its key is 400, and a GET
// passes through. Without the directive the same
// Caddyfile runs the retry again, which is what the checks would see if the handler
// did nothing.
func TestMinimal(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(minimal, filepath.Join(t.TempDir(), "keys.db"), up.URL)).base

	first := send(t, "POST", base+"/payments", "k-1", `{"amount":10}`)
	again := send(t, "POST", base+"/payments", "k-1", `{"amount":10}`)
	if first.status != 200 || again.status != 200 || again.body != first.body {
		t.Fatalf("a retry: %d %q, then %d %q; want the first answer twice", first.status, first.body, again.status, again.body)
	}
	if again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the retry's answer lacks Idempotent-Replayed: true: %v", again.header)
	}
	if n := up.count("/payments"); n != 1 {
		t.Errorf("the upstream executed the keyed POST %d times, want 1", n)
	}
	if a := send(t, "POST", base+"/payments", "k-1", `{"amount":99}`); a.status != http.StatusUnprocessableEntity {
		t.Errorf("the key reused with another body: %d %q, want 422", a.status, a.body)
	}
	req, err := http.NewRequest("POST", base+"/payments", strings.NewReader(`{"amount":10}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "k-hop")
	req.Header.Set("Connection", "Idempotency-Key")
	if res, err := http.DefaultClient.Do(req); err != nil {
		t.Error(err)
	} else {
		_ = res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("Connection: Idempotency-Key: %d, want 400 (the key would not reach the upstream)", res.StatusCode)
		}
	}
	if a := send(t, "POST", base+"/payments", "", `{"amount":10}`); a.status != http.StatusBadRequest {
		t.Errorf("a POST without a key: %d %q, want 400", a.status, a.body)
	}
	for range 2 {
		if a := send(t, "GET", base+"/search", "", ""); a.status != 200 {
			t.Errorf("GET: %d %q", a.status, a.body)
		}
	}
	if n := up.count("/search"); n != 2 {
		t.Errorf("two GETs executed %d times, want 2 (not keyed, passed through)", n)
	}
	if n := up.count("/payments"); n != 1 {
		t.Errorf("the upstream executed /payments %d times in all, want 1", n)
	}
}

// TestWithoutDirective is the control of TestMinimal: the same requests through Caddy
// without the directive reach the upstream twice, so the count TestMinimal checks is the
// handler's doing; and the endpoint battery TestStores passes fails.
func TestWithoutDirective(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf("%%s {\n\treverse_proxy %s\n}\n", up.URL)).base
	send(t, "POST", base+"/payments", "k-1", `{"amount":10}`)
	send(t, "POST", base+"/payments", "k-1", `{"amount":10}`)
	if n := up.count("/payments"); n != 2 {
		t.Fatalf("without the directive the upstream executed the POST %d times; the test upstream must execute every request (2)", n)
	}
	battery(t, base+"/charges", true)
}

// TestMatcher: a handle block with a path matcher protects POST /payments and leaves
// /search alone, in one Caddyfile.
func TestMatcher(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	site := fmt.Sprintf(`%%s {
	handle /payments* {
		idempotency {
			store sqlite:%s
			conflict reject
		}
		reverse_proxy %s
	}
	handle {
		reverse_proxy %s
	}
}
`, filepath.Join(t.TempDir(), "keys.db"), up.URL, up.URL)
	base := startCaddy(t, site).base
	for range 2 {
		if a := send(t, "POST", base+"/payments", "k-2", `{}`); a.status != 200 {
			t.Errorf("POST /payments: %d %q", a.status, a.body)
		}
		if a := send(t, "POST", base+"/search", "k-2", `{}`); a.status != 200 {
			t.Errorf("POST /search: %d %q", a.status, a.body)
		}
	}
	if a := send(t, "POST", base+"/search", "", `{}`); a.status != 200 {
		t.Errorf("POST /search without a key: %d %q, want it passed through", a.status, a.body)
	}
	if n := up.count("/payments"); n != 1 {
		t.Errorf("POST /payments twice with one key executed %d times, want 1", n)
	}
	if n := up.count("/search"); n != 3 {
		t.Errorf("POST /search three times executed %d times, want 3 (not protected)", n)
	}
}

// TestProxyRetries: reverse_proxy configured to retry, in front of an upstream that
// executes a keyed POST and hangs up on its reused connection without an answer, the
// case where net/http's transport resends a request bearing an Idempotency-Key and
// reverse_proxy's retries send it again (with lb_retry_match, and request_buffers,
// which lets it replay the body): the upstream executes it once, the client is
// answered 502 upstream-failed, and a retry with the key is not forwarded while its
// lease runs.
func TestProxyRetries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, lb string }{
		{"lb_retries", "lb_retries 3\n\t\tlb_try_interval 10ms"},
		{"lb_try_duration", "lb_try_duration 2s\n\t\tlb_try_interval 10ms"},
		{"lb_retry_match POST", "lb_retries 3\n\t\tlb_try_interval 10ms\n\t\tlb_retry_match {\n\t\t\tmethod POST\n\t\t}"},
		{"request_buffers", "request_buffers 1MB\n\t\tlb_retries 3\n\t\tlb_try_interval 10ms\n\t\tlb_retry_match {\n\t\t\tmethod POST\n\t\t}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			var dropped atomic.Bool
			up.drop = func(r *http.Request) bool {
				return r.Method == "POST" && dropped.CompareAndSwap(false, true)
			}
			site := fmt.Sprintf(`%%s {
	idempotency {
		store sqlite:%s
	}
	reverse_proxy %s {
		%s
	}
}
`, filepath.Join(t.TempDir(), "keys.db"), up.URL, tc.lb)
			base := startCaddy(t, site).base
			// A GET first, so that the POST goes on a reused connection to the upstream.
			if a := send(t, "GET", base+"/warm", "", ""); a.status != 200 {
				t.Fatalf("GET: %d %q", a.status, a.body)
			}
			a := send(t, "POST", base+"/payments", "k-3", `{"amount":10}`)
			if n := up.count("/payments"); n != 1 {
				t.Fatalf("the keyed POST was executed %d times by the upstream, want 1 (answered %d %q)", n, a.status, a.body)
			}
			if a.status != http.StatusBadGateway || !strings.Contains(a.body, "upstream-failed") {
				t.Errorf("the POST whose connection broke: %d %q, want 502 upstream-failed", a.status, a.body)
			}
			if r := send(t, "POST", base+"/payments", "k-3", `{"amount":10}`); r.status != http.StatusConflict {
				t.Errorf("its retry within the lease: %d %q, want 409", r.status, r.body)
			}
			if n := up.count("/payments"); n != 1 {
				t.Errorf("after the retry the upstream executed it %d times, want 1", n)
			}
		})
	}
}
