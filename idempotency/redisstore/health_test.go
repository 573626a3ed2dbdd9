package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/harness/redisha"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
)

// logBuffer is a log the test reads: what a store logs through slog.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), substr)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// storeAt returns a store on the Redis at addr (its own client, closed when t ends)
// configured by cfg, whose Client and Logger it sets, and the log it writes.
func storeAt(t *testing.T, addr string, cfg Config) (*Store, *logBuffer) {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = client.Close() })
	return storeWith(t, client, cfg)
}

func storeWith(t *testing.T, client redis.UniversalClient, cfg Config) (*Store, *logBuffer) {
	t.Helper()
	log := &logBuffer{}
	cfg.Client, cfg.Logger = client, slog.New(slog.NewTextHandler(log, nil))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, log
}

func claimReq(key, id string) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Scope: "sc", Key: key, Fingerprint: "fp", ID: id, Lease: time.Minute, TTL: time.Hour}
}

func completion(key string, token int64) idempotency.Completion {
	return idempotency.Completion{Scope: "sc", Key: key, Token: token, TTL: time.Hour,
		Response: idempotency.Response{Status: 201, Body: []byte("done")}}
}

// replyDropper is a TCP proxy to a Redis that, once armed, swallows the next reply the
// server sends and closes that connection: a request that reached Redis and ran, whose
// answer was lost.
type replyDropper struct {
	ln    net.Listener
	armed atomic.Bool
	conns atomic.Int64
}

func newReplyDropper(t *testing.T, target string) *replyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &replyDropper{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d.conns.Add(1)
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			stop := func() { _ = c.Close(); _ = s.Close() }
			t.Cleanup(stop)
			wg.Go(func() {
				defer stop()
				buf := make([]byte, 32<<10)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := s.Write(buf[:n]); err != nil {
						return
					}
				}
			})
			wg.Go(func() {
				defer stop()
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					if err != nil {
						return
					}
					if d.armed.CompareAndSwap(true, false) {
						return // the reply is lost with the connection
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			})
		}
	})
	return d
}

// TestClaimSentAgainByTheClient: go-redis sends a command again on a new connection when
// the one it was sent on breaks before the answer. A claim that ran in Redis and lost its
// answer so comes back granted with its own token, not as a request in flight (another
// claim's record).
func TestClaimSentAgainByTheClient(t *testing.T) {
	t.Parallel()
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(opts)
	t.Cleanup(func() { _ = admin.Close() })
	d := newReplyDropper(t, opts.Addr)
	via := *opts
	via.Addr = d.ln.Addr().String()
	client := redis.NewClient(&via) // go-redis's default: up to 3 retries
	t.Cleanup(func() { _ = client.Close() })
	s := storeOn(t, client, admin, nil)
	ctx := context.Background()
	if res, err := s.Claim(ctx, claimReq("warm", "warm-id")); err != nil || !res.Claimed { // the script loaded
		t.Fatalf("warm-up claim = %+v, %v", res, err)
	}
	before := d.conns.Load()
	d.armed.Store(true)
	res, err := s.Claim(ctx, claimReq("k", "claim-1"))
	if d.armed.Load() || d.conns.Load() == before {
		t.Fatalf("the claim's answer was not lost and sent again (armed %v, connections %d → %d)", d.armed.Load(), before, d.conns.Load())
	}
	rec, gerr := s.Get(ctx, "sc", "k")
	if gerr != nil {
		t.Fatal(gerr)
	}
	if err != nil || !res.Claimed || res.Token != rec.Token {
		t.Fatalf("the claim sent again by the client = %+v (existing %+v), %v; want granted with the record's token %d",
			res, res.Existing, err, rec.Token)
	}
	if err := s.Complete(ctx, completion("k", res.Token)); err != nil {
		t.Fatalf("completing with the token: %v", err)
	}
}

// replicated starts a master and one replica (no Sentinel) and returns them with a store
// on the master that waits for the replica (Wait 1, a short WaitTimeout).
func replicated(t *testing.T) (*redisha.Group, *Store, *logBuffer) {
	t.Helper()
	g := redisha.Start(t, redisha.Options{NoSentinel: true})
	s, log := storeAt(t, g.Master().Addr, Config{Wait: 1, WaitTimeout: 200 * time.Millisecond})
	return g, s, log
}

// acked runs the write f until the replicas acknowledge it, as the middleware does
// with a write whose outcome is unknown: on a busy machine a replica up and
// replicating may still answer after the short WaitTimeout these tests use to see a
// stalled one fail fast, and every write here is safe to send again (a claim by its ID,
// a completion under its token, a renewal, a ping). The bound is an outer one: a
// replica that is up acknowledges long before it.
func acked(t *testing.T, what string, f func() error) {
	t.Helper()
	var err error
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
		if err = f(); !errors.Is(err, idempotency.ErrNotDurable) {
			break
		}
	}
	if err != nil {
		t.Fatalf("%s with the replica up: %v", what, err)
	}
}

// ackedClaim claims r with acked.
func ackedClaim(t *testing.T, s *Store, r idempotency.ClaimRequest) idempotency.ClaimResult {
	t.Helper()
	var res idempotency.ClaimResult
	acked(t, "claim "+r.Key, func() (err error) {
		res, err = s.Claim(context.Background(), r)
		return err
	})
	if !res.Claimed {
		t.Fatalf("claim %s with the replica up = %+v", r.Key, res)
	}
	return res
}

func wantNotDurable(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, idempotency.ErrNotDurable) || errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("%s with the replication link stalled: err = %v, want ErrNotDurable", what, err)
	}
}

// TestWaitForReplicas: with Wait, a claim, a renewal and a completion the replica did
// not acknowledge are errors wrapping ErrNotDurable — though the master has them — and
// Ping says so too, until the replica acknowledges again. A completion sent again under
// its token, or a claim sent again with its ID, on a connection that did not write the
// first, is confirmed only once the replica has the first. (Each writes again, because
// a WAIT covers the writes of its own connection; a Redis that counts the server's
// offset after the connection's last command, as 7.0 does, covers them without it.)
func TestWaitForReplicas(t *testing.T) {
	t.Parallel()
	g, s, log := replicated(t)
	master := g.Master()
	link := g.Replicas()[0].Link()
	// A second store on its own connections: nothing it sends follows a write of s.
	other, _ := storeAt(t, master.Addr, Config{Prefix: s.prefix, Wait: 1, WaitTimeout: 200 * time.Millisecond})
	ctx := context.Background()

	done := ackedClaim(t, s, claimReq("done", "id-done"))
	live := ackedClaim(t, s, claimReq("live", "id-live"))
	acked(t, "Ping", func() error { return s.Ping(ctx) })

	// A write acknowledged late above may have logged the replicas short already.
	shortBefore := log.count("replicas do not acknowledge writes")
	link.Stall()
	_, err := s.Claim(ctx, claimReq("new", "id-new"))
	wantNotDurable(t, "Claim", err)
	wantNotDurable(t, "Extend", s.Extend(ctx, "sc", "live", live.Token, time.Minute))
	wantNotDurable(t, "Complete", s.Complete(ctx, completion("done", done.Token)))
	wantNotDurable(t, "Ping", s.Ping(ctx))
	if _, replicas := s.Unsafe(); !replicas {
		t.Error("Unsafe does not report the replicas short")
	}
	// The master has the writes: the claim is granted again with its ID, the completion
	// is found done under its token — each written again, and still not acknowledged,
	// on connections that never wrote the first.
	if rec, err := s.Get(ctx, "sc", "done"); err != nil || rec.State != idempotency.StateDone {
		t.Fatalf("the completion on the master: %+v, %v", rec, err)
	}
	_, err = other.Claim(ctx, claimReq("new", "id-new"))
	wantNotDurable(t, "the claim sent again on another connection", err)
	wantNotDurable(t, "the completion sent again on another connection", other.Complete(ctx, completion("done", done.Token)))
	// What waits for no replica answers as always.
	if res, err := other.Claim(ctx, claimReq("new", "someone-else")); err != nil || res.Claimed || res.Existing == nil {
		t.Errorf("a claim lost to the record in flight = %+v, %v; want the record", res, err)
	}
	if err := s.Abandon(ctx, "sc", "live", live.Token); err != nil {
		t.Errorf("Abandon: %v", err)
	}
	if n := log.count("replicas do not acknowledge writes") - shortBefore; n != 1 {
		t.Errorf("the store logged the replicas short %d times, want once:\n%s", n, log)
	}

	link.Restore()
	acked(t, "Ping once the link is back", func() error { return other.Ping(ctx) })
	acked(t, "the completion sent again once the link is back", func() error { return other.Complete(ctx, completion("done", done.Token)) })
	res := ackedClaim(t, other, claimReq("new", "id-new"))
	if _, replicas := other.Unsafe(); replicas {
		t.Error("Unsafe still reports the replicas short")
	}
	replica, _ := storeAt(t, g.Replicas()[0].Addr, Config{Prefix: s.prefix, Eviction: EvictionIgnore})
	if rec, err := replica.Get(ctx, "sc", "done"); err != nil || rec.State != idempotency.StateDone || rec.Token != done.Token {
		t.Errorf("the completion on the replica: %+v, %v", rec, err)
	}
	if rec, err := replica.Get(ctx, "sc", "new"); err != nil || rec.Token != res.Token {
		t.Errorf("the claim on the replica: %+v, %v", rec, err)
	}
}

// TestWaitLoadsTheScript: the pipeline of a script and WAIT loads the script when Redis
// does not have it (NOSCRIPT: restarted, failed over, SCRIPT FLUSH).
func TestWaitLoadsTheScript(t *testing.T) {
	t.Parallel()
	g, s, _ := replicated(t)
	ctx := context.Background()
	for i := range 2 {
		if err := g.Master().Client().ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		res := ackedClaim(t, s, claimReq(fmt.Sprint("k", i), "id"))
		acked(t, "complete", func() error { return s.Complete(ctx, completion(fmt.Sprint("k", i), res.Token)) })
	}
}

// TestEvictionPolicy: a Redis whose maxmemory-policy may evict records is reported by
// EvictionPolicy, and by Ping unless the configuration allows or ignores it; a policy
// changed at run time is found by the next Ping and logged once; where CONFIG is
// disabled, as on managed Redis services, the policy is read from INFO memory.
func TestEvictionPolicy(t *testing.T) {
	t.Parallel()
	for _, config := range []bool{true, false} {
		t.Run(fmt.Sprintf("CONFIG=%v", config), func(t *testing.T) {
			t.Parallel()
			var args []string
			if !config {
				args = []string{"--rename-command", "CONFIG", ""}
			}
			g := redisha.Start(t, redisha.Options{Replicas: -1, NoSentinel: true,
				Args: append(args, "--maxmemory-policy", "allkeys-lru")})
			ctx := context.Background()
			refuse, log := storeAt(t, g.Master().Addr, Config{})
			allow, allowLog := storeAt(t, g.Master().Addr, Config{Eviction: EvictionAllow})
			ignore, _ := storeAt(t, g.Master().Addr, Config{Eviction: EvictionIgnore})

			var ee *EvictionError
			if err := refuse.EvictionPolicy(ctx); !errors.As(err, &ee) || ee.Policy != "allkeys-lru" || !errors.Is(err, idempotency.ErrNotDurable) {
				t.Fatalf("EvictionPolicy = %v, want an EvictionError for allkeys-lru", err)
			}
			for range 3 {
				if err := refuse.Ping(ctx); !errors.As(err, &ee) || ee.Policy != "allkeys-lru" {
					t.Fatalf("Ping refusing eviction = %v, want an EvictionError", err)
				}
			}
			if err := allow.Ping(ctx); err != nil {
				t.Errorf("Ping allowing eviction = %v", err)
			}
			if err := ignore.Ping(ctx); err != nil {
				t.Errorf("Ping ignoring eviction = %v", err)
			}
			if ev, _ := allow.Unsafe(); !ev {
				t.Error("Unsafe does not report the eviction the configuration allows")
			}
			// EvictionPolicy found it before the first Ping: nothing new to log.
			if log.String() != "" {
				t.Errorf("logged what EvictionPolicy had found:\n%s", log)
			}

			// Changed at run time, the policy is found by the next Ping.
			setPolicy := func(p string) {
				t.Helper()
				if !config {
					t.Skip("CONFIG is disabled: the policy stays")
				}
				if err := g.Master().Client().ConfigSet(ctx, "maxmemory-policy", p).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if !config {
				return
			}
			setPolicy("noeviction")
			if err := refuse.Ping(ctx); err != nil {
				t.Errorf("Ping under noeviction = %v", err)
			}
			if ev, _ := refuse.Unsafe(); ev {
				t.Error("Unsafe reports eviction under noeviction")
			}
			setPolicy("volatile-lru")
			for range 3 {
				if err := refuse.Ping(ctx); !errors.As(err, &ee) || ee.Policy != "volatile-lru" || !errors.Is(err, idempotency.ErrNotDurable) {
					t.Fatalf("Ping after the change to volatile-lru = %v, want an EvictionError", err)
				}
			}
			if err := allow.Ping(ctx); err != nil {
				t.Errorf("Ping allowing eviction = %v", err)
			}
			// One line for each change: the refusing store found noeviction (which it
			// logs as good news), then volatile-lru; the allowing store, which had not
			// checked before its first Ping, allkeys-lru, then volatile-lru.
			if n := log.count("level=ERROR"); n != 1 || log.count("level=WARN") != 0 || !strings.Contains(log.String(), "policy=volatile-lru") {
				t.Errorf("the refusing store logged %d errors, want one for volatile-lru:\n%s", n, log)
			}
			if n := allowLog.count("level=WARN"); n != 2 || allowLog.count("level=ERROR") != 0 {
				t.Errorf("the store allowing eviction logged %d warnings, want two:\n%s", n, allowLog)
			}
		})
	}
}

// TestRecordEvicted: an owner whose record Redis evicted (allkeys-lru, memory full) is
// told that its record is gone, not that another request took the key over.
func TestRecordEvicted(t *testing.T) {
	t.Parallel()
	g := redisha.Start(t, redisha.Options{Replicas: -1, NoSentinel: true,
		Args: []string{"--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"}})
	s, _ := storeAt(t, g.Master().Addr, Config{Eviction: EvictionAllow})
	ctx := context.Background()
	res, err := s.Claim(ctx, claimReq("k", "id"))
	if err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	admin := g.Master().Client()
	value := strings.Repeat("x", 64<<10)
	for i := 0; ; i++ {
		n, err := admin.Exists(ctx, s.recordKey("sc", "k")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if i == 1000 { // 64 MB written into 4 MB
			t.Fatal("the record was never evicted")
		}
		if err := admin.Set(ctx, fmt.Sprint("fill:", i), value, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for what, err := range map[string]error{
		"Extend":   s.Extend(ctx, "sc", "k", res.Token, time.Minute),
		"Complete": s.Complete(ctx, completion("k", res.Token)),
		"Abandon":  s.Abandon(ctx, "sc", "k", res.Token),
		"Release":  s.Release(ctx, "sc", "k", res.Token),
	} {
		if !errors.Is(err, idempotency.ErrRecordGone) {
			t.Errorf("%s of the evicted record: %v, want ErrRecordGone", what, err)
		}
	}
}

// TestSentinel: a store on a Sentinel failover client, waiting for one replica, follows
// a failover: its calls fail while the master is gone, and succeed on the promoted
// replica once that has a replica of its own.
func TestSentinel(t *testing.T) {
	t.Parallel()
	g := redisha.Start(t, redisha.Options{})
	opts, err := redis.ParseFailoverURL(g.URL())
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewFailoverClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	s, _ := storeWith(t, client, Config{Wait: 1, WaitTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	res := ackedClaim(t, s, claimReq("k", "id"))
	g.Failover()
	// The promoted replica has the claim (the replica acknowledged it), but no replica.
	if err := s.Complete(ctx, completion("k", res.Token)); !errors.Is(err, idempotency.ErrNotDurable) {
		t.Fatalf("complete on the promoted replica, which has no replica: %v, want ErrNotDurable", err)
	}
	g.AddReplica()
	acked(t, "complete once the new master has a replica", func() error { return s.Complete(ctx, completion("k", res.Token)) })
	acked(t, "Ping", func() error { return s.Ping(ctx) })
}

// TestConformanceWait runs the suite on a store that waits for a replica (Config.Wait 1):
// the scripts in a pipeline with WAIT keep the contract.
func TestConformanceWait(t *testing.T) {
	g := redisha.Start(t, redisha.Options{NoSentinel: true})
	client := redis.NewClient(&redis.Options{Addr: g.Master().Addr})
	t.Cleanup(func() { _ = client.Close() })
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T, clock func() time.Time) idempotency.Store {
			// The replica is up throughout: the WaitTimeout is only an outer bound.
			s, err := New(Config{Client: client, Prefix: testenv.Name("rs") + ":", Clock: clock, Wait: 1, WaitTimeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}
