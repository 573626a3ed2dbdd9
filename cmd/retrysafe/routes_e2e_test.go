package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/testenv"
)

// writeFile writes text to a file of the test's own and returns its path.
func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// routesFile is a mixed API in front of two upstreams: payments need a key, search is
// passed through, notes take a key when there is one, a Stripe-style webhook is keyed
// by the event id in its body, and an admin API is scoped by its session cookie.
const routesFile = `
store: ${TEST_STORE}
upstreams:
  api: ${API_URL}
  hooks: ${HOOKS_URL}
defaults:
  upstream: api
routes:
  - match: POST /payments
  - match: POST /search
    mode: off
  - match: POST /notes
    mode: optional
  - match: POST /webhooks/stripe
    upstream: hooks
    key: {pointer: /id}
    scope: none
    fingerprint: {ignore: [/created]}
  - match: POST /admin/
    scope: {cookie: session}
`

// TestE2ERouteTable: one gateway, configured by a file, applies each route's policy
// to its requests, on every store. The upstreams count executions (they never
// deduplicate).
func TestE2ERouteTable(t *testing.T) {
	t.Parallel()
	for _, s := range storeDSNs {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			api, hooks := newUpstream(t), newUpstream(t)
			file := writeFile(t, "gateway.yaml", routesFile)
			gw := startGateway(t, []string{"TEST_STORE=" + s.dsn(t), "API_URL=" + api.URL, "HOOKS_URL=" + hooks.URL}, "--config", file)
			key := func(k string) string { return testenv.Name(k) }
			expect := func(r reply, status int, replayed bool, what string) {
				t.Helper()
				if r.err != nil || r.status != status || (r.header.Get("Idempotent-Replayed") == "true") != replayed {
					t.Fatalf("%s: %v, want %d (replayed %v)", what, r, status, replayed)
				}
			}

			// required
			expect(send(t, gw.addr, "/payments", `{}`), 400, false, "a payment without a key")
			pay := key("pay")
			expect(send(t, gw.addr, "/payments", `{}`, "Idempotency-Key", pay), 201, false, "a payment")
			expect(send(t, gw.addr, "/payments", `{}`, "Idempotency-Key", pay), 201, true, "its retry")
			// off: the key is the upstream's business; each request is forwarded.
			search := key("search")
			expect(send(t, gw.addr, "/search", `{}`, "Idempotency-Key", search), 201, false, "a search")
			expect(send(t, gw.addr, "/search", `{}`, "Idempotency-Key", search), 201, false, "the same search")
			// optional
			expect(send(t, gw.addr, "/notes", `{}`), 201, false, "a note without a key")
			note := key("note")
			expect(send(t, gw.addr, "/notes", `{}`, "Idempotency-Key", note), 201, false, "a keyed note")
			expect(send(t, gw.addr, "/notes", `{}`, "Idempotency-Key", note), 201, true, "its retry")
			// the catch-all has the defaults: required
			expect(send(t, gw.addr, "/elsewhere", `{}`), 400, false, "another path without a key")
			// a webhook keyed by its body, retried with another timestamp
			evt := key("evt")
			for i := range 3 {
				body := fmt.Sprintf(`{"id":%q,"type":"charge.succeeded","created":%d}`, evt, 1700000000+i)
				expect(send(t, gw.addr, "/webhooks/stripe", body), 201, i > 0, fmt.Sprintf("delivery %d", i))
			}
			// cookie scopes: one key, two sessions, two records
			adm := key("adm")
			expect(send(t, gw.addr, "/admin/users", `{}`, "Idempotency-Key", adm, "Cookie", "session=alice"), 201, false, "alice")
			expect(send(t, gw.addr, "/admin/users", `{}`, "Idempotency-Key", adm, "Cookie", "session=bob"), 201, false, "bob, same key")
			expect(send(t, gw.addr, "/admin/users", `{}`, "Idempotency-Key", adm, "Cookie", "session=alice"), 201, true, "alice's retry")

			for k, want := range map[string]int{pay: 1, search: 2, note: 1, adm: 2} {
				if n := api.callsFor(k); n != want {
					t.Errorf("api executions for %s: %d, want %d", k, n, want)
				}
			}
			if n := hooks.callsFor(""); n != 1 {
				t.Errorf("the webhook upstream executed the event %d times, want 1", n)
			}
			if n := api.callsFor(""); n != 1 { // the one unkeyed note
				t.Errorf("the api saw %d unkeyed requests, want 1 (the note)", n)
			}
		})
	}
}

// reloadFile is a two-route configuration; other's mode is the parameter.
func reloadFile(otherMode string) string {
	return `
upstreams:
  api: ${API_URL}
routes:
  - match: POST /held-once
  - match: POST /pay
  - match: POST /other
    mode: ` + otherMode + "\n"
}

// TestE2ESIGHUP: SIGHUP reloads the file while requests are in flight. A good file
// changes the policy of the next requests; the request in flight finishes under the
// policy it began with (its answer is stored); a broken file is refused with one log
// line and the running policy stays; no request sent meanwhile fails.
func TestE2ESIGHUP(t *testing.T) {
	t.Parallel()
	api := newUpstream(t)
	file := writeFile(t, "gateway.yaml", reloadFile("off"))
	gw := startGateway(t, []string{"API_URL=" + api.URL}, "--config", file, "--store", sqliteDSN(t))

	// Traffic all along: each request must succeed, whatever reload happens meanwhile.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	sent := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r := send(t, gw.addr, "/pay", `{}`, "Idempotency-Key", fmt.Sprintf("traffic-%d-%s", i, t.Name()))
			mu.Lock()
			sent++
			if r.err != nil || r.status != http.StatusCreated {
				failures = append(failures, r.String())
			}
			mu.Unlock()
		}
	}()

	held := testenv.Name("held")
	first := make(chan reply, 1)
	go func() { first <- send(t, gw.addr, "/held-once", `{}`, "Idempotency-Key", held) }()
	await(t, "the held request upstream", 10*time.Second, api.arrived(held))

	if r := send(t, gw.addr, "/other", `{}`); r.status != http.StatusCreated {
		t.Fatalf("/other while off: %v", r)
	}
	reloads := func() int { return strings.Count(gw.log(), `"msg":"config reloaded"`) }
	hup := func() {
		t.Helper()
		if err := gw.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}

	// A good file: /other needs a key from now on; /held-once becomes off.
	if err := os.WriteFile(file, []byte(strings.Replace(reloadFile("required"), "  - match: POST /held-once\n", "  - match: POST /held-once\n    mode: off\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	hup()
	gw.awaitLog("the reload", 10*time.Second, func(line string) bool { return strings.Contains(line, `"msg":"config reloaded"`) })
	if r := send(t, gw.addr, "/other", `{}`); r.status != http.StatusBadRequest {
		t.Fatalf("/other after the reload: %v, want 400 (required)", r)
	}
	// The request in flight began keyed: it finishes so, and its answer is stored.
	api.release(held)
	if r := <-first; r.err != nil || r.status != http.StatusCreated {
		t.Fatalf("the request in flight: %v", r)
	}
	gw.awaitLog("the held request's line", 10*time.Second, func(line string) bool {
		var m map[string]any
		return json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "request" && m["key"] == held && m["outcome"] == "executed"
	})

	// A broken file: refused, in one line naming the file and line; the policy stays.
	if err := os.WriteFile(file, []byte(reloadFile("required")+"    ttl: soon\n  - match: POST /x\n    colour: red\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup()
	gw.awaitLog("the refusal", 10*time.Second, func(line string) bool { return strings.Contains(line, "config reload refused") })
	refusals := 0
	for _, line := range strings.Split(gw.log(), "\n") {
		if strings.Contains(line, "config reload refused") {
			refusals++
			if !strings.Contains(line, "gateway.yaml:") {
				t.Errorf("the refusal does not name the file and line: %s", line)
			}
		}
	}
	if refusals != 1 || reloads() != 1 {
		t.Errorf("%d refusal lines and %d reloads, want 1 and 1", refusals, reloads())
	}
	if r := send(t, gw.addr, "/other", `{}`); r.status != http.StatusBadRequest {
		t.Fatalf("/other after the refused reload: %v, want 400 (the running policy)", r)
	}

	close(stop)
	wg.Wait()
	if len(failures) > 0 || sent == 0 {
		t.Fatalf("%d of %d requests during the reloads failed: %v", len(failures), sent, failures)
	}
	t.Logf("%d requests sent during the reloads, none failed", sent)
}

// TestE2EConfigFlagsOverride: a flag overrides the file's defaults.
func TestE2EConfigFlagsOverride(t *testing.T) {
	t.Parallel()
	api := newUpstream(t)
	file := writeFile(t, "gateway.yaml", "upstreams:\n  api: ${API_URL}\ndefaults:\n  mode: required\n")
	gw := startGateway(t, []string{"API_URL=" + api.URL}, "--config", file, "--store", "memory:", "--require-key=false")
	if r := send(t, gw.addr, "/pay", `{}`); r.status != http.StatusCreated {
		t.Fatalf("without a key, with --require-key=false over the file's required: %v", r)
	}
}
