package storedsn

import (
	"os"
	"regexp"
	"testing"
	"time"
)

// TestParamsAreTheParsers: every query parameter the parser reads by name is listed by
// Params (so the generated reference cannot miss one), and every parameter Params lists
// is accepted with its example value by the parser of its store.
func TestParamsAreTheParsers(t *testing.T) {
	t.Parallel()
	listed := map[string]bool{}
	for _, p := range Params() {
		if p.Value == "" || p.Default == "" || p.Doc == "" || p.Example == "" {
			t.Errorf("Params: %s %s lacks its value, default, documentation or example: %+v", p.Kind, p.Name, p)
		}
		if listed[p.Kind+" "+p.Name] {
			t.Errorf("Params lists %s %s twice", p.Kind, p.Name)
		}
		listed[p.Kind+" "+p.Name] = true
		listed[p.Name] = true
	}

	// The names the parser reads: q.Get("…"), q.Has("…"), q.Del("…"), q.Set("…"), and
	// the SQLite parameter compared as k != "…".
	src, err := os.ReadFile("storedsn.go")
	if err != nil {
		t.Fatal(err)
	}
	read := regexp.MustCompile(`\bq\.(?:Get|Has|Del|Set)\("([a-z_]+)"|\bk != "([a-z_]+)"`).FindAllStringSubmatch(string(src), -1)
	if len(read) < 5 {
		t.Fatalf("found %d parameters read in storedsn.go: has the parser changed shape? %q", len(read), read)
	}
	for _, m := range read {
		name := m[1] + m[2]
		if !listed[name] {
			t.Errorf("storedsn.go reads the parameter %q, which Params does not list", name)
		}
	}

	base := map[string]string{
		KindSQLite:   "sqlite:" + t.TempDir() + "/x.db?",
		KindPostgres: "postgres://u@h1:5432,h2:5432/db?",
		KindRedis:    "redis://127.0.0.1:6379/0?",
	}
	for _, p := range Params() {
		dsn := base[p.Kind] + p.Name + "=" + p.Example
		if p.Name == "wait_timeout" || p.Name == "read_timeout" {
			dsn += "&wait=1"
		}
		sp, err := parse(dsn)
		if err != nil {
			t.Errorf("%s %s: the example %q is refused: %v", p.Kind, p.Name, dsn, err)
			continue
		}
		if sp.kind != p.Kind {
			t.Errorf("%q parsed as %s, want %s", dsn, sp.kind, p.Kind)
		}
		// Those this package consumes have their effect.
		switch p.Kind + " " + p.Name {
		case "sqlite batch", "postgres batch":
			if sp.batch {
				t.Errorf("%q: batching still on", dsn)
			}
		case "sqlite gather":
			if sp.gather >= 0 {
				t.Errorf("%q: gather %v, want none (negative)", dsn, sp.gather)
			}
		case "postgres gather":
			if sp.gather != time.Millisecond {
				t.Errorf("%q: gather %v, want 1ms", dsn, sp.gather)
			}
			if _, ok := sp.pg.ConnConfig.RuntimeParams["gather"]; ok {
				t.Errorf("%q: gather would reach the server as a run-time parameter", dsn)
			}
		case "postgres schema":
			if sp.schema != p.Example {
				t.Errorf("%q: schema %q", dsn, sp.schema)
			}
		case "redis prefix":
			if sp.prefix != p.Example {
				t.Errorf("%q: prefix %q", dsn, sp.prefix)
			}
		case "redis wait":
			if sp.wait != 1 {
				t.Errorf("%q: wait %d", dsn, sp.wait)
			}
		case "redis wait_timeout":
			if sp.waitTimeout.String() != p.Example {
				t.Errorf("%q: wait_timeout %s", dsn, sp.waitTimeout)
			}
		case "redis master_name":
			if sp.failover == nil {
				t.Errorf("%q: not a Sentinel client", dsn)
			}
		case "redis addr":
			if sp.cluster == nil {
				t.Errorf("%q: not a Cluster client", dsn)
			}
		}
	}
}
