// Package testenv finds the real services integration tests run against.
//
// Each service is named by an environment variable (RETRYSAFE_POSTGRES_URL,
// RETRYSAFE_REDIS_URL, RETRYSAFE_AMQP_URL, RETRYSAFE_NATS_URL). Unset, the local default
// address is tried. When nothing answers the test is skipped with a message naming the
// variable, unless RETRYSAFE_REQUIRE_SERVICES=1 (CI), in which case it fails.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults used when the variables are unset.
const (
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultNATSURL     = "nats://127.0.0.1:4222"
)

// PostgresURL returns the PostgreSQL URL to test against, or skips/fails t.
func PostgresURL(t testing.TB) string {
	return service(t, "RETRYSAFE_POSTGRES_URL", DefaultPostgresURL, "5432")
}

// RedisURL returns the Redis URL to test against, or skips/fails t.
func RedisURL(t testing.TB) string {
	return service(t, "RETRYSAFE_REDIS_URL", DefaultRedisURL, "6379")
}

// AMQPURL returns the RabbitMQ URL to test against, or skips/fails t.
func AMQPURL(t testing.TB) string {
	return service(t, "RETRYSAFE_AMQP_URL", DefaultAMQPURL, "5672")
}

// NATSURL returns the NATS URL to test against, or skips/fails t.
func NATSURL(t testing.TB) string {
	return service(t, "RETRYSAFE_NATS_URL", DefaultNATSURL, "4222")
}

// Required reports whether RETRYSAFE_REQUIRE_SERVICES asks missing services to fail.
func Required() bool {
	v := os.Getenv("RETRYSAFE_REQUIRE_SERVICES")
	return v == "1" || strings.EqualFold(v, "true")
}

func service(t testing.TB, env, def, defPort string) string {
	t.Helper()
	raw := os.Getenv(env)
	if raw == "" {
		raw = def
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s=%q is not a URL: %v", env, raw, err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), defPort)
	}
	conn, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		msg := "no service at " + host + " (" + err.Error() + "); set " + env + " to test against one"
		if Required() {
			t.Fatal(msg + " [RETRYSAFE_REQUIRE_SERVICES=1]")
		}
		t.Skip(msg)
	}
	_ = conn.Close()
	return raw
}

// Name returns a unique lowercase identifier with the given prefix, usable as a schema
// name, key prefix, queue or stream name, so tests sharing a service never collide.
func Name(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// DeadAddr returns a loopback address on which nothing listens (a port that was free a
// moment ago, as FreePort chooses it), for tests of an unreachable backend.
func DeadAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}

// FreePort returns a loopback TCP port on which nothing listens, for a server a test
// starts and may restart on the same port. It is chosen below the kernel's ephemeral
// range (net.ipv4.ip_local_port_range), from which every outgoing connection takes its
// local port: a port of that range, free when checked, can be taken by a connection
// before the server binds it or while the server is down for a restart, which a busy
// machine does often.
func FreePort(t testing.TB) int {
	t.Helper()
	low := ephemeralLow()
	const span = 12000
	if low > span+1024 {
		for range 200 {
			port := low - 1 - mrand.IntN(span)
			if !reservePort(port) {
				continue
			}
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				continue
			}
			_ = l.Close()
			return port
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// portHold is how long a port FreePort returned stays reserved for its test.
const portHold = 15 * time.Minute

// reservePort reserves port across the test processes of the machine (go test runs
// packages in parallel, each choosing ports at random from the same range): a file
// named by the port in a shared directory, created exclusively. A reservation older
// than portHold has lapsed and is taken over. Without the directory, nothing is
// reserved and every port may be tried.
func reservePort(port int) bool {
	dir := filepath.Join(os.TempDir(), "retrysafe-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true
	}
	name := filepath.Join(dir, strconv.Itoa(port))
	f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666)
	if err == nil {
		_ = f.Close()
		return true
	}
	if fi, serr := os.Stat(name); serr == nil && time.Since(fi.ModTime()) > portHold {
		now := time.Now()
		return os.Chtimes(name, now, now) == nil
	}
	return false
}

// ephemeralLow returns the first port of the kernel's ephemeral range (Linux's
// default, 32768, where it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return low
}

// PostgresPool returns a connection pool on the test database, of at most maxConns
// connections (0: pgx's default), closed when t ends.
func PostgresPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Schema returns a fresh PostgreSQL schema name with the given prefix, so tests sharing
// the database never collide. The schema is not created; whatever creates it (a store's
// Migrate, the test's DDL, a process given the name), it is dropped with everything in it
// when t ends, on a connection of its own. Cleanups run last-registered first, so call
// Schema before making the pools and processes that use the schema: they are closed
// before it is dropped.
func Schema(t testing.TB, prefix string) string {
	t.Helper()
	url := PostgresURL(t)
	schema := Name(prefix)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return schema
}

// Eventually calls cond until it returns true, and fails t with "timed out after
// <timeout> waiting for <format, args>" when timeout passes first. It is how a test
// waits for a state it cannot be told about (a broker's queue count, a database row, a
// component's counter): the condition is checked again after 1ms, then after waits
// doubling up to 20ms, so a condition that holds soon is seen soon and a long wait does
// not flood the service. The message is formatted only on failure, so an argument that
// is a pointer to a struct, or a fmt.Stringer, reports the state at that moment.
//
// It calls t.Fatalf: call it from the test's goroutine.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for !cond() {
		if !time.Now().Before(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, fmt.Sprintf(format, args...))
		}
		timer := time.NewTimer(min(wait, time.Until(deadline)))
		<-timer.C
		wait = min(2*wait, 20*time.Millisecond)
	}
}
