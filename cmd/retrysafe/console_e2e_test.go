package main

// End-to-end tests of the operator console as the binary serves it: on the gateway's
// admin listener (--admin-token, --console) and as retrysafe console.

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/testenv"
)

// adminGet sends a GET to the admin listener, with the bearer token when given.
func adminGet(t *testing.T, u, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// adminPost posts form with the bearer token, following no redirect.
func adminPost(t *testing.T, u, token string, form url.Values) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+token)
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

var consoleCSRF = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// TestE2EConsoleExposure: a console reachable from other hosts without a token is
// refused at start, for the gateway's admin listener and for retrysafe console; with
// --console off the admin listener may be exposed as before.
func TestE2EConsoleExposure(t *testing.T) {
	t.Parallel()
	gw := []string{"gateway", "--upstream", "http://127.0.0.1:1", "--store", "memory:", "--listen", "127.0.0.1:0"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(gw, "--admin", "0.0.0.0:0"), "--admin 0.0.0.0:0 is not a loopback address"},
		{append(gw, "--admin", ":0", "--console", "read-only"), "set --admin-token"},
		{append(gw, "--console", "maybe"), `--console "maybe": want on, off or read-only`},
		{[]string{"console", "--store", "memory:", "--listen", "0.0.0.0:0"}, "--listen 0.0.0.0:0 is not a loopback address"},
		{[]string{"console", "--store", "memory:", "--queue", "q"}, "--queue needs --amqp or --nats"},
		{append(gw, "--queue", "q"), "--queue needs --amqp or --nats"},
		{append(gw, "--amqp", "amqp://127.0.0.1:1/", "--queue", "q", "--console", "off"), "--console off leaves out"},
		{[]string{"console", "--store", "memory:", "--amqp", "amqp://127.0.0.1:1/"}, "need at least one --queue"},
		{[]string{"console", "--store", "memory:", "--nats", "amqp://127.0.0.1:1/", "--queue", "q"}, "--nats amqp://127.0.0.1:1/: want nats://"},
	} {
		out, code := runBinary(t, c.args...)
		if code != exitUsage || !strings.Contains(out, c.want) || strings.Count(strings.TrimSpace(out), "\n") > 0 {
			t.Errorf("%v: exit %d, want 2 and one line with %q:\n%s", c.args, code, c.want, out)
		}
	}
	p := startGateway(t, nil, "--upstream", "http://127.0.0.1:1", "--store", "memory:", "--admin", "0.0.0.0:0", "--console", "off")
	if status, _ := adminGet(t, p.admin+"/healthz", ""); status != http.StatusOK {
		t.Errorf("/healthz with --console off: %d", status)
	}
	if status, _ := adminGet(t, p.admin+"/keys", ""); status != http.StatusNotFound {
		t.Errorf("/keys with --console off: %d, want 404", status)
	}
}

// TestE2EConsoleGateway: the gateway's admin listener serves the console at /, behind
// the token from RETRYSAFE_ADMIN_TOKEN when bound off loopback; an eviction through it
// makes the next request with the key execute again; read-only refuses it.
func TestE2EConsoleGateway(t *testing.T) {
	t.Parallel()
	var executions atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		executions.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(up.Close)
	const token = "e2e-console-token"
	p := startGateway(t, []string{"RETRYSAFE_ADMIN_TOKEN=" + token}, "--upstream", up.URL, "--store", "memory:", "--admin", "0.0.0.0:0")
	key := testenv.Name("console-e2e")
	send := func() {
		req, _ := http.NewRequest(http.MethodPost, p.addr+"/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Idempotency-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	send()
	send()
	if n := executions.Load(); n != 1 {
		t.Fatalf("upstream executions %d, want 1", n)
	}
	for _, path := range []string{"/keys", "/outcomes", "/metrics"} {
		if status, _ := adminGet(t, p.admin+path, ""); status != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d, want 401", path, status)
		}
	}
	if status, _ := adminGet(t, p.admin+"/healthz", ""); status != http.StatusOK {
		t.Errorf("/healthz without the token: %d, want 200 (probes stay open)", status)
	}
	if status, body := adminGet(t, p.admin+"/metrics", token); status != http.StatusOK || !strings.Contains(body, "retrysafe_gateway_requests_total") {
		t.Errorf("/metrics with the token: %d", status)
	}
	status, body := adminGet(t, p.admin+"/keys?key="+url.QueryEscape(key), token)
	if status != http.StatusOK || !strings.Contains(body, key) {
		t.Fatalf("GET /keys with the token: %d:\n%s", status, body)
	}
	if status, body := adminGet(t, p.admin+"/routes", token); status != http.StatusOK || !strings.Contains(body, "catch-all") {
		t.Errorf("GET /routes: %d:\n%s", status, body)
	}
	if status, body := adminGet(t, p.admin+"/outcomes", token); status != http.StatusOK || !strings.Contains(body, "Store latency") {
		t.Errorf("GET /outcomes: %d:\n%s", status, body)
	}
	_, page := adminGet(t, p.admin+"/keys/evict?"+url.Values{"scope": {`""`}, "key": {key}}.Encode(), token)
	m := consoleCSRF.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the confirmation page:\n%s", page)
	}
	form := url.Values{"scope": {`""`}, "key": {key}}
	if status := adminPost(t, p.admin+"/keys/evict", token, form); status != http.StatusForbidden {
		t.Errorf("POST without the CSRF token: %d, want 403", status)
	}
	form.Set("csrf", m[1])
	if status := adminPost(t, p.admin+"/keys/evict", token, form); status != http.StatusSeeOther {
		t.Fatalf("POST with the CSRF token: %d, want 303", status)
	}
	send()
	if n := executions.Load(); n != 2 {
		t.Errorf("upstream executions after the eviction %d, want 2", n)
	}

	ro := startGateway(t, nil, "--upstream", up.URL, "--store", "memory:", "--console", "read-only")
	if status, body := adminGet(t, ro.admin+"/keys", ""); status != http.StatusOK || strings.Contains(body, "Evict") || !strings.Contains(body, "read-only") {
		t.Errorf("read-only /keys: %d:\n%s", status, body)
	}
	if status := adminPost(t, ro.admin+"/keys/evict", "", form); status != http.StatusForbidden {
		t.Errorf("read-only POST: %d, want 403", status)
	}
}

// consoleProc is a running retrysafe console.
type consoleProc struct {
	cmd  *exec.Cmd
	base string // its URL, without the trailing slash
	done chan struct{}
	mu   sync.Mutex
	log  strings.Builder
}

func (p *consoleProc) logged() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// startConsole runs retrysafe console with args (plus a free loopback address and JSON
// logs) and waits for its "listening" line.
func startConsole(t *testing.T, args ...string) *consoleProc {
	t.Helper()
	p := &consoleProc{done: make(chan struct{})}
	p.cmd = exec.Command(binary, append([]string{"console", "--listen", "127.0.0.1:0", "--log-format", "json"}, args...)...)
	p.cmd.Env = env()
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("retrysafe console %v log:\n%s", args, p.logged())
		}
	})
	addr := make(chan string, 1)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "retrysafe console listening" {
				addr <- m["addr"].(string)
			}
		}
		_ = p.cmd.Wait()
	}()
	select {
	case a := <-addr:
		p.base = strings.TrimSuffix(a, "/")
	case <-p.done:
		t.Fatalf("retrysafe console exited:\n%s", p.logged())
	case <-time.After(20 * time.Second):
		t.Fatalf("retrysafe console did not start:\n%s", p.logged())
	}
	return p
}

// TestE2EConsoleCommand: retrysafe console serves a store's keys without a gateway,
// says that the outcomes come from a gateway, and stops on SIGTERM with status 0.
func TestE2EConsoleCommand(t *testing.T) {
	t.Parallel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "keys.db")
	if out, code := runBinary(t, "migrate", "--store", db); code != 0 {
		t.Fatalf("migrate: %d %s", code, out)
	}
	p := startConsole(t, "--store", db)
	if status, body := adminGet(t, p.base+"/keys", ""); status != http.StatusOK || !strings.Contains(body, "No record matches") {
		t.Errorf("GET /keys: %d:\n%s", status, body)
	}
	if status, body := adminGet(t, p.base+"/outcomes", ""); status != http.StatusOK || !strings.Contains(body, "come from a gateway") {
		t.Errorf("GET /outcomes: %d:\n%s", status, body)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-p.done
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("retrysafe console after SIGTERM: exit %d\n%s", code, p.logged())
	}
}

// TestE2EConsoleDLQ: retrysafe console lists the dead letters of a queue on RabbitMQ
// and on NATS JetStream, and replays the one selected back to its work queue.
func TestE2EConsoleDLQ(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, flag string
		setup      func(t *testing.T) *dlqBroker
	}{
		{"rabbitmq", "--amqp", rabbitDLQ},
		{"jetstream", "--nats", natsDLQ},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := c.setup(t)
			p := startConsole(t, "--store", "memory:", c.flag, b.url, "--queue", b.queue)
			path := p.base + "/dlq/" + url.PathEscape(b.queue)
			status, page := adminGet(t, path, "")
			for _, id := range dlqTestIDs() {
				if status != http.StatusOK || !strings.Contains(page, id) || !strings.Contains(page, "boom: the handler refuses") {
					t.Fatalf("GET the DLQ page: %d, want %s and its error:\n%s", status, id, page)
				}
			}
			m := consoleCSRF.FindStringSubmatch(page)
			if m == nil {
				t.Fatalf("no CSRF token on the DLQ page:\n%s", page)
			}
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			res, err := client.PostForm(path+"/replay", url.Values{"csrf": {m[1]}, "id": {"dlq-m2"}})
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusSeeOther {
				t.Fatalf("replay: %d, want 303", res.StatusCode)
			}
			waitFor(t, "the replayed message in the work queue", 15*time.Second, func() bool {
				work, dlq := b.counts(t)
				return work == 1 && dlq == 2
			})
			if _, page := adminGet(t, path, ""); strings.Contains(page, ">dlq-m2<") || !strings.Contains(page, ">dlq-m1<") {
				t.Errorf("the DLQ page after the replay:\n%s", page)
			}

			// Purge: the list's button leads to a confirmation page that removes nothing;
			// its form, confirmed, removes the one selected.
			res, err = client.PostForm(path+"/purge", url.Values{"csrf": {m[1]}, "id": {"dlq-m1"}})
			if err != nil {
				t.Fatal(err)
			}
			confirm, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusOK || !strings.Contains(string(confirm), "cannot be replayed afterwards") {
				t.Fatalf("purge without confirm: %d, want the confirmation page:\n%s", res.StatusCode, confirm)
			}
			if _, dlq := b.counts(t); dlq != 2 {
				t.Fatalf("the confirmation page purged: %d dead letters left, want 2", dlq)
			}
			res, err = client.PostForm(path+"/purge", url.Values{"csrf": {m[1]}, "id": {"dlq-m1"}, "confirm": {"1"}})
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusSeeOther || !strings.Contains(res.Header.Get("Location"), "Purged+1+dead+letter") {
				t.Fatalf("purge: %d %s, want 303 saying it purged one", res.StatusCode, res.Header.Get("Location"))
			}
			waitFor(t, "one dead letter left", 15*time.Second, func() bool {
				work, dlq := b.counts(t)
				return work == 1 && dlq == 1
			})
		})
	}
}

// TestE2EConsoleRoutesReload: the routes page shows the file's table, upstream names
// included, and after SIGHUP the table of the file the gateway took; a file it refused
// leaves the page as it was.
func TestE2EConsoleRoutesReload(t *testing.T) {
	t.Parallel()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(api.Close)
	file := writeFile(t, "gateway.yaml", "upstreams:\n  ledger: ${API_URL}\nroutes:\n  - match: POST /payments\n    upstream: ledger\n")
	gw := startGateway(t, []string{"API_URL=" + api.URL}, "--config", file, "--store", "memory:")
	routes := func() string {
		t.Helper()
		status, body := adminGet(t, gw.admin+"/routes", "")
		if status != http.StatusOK {
			t.Fatalf("GET /routes: %d", status)
		}
		return body
	}
	if body := routes(); !strings.Contains(body, "POST /payments") || !strings.Contains(body, "<td>ledger</td>") {
		t.Fatalf("the routes page before the reload:\n%s", body)
	}
	reloads := 0
	reload := func(text, msg string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := gw.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		reloads++
		n := reloads
		gw.awaitLog(msg, 10*time.Second, func(string) bool {
			return strings.Count(gw.log(), `"msg":"config reload`) >= n
		})
	}
	reload("upstreams:\n  ledger: ${API_URL}\nroutes:\n  - match: POST /refunds\n    upstream: ledger\n    mode: optional\n", "the reload")
	// The table is replaced just after the reload is logged.
	var body string
	waitFor(t, "the reloaded table", 10*time.Second, func() bool {
		body = routes()
		return strings.Contains(body, "POST /refunds")
	})
	if strings.Contains(body, "POST /payments") || !strings.Contains(body, "<td>ledger</td>") {
		t.Errorf("the routes page after the reload:\n%s", body)
	}
	reload("routes:\n  - match: POST /broken\n    upstream: nowhere\n", "the refused reload")
	if body := routes(); strings.Contains(body, "/broken") || !strings.Contains(body, "POST /refunds") {
		t.Errorf("the routes page after a refused reload:\n%s", body)
	}
}

// TestE2EConsoleConfigFile: the file's console and admin_token act as the flags do: an
// exposed admin listener without a token is refused, a token from the environment
// through ${NAME} protects it, and read-only hides the actions.
func TestE2EConsoleConfigFile(t *testing.T) {
	t.Parallel()
	const base = "upstreams:\n  api: http://127.0.0.1:1\nstore: \"memory:\"\nadmin: 0.0.0.0:0\n"
	out, code := runBinary(t, "gateway", "--listen", "127.0.0.1:0", "--config", writeConfig(t, base))
	if code != exitUsage || !strings.Contains(out, "is not a loopback address") {
		t.Errorf("exposed admin in the file, no token: exit %d, want 2 and the loopback error:\n%s", code, out)
	}
	const token = "file-console-token"
	file := writeConfig(t, base+"console: read-only\nadmin_token: ${CONSOLE_TOKEN}\n")
	p := startGateway(t, []string{"CONSOLE_TOKEN=" + token}, "--config", file, "--admin", "0.0.0.0:0")
	if status, _ := adminGet(t, p.admin+"/keys", ""); status != http.StatusUnauthorized {
		t.Errorf("GET /keys without the token: %d, want 401", status)
	}
	status, body := adminGet(t, p.admin+"/keys", token)
	if status != http.StatusOK || strings.Contains(body, "Evict") || !strings.Contains(body, "read-only") {
		t.Errorf("GET /keys with the file's token: %d, want 200 read-only:\n%s", status, body)
	}
}

// TestE2EGatewayConsoleDLQ: the gateway's console shows the dead letters of the queues
// given with --amqp and --queue, and replays the one selected to its work queue.
func TestE2EGatewayConsoleDLQ(t *testing.T) {
	t.Parallel()
	b := rabbitDLQ(t)
	p := startGateway(t, nil, "--upstream", "http://127.0.0.1:1", "--store", "memory:", "--amqp", b.url, "--queue", b.queue)
	path := p.admin + "/dlq/" + url.PathEscape(b.queue)
	status, page := adminGet(t, path, "")
	for _, id := range dlqTestIDs() {
		if status != http.StatusOK || !strings.Contains(page, id) {
			t.Fatalf("GET the gateway console's DLQ page: %d, want %s:\n%s", status, id, page)
		}
	}
	// The filter: by the last error's text (any case), and by reason.
	for query, want := range map[string]int{"?err=HANDLER+REFUSES": 3, "?err=no+such+error": 0, "?reason=no-such-reason": 0} {
		_, filtered := adminGet(t, path+query, "")
		n := 0
		for _, id := range dlqTestIDs() {
			if strings.Contains(filtered, ">"+id+"<") {
				n++
			}
		}
		if n != want {
			t.Errorf("GET %s: %d dead letters shown, want %d:\n%s", query, n, want, filtered)
		}
	}
	if m := regexp.MustCompile(`<option value="([a-z-]+)"`).FindStringSubmatch(page); m == nil {
		t.Errorf("no reason to filter by on the DLQ page:\n%s", page)
	} else if _, filtered := adminGet(t, path+"?reason="+m[1], ""); !strings.Contains(filtered, ">dlq-m1<") {
		t.Errorf("GET ?reason=%s: the dead letters of that reason are not shown:\n%s", m[1], filtered)
	}
	m := consoleCSRF.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the DLQ page:\n%s", page)
	}
	if status := adminPost(t, path+"/replay", "", url.Values{"csrf": {m[1]}, "id": {"dlq-m3"}}); status != http.StatusSeeOther {
		t.Fatalf("replay: %d, want 303", status)
	}
	waitFor(t, "the replayed message in the work queue", 15*time.Second, func() bool {
		work, dlq := b.counts(t)
		return work == 1 && dlq == 2
	})
}
