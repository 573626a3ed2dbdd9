package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency/endpointcheck"
)

// TestPolicy: the subdirectives are the gateway's policy keys: a key read from the body
// (key pointer), one scope for all, the keyed methods, and a member left out of the
// fingerprint.
func TestPolicy(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	site := fmt.Sprintf(`%%s {
	idempotency {
		store sqlite:%s
		key pointer /id
		scope none
		methods POST PUT
		fingerprint ignore /sent_at
	}
	reverse_proxy %s
}
`, filepath.Join(t.TempDir(), "keys.db"), up.URL)
	base := startCaddy(t, site).base
	a := send(t, "PUT", base+"/events", "", `{"id":"evt_1","sent_at":1}`)
	b := send(t, "PUT", base+"/events", "", `{"id":"evt_1","sent_at":2}`)
	if a.status != 200 || b.status != 200 || b.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("one event id twice, another sent_at: %d %q, then %d %q %v; want the second replayed", a.status, a.body, b.status, b.body, b.header)
	}
	if n := up.count("/events"); n != 1 {
		t.Errorf("the event was executed %d times, want 1", n)
	}
	if r := send(t, "POST", base+"/events", "", `{"no_id":true}`); r.status != http.StatusBadRequest {
		t.Errorf("a POST whose body has no /id: %d %q, want 400", r.status, r.body)
	}
	for range 2 {
		if r := send(t, "PATCH", base+"/other", "", `{"id":"evt_1"}`); r.status != 200 {
			t.Errorf("PATCH: %d %q", r.status, r.body)
		}
	}
	if n := up.count("/other"); n != 2 {
		t.Errorf("PATCH, not keyed here, executed %d times, want 2", n)
	}
}

// TestInvalid: caddy validate refuses what the gateway's configuration file refuses,
// with the file's key names, the gateway's keys that have no meaning in Caddy, saying
// what takes their place, and handlers over one store whose store-wide bounds differ.
func TestInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ sub, second, want string }{
		{sub: "ttl 10s", want: "ttl"},
		{sub: "mode sometimes", want: "mode"},
		{sub: "conflict later", want: "conflict"},
		{sub: "upstream http://127.0.0.1:1", want: "upstream is not a setting"},
		{sub: "upstream_timeout 5s", want: "reverse_proxy's transport http"},
		{sub: "shutdown_timeout 5s", want: "grace_period"},
		{sub: "listen :8080", want: "site's address"},
		{sub: "key header Idempotency-Key\n\t\tkey header Other", want: "set twice"},
		{sub: "store mysql://db/app", want: "unknown store"},
		{sub: "methods GET", want: "safe method"},
		{sub: "max_body_memory lots", want: "max_body_memory"},
		{sub: "max_waiters -1", want: "max_waiters"},
		{sub: "max_body_memory 1MiB\n\t\tmax_body 2MiB", want: "max_body"},
		// Two handlers over one store with different store-wide bounds.
		{sub: "max_body_memory 64MiB", second: "max_body_memory 32MiB", want: "set it alike on all of them"},
		{sub: "max_waiters 10", second: "max_waiters 20", want: "set it alike on all of them"},
	} {
		t.Run(tc.sub, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			db := filepath.Join(dir, "keys.db")
			second := ""
			if tc.second != "" {
				second = fmt.Sprintf("\thandle /b* {\n\t\tidempotency {\n\t\t\tstore sqlite:%s\n\t\t\t%s\n\t\t}\n\t\treverse_proxy 127.0.0.1:1\n\t}\n", db, tc.second)
			}
			cf := fmt.Sprintf("{\n\tadmin off\n\torder idempotency before reverse_proxy\n}\n:0 {\n%s\tidempotency {\n\t\tstore sqlite:%s\n\t\t%s\n\t}\n\treverse_proxy 127.0.0.1:1\n}\n",
				second, db, tc.sub)
			path := filepath.Join(dir, "Caddyfile")
			if err := os.WriteFile(path, []byte(cf), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(caddyBin, "validate", "--config", path, "--adapter", "caddyfile")
			cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) {
				t.Errorf("caddy validate of %q: %v, want an error naming %q:\n%s", tc.sub, err, tc.want, out)
			}
		})
	}
}

// TestStores: the minimal form on SQLite, PostgreSQL and Redis: a retry is replayed,
// and the endpoint battery (endpointcheck, what retrysafe check runs) passes every
// required case.
func TestStores(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"sqlite", "postgres", "redis"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var dsn string
			switch kind {
			case "sqlite":
				dsn = "sqlite:" + filepath.Join(t.TempDir(), "keys.db")
			case "postgres":
				dsn = postgresDSN(t, "caddy").String()
			case "redis":
				u, err := url.Parse(testenv.RedisURL(t))
				if err != nil {
					t.Fatal(err)
				}
				q := u.Query()
				q.Set("prefix", testenv.Name("caddy")+":")
				u.RawQuery = q.Encode()
				dsn = u.String()
			}
			up := newUpstream(t)
			site := fmt.Sprintf("%%s {\n\tidempotency {\n\t\tstore %s\n\t}\n\treverse_proxy %s\n}\n", strings.ReplaceAll(dsn, "%", "%%"), up.URL)
			base := startCaddy(t, site).base
			first := send(t, "POST", base+"/payments", "k-s", `{"amount":1}`)
			again := send(t, "POST", base+"/payments", "k-s", `{"amount":1}`)
			if first.status != 200 || again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("a retry: %d %q, then %d %q", first.status, first.body, again.status, again.body)
			}
			if n := up.count("/payments"); n != 1 {
				t.Errorf("the keyed POST was executed %d times, want 1", n)
			}
			battery(t, base+"/charges", false)
		})
	}
}

// postgresDSN returns the DSN of a fresh schema of the test PostgreSQL, dropped when t
// ends.
func postgresDSN(t *testing.T, prefix string) *url.URL {
	t.Helper()
	u, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", testenv.Schema(t, prefix))
	u.RawQuery = q.Encode()
	return u
}

// battery runs the endpoint battery against url and checks that every required case
// passes, or, with fails, that one fails at least; it returns the report.
func battery(t *testing.T, url string, fails bool, transport ...http.RoundTripper) *endpointcheck.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := endpointcheck.Config{URL: url, Body: []byte(`{"amount":100}`), Auth: []string{"Bearer alice", "Bearer bob"}}
	if len(transport) > 0 {
		cfg.Transport = transport[0]
	}
	rep, err := endpointcheck.Check(ctx, cfg)
	if err != nil {
		t.Fatalf("endpointcheck: %v", err)
	}
	passed, required := 0, 0
	for _, r := range rep.Results {
		if r.Level == endpointcheck.Required {
			required++
			if r.Verdict == endpointcheck.Pass {
				passed++
			} else {
				t.Logf("endpoint battery: required case %s: %s (%s)", r.ID, r.Verdict, r.Observed)
			}
		}
	}
	t.Logf("endpoint battery: %d requests, %d of %d required cases passed", rep.Requests, passed, required)
	if required == 0 {
		t.Errorf("the endpoint battery ran no required case")
	}
	if rep.Failed() != fails {
		var b strings.Builder
		_ = rep.WriteText(&b)
		t.Errorf("endpoint battery: failed %v, want %v:\n%s", rep.Failed(), fails, b.String())
	}
	return rep
}

// TestBatteryConflictReject: under conflict reject the battery's concurrent duplicates
// are answered 409, so its Retry-After case, which has no 409 to look at under wait,
// runs, and passes with every other required case. The burst's execution is held at
// the upstream until the battery has seen a 409, so that its duplicates find the key in
// flight however fast the upstream would have answered.
func TestBatteryConflictReject(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	conflict := make(chan struct{})
	var sawConflict sync.Once
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	observe := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		res, err := base.RoundTrip(r)
		if err == nil && res.StatusCode == http.StatusConflict {
			sawConflict.Do(func() { close(conflict) })
		}
		return res, err
	})
	// The burst's key is the second the upstream executes (the first is the
	// sequential replay case's).
	var (
		mu   sync.Mutex
		keys = map[string]bool{}
	)
	up.hold = func(r *http.Request) {
		mu.Lock()
		k := r.Header.Get("Idempotency-Key")
		first := k != "" && !keys[k]
		keys[k] = true
		burst := first && len(keys) == 2
		mu.Unlock()
		if burst {
			select {
			case <-conflict:
			case <-r.Context().Done():
			}
		}
	}
	site := fmt.Sprintf("%%s {\n\tidempotency {\n\t\tstore sqlite:%s\n\t\tconflict reject\n\t}\n\treverse_proxy %s\n}\n",
		filepath.Join(t.TempDir(), "keys.db"), up.URL)
	rep := battery(t, startCaddy(t, site).base+"/charges", false, observe)
	i := slices.IndexFunc(rep.Results, func(r endpointcheck.Result) bool { return r.ID == endpointcheck.CaseRetryAfter })
	if i < 0 {
		t.Fatal("the battery has no Retry-After case")
	}
	if r := rep.Results[i]; r.Verdict != endpointcheck.Pass {
		t.Errorf("the Retry-After case under conflict reject: %s (%s), want pass", r.Verdict, r.Observed)
	}
}

// TestReload: a configuration reloaded through the admin API keeps the store (it is
// opened once) and its records: a retry after the reload is replayed.
func TestReload(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	db := filepath.Join(t.TempDir(), "keys.db")
	site := func(conflict string) string {
		return fmt.Sprintf("%%s {\n\tidempotency {\n\t\tstore sqlite:%s\n\t\tconflict %s\n\t}\n\treverse_proxy %s\n}\n", db, conflict, up.URL)
	}
	p := startCaddy(t, site("wait"))
	first := send(t, "POST", p.base+"/payments", "k-r", `{"amount":1}`)
	p.reload(t, site("reject"))
	again := send(t, "POST", p.base+"/payments", "k-r", `{"amount":1}`)
	if again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a retry after the reload: %d %q, want the first answer replayed (%q)", again.status, again.body, first.body)
	}
	if n := up.count("/payments"); n != 1 {
		t.Errorf("the keyed POST was executed %d times, want 1", n)
	}
	if n := strings.Count(p.log.String(), "idempotency: store opened"); n != 1 {
		t.Errorf("the store was opened %d times, want once (shared across the reload)", n)
	}
	if n := strings.Count(p.log.String(), "idempotency: store closed"); n != 0 {
		t.Errorf("the store was closed %d times by the reload, want 0", n)
	}
}

// TestUnreachable: a keyed request whose upstream cannot be reached is answered 502
// upstream-unreachable and its key released, so that its retry is forwarded once the
// upstream is back; Caddy's shutdown closes the store.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	dead := testenv.DeadAddr(t)
	site := fmt.Sprintf("%%s {\n\tidempotency {\n\t\tstore sqlite:%s\n\t}\n\treverse_proxy %s\n}\n", filepath.Join(t.TempDir(), "keys.db"), dead)
	p := startCaddy(t, site)
	for i := range 2 {
		a := send(t, "POST", p.base+"/payments", "k-u", `{"amount":1}`)
		if a.status != http.StatusBadGateway || !strings.Contains(a.body, "upstream-unreachable") {
			t.Errorf("attempt %d to an upstream that is down: %d %q, want 502 upstream-unreachable (the key released, not 409)", i+1, a.status, a.body)
		}
	}
	p.stop()
	if !strings.Contains(p.log.String(), "idempotency: store closed") {
		t.Errorf("Caddy stopped without closing the store:\n%s", p.log)
	}
}

// TestReloadUnderLoad: configurations reloaded through the admin API while keyed
// requests run lose no answer and no record: every request answered is answered 200 and
// replayed when retried afterwards, and no key runs twice. A request may meet a
// keep-alive connection that the reload closes (the client sees a reset or EOF, Caddy
// never read it); its retry with the key runs it, once.
func TestReloadUnderLoad(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	db := filepath.Join(t.TempDir(), "keys.db")
	site := func(ttl string) string {
		return fmt.Sprintf("%%s {\n\tidempotency {\n\t\tstore sqlite:%s\n\t\tttl %s\n\t}\n\treverse_proxy %s\n}\n", db, ttl, up.URL)
	}
	p := startCaddy(t, site("24h"))
	const workers, perWorker = 4, 25
	done := make(chan struct{})
	errs := make(chan error, workers*perWorker)
	var lostMu sync.Mutex
	lost := map[string]bool{} // requests whose connection failed: no answer
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				path := fmt.Sprintf("/payments/%d-%d", w, i)
				req, _ := http.NewRequest("POST", p.base+path, strings.NewReader(`{"amount":1}`))
				req.Header.Set("Idempotency-Key", path)
				req.Header.Set("Content-Type", "application/json")
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					lostMu.Lock()
					lost[path] = true
					lostMu.Unlock()
					continue
				}
				_ = res.Body.Close()
				if res.StatusCode != 200 {
					errs <- fmt.Errorf("%s: %d", path, res.StatusCode)
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	reloads := 0
	for ttl := 0; ; ttl++ {
		select {
		case <-done:
		default:
			if err := os.WriteFile(p.path, []byte(p.config(site(fmt.Sprintf("%dh", 24+ttl%2)))), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(caddyBin, "reload", "--config", p.path, "--adapter", "caddyfile", "--address", p.admin, "--force")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("caddy reload: %v\n%s", err, out)
			}
			reloads++
			continue
		}
		break
	}
	close(errs)
	for err := range errs {
		t.Errorf("a request during the reloads: %v", err)
	}
	for w := range workers {
		for i := range perWorker {
			path := fmt.Sprintf("/payments/%d-%d", w, i)
			a := send(t, "POST", p.base+path, path, `{"amount":1}`)
			if a.status != 200 || !lost[path] && a.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("%s retried after the reloads: %d %q, want it replayed", path, a.status, a.body)
			}
			if n := up.count(path); n != 1 {
				t.Errorf("%s executed %d times, want 1", path, n)
			}
		}
	}
	t.Logf("%d keyed requests during %d reloads, %d met a connection the reload closed", workers*perWorker, reloads, len(lost))
	if reloads == 0 {
		t.Error("no reload happened while the requests ran")
	}
	if n := strings.Count(p.log.String(), "idempotency: store opened"); n != 1 {
		t.Errorf("the store was opened %d times, want once", n)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
