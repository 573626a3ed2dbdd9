package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/testenv"
)

// runSplit runs the binary with args and extraEnv to completion and returns its stdout,
// its stderr and its exit status.
func runSplit(t *testing.T, extraEnv []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = env(extraEnv...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	_ = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%v still running after a minute:\n%s%s", args, out.String(), errOut.String())
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// TestE2EGatewayCheck: --check accepts a configuration whose store and upstream nothing
// answers for, and whose listen address is taken, because it opens and binds nothing;
// it prints a summary without the store's password.
func TestE2EGatewayCheck(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = busy.Close() })
	dead := testenv.DeadAddr(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(config, []byte(`store: ${RETRYSAFE_TEST_STORE}
admin_token: ${RETRYSAFE_TEST_TOKEN}
upstreams:
  api: http://api.internal:3000
  hooks: http://hooks.internal:3001
defaults: {upstream: api}
routes:
  - match: POST /payments
  - match: POST /webhooks/
    upstream: hooks
    key: {pointer: /id}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		env  []string
		args []string
		want []string // lines of the summary, each contained in its output
	}{
		{"postgres nothing listens on", nil,
			[]string{"--upstream", "http://" + dead, "--store", "postgres://u:secret@" + dead + "/db?sslmode=disable", "--listen", busy.Addr().String(), "--admin", busy.Addr().String()},
			[]string{"store     postgres (postgres://u:xxxxx@" + dead + "/db", "upstream  http://" + dead, "listen    " + busy.Addr().String(), "routes    none"}},
		{"redis nothing listens on, from the environment",
			[]string{"RETRYSAFE_UPSTREAM=http://api:3000", "RETRYSAFE_STORE=redis://:secret@" + dead + "/0", "RETRYSAFE_LISTEN=:8080", "RETRYSAFE_ADMIN=:9090", "RETRYSAFE_ADMIN_TOKEN=t0ken"},
			nil,
			[]string{"store     redis", "upstream  http://api:3000", "listen    :8080", "admin     :9090 (console on, token set)"}},
		{"config file", []string{"RETRYSAFE_TEST_STORE=postgres://u:secret@" + dead + "/db", "RETRYSAFE_TEST_TOKEN=t0ken"},
			[]string{"--config", config, "--listen", ":8080", "--admin", ":9090"},
			[]string{"store     postgres", "upstream  http://api.internal:3000, http://hooks.internal:3001", "admin     :9090 (console on, token set)", "routes    2 (" + config + ")"}},
		{"admin off", nil, []string{"--upstream", "http://api:3000", "--store", "memory:", "--admin", "off"},
			[]string{"store     memory (memory:)", "admin     off"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			out, errOut, code := runSplit(t, c.env, append([]string{"gateway", "--check"}, c.args...)...)
			if code != 0 {
				t.Fatalf("exit status %d, want 0; stderr:\n%s", code, errOut)
			}
			if errOut != "" {
				t.Errorf("stderr: %q", errOut)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("the summary has no %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "secret") {
				t.Errorf("the summary shows the password:\n%s", out)
			}
		})
	}
}

// TestE2EGatewayCheckProblems: each problem --check finds is one line on stderr, all of
// them at once, exit 2, nothing on stdout; and a problem that needs no I/O is reported
// by a start in the same words as by --check, the two sharing one validation.
func TestE2EGatewayCheckProblems(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	badFile := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badFile, []byte("upstreams: {api: http://api:3000}\nroutes:\n  - match: POST /a\n    upstream: nowhere\n  - match: POST /b\n    ttl: soon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		env  []string
		args []string
		want []string // one line each, in order
	}{
		{"many flags", nil,
			[]string{"--upstream", "localhost:3000", "--ttl", "0s", "--store", "mysql://u:secret@db", "--admin", ":9090", "--queue", "q"},
			[]string{"http or https", "--ttl must be positive", "--queue needs --amqp or --nats", "--store: unknown store", "--admin :9090 is not a loopback address"}},
		{"ttl under lease", nil, []string{"--upstream", "http://x", "--ttl", "1s", "--lease", "2s"}, []string{"--ttl (1s) must be longer than --lease"}},
		{"invalid postgres DSN", nil, []string{"--upstream", "http://x", "--store", "postgres:db"}, []string{"--store: invalid store"}},
		{"bad console", []string{"RETRYSAFE_CONSOLE=sometimes"}, []string{"--upstream", "http://x"}, []string{`--console "sometimes"`}},
		{"no upstream", nil, []string{"--store", "memory:"}, []string{"--upstream is required"}},
		{"file", nil, []string{"--config", badFile}, []string{"nowhere", "soon"}},
		{"missing file", nil, []string{"--config", filepath.Join(dir, "none.yaml")}, []string{"none.yaml"}},
		{"certificate that does not load", nil,
			[]string{"--upstream", "http://x", "--tls-cert", filepath.Join(dir, "none.crt"), "--tls-key", filepath.Join(dir, "none.key")},
			[]string{"none.crt"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"gateway", "--check"}, c.args...)
			out, errOut, code := runSplit(t, c.env, args...)
			if code != 2 {
				t.Errorf("exit status %d, want 2; stderr %q", code, errOut)
			}
			if out != "" {
				t.Errorf("stdout: %q", out)
			}
			lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
			if len(lines) != len(c.want) || !strings.HasSuffix(errOut, "\n") {
				t.Fatalf("stderr has %d lines, want %d:\n%s", len(lines), len(c.want), errOut)
			}
			for i, w := range c.want {
				if !strings.HasPrefix(lines[i], "retrysafe gateway: ") || !strings.Contains(lines[i], w) {
					t.Errorf("line %d is %q, want one with %q", i+1, lines[i], w)
				}
			}
			if strings.Contains(errOut, "secret") {
				t.Errorf("the password leaks: %q", errOut)
			}
			// A start finds the same problems, in the same words, before it opens
			// anything.
			_, startErr, startCode := runSplit(t, c.env, append([]string{"gateway"}, c.args...)...)
			if startCode != 2 || startErr != errOut {
				t.Errorf("a start exits %d with\n%s\nwant 2 with what --check said:\n%s", startCode, startErr, errOut)
			}
		})
	}
}

// TestE2EGatewayCheckNotFromEnv: RETRYSAFE_CHECK does not turn a start into a check, so
// that a variable left in a deployment cannot stop its gateways from serving.
func TestE2EGatewayCheckNotFromEnv(t *testing.T) {
	t.Parallel()
	p := startGateway(t, []string{"RETRYSAFE_CHECK=true"}, "--upstream", "http://127.0.0.1:1", "--store", "memory:")
	if p.addr == "" {
		t.Fatal("no proxy address logged")
	}
}
