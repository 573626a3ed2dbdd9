package storedsn_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/redisha"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/redisstore"
	"github.com/retrysafe/retrysafe/storedsn"
)

// roundTrip claims, completes and reads back one key.
func roundTrip(t *testing.T, s idempotency.Store) {
	t.Helper()
	ctx := context.Background()
	key := testenv.Name("k")
	res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || !res.Claimed {
		t.Fatalf("Claim: %+v %v", res, err)
	}
	if err := s.Complete(ctx, idempotency.Completion{Key: key, Token: res.Token, TTL: time.Hour,
		Response: idempotency.Response{Status: 201}}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec, err := s.Get(ctx, "", key)
	if err != nil || rec.State != idempotency.StateDone {
		t.Fatalf("Get: %+v %v", rec, err)
	}
}

func TestMemory(t *testing.T) {
	t.Parallel()
	o, err := storedsn.Open(context.Background(), "memory:", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.Kind != storedsn.KindMemory || o.Janitor == nil {
		t.Fatalf("%+v", o)
	}
	if err := o.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, o.Store)
}

func TestSQLite(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, dsn := range []string{"sqlite:" + filepath.Join(dir, "a.db"), "sqlite://" + filepath.Join(dir, "b.db"),
		"sqlite:" + filepath.Join(dir, "c.db") + "?batch=false"} {
		o, err := storedsn.Open(context.Background(), dsn, nil)
		if err != nil {
			t.Fatalf("%s: %v", dsn, err)
		}
		if o.Kind != storedsn.KindSQLite || o.Janitor == nil {
			t.Fatalf("%+v", o)
		}
		if err := o.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		roundTrip(t, o.Store)
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
		_ = o.Close() // twice is fine
	}
	for _, f := range []string{"a.db", "b.db", "c.db"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSQLiteDefault: the empty DSN and "sqlite:" are sqlite:retrysafe.db in the
// working directory.
func TestSQLiteDefault(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, dsn := range []string{"", "sqlite:"} {
		o, err := storedsn.Open(context.Background(), dsn, nil)
		if err != nil {
			t.Fatal(err)
		}
		if o.Name != storedsn.Default {
			t.Errorf("%q: Name %q", dsn, o.Name)
		}
		_ = o.Close()
		if _, err := os.Stat("retrysafe.db"); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	base := testenv.PostgresURL(t)
	schema := testenv.Schema(t, "dsn") // before the store: dropped after it is closed
	u, _ := url.Parse(base)
	q := u.Query()
	q.Set("schema", schema)
	u.RawQuery = q.Encode()
	ctx := context.Background()
	o, err := storedsn.Open(ctx, u.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	if o.Kind != storedsn.KindPostgres || o.Janitor == nil || strings.Contains(o.Name, "schema=") {
		t.Fatalf("%+v", o)
	}
	if err := o.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, o.Store)
	// The table is in the schema asked for.
	pool := testenv.PostgresPool(t, 1)
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".retrysafe_idempotency").Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows in %s: %d %v", schema, n, err)
	}
}

func TestRedis(t *testing.T) {
	t.Parallel()
	prefix := testenv.Name("dsn") + ":"
	o, err := storedsn.Open(context.Background(), testenv.RedisURL(t)+"?prefix="+url.QueryEscape(prefix), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.Kind != storedsn.KindRedis || o.Janitor != nil {
		t.Fatalf("%+v", o)
	}
	if err := o.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, o.Store)
	page, err := o.Store.(idempotency.Lister).List(context.Background(), idempotency.ListFilter{})
	if err != nil || len(page.Records) != 1 {
		t.Fatalf("List under the prefix: %d records, %v", len(page.Records), err)
	}
	_ = o.Store.Delete(context.Background(), "", page.Records[0].Key)
}

func TestErrors(t *testing.T) {
	t.Parallel()
	dead := testenv.DeadAddr(t)
	cases := []struct {
		dsn  string
		want error
	}{
		{"mysql://x", storedsn.ErrUnknownScheme},
		{"retrysafe.db", storedsn.ErrUnknownScheme},
		{"memory:foo", storedsn.ErrInvalid},
		{"postgres://u:hunter2@" + dead + "/db?sslmode=disable", storedsn.ErrUnreachable},
		{"postgres://u:hunter2@" + dead + "/db?schema=Bad-Name", storedsn.ErrInvalid},
		{"postgres://u:hunter2@" + dead + "/db?batch=maybe", storedsn.ErrInvalid},
		{"sqlite:" + filepath.Join(t.TempDir(), "x.db") + "?batch=maybe", storedsn.ErrInvalid},
		{"sqlite:" + filepath.Join(t.TempDir(), "x.db") + "?other=1", storedsn.ErrInvalid},
		{"sqlite:" + filepath.Join(t.TempDir(), "x.db") + "?gather=-1ms", storedsn.ErrInvalid},
		{"sqlite:" + filepath.Join(t.TempDir(), "x.db") + "?gather=soon", storedsn.ErrInvalid},
		{"postgres://u:hunter2@" + dead + "/db?gather=-2ms", storedsn.ErrInvalid},
		{"postgres://u:hunter2@" + dead + "/db?gather=2", storedsn.ErrInvalid},
		{"postgres://u:hunter2@" + dead + "/db?sslmode=bogus", storedsn.ErrInvalid},
		{"redis://:hunter2@" + dead + "/0", storedsn.ErrUnreachable},
		{"redis://" + dead + "/0?nope=1", storedsn.ErrInvalid},
		{"redis://" + dead + "/0?prefix=a{b}", storedsn.ErrInvalid},
		{"sqlite:" + filepath.Join(t.TempDir(), "missing-dir", "x.db"), storedsn.ErrUnreachable},
		// Passwords in other places than the user info, or in a DSN that is no URL.
		{"postgres://" + dead + "/db?password=hunter2&sslmode=disable", storedsn.ErrUnreachable},
		{"postgres://" + dead + "/db?sslpassword=hunter2&sslmode=disable", storedsn.ErrUnreachable},
		{"postgres://u:hunter2/more@" + dead + "/db", storedsn.ErrInvalid},
		{"postgres://u:hunter2%zz@" + dead + "/db", storedsn.ErrInvalid},
		{"postgres:host=" + dead + " password=hunter2", storedsn.ErrInvalid},
		{"memory://u:hunter2@x", storedsn.ErrInvalid},
		{"mysql://db/app?password=hunter2", storedsn.ErrUnknownScheme},
		{"mysql:host=db password=hunter2", storedsn.ErrUnknownScheme},
		{"password=hunter2", storedsn.ErrUnknownScheme},
		{"= password=hunter2", storedsn.ErrUnknownScheme},
		{"x=?password=hunter2", storedsn.ErrUnknownScheme},
		{"redis:host password=hunter2", storedsn.ErrInvalid},
		{"sqlite:" + filepath.Join(t.TempDir(), "a\nb.db"), storedsn.ErrInvalid},
		{"sqlite:" + filepath.Join(t.TempDir(), "x.db") + "?\r0", storedsn.ErrInvalid},
	}
	for _, c := range cases {
		start := time.Now()
		o, err := storedsn.Open(context.Background(), c.dsn, nil)
		if err == nil {
			_ = o.Close()
			t.Errorf("%s: opened", c.dsn)
			continue
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.dsn, err, c.want)
		}
		msg := err.Error()
		if strings.Contains(msg, "hunter2") {
			t.Errorf("%s: the password leaks: %s", c.dsn, msg)
		}
		if strings.ContainsAny(msg, "\r\n") {
			t.Errorf("%q: the error is not one line: %q", c.dsn, msg)
		}
		// Bounded by the ping timeout; twice that leaves a loaded machine its slack.
		if time.Since(start) > 2*storedsn.PingTimeout {
			t.Errorf("%s: took %v", c.dsn, time.Since(start))
		}
	}
}

// TestRedisSentinel: a failover URL opens a store on the master the Sentinel names,
// waiting for its replica (wait=1); after a failover the same store works on the
// promoted replica, once that has a replica of its own.
func TestRedisSentinel(t *testing.T) {
	t.Parallel()
	g := redisha.Start(t, redisha.Options{})
	ctx := context.Background()
	o, err := storedsn.OpenWith(ctx, g.URL("wait", "1", "wait_timeout", "1m"), storedsn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	if o.Kind != storedsn.KindRedis || !strings.Contains(o.Name, "master_name="+g.MasterName()) || !strings.Contains(o.Name, "wait=1") {
		t.Fatalf("%+v", o)
	}
	roundTrip(t, o.Store)
	g.Failover()
	g.AddReplica()
	roundTrip(t, o.Store)
}

// TestRedisEviction: a Redis whose maxmemory-policy may evict records is refused, with
// an error naming the policy; allowed, it opens with a warning; ignored (the tools), it
// opens without a word.
func TestRedisEviction(t *testing.T) {
	t.Parallel()
	g := redisha.Start(t, redisha.Options{Replicas: -1, NoSentinel: true, Args: []string{"--maxmemory-policy", "volatile-lru"}})
	ctx := context.Background()
	_, err := storedsn.Open(ctx, g.Master().URL(), nil)
	var ee *redisstore.EvictionError
	if !errors.Is(err, storedsn.ErrEvicting) || !errors.As(err, &ee) || ee.Policy != "volatile-lru" ||
		!strings.Contains(err.Error(), "volatile-lru") || !strings.Contains(err.Error(), "noeviction") {
		t.Fatalf("Open = %v, want ErrEvicting naming volatile-lru and noeviction", err)
	}
	for _, c := range []struct {
		eviction redisstore.Eviction
		warns    int
	}{{redisstore.EvictionAllow, 1}, {redisstore.EvictionIgnore, 0}} {
		var log strings.Builder
		o, err := storedsn.OpenWith(ctx, g.Master().URL(), storedsn.Options{Eviction: c.eviction,
			Logger: slog.New(slog.NewTextHandler(&log, nil))})
		if err != nil {
			t.Fatalf("eviction %d: %v", c.eviction, err)
		}
		roundTrip(t, o.Store)
		_ = o.Close()
		if n := strings.Count(log.String(), "maxmemory_policy=volatile-lru"); n != c.warns || strings.Count(log.String(), "level=WARN msg=\"the store may evict") != c.warns {
			t.Errorf("eviction %d: %d warnings of the policy, want %d:\n%s", c.eviction, n, c.warns, log.String())
		}
		// The rest of what the Redis can lose is the gateway's to report (Inspect).
		if n := strings.Count(log.String(), "level=WARN"); n != c.warns {
			t.Errorf("eviction %d: %d warnings, want only the policy's:\n%s", c.eviction, n, log.String())
		}
	}
}
