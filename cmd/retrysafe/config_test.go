package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// runConfigCmd runs `retrysafe args…` in process and returns its status and output.
func runConfigCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut strings.Builder
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// writeConfig writes a configuration file into a new directory and returns its path.
func writeConfig(t *testing.T, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

var examplePath = filepath.Join("..", "..", "examples", "gateway.yaml")

// The example passes, with its summary line and its table on stdout.
func TestConfigCheckExample(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runConfigCmd(t, "config", "check", examplePath)
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	lines := strings.Split(stdout, "\n")
	if lines[0] != examplePath+": ok (6 routes, 2 upstreams)" {
		t.Errorf("first line %q", lines[0])
	}
	for _, want := range []string{"UPSTREAM  URL", "ROUTE ", "POST /payments ", "POST /webhooks/stripe ", "pointer /id", "/ (catch-all) "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
}

// Broken files: exit 1, nothing on stdout, every error on its own line on stderr as
// FILE:LINE: message.
func TestConfigCheckErrors(t *testing.T) {
	t.Parallel()
	const head = "upstreams:\n  api: http://127.0.0.1:3000\n"
	for _, c := range []struct {
		name, src string
		want      []string // the lines of stderr, after "FILE:"
	}{
		{"unknown field", head + "defaults:\n  ttl: 24h\n  tll: 1h\n", []string{`5: unknown field "tll" in defaults (did you mean ttl?)`}},
		{"unknown field in a route", head + "routes:\n  - match: POST /a\n    key: {header: X-Key, poiner: /id}\n",
			[]string{`5: unknown field "poiner" in routes[0].key (did you mean pointer?)`}},
		{"bad duration", head + "routes:\n  - match: POST /payments\n    ttl: 5x\n", []string{`5: routes[0].ttl: "5x" is not a duration (such as 30s, 5m, 24h)`}},
		{"unknown upstream", head + "routes:\n  - match: POST /hooks\n    upstream: hooks\n",
			[]string{`5: routes[0].upstream: unknown upstream "hooks": want one of api, or an absolute URL (http://host:port)`}},
		{"conflicting patterns", head + "routes:\n  - match: POST /a/{x}\n  - match: POST /{y}/b\n",
			[]string{`5: routes[1]: the pattern conflicts with route "POST /a/{x}": requests match both and neither is more specific`}},
		{"two errors", head + "defaults:\n  lease: forever\nroutes:\n  - match: POST /a\n    mode: sometimes\n", []string{
			`4: defaults.lease: "forever" is not a duration (such as 30s, 5m, 24h)`,
			`7: routes[0].mode: "sometimes" is not a mode: want required, optional or off`,
		}},
		{"ttl under lease", head + "defaults:\n  lease: 2m\n  ttl: 1m\n", []string{`5: defaults: ttl (1m0s) must be longer than lease (2m0s)`}},
		{"store", head + "store: mysql://app:hunter2@db/app\n", []string{`3: store: unknown store "mysql://app:xxxxx@db/app": want sqlite:PATH, postgres://…, redis://… or memory:`}},
		{"empty", "", []string{` the file is empty: want a mapping of keys (upstreams, defaults, routes, …)`}},
		{"a list", "- listen: :80\n", []string{`1: the file is a list: want a mapping of keys (upstreams, defaults, routes, …)`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, c.src)
			code, stdout, stderr := runConfigCmd(t, "config", "check", path)
			if code != exitFail || stdout != "" {
				t.Errorf("exit %d, stdout %q", code, stdout)
			}
			var want []string
			for _, w := range c.want {
				want = append(want, path+":"+w) // w starts with the line, or a blank for none
			}
			if got := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("stderr:\n%s\nwant:\n%s", stderr, strings.Join(want, "\n"))
			}
			if strings.Contains(stderr, "hunter2") {
				t.Errorf("the password leaks: %s", stderr)
			}
		})
	}
}

// ${NAME} in the store and upstream URLs comes from the environment. Unset, each use is
// reported on a line of its own and the file passes (it is checked where its secrets
// are not), unless --strict; the gateway itself refuses to start without them.
func TestConfigCheckEnv(t *testing.T) {
	path := writeConfig(t, "store: ${RETRYSAFE_CONFIG_TEST_STORE}\nupstreams:\n  api: ${RETRYSAFE_CONFIG_TEST_API}\n")
	t.Setenv("RETRYSAFE_CONFIG_TEST_API", "http://127.0.0.1:3000")
	unset := path + ":1: store: ${RETRYSAFE_CONFIG_TEST_STORE}: environment variable not set\n"
	code, stdout, stderr := runConfigCmd(t, "config", "check", path)
	if code != exitOK || stderr != unset || !strings.HasPrefix(stdout, path+": ok (0 routes, 1 upstream), but for 1 use of an unset variable") {
		t.Errorf("exit %d, stdout %q, stderr %q; want 0, ok, and %q", code, stdout, stderr, unset)
	}
	code, stdout, stderr = runConfigCmd(t, "config", "check", "--strict", path)
	if code != exitUsage || stderr != unset || stdout != "" {
		t.Errorf("--strict: exit %d, stdout %q, stderr %q; want 2 and %q alone", code, stdout, stderr, unset)
	}
	// A file with errors fails whatever the variables: they are listed with them.
	bad := writeConfig(t, "store: ${RETRYSAFE_CONFIG_TEST_STORE}\nupstreams:\n  api: ${RETRYSAFE_CONFIG_TEST_API}\ndefaults:\n  ttl: soon\n")
	if code, _, stderr := runConfigCmd(t, "config", "check", bad); code != exitFail || !strings.Contains(stderr, "${RETRYSAFE_CONFIG_TEST_STORE}") ||
		!strings.Contains(stderr, ":5: defaults.ttl") {
		t.Errorf("a bad file: exit %d, stderr %q", code, stderr)
	}
	// The gateway refuses to start without the variable, naming it. (Its context is
	// done: were the file taken, it would stop at once rather than serve.)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errOut strings.Builder
	code = run(ctx, []string{"gateway", "--config", path, "--listen", "127.0.0.1:0", "--admin", "off"}, &out, &errOut)
	if code != exitUsage || !strings.Contains(errOut.String(), "${RETRYSAFE_CONFIG_TEST_STORE}: environment variable not set") {
		t.Errorf("gateway: exit %d, stderr %q; want it refused", code, errOut.String())
	}
	t.Setenv("RETRYSAFE_CONFIG_TEST_STORE", "memory:")
	for _, args := range [][]string{{"config", "check", path}, {"config", "check", "--strict", path}} {
		if code, stdout, stderr := runConfigCmd(t, args...); code != exitOK || stderr != "" || !strings.Contains(stdout, "api       http://127.0.0.1:3000") {
			t.Errorf("%v, all set: exit %d:\n%s%s", args, code, stdout, stderr)
		}
	}
}

func TestConfigUsage(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "none.yaml")
	for _, c := range []struct {
		args         []string
		code         int
		stdout, errs string // in stdout, in stderr
	}{
		{[]string{"config"}, exitUsage, "", "want a subcommand: check"},
		{[]string{"config", "lint"}, exitUsage, "", `unknown subcommand "lint"`},
		{[]string{"config", "check"}, exitUsage, "", "want one FILE, not 0 arguments"},
		{[]string{"config", "check", "a.yaml", "b.yaml"}, exitUsage, "", "want one FILE, not 2 arguments"},
		{[]string{"config", "check", "--lenient", "a.yaml"}, exitUsage, "", "flag provided but not defined"},
		{[]string{"config", "check", "--help"}, exitOK, "usage: retrysafe config check FILE", ""},
		{[]string{"config", "--help"}, exitOK, "examples:", ""},
		{[]string{"help", "config"}, exitOK, "FILE:LINE: message", ""},
		{[]string{"help"}, exitOK, "config    check a gateway configuration file", ""},
		{[]string{"config", "check", missing}, exitFail, "", missing + ": cannot read it: no such file or directory"},
	} {
		code, stdout, stderr := runConfigCmd(t, c.args...)
		if code != c.code || !strings.Contains(stdout, c.stdout) || !strings.Contains(stderr, c.errs) || (c.errs == "") != (stderr == "") {
			t.Errorf("retrysafe %v: exit %d, stdout %q, stderr %q; want %d, %q, %q", c.args, code, stdout, stderr, c.code, c.stdout, c.errs)
		}
	}
}

// The built binary: the example passes, a broken file fails with its lines.
func TestConfigCheckBinary(t *testing.T) {
	t.Parallel()
	out, code := runBinary(t, "config", "check", examplePath)
	if code != 0 || !strings.HasPrefix(out, examplePath+": ok (6 routes, 2 upstreams)\n") {
		t.Errorf("exit %d:\n%s", code, out)
	}
	path := writeConfig(t, "upstreams:\n  api: http://127.0.0.1:3000\nroutes:\n  - match: POST /a\n    ttl: 5x\n  - matc: POST /b\n")
	out, code = runBinary(t, "config", "check", path)
	line := regexp.MustCompile(`^` + regexp.QuoteMeta(path) + `:\d+: `)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 1 || len(lines) != 3 {
		t.Fatalf("exit %d, want 1 and three errors:\n%s", code, out)
	}
	for _, l := range lines {
		if !line.MatchString(l) {
			t.Errorf("not FILE:LINE: message: %q", l)
		}
	}
	if !strings.Contains(out, ":6: unknown field \"matc\" in routes[1] (did you mean match?)") {
		t.Errorf("%s", out)
	}
}

func TestConfigStoreDSN(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"", "sqlite:gw.db", "sqlite:///var/lib/gw.db", "memory:", "postgres://app@db/app?schema=rs", "redis://cache:6379/0", "rediss://c/1"} {
		if err := checkStoreDSN(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"mysql://u:pw@db", "postgres:host=db password=pw", "redis:cache", "memory:x", "nonsense", "sqlite:gw.db?batch=maybe"} {
		err := checkStoreDSN(bad)
		if err == nil {
			t.Errorf("%q accepted", bad)
		} else if strings.Contains(err.Error(), "pw") {
			t.Errorf("%q: the password leaks: %v", bad, err)
		}
	}
}
