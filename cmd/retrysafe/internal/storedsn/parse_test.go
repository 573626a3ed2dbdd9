package storedsn

import (
	"errors"
	"strings"
	"testing"
	"time"
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

// The pool's size and idle time default to what leaves a small server's slots to its
// other clients, and the URL's pool_* parameters override them; several hosts connect to
// the one that accepts writes unless told otherwise.
func TestParsePostgresPool(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		dsn             string
		maxConns        int32
		minConns        int32
		idle, health    time.Duration
		readWrite, fail bool
	}{
		{dsn: "postgres://u@db/app", maxConns: DefaultPoolMaxConns, idle: DefaultPoolMaxConnIdleTime, health: DefaultPoolHealthCheckPeriod},
		{dsn: "postgres://u@db/app?pool_max_conns=20&pool_min_conns=2&pool_max_conn_idle_time=1m&pool_health_check_period=5s",
			maxConns: 20, minConns: 2, idle: time.Minute, health: 5 * time.Second},
		{dsn: "postgres://u@db/app?pool_min_conns=5", fail: true}, // more than the default max
		{dsn: "postgres://u@h1:5432,h2:5433/app", maxConns: DefaultPoolMaxConns, idle: DefaultPoolMaxConnIdleTime,
			health: DefaultPoolHealthCheckPeriod, readWrite: true},
		{dsn: "postgres://u@h1:5432,h2:5433/app?target_session_attrs=any", maxConns: DefaultPoolMaxConns,
			idle: DefaultPoolMaxConnIdleTime, health: DefaultPoolHealthCheckPeriod},
	} {
		sp, err := parse(tc.dsn)
		if tc.fail {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s: %v, want ErrInvalid", tc.dsn, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.dsn, err)
		}
		c := sp.pg
		if c.MaxConns != tc.maxConns || c.MinConns != tc.minConns || c.MaxConnIdleTime != tc.idle || c.HealthCheckPeriod != tc.health {
			t.Errorf("%s: max %d min %d idle %v health %v, want %d %d %v %v", tc.dsn, c.MaxConns, c.MinConns,
				c.MaxConnIdleTime, c.HealthCheckPeriod, tc.maxConns, tc.minConns, tc.idle, tc.health)
		}
		if rw := strings.Contains(sp.name, "target_session_attrs=read-write"); rw != tc.readWrite || (c.ConnConfig.ValidateConnect != nil) != tc.readWrite {
			t.Errorf("%s: name %s, validated %v; want read-write %v", tc.dsn, sp.name, c.ConnConfig.ValidateConnect != nil, tc.readWrite)
		}
		if c.ConnConfig.OnNotice == nil || c.AfterConnect == nil {
			t.Errorf("%s: the pool is not configured for pgstore (pgstore.ConfigurePool)", tc.dsn)
		}
	}
}
