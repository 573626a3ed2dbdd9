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
