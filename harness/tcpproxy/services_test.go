package tcpproxy

import (
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/harness/testenv"
)

// timedOut reports whether err is a timeout of any kind: the context's, a deadline on
// the connection, a client's own read timeout. A client across a Cut must fail with a
// network error that is none of these (the reset), however long a busy machine takes to
// deliver it; one across a link that drops its packets times out.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.As(err, &ne) && ne.Timeout()
}

// hang is the context of a call across a Stall: the call must last all of it.
const hang = time.Second

// TestPostgres drives a real pgx connection to the real PostgreSQL through the proxy.
func TestPostgres(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, u.Host)
	u.Host = p.Addr()
	dsn := u.String()
	connect := func(ctx context.Context) (*pgx.Conn, error) {
		c, err := pgx.Connect(ctx, dsn)
		if err == nil {
			t.Cleanup(func() { _ = c.Close(context.Background()) })
		}
		return c, err
	}
	query := func(ctx context.Context, c *pgx.Conn) error {
		var one int
		return c.QueryRow(ctx, "SELECT 1").Scan(&one)
	}
	ctx10 := func() context.Context {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		t.Cleanup(cancel)
		return ctx
	}

	c, err := connect(ctx10())
	if err != nil {
		t.Fatal(err)
	}
	if err := query(ctx10(), c); err != nil {
		t.Fatal(err)
	}

	t.Run("cut fails fast", func(t *testing.T) {
		p.Cut()
		defer p.Restore()
		start := time.Now()
		err := query(ctx10(), c)
		if err == nil || timedOut(err) {
			t.Errorf("query on a live connection across a Cut: %v after %s, want the reset's network error", err, time.Since(start))
		}
		start = time.Now()
		_, err = connect(ctx10())
		if err == nil || timedOut(err) {
			t.Errorf("connect across a Cut: %v after %s, want the refusal's network error", err, time.Since(start))
		}
	})
	t.Run("works after the cut", func(t *testing.T) {
		c, err = connect(ctx10())
		if err != nil {
			t.Fatalf("connect after Restore: %v", err)
		}
		if err := query(ctx10(), c); err != nil {
			t.Fatalf("query after Restore: %v", err)
		}
	})
	t.Run("stall hangs until the context ends", func(t *testing.T) {
		p.Stall()
		defer p.Restore()
		for name, call := range map[string]func(context.Context) error{
			"query on a live connection": func(ctx context.Context) error { return query(ctx, c) },
			"connect":                    func(ctx context.Context) error { _, err := connect(ctx); return err },
		} {
			ctx, cancel := context.WithTimeout(t.Context(), hang)
			start := time.Now()
			err := call(ctx)
			cancel()
			if el := time.Since(start); err == nil || el < hang-50*time.Millisecond {
				t.Errorf("%s across a Stall: %v after %s, want it to hang for the context's %s", name, err, el, hang)
			}
		}
	})
	t.Run("works after the stall", func(t *testing.T) {
		c, err := connect(ctx10())
		if err != nil {
			t.Fatalf("connect after Restore: %v", err)
		}
		if err := query(ctx10(), c); err != nil {
			t.Fatalf("query after Restore: %v", err)
		}
	})
	if s := p.Stats(); s.Cuts != 1 || s.Stalls != 1 || s.Reset == 0 || s.Refused == 0 || s.Stalled == 0 {
		t.Errorf("stats: %+v", s)
	}
}

// TestRedis drives a real go-redis client to the real Redis through the proxy.
func TestRedis(t *testing.T) {
	t.Parallel()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, opt.Addr)
	opt.Addr = p.Addr()
	// Context deadlines bound the calls (go-redis otherwise bounds each read by its
	// ReadTimeout, 3s by default, whatever the context says).
	opt.ContextTimeoutEnabled = true
	rc := redis.NewClient(opt)
	t.Cleanup(func() { _ = rc.Close() })
	ping := func(d time.Duration) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		defer cancel()
		start := time.Now()
		err := rc.Ping(ctx).Err()
		return time.Since(start), err
	}

	if _, err := ping(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	p.Cut()
	// The pooled connection is reset, and go-redis's own retries (3 by default) dial
	// again and are reset at once: still a network error, no timeout.
	if el, err := ping(10 * time.Second); err == nil || timedOut(err) {
		t.Errorf("PING across a Cut: %v after %s, want the reset's network error", err, el)
	}
	p.Restore()
	if _, err := ping(10 * time.Second); err != nil {
		t.Fatalf("PING after the Cut's Restore: %v", err)
	}

	p.Stall()
	if el, err := ping(hang); err == nil || el < hang-50*time.Millisecond {
		t.Errorf("PING across a Stall: %v after %s, want it to hang for the context's %s", err, el, hang)
	}
	p.Restore()
	if _, err := ping(10 * time.Second); err != nil {
		t.Fatalf("PING after the Stall's Restore: %v", err)
	}
	if s := p.Stats(); s.Cuts != 1 || s.Stalls != 1 || s.Reset == 0 || s.Refused == 0 {
		t.Errorf("stats: %+v", s)
	}
}
