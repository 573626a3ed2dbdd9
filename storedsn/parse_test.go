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

// A Redis URL is a Sentinel failover client when it names a master (master_name), its
// addr parameters then naming more Sentinels; a Cluster client when it has addr
// parameters and no master_name; a client of one server otherwise. wait and
// wait_timeout are the store's, kept in the name, and lengthen go-redis's default read
// timeout past the wait.
func TestParseRedis(t *testing.T) {
	t.Parallel()
	sp, err := parse("redis://sentinel-user:hunter2@s1:26379/2?master_name=mymaster&addr=s2:26379&password=hunter3&wait=1&wait_timeout=4s&prefix=p:")
	if err != nil {
		t.Fatal(err)
	}
	f := sp.failover
	if f == nil || sp.cluster != nil || sp.redis != nil {
		t.Fatalf("failover %v, cluster %v, redis %v: want a failover client", f, sp.cluster, sp.redis)
	}
	if f.MasterName != "mymaster" || strings.Join(f.SentinelAddrs, ",") != "s1:26379,s2:26379" || f.DB != 2 ||
		f.SentinelPassword != "hunter2" || f.Password != "hunter3" {
		t.Errorf("failover options %+v", f)
	}
	if sp.wait != 1 || sp.waitTimeout != 4*time.Second || sp.prefix != "p:" || f.ReadTimeout <= sp.waitTimeout {
		t.Errorf("wait %d, wait_timeout %v, prefix %q, read timeout %v", sp.wait, sp.waitTimeout, sp.prefix, f.ReadTimeout)
	}
	if strings.Contains(sp.name, "hunter") || !strings.Contains(sp.name, "wait=1") || !strings.Contains(sp.name, "master_name=mymaster") {
		t.Errorf("name %q", sp.name)
	}

	sp, err = parse("redis://n1:7000?addr=n2:7000&addr=n3:7000")
	if err != nil || sp.cluster == nil || sp.failover != nil || len(sp.cluster.Addrs) != 3 || sp.wait != 0 {
		t.Errorf("cluster URL: %+v, %v", sp, err)
	}
	sp, err = parse("redis://db:6379/0")
	if err != nil || sp.redis == nil || sp.redis.ReadTimeout != 0 || sp.waitTimeout != time.Second {
		t.Errorf("single-server URL: %+v, %v", sp, err)
	}
	for _, bad := range []string{
		"redis://db/0?wait=-1", "redis://db/0?wait=two", "redis://db/0?wait=1&wait_timeout=0s",
		"redis://db/0?wait=1&wait_timeout=soon", "redis://db/0?wait=1&wait_timeout=2s&read_timeout=2s",
		"redis://s1:26379/0?master_name=m&bogus=1",
	} {
		if _, err := parse(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := parse("redis+sentinel://s1:26379/mymaster"); !errors.Is(err, ErrUnknownScheme) || !strings.Contains(err.Error(), "master_name=NAME") {
		t.Errorf("redis+sentinel: %v, want ErrUnknownScheme naming the failover URL", err)
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

// Describe names the kind and the redacted name Open would give, and Check's error for
// what Open refuses, connecting to nothing (the addresses below have no server).
func TestDescribe(t *testing.T) {
	for _, c := range []struct{ dsn, kind, name string }{
		{"sqlite:/data/r.db", KindSQLite, "sqlite:/data/r.db"},
		{"postgres://u:secret@127.0.0.1:1/db", KindPostgres, "postgres://u:xxxxx@127.0.0.1:1/db"},
		{"redis://:secret@127.0.0.1:1/0", KindRedis, "redis://:xxxxx@127.0.0.1:1/0"},
		{"memory:", KindMemory, "memory:"},
	} {
		kind, name, err := Describe(c.dsn)
		if err != nil || kind != c.kind || name != c.name {
			t.Errorf("Describe(%q) = %q, %q, %v; want %q, %q", c.dsn, kind, name, err, c.kind, c.name)
		}
	}
	if _, _, err := Describe("mysql://db"); !errors.Is(err, ErrUnknownScheme) {
		t.Errorf("Describe(mysql://db): %v, want ErrUnknownScheme", err)
	}
}

// TestParseHidesOpaquePassword: a DSN written without "//" (scheme:user:password@host)
// is refused, and its error does not show the password.
func TestParseHidesOpaquePassword(t *testing.T) {
	for _, dsn := range []string{"postgres:u:s3cr3tpw@db", "redis:u:s3cr3tpw@db:6379", "postgresql:s3cr3tpw@db/app"} {
		_, err := parse(dsn)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", dsn, err)
			continue
		}
		if strings.Contains(err.Error(), "s3cr3tpw") {
			t.Errorf("%s: the error shows the password: %v", dsn, err)
		}
	}
}
