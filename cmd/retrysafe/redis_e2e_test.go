package main

// End-to-end tests of the gateway on Redis setups that can lose records — an evicting
// maxmemory-policy, a Sentinel failover, replication that falls behind — each on
// disposable servers of its own (harness/redisha), never the shared Redis.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/redisha"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
)

// get returns the status and body of GET url.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestE2ERedisEvictingRefused: a Redis whose maxmemory-policy may evict records —
// allkeys-lru, or volatile-lru, which evicts every record since each has a TTL — is
// refused at start: exit status 2 and one line naming the policy, noeviction and the
// flag. --allow-evicting-store (or its variable) starts the gateway with a warning.
func TestE2ERedisEvictingRefused(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"allkeys-lru", "volatile-lru"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			g := redisha.Start(t, redisha.Options{Replicas: -1, NoSentinel: true,
				Args: []string{"--maxmemory", "4mb", "--maxmemory-policy", policy}})
			dsn := g.Master().URL()
			up := newUpstream(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary, "gateway", "--admin", "off", "--listen", "127.0.0.1:0",
				"--store", dsn, "--upstream", up.URL)
			cmd.Env = env()
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			_ = cmd.Run()
			msg := stderr.String()
			if code := cmd.ProcessState.ExitCode(); code != 2 {
				t.Errorf("exit status %d, want 2; stderr %q", code, msg)
			}
			if strings.Count(msg, "\n") != 1 || !strings.Contains(msg, "maxmemory-policy is "+policy) ||
				!strings.Contains(msg, "noeviction") || !strings.Contains(msg, "--allow-evicting-store") {
				t.Errorf("stderr is not one line naming %s, noeviction and the flag: %q", policy, msg)
			}

			for _, how := range []struct {
				env  []string
				args []string
			}{{nil, []string{"--allow-evicting-store"}}, {[]string{"RETRYSAFE_ALLOW_EVICTING_STORE=true"}, nil}} {
				gw := startGateway(t, how.env, append([]string{"--store", dsn, "--upstream", up.URL}, how.args...)...)
				if !hasLine(gw.log(), `"level":"WARN"`, policy) {
					t.Errorf("allowed by %v%v: no warning naming %s:\n%s", how.env, how.args, policy, gw.log())
				}
				k := testenv.Name("allowed")
				if r := post(context.Background(), gw.addr, "/pay", k, `{}`); r.status != 201 {
					t.Errorf("a request through the gateway allowed to run: %v", r)
				}
			}
		})
	}
}

// hasLine reports whether a line of log holds every one of parts.
func hasLine(log string, parts ...string) bool {
	for line := range strings.Lines(log) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// TestE2ERedisEvictionAtRunTime: a maxmemory-policy changed to an evicting one while the
// gateway runs turns /readyz 503 (the store's ping checks the policy), is logged once as
// an error however often /readyz asks, and shows in retrysafe_store_unsafe; back to
// noeviction, /readyz is 200 again.
func TestE2ERedisEvictionAtRunTime(t *testing.T) {
	t.Parallel()
	g := redisha.Start(t, redisha.Options{Replicas: -1, NoSentinel: true})
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", g.Master().URL(), "--upstream", up.URL)
	if code, body := get(t, gw.admin+"/readyz"); code != 200 {
		t.Fatalf("/readyz under noeviction: %d %s", code, body)
	}
	ctx := context.Background()
	if err := g.Master().Client().ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if code, body := get(t, gw.admin+"/readyz"); code != 503 || !strings.Contains(body, "allkeys-lru") {
			t.Errorf("/readyz after CONFIG SET maxmemory-policy allkeys-lru: %d %s, want 503 naming the policy", code, body)
		}
	}
	if n := strings.Count(gw.log(), "redisstore: the store is not durable: maxmemory-policy is allkeys-lru"); n != 1 ||
		!hasLine(gw.log(), `"level":"ERROR"`, "redisstore: the store is not durable: maxmemory-policy is allkeys-lru") {
		t.Errorf("the change was logged %d times, want one error line:\n%s", n, gw.log())
	}
	if code, body := get(t, gw.admin+"/metrics"); code != 200 || !strings.Contains(body, `retrysafe_store_unsafe{reason="eviction"} 1`) {
		t.Errorf("/metrics: %d, want retrysafe_store_unsafe{reason=\"eviction\"} 1:\n%s", code, body)
	}
	if err := g.Master().Client().ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, gw.admin+"/readyz"); code != 200 {
		t.Errorf("/readyz back under noeviction: %d %s", code, body)
	}
	if _, body := get(t, gw.admin+"/metrics"); !strings.Contains(body, `retrysafe_store_unsafe{reason="eviction"} 0`) {
		t.Errorf("/metrics back under noeviction lacks retrysafe_store_unsafe{reason=\"eviction\"} 0")
	}
}

// TestE2ERedisSentinelFailover: the gateway takes a Sentinel URL, and follows a failover
// without a restart: once the Sentinel has promoted the replica, requests succeed again,
// and a key completed before the failover (and replicated) replays.
func TestE2ERedisSentinelFailover(t *testing.T) {
	t.Parallel()
	g := redisha.Start(t, redisha.Options{})
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", g.URL(), "--upstream", up.URL)
	ctx := context.Background()
	before := testenv.Name("before")
	first := post(ctx, gw.addr, "/pay", before, `{}`)
	if first.status != 201 {
		t.Fatalf("before the failover: %v", first)
	}
	g.AwaitCaughtUp(ctx)
	g.Failover()
	var r reply
	after := testenv.Name("after")
	waitFor(t, "a request to succeed after the failover", 20*time.Second, func() bool {
		r = post(ctx, gw.addr, "/pay", after, `{}`)
		return r.status != 503
	})
	if r.status != 201 || up.callsFor(after) != 1 {
		t.Errorf("after the failover: %v, %d executions", r, up.callsFor(after))
	}
	if r := post(ctx, gw.addr, "/pay", before, `{}`); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" ||
		r.body != first.body || up.callsFor(before) != 1 {
		t.Errorf("the key completed before the failover: %v, %d executions; want its replay", r, up.callsFor(before))
	}
	if code, body := get(t, gw.admin+"/readyz"); code != 200 {
		t.Errorf("/readyz after the failover: %d %s", code, body)
	}
	select {
	case code := <-gw.done():
		t.Fatalf("the gateway exited (%d)", code)
	default:
	}
}

// TestE2ERedisFailoverStalledReplication: a Sentinel failover to a replica whose
// replication link stalled, with wait=1. While the replica acknowledges nothing, a
// completion is held (its client has the answer) and a new claim is answered 503
// without being forwarded. The master is then lost; the promoted replica lacks both
// writes. Once it has a replica of its own, the held answer is stored on it, the
// completed key replays, and the key refused earlier executes once: no key runs twice.
func TestE2ERedisFailoverStalledReplication(t *testing.T) {
	t.Parallel()
	g := redisha.Start(t, redisha.Options{})
	up := newUpstream(t)
	// wait_timeout stays under the store calls' own bound (5 s), so that a write the
	// replica does not acknowledge fails as that, not as a call cut short.
	gw := startGateway(t, nil, "--store", g.URL("wait", "1", "wait_timeout", "2s"), "--upstream", up.URL, "--lease", "2s")
	ctx := context.Background()
	done, fresh := testenv.Name("done"), testenv.Name("fresh")
	first := make(chan reply, 1)
	go func() {
		// A claim the replica acknowledged later than wait_timeout on a busy machine is
		// refused with 503, which a client retries.
		r := post(ctx, gw.addr, "/held-once", done, `{}`)
		for r.status == 503 {
			time.Sleep(100 * time.Millisecond) // a client's pause before its retry
			r = post(ctx, gw.addr, "/held-once", done, `{}`)
		}
		first <- r
	}()
	await(t, "the request upstream", 10*time.Second, up.arrived(done))

	g.Replicas()[0].Link().Stall()
	up.release(done)
	answer := <-first
	if answer.status != 201 {
		t.Fatalf("the request completed while the link stalled: %v", answer)
	}
	if r := post(ctx, gw.addr, "/pay", fresh, `{}`); r.status != 503 || r.problem() != idempotency.ProblemStoreNotDurable || up.callsFor(fresh) != 0 {
		t.Fatalf("a new key while the replica acknowledges nothing: %v, %d executions; want 503 store-not-durable, not forwarded", r, up.callsFor(fresh))
	}
	// The master has the completion; the replica does not.
	master := g.Master()
	if s := keyState(t, master.URL(), done); s != "done" {
		t.Fatalf("the completed key on the master: %s", s)
	}

	promoted := g.Failover()
	g.AddReplica()
	waitFor(t, "the held answer stored on the promoted master", 20*time.Second, func() bool {
		return keyState(t, promoted.URL(), done) == "done"
	})
	if r := post(ctx, gw.addr, "/held-once", done, `{}`); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" ||
		r.body != answer.body || up.callsFor(done) != 1 {
		t.Errorf("the completed key after the failover: %v, %d executions; want the replay of %q", r, up.callsFor(done), answer.body)
	}
	var r reply
	waitFor(t, "the refused key to be served", 20*time.Second, func() bool {
		r = post(ctx, gw.addr, "/pay", fresh, `{}`)
		return r.status != 503 && r.status != 409
	})
	if r.status != 201 || up.callsFor(fresh) != 1 {
		t.Errorf("the refused key after the failover: %v, %d executions; want one", r, up.callsFor(fresh))
	}
}

// TestE2ERedisEvictedRecordLogged: on an evicting Redis the operator allowed, a record
// evicted while its request runs is logged as a record that vanished, not as a key
// another request took over.
func TestE2ERedisEvictedRecordLogged(t *testing.T) {
	t.Parallel()
	g := redisha.Start(t, redisha.Options{Replicas: -1, NoSentinel: true,
		Args: []string{"--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"}})
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", g.Master().URL(), "--upstream", up.URL, "--allow-evicting-store")
	ctx := context.Background()
	k := testenv.Name("evicted")
	first := make(chan reply, 1)
	go func() { first <- post(ctx, gw.addr, "/held-once", k, `{}`) }()
	await(t, "the request upstream", 10*time.Second, up.arrived(k))
	admin := g.Master().Client()
	value := strings.Repeat("x", 64<<10)
	// The record is the one key whose name ends in the request's key (see redisstore's
	// key layout).
	exists := func() bool {
		keys, err := admin.Keys(ctx, "*:"+k+"}").Result()
		if err != nil {
			t.Fatal(err)
		}
		return len(keys) > 0
	}
	if !exists() {
		t.Fatal("no record for the key in flight")
	}
	for i := 0; exists(); i++ {
		if i == 1000 { // 64 MB written into 4 MB
			t.Fatal("the record was never evicted")
		}
		for j := range 16 {
			if err := admin.Set(ctx, fmt.Sprint("fill:", i, ":", j), value, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	up.release(k)
	if r := <-first; r.status != 201 {
		t.Fatalf("the request whose record was evicted: %v", r)
	}
	gw.awaitLog("the owner's completion refused", 10*time.Second, func(line string) bool {
		return strings.Contains(line, "response not stored") && strings.Contains(line, k)
	})
	if !hasLine(gw.log(), "record vanished", k) || hasLine(gw.log(), "taken over", k) {
		t.Errorf("the eviction is not logged as a record that vanished:\n%s", gw.log())
	}
}
