package storedsn

import (
	"errors"
	"strings"
	"testing"
)

// What PostgreSQL's driver is given has no fragment: its own URL parser does not read one
// as such, and a "#?batch=false" would reach the server as a run-time parameter.
func TestParsePostgresFragment(t *testing.T) {
	t.Parallel()
	sp, err := parse("postgres://u:pw@db/app?sslmode=disable#?batch=false&schema=x&password=hunter2")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"batch", "schema", "password"} {
		if v, ok := sp.pg.ConnConfig.RuntimeParams[k]; ok {
			t.Errorf("run-time parameter %s=%q", k, v)
		}
	}
	if strings.Contains(sp.name, "#") || strings.Contains(sp.name, "hunter2") {
		t.Errorf("name %q", sp.name)
	}
}

// An invalid SQLite DSN gets the same error every time, whatever the order the query
// map yields its parameters in.
func TestParseSQLiteErrorIsStable(t *testing.T) {
	t.Parallel()
	const dsn = "sqlite:x.db?zz=1&batch=maybe&aa=2"
	_, first := parse(dsn)
	if !errors.Is(first, ErrInvalid) {
		t.Fatalf("%v, want ErrInvalid", first)
	}
	for range 50 {
		if _, err := parse(dsn); err.Error() != first.Error() {
			t.Fatalf("%q, then %q", first, err)
		}
	}
}
