package configfile_test

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/retrysafe/retrysafe/gateway/configfile"
)

// FuzzParse: no input makes Parse panic, and a file it accepts is a gateway.Config that
// Resolve accepts, with a table that can be written.
func FuzzParse(f *testing.F) {
	example, err := os.ReadFile(filepath.Join("..", "..", "examples", "gateway.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		string(example),
		"",
		"upstreams: {api: 'http://a:1'}\n",
		"defaults: {upstream: 'http://a', mode: off}\nroutes: [{match: GET /r}, {match: /}]\n",
		"upstreams: {a: 'http://a', b: 'http://b'}\nroutes:\n  - {match: POST /x, upstream: a, key: {pointer: /id}, scope: none}\n  - {match: POST /y/{z}, upstream: b, fingerprint: {ignore: [/t]}}\n",
		"upstreams: {api: 'http://a'}\nroutes:\n  - match: POST /a/{x}\n  - match: POST /{y}/b\n",
		"store: ${S}\nupstreams: {api: '${U}'}\ndefaults: {ttl: 1s, lease: 2s, scope: {cookie: c}}\n",
		"- a\n- b\n",
		"a: &x [1]\nb: *x\n",
		"upstreams: {api: 'http://a'}\nmax_body_memory: 1KiB\nmax_waiters: 3\nshutdown_timeout: 1s\nlog: {format: json, level: debug}\n",
	} {
		f.Add([]byte(seed))
	}
	lookup := func(name string) (string, bool) {
		switch name {
		case "U":
			return "http://u:1", true
		case "S":
			return "memory:", true
		}
		return "", false
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := configfile.Parse("fuzz.yaml", data, configfile.Options{LookupEnv: lookup})
		if err != nil {
			return
		}
		if _, err := file.Gateway.Resolve(); err != nil {
			t.Fatalf("Parse accepted a Config that Resolve refuses: %v\n%s", err, data)
		}
		if err := file.WriteTable(io.Discard); err != nil {
			t.Fatalf("WriteTable: %v\n%s", err, data)
		}
	})
}
