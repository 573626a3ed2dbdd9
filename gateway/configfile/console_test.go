package configfile_test

import (
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/gateway/configfile"
)

func TestConfigConsole(t *testing.T) {
	t.Parallel()
	const base = "upstreams:\n  api: http://127.0.0.1:3000\n"
	vars := configfile.Options{LookupEnv: env(map[string]string{"TOK": "s3cret"})}
	for _, c := range []struct {
		src, console, token string
	}{
		{"", "", ""},
		{"console: read-only\n", "read-only", ""},
		{"console: off\nadmin_token: plain\n", "off", "plain"},
		{"admin_token: ${TOK}\n", "", "s3cret"},
	} {
		f := mustParse(t, base+c.src, vars)
		if f.Console != c.console || f.AdminToken != c.token {
			t.Errorf("%q: Console %q AdminToken %q, want %q %q", c.src, f.Console, f.AdminToken, c.console, c.token)
		}
	}
	for src, want := range map[string][]string{
		"console: maybe\n":          {"console", "on, off or read-only"},
		"admin_token: ${MISSING}\n": {"admin_token", "MISSING"},
	} {
		_, err := parse(base+src, configfile.Options{})
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v, want an error with %q", src, err, w)
			}
		}
	}
	// A flag overrides the file's value, as for every other key.
	f := mustParse(t, base+"console: off\n", configfile.Options{Overrides: []configfile.Override{{Key: "console", Value: "read-only", Source: "--console"}}})
	if f.Console != "read-only" {
		t.Errorf("--console read-only over the file's off: %q", f.Console)
	}
}
