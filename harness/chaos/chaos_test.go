//go:build linux

package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/harness/faultproxy"
	"github.com/retrysafe/retrysafe/harness/payclient"
	"github.com/retrysafe/retrysafe/harness/pgcluster"
	"github.com/retrysafe/retrysafe/harness/redisha"
	"github.com/retrysafe/retrysafe/harness/tcpproxy"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
	"github.com/retrysafe/retrysafe/idempotency/redisstore"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
)

// The suite's fixed parameters.
const (
	clients     = 32
	slowClients = 3 // of clients: they read slowly and ask for large answers
	lease       = 2 * time.Second
	// upstreamTimeout is the gateways' --upstream-timeout: low, so that an answer held
	// by the upstream link, a slow answer and a slow reader all outlast it within a run.
	upstreamTimeout = 2500 * time.Millisecond
	attemptTimeout  = time.Second
	patience        = 60 * time.Second // one logical payment's bound; also the drain's
	// slowPatience bounds a slow reader's payment: its first answer read at 8 KiB/s for
	// 5s and then at full speed takes about 6s, and one whose first answer was lost on
	// the upstream link (a lease and the upstream timeout), that met a store partition
	// (up to 6s) and the lease after it in which no replica takes a key over, about 20s;
	// partitions come every 4–8s, so it may meet two, and replicas killed meanwhile:
	// about 32s was seen. Slow readers begin none in the last slowStop of the load, so
	// that they do not stretch the drain.
	slowPatience, slowStop = 45 * time.Second, 20 * time.Second

	// Client ↔ gateway fault rates of each proxy: per connection, then per request.
	rateRefuse, rateBlackHole                    = 0.02, 0.02
	rateReadTimeout, rateReset, rateResponseLost = 0.03, 0.04, 0.04

	// Gateway ↔ upstream fault rates, per request; slow answers are the upstream's own.
	upReadTimeout, upReset, upResponseLost, upResponseReset = 0.004, 0.004, 0.006, 0.006
	upSlowRate                                              = 0.004
	upSlowMin, upSlowMax                                    = upstreamTimeout + 500*time.Millisecond, upstreamTimeout + 1500*time.Millisecond

	// Gateway ↔ store: partitions longer than the lease, and latency spikes.
	partitionGapMin, partitionGapMax = 4 * time.Second, 8 * time.Second
	partitionMin, partitionMax       = 3 * time.Second, 6 * time.Second
	spikeRate                        = 0.5 // per gap
	spikeMin, spikeMax               = 50 * time.Millisecond, 250 * time.Millisecond
	spikeForMin, spikeForMax         = time.Second, 2 * time.Second

	// Large answers: padding asked for by every payment of a slow reader and by a few
	// of the others. Far more than the narrow connections' buffers hold (a slow reader
	// reads 40 KB in its slow 5s), and small enough that, through the race detector on a
	// loaded machine, one moves from the upstream to the gateway well within the
	// upstream timeout.
	padMin, padMax = 300_000, 1_000_000
	padRateFast    = 0.005
)

// slowReading is how the slow readers read: 8 KiB/s for longer than the upstream timeout.
var slowReading = slowRead{For: upstreamTimeout + 2500*time.Millisecond, Chunk: 1 << 10, Every: 125 * time.Millisecond}

// The failovers: each begins with the standby's (replica's) replication link stalled
// for longer than a write waits to be acknowledged — the store call's bound (5s, the
// gateway's default) on PostgreSQL, wait_timeout on Redis — so that writes committed on
// the primary alone come back as not durable, keyed requests get 503 store-not-durable,
// and completions are held; then the primary is lost and the standby promoted.
const (
	// The failover begins at 45–60% of the load (in tenths of it): late enough that a
	// partition of the store link fits before it, with failoverQuiet to spare.
	failoverAtMin, failoverAtSpread = 4.5, 1.5
	pgStallMin, pgStallMax          = storeCallBound + 500*time.Millisecond, storeCallBound + 2500*time.Millisecond
	redisWaitTimeout                = 2 * time.Second
	redisStallMin, redisStallMax    = redisWaitTimeout + time.Second, redisWaitTimeout + 2500*time.Millisecond
	// storeCallBound is the gateway's bound on each store call (idempotency's
	// DefaultStoreTimeout): a commit waiting for a lost synchronous standby is cancelled
	// then, and reported not durable.
	storeCallBound = 5 * time.Second
	// answerHold is how long the upstream holds its answers as a failover begins, the
	// standby's link stalling answerHoldAfter before they leave: the completions of the
	// requests it held are sent during the stall. Shorter than the clients' attempt
	// timeout and the gateways' upstream timeout.
	answerHold, answerHoldAfter = 600 * time.Millisecond, 100 * time.Millisecond
	// failoverQuiet keeps the store link's partitions away from a failover, before and
	// after: it meets gateways that are not recovering from a partition, and the report
	// measures how long the failover alone left the store unwritable.
	failoverQuiet = 5 * time.Second
)

// storeCase is one store the suite runs against.
type storeCase struct {
	name      string
	replicas  int
	load      time.Duration // default load duration
	restartPG bool          // restart the ledger's PostgreSQL once (it holds the store)
	// setup makes the store for a run; ledger is the disposable PostgreSQL of the
	// ledger. It skips t when the store's server is absent.
	setup func(t *testing.T, ledger *pgcluster.Cluster) storeSetup
}

// storeSetup is a store made for one run.
type storeSetup struct {
	dsn   string // the store, reached directly: the checks list it through it
	gwDSN string // the gateways' DSN: through the store link's proxies, if any
	desc  string // for the report
	// noLink says why the store link has no proxies.
	noLink string
	// writeWait is how long a write waits to be acknowledged before the store reports
	// it not durable: no gateway is killed from the failover's stall until then.
	writeWait time.Duration
	// proxies are the store link: every connection of the gateways to the store goes
	// through one of them, and the suite cuts, stalls and slows them together. None:
	// no store link to fault.
	proxies []*tcpproxy.Proxy
	// failover, when set, fails the store over once, mid-load, and says when each step
	// happened; rng draws its timing. It runs on the test's goroutine (it may fail t).
	failover     func(ctx context.Context, rng *rand.Rand) (Failover, error)
	failoverDesc string
}

func storeCases() []storeCase {
	return []storeCase{
		{name: "postgres", replicas: 2, load: 40 * time.Second, restartPG: true,
			setup: func(t *testing.T, ledger *pgcluster.Cluster) storeSetup {
				dsn := ledger.Primary.URL() + "&schema=idem_chaos&pool_max_conns=16"
				p := newStoreProxy(t, ledger.Primary.Addr())
				return storeSetup{dsn: dsn, gwDSN: strings.Replace(dsn, ledger.Primary.Addr(), p.Addr(), 1), proxies: []*tcpproxy.Proxy{p},
					desc: "PostgreSQL, the ledger's disposable server (schema idem_chaos), shared by both replicas through one store proxy"}
			}},
		{name: "sqlite", replicas: 1, load: 25 * time.Second,
			setup: func(t *testing.T, _ *pgcluster.Cluster) storeSetup {
				path := filepath.Join(t.TempDir(), "keys.db")
				return storeSetup{dsn: "sqlite:" + path, gwDSN: "sqlite:" + path, noLink: "the store is a local file",
					desc: "SQLite file " + path + ", kept across the kills (a local file: no store link to fault)"}
			}},
		{name: "redis", replicas: 2, load: 25 * time.Second,
			setup: func(t *testing.T, _ *pgcluster.Cluster) storeSetup {
				base := testenv.RedisURL(t)
				prefix := testenv.Name("chaos") + ":"
				t.Cleanup(func() { deleteRedisPrefix(base, prefix) })
				sep := "?"
				if strings.Contains(base, "?") {
					sep = "&"
				}
				dsn := base + sep + "prefix=" + url.QueryEscape(prefix)
				u, err := url.Parse(dsn)
				if err != nil {
					t.Fatalf("chaos: %v", err)
				}
				p := newStoreProxy(t, u.Host)
				u.Host = p.Addr()
				return storeSetup{dsn: dsn, gwDSN: u.String(), proxies: []*tcpproxy.Proxy{p},
					desc: "the machine's shared Redis, key prefix " + prefix + ", shared by both replicas through one store proxy (Redis itself is not restarted)"}
			}},
		{name: "postgres-failover", replicas: 2, load: 30 * time.Second, setup: postgresFailover},
		{name: "redis-sentinel", replicas: 2, load: 25 * time.Second, setup: redisSentinel},
	}
}

// newStoreProxy starts a proxy of the store link to target, closed at t's cleanup.
func newStoreProxy(t *testing.T, target string) *tcpproxy.Proxy {
	t.Helper()
	p, err := tcpproxy.New(target)
	if err != nil {
		t.Fatalf("chaos: store proxy: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// postgresFailover is the store of the postgres-failover run: a primary and a
// synchronous standby of their own (the ledger stays on its own server, which does not
// fail over), reached by the gateways through a multi-host DSN naming both, each
// through a store proxy of its own (cut, stalled and slowed together, as one link).
// Mid-load the standby's replication link stalls past the store-call bound, the primary
// is stopped as a crash would stop it, and the standby is promoted: the gateways
// follow it (target_session_attrs=read-write).
func postgresFailover(t *testing.T, _ *pgcluster.Cluster) storeSetup {
	c := pgcluster.Start(t, pgcluster.Options{Standbys: 1, Sync: true, Settings: []string{"fsync=on"}})
	standby := c.Standbys[0]
	q := url.Values{"sslmode": {"disable"}, "target_session_attrs": {"read-write"}, "connect_timeout": {"2"},
		"schema": {"idem_chaos"}, "pool_max_conns": {"16"}}
	var proxies []*tcpproxy.Proxy
	var hosts []string
	for _, n := range c.Nodes() {
		p := newStoreProxy(t, n.Addr())
		proxies = append(proxies, p)
		hosts = append(hosts, p.Addr())
	}
	return storeSetup{
		dsn:       c.MultiHostURL(url.Values{"schema": {"idem_chaos"}}),
		writeWait: storeCallBound,
		gwDSN:     "postgres://postgres@" + strings.Join(hosts, ",") + "/postgres?" + q.Encode(),
		proxies:   proxies,
		desc:      "PostgreSQL primary + synchronous standby of their own (schema idem_chaos), fsync on; the gateways' DSN names both (target_session_attrs=read-write), each through a store proxy",
		failoverDesc: fmt.Sprintf("once, at %.0f–%.0f%% of the load: the synchronous standby's replication link stalled %s–%s (past the %s store-call bound: commits on the primary alone, cancelled, not durable), then the primary stopped (pg_ctl stop -m immediate) and the standby promoted",
			failoverAtMin*10, (failoverAtMin+failoverAtSpread)*10, pgStallMin, pgStallMax, storeCallBound),
		failover: func(ctx context.Context, rng *rand.Rand) (Failover, error) {
			stall := pgStallMin + time.Duration(rng.Int64N(int64(pgStallMax-pgStallMin)))
			f := Failover{Kind: "postgres", Start: time.Now()}
			standby.Link().Stall()
			if !sleepCtx(ctx, stall) {
				standby.Link().Restore()
				return f, ctx.Err()
			}
			f.Lost = time.Now()
			err := c.Primary.Stop(ctx)
			standby.Link().Restore()
			if err != nil {
				return f, err
			}
			if err := standby.Promote(ctx); err != nil {
				return f, fmt.Errorf("%w\n%s", err, standby.LogTail())
			}
			f.Promoted = time.Now()
			f.End = f.Promoted // a promoted standby waits for no standby of its own
			return f, nil
		},
	}
}

// redisSentinel is the store of the redis-sentinel run: a Redis master, a replica and a
// Sentinel of their own (harness/redisha), which the gateways follow
// (master_name=…), with wait=1: a write counts once the replica acknowledged it. Mid-load
// the replica's replication link stalls past wait_timeout, the master is SIGKILLed, the
// Sentinel promotes the replica, and a new replica of the promoted master is started so
// that writes can be acknowledged again. The gateways reach the Sentinel and the master
// directly: the Sentinel hands out the master's own address, which leaves no store link
// for the suite to partition.
func redisSentinel(t *testing.T, _ *pgcluster.Cluster) storeSetup {
	g := redisha.Start(t, redisha.Options{Replicas: 1})
	dsn := g.URL("wait", "1", "wait_timeout", redisWaitTimeout.String())
	return storeSetup{dsn: dsn, gwDSN: dsn, noLink: "the Sentinel hands the gateways the master's own address", writeWait: redisWaitTimeout,
		desc: "Redis master + 1 replica + Sentinel of their own (no persistence), followed through the Sentinel, wait=1 wait_timeout=" + redisWaitTimeout.String() +
			"; reached directly (the Sentinel names the master's own address: no store link to fault)",
		failoverDesc: fmt.Sprintf("once, at %.0f–%.0f%% of the load: the replica's replication link stalled %s–%s (past wait_timeout: WAIT short, writes not durable), then the master SIGKILLed, the Sentinel's failover (down-after 1s) awaited, and a new replica added to the promoted master",
			failoverAtMin*10, (failoverAtMin+failoverAtSpread)*10, redisStallMin, redisStallMax),
		failover: func(ctx context.Context, rng *rand.Rand) (Failover, error) {
			stall := redisStallMin + time.Duration(rng.Int64N(int64(redisStallMax-redisStallMin)))
			replica := g.Replicas()[0]
			f := Failover{Kind: "redis", Start: time.Now()}
			replica.Link().Stall()
			if !sleepCtx(ctx, stall) {
				replica.Link().Restore()
				return f, ctx.Err()
			}
			old := g.Master()
			f.Lost = time.Now()
			old.Kill()
			replica.Link().Restore()
			if promoted := g.AwaitSwitch(old); promoted != replica {
				return f, fmt.Errorf("the Sentinel promoted %s, not %s", promoted.Name, replica.Name)
			}
			f.Promoted = time.Now()
			g.AddReplica()
			f.End = time.Now()
			return f, nil
		},
	}
}

// sleepCtx waits d, and reports false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func deleteRedisPrefix(base, prefix string) {
	opt, err := redis.ParseURL(base)
	if err != nil {
		return
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 500).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 500 {
			c.Del(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		c.Del(ctx, keys...)
	}
}

// settings are what the environment may change.
type settings struct {
	seed  uint64
	load  time.Duration // 0: each store's default
	dedup bool
}

func readSettings(t *testing.T) settings {
	t.Helper()
	var s settings
	if v := os.Getenv("RETRYSAFE_CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 10*time.Second {
			t.Fatalf("RETRYSAFE_CHAOS_DURATION=%q: want a duration of at least 10s, such as 10m", v)
		}
		s.load = d
	}
	if v := os.Getenv("RETRYSAFE_CHAOS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			t.Fatalf("RETRYSAFE_CHAOS_SEED=%q: want a positive integer", v)
		}
		s.seed = n
	} else {
		s.seed = uint64(time.Now().UnixNano())
	}
	if v := os.Getenv("RETRYSAFE_CHAOS_DEDUP_UPSTREAM"); v == "1" || strings.EqualFold(v, "true") {
		s.dedup = true
	}
	return s
}

// TestChaos is the exactly-once chaos suite: for each store, 32 clients make payments
// through fault proxies and gateway processes that are killed and restarted, whose
// links to the upstream and to the store fail too (two stores fail over, once each), to
// a payments upstream that executes every request it gets; every execution beyond the
// first of a payment must have a documented cause, and the ledger, the store and what
// the clients saw are checked against each other. See the package doc.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: the exactly-once chaos suite takes about 3 minutes; skipped with -short")
	}
	set := readSettings(t)
	cases := storeCases()
	planned := time.Duration(0)
	for _, sc := range cases {
		planned += cmpOr(set.load, sc.load) + 25*time.Second // setup, drain, the lease, checks
	}
	if dl, ok := t.Deadline(); ok && time.Until(dl) < planned {
		t.Fatalf("chaos: the run needs about %s and the test deadline is in %s: run go test with -timeout %s or more",
			planned.Round(time.Second), time.Until(dl).Round(time.Second), (planned + planned/2).Round(time.Minute))
	}
	ctx := t.Context()
	ledger := startLedger(t)
	bin := buildBinary(ctx, t)
	t.Logf("chaos: seed %d (RETRYSAFE_CHAOS_SEED to repeat the schedule)", set.seed)
	for _, sc := range cases {
		t.Run(sc.name, func(t *testing.T) {
			runStore(t, ledger, bin, sc, set, set.seed)
		})
	}
}

func cmpOr(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

// faultLog keeps the upstream link's fault reports by the execution they hit.
type faultLog struct {
	mu     sync.Mutex
	byExec map[uint64]faultproxy.Fault
}

func (l *faultLog) add(f faultproxy.Fault) {
	id, err := strconv.ParseUint(f.ResponseHeader.Get(execIDHeader), 10, 64)
	if err != nil {
		return // not an answer of the upstream's: nothing to attribute it to
	}
	l.mu.Lock()
	l.byExec[id] = f
	l.mu.Unlock()
}

// runStore runs the suite against one store.
func runStore(t *testing.T, ledger *pgcluster.Cluster, bin string, sc storeCase, set settings, seed uint64) {
	ctx := t.Context()
	began := time.Now()
	load := cmpOr(set.load, sc.load)
	quiet := slog.New(slog.DiscardHandler)
	rep := Report{Store: sc.name, Replicas: sc.replicas, Seed: seed, Lease: lease, UpstreamTimeout: upstreamTimeout,
		Load: load, Clients: clients, SlowClients: slowClients, Dedup: set.dedup}

	// The store, and the gateways' link to it: proxies shared by every replica.
	store := sc.setup(t, ledger) // skips t when the store's server is absent
	dsn, gwDSN, storeProxies := store.dsn, store.gwDSN, storeLink(store.proxies)
	rep.NoStoreLink = store.noLink

	names := make([]string, sc.replicas)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", sc.name, i+1)
	}
	// The payments upstream, its ledger in the disposable cluster (reached directly).
	up, err := startUpstream(ctx, upstreamConfig{dsn: ledger.Primary.URL(), schema: "ledger_" + strings.ReplaceAll(sc.name, "-", "_"), replicas: names, dedup: set.dedup,
		slowRate: upSlowRate, slowMin: upSlowMin, slowMax: upSlowMax, seed: seed, logger: quiet})
	if err != nil {
		t.Fatalf("chaos: %v", err)
	}
	var upClose sync.Once
	closeUpstream := func() { upClose.Do(up.close) }
	t.Cleanup(closeUpstream)

	// The gateways' link to the upstream: a fault proxy per replica, to the upstream's
	// listener for that replica.
	faults := &faultLog{byExec: map[uint64]faultproxy.Fault{}}
	upProxies := make([]*faultproxy.Proxy, sc.replicas)
	for i := range upProxies {
		p, err := faultproxy.Start(ctx, faultproxy.Config{
			Target: up.Addr(i), Seed: seed + uint64(i)*104729 + 1,
			ReadTimeout: upReadTimeout, Reset: upReset, ResponseLost: upResponseLost, ResponseReset: upResponseReset,
			Latency: time.Millisecond, Jitter: 4 * time.Millisecond, DialTimeout: time.Second, Logger: quiet, OnFault: faults.add,
		})
		if err != nil {
			t.Fatalf("chaos: upstream-link fault proxy: %v", err)
		}
		t.Cleanup(func() { _ = p.Close() })
		upProxies[i] = p
	}

	// The gateway replicas: processes of the binary, one store.
	replicas := make([]*replica, sc.replicas)
	for i := range replicas {
		r := newReplica(names[i], bin, "--upstream", upProxies[i].URL(), "--store", gwDSN, "--lease", lease.String(),
			"--ttl", "1h", "--upstream-timeout", upstreamTimeout.String())
		if err := r.start(ctx); err != nil {
			t.Fatalf("chaos: gateway %v", err)
		}
		t.Cleanup(func() { r.kill() })
		replicas[i] = r
	}

	// The clients' link: a fault proxy in front of each replica.
	proxies := make([]*faultproxy.Proxy, len(replicas))
	targets := make([]string, len(replicas))
	for i, r := range replicas {
		p, err := faultproxy.Start(ctx, faultproxy.Config{
			Target: r.Addr(), Seed: seed + uint64(i)*7919,
			Refuse: rateRefuse, BlackHole: rateBlackHole,
			ReadTimeout: rateReadTimeout, Reset: rateReset, ResponseLost: rateResponseLost,
			Latency: time.Millisecond, Jitter: 2 * time.Millisecond, DialTimeout: time.Second, Logger: quiet,
		})
		if err != nil {
			t.Fatalf("chaos: fault proxy: %v", err)
		}
		t.Cleanup(func() { _ = p.Close() })
		proxies[i], targets[i] = p, p.Addr()
	}

	chaos := "SIGKILL a random replica every 1.5–5s, restart it 0–1s later (same flags, same address), during the load"
	switch {
	case sc.restartPG:
		chaos += "; PostgreSQL (store and ledger) stopped immediately, as a crash, and restarted once"
	case sc.name == "redis":
		chaos += "; Redis is the machine's shared server and is not restarted"
	}
	if store.failover != nil {
		chaos += "; the store fails over " + store.failoverDesc
	}
	upDesc := "executes every request it gets (no deduplication): each forward is a ledger row"
	if set.dedup {
		upDesc = "deduplicates on the forwarded Idempotency-Key (RETRYSAFE_CHAOS_DEDUP_UPSTREAM): the ledger's UNIQUE (user_id, idempotency_key)"
	}
	storeLink := "none: " + store.noLink
	if len(storeProxies) > 0 {
		storeLink = fmt.Sprintf("%d tcpproxy shared by the replicas (several: cut, stalled and slowed together): a partition (cut or stall, %s–%s) after every %s–%s, a latency spike (%s–%s for %s–%s) in %.0f%% of the gaps",
			len(storeProxies), partitionMin, partitionMax, partitionGapMin, partitionGapMax, spikeMin, spikeMax, spikeForMin, spikeForMax, 100*spikeRate)
	}
	rep.Setup = []string{
		fmt.Sprintf("clients   %d × retry.Transport with AutoKey (attempt timeout %s, no budget), each attempt to the next replica in turn; %d of them, straight to the replicas over narrow connections (16 KiB receive buffer, 1 KiB segments), ask for %d–%d B answers and read the first answer of each payment at %d B per %s for %s; the others, through the client fault proxies, %.1f%% of the time",
			clients, attemptTimeout, slowClients, padMin, padMax, slowReading.Chunk, slowReading.Every, slowReading.For, 100*padRateFast),
		fmt.Sprintf("client    a fault proxy per replica: refuse %.0f%%, black hole %.0f%% of connections; read timeout %.0f%%, reset %.0f%%, response lost %.0f%% of requests; latency 1–3ms",
			100*rateRefuse, 100*rateBlackHole, 100*rateReadTimeout, 100*rateReset, 100*rateResponseLost),
		fmt.Sprintf("gateways  %d × `retrysafe gateway` process, --lease %s, --upstream-timeout %s, store: %s", len(replicas), lease, upstreamTimeout, store.desc),
		fmt.Sprintf("upstream  a fault proxy per replica: read timeout %.1f%%, reset %.1f%%, response lost %.1f%%, response reset %.1f%% of requests; latency 1–5ms; the upstream answers %.1f%% late (%s–%s)",
			100*upReadTimeout, 100*upReset, 100*upResponseLost, 100*upResponseReset, 100*upSlowRate, upSlowMin, upSlowMax),
		"store     " + storeLink,
		"ledger    POST /payments on a PostgreSQL ledger (a disposable server, fsync on, never failed over), no idempotency layer; " + upDesc,
		"chaos     " + chaos,
	}

	// The clients.
	var st payclient.Counts
	cuts := &cutLog{}
	base := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConnsPerHost: clients,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	defer base.CloseIdleConnections()
	hc := &http.Client{Transport: clientTransport(base, &st, targets, nil, cuts)}
	// The slow readers reach the replicas directly, over narrow connections: a fault
	// proxy in between would buffer their answers for them.
	slowBase := &http.Transport{
		DialContext:         narrowDialer().DialContext,
		MaxIdleConnsPerHost: slowClients,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	defer slowBase.CloseIdleConnections()
	direct := make([]string, len(replicas))
	for i, r := range replicas {
		direct[i] = r.Addr()
	}
	slowHC := &http.Client{Transport: clientTransport(slowBase, &st, direct, &slowReading, cuts)}

	loadStart := time.Now()
	loadEnd := loadStart.Add(load)
	runCtx, cancelRun := context.WithDeadline(ctx, loadEnd.Add(patience))
	defer cancelRun()
	payments := make([][]Payment, clients)
	var clientsWG sync.WaitGroup
	for i := range clients {
		clientsWG.Go(func() {
			slow := i < slowClients
			c := &client{pc: &payclient.Client{HC: hc, URL: "http://" + targets[0] + "/payments", User: fmt.Sprintf("client-%02d", i+1),
				Counts: &st, Backoff: 20 * time.Millisecond, Patience: patience, Final: payclient.FinalStatus},
				rng: rand.New(rand.NewPCG(seed, uint64(i))), slow: slow, pad: padRateFast}
			end := loadEnd
			if slow {
				c.pc.HC, c.pc.Patience, c.pad = slowHC, slowPatience, 1
				end = loadEnd.Add(-min(slowStop, load/3))
			}
			for n := 0; time.Now().Before(end) && runCtx.Err() == nil; n++ {
				payments[i] = append(payments[i], c.pay(runCtx, fmt.Sprintf("%s-c%02d-%06d", sc.name, i+1, n)))
			}
		})
	}

	// The chaos: kills and restarts of the replicas, partitions of the store link and,
	// once, a PostgreSQL restart.
	chaosCtx, stopChaos := context.WithDeadline(ctx, loadEnd)
	defer stopChaos()
	var chaosWG sync.WaitGroup
	var chaosMu sync.Mutex
	var chaosErrs []error
	chaosFail := func(err error) {
		chaosMu.Lock()
		chaosErrs = append(chaosErrs, err)
		chaosMu.Unlock()
	}
	sleep := func(d time.Duration) bool {
		select {
		case <-chaosCtx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	// The failover's moment is drawn now, so that the kills pause through the start of
	// its stall, and the store link's faults keep clear of it: none comes within
	// failoverQuiet of it, before or after. Each extra execution then has one store
	// fault to blame, and the report measures the failover alone.
	var failoverAt time.Time
	var failoverEnd time.Time // written before failoverDone is closed
	failoverDone := make(chan struct{})
	frng := rand.New(rand.NewPCG(seed, 0x6661696c)) // "fail"
	if store.failover != nil {
		failoverAt = loadStart.Add(time.Duration(float64(load) * (failoverAtMin + failoverAtSpread*frng.Float64()) / 10))
	}
	chaosWG.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 0x6b696c6c)) // "kill"
		for {
			wait := 1500*time.Millisecond + time.Duration(rng.Int64N(int64(3500*time.Millisecond)))
			r := replicas[rng.IntN(len(replicas))]
			down := time.Duration(rng.Int64N(int64(time.Second)))
			if !sleep(wait) {
				return
			}
			// No kill from just before the failover's stall until the writes in flight
			// when it began have come back not durable: the gateways must hold those
			// answers, and a kill would take them away untested.
			if store.failover != nil {
				stall := failoverAt.Add(answerHold - answerHoldAfter)
				if now := time.Now(); now.After(stall.Add(-time.Second)) && now.Before(stall.Add(store.writeWait+time.Second)) &&
					!sleep(time.Until(stall.Add(store.writeWait+time.Second))) {
					return
				}
			}
			killed := r.kill()
			// The replica stays down for down, a wait of the schedule like the others:
			// once the load ends it is restarted at once, to be stopped gracefully
			// with the rest.
			sleep(down)
			if err := r.start(ctx); err != nil {
				chaosFail(fmt.Errorf("restarting gateway %w", err))
				return
			}
			chaosMu.Lock()
			if killed {
				rep.Kills++
			}
			rep.Restarts++
			chaosMu.Unlock()
		}
	})
	// room returns how much of a store-link fault of d beginning now keeps clear of the
	// failover: all of it, or what ends failoverQuiet before the failover begins, or none.
	room := func(d time.Duration) time.Duration {
		if store.failover == nil {
			return d
		}
		select {
		case <-failoverDone:
			if time.Now().After(failoverEnd.Add(failoverQuiet)) {
				return d
			}
			return 0
		default:
			return max(0, min(d, time.Until(failoverAt)-failoverQuiet))
		}
	}
	if len(storeProxies) > 0 {
		chaosWG.Go(func() {
			defer func() {
				storeProxies.Restore()
				storeProxies.SetLatency(0)
			}()
			rng := rand.New(rand.NewPCG(seed, 0x70617274)) // "part"
			between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo))) }
			record := func(p Partition) {
				chaosMu.Lock()
				rep.Partitions = append(rep.Partitions, p)
				chaosMu.Unlock()
			}
			for first := true; ; first = false {
				// Every draw is made whatever is used, so the schedule depends on the seed only.
				gap, spike, spikeLat, spikeFor := between(partitionGapMin, partitionGapMax), rng.Float64() < spikeRate,
					between(spikeMin, spikeMax), between(spikeForMin, spikeForMax)
				stall, dur := rng.IntN(2) == 1, between(partitionMin, partitionMax)
				if first {
					gap /= 2 // the first partition early, so that a short run has one too
				}
				if spike {
					if !sleep(gap / 3) {
						return
					}
					d := min(spikeFor, gap/2)
					ok := true
					if r := room(d); r > 0 {
						storeProxies.SetLatency(spikeLat)
						p := Partition{Kind: "latency", Start: time.Now(), Latency: spikeLat}
						ok = sleep(r)
						storeProxies.SetLatency(0)
						p.End = time.Now()
						record(p)
						d -= r
					}
					if !ok || !sleep(d) || !sleep(gap-gap/3-min(spikeFor, gap/2)) {
						return
					}
				} else if !sleep(gap) {
					return
				}
				if time.Now().Add(dur + time.Second).After(loadEnd) {
					return // no partition past the load: the drain is not the place for one
				}
				// Shortened to end failoverQuiet before the failover, so that the run has
				// one partition before it, but never shorter than partitionMin.
				if dur = room(dur); dur < partitionMin {
					continue
				}
				p := Partition{Kind: "cut", Start: time.Now()}
				if stall {
					p.Kind = "stall"
					storeProxies.Stall()
				} else {
					storeProxies.Cut()
				}
				ok := sleep(dur)
				storeProxies.Restore()
				p.End = time.Now()
				record(p)
				t.Logf("chaos: %s: store link %s", sc.name, p)
				if !ok {
					return
				}
			}
		})
	}
	if sc.restartPG {
		chaosWG.Go(func() {
			rng := rand.New(rand.NewPCG(seed, 0x70677265)) // "pgre"
			at := load*3/10 + time.Duration(rng.Int64N(int64(load*3/10)))
			if !sleep(at) {
				return
			}
			downtime, err := restartCrashed(ctx, ledger.Primary, 300*time.Millisecond)
			if err != nil {
				chaosFail(fmt.Errorf("restarting PostgreSQL: %w", err))
				return
			}
			chaosMu.Lock()
			rep.PGRestarts++
			rep.PGDowntime = downtime
			chaosMu.Unlock()
			t.Logf("chaos: %s: PostgreSQL restarted at %s, unreachable for %s", sc.name, time.Since(loadStart).Round(time.Millisecond), downtime.Round(time.Millisecond))
		})
	}

	// Progress, every 10s.
	clientsDone := make(chan struct{})
	go func() { clientsWG.Wait(); close(clientsDone) }()
	tick := time.NewTicker(10 * time.Second)
	// The failover, once, on this goroutine (the store's helpers may fail the test).
	var failovers []Failover
	var failoverTimer <-chan time.Time
	if store.failover != nil {
		timer := time.NewTimer(time.Until(failoverAt))
		defer timer.Stop()
		failoverTimer = timer.C
	}
progress:
	for {
		select {
		case <-clientsDone:
			break progress
		case <-failoverTimer:
			failoverTimer = nil
			// The upstream holds its answers back for a moment, so that many requests
			// have their claims acknowledged and their completions still to make when
			// the standby's link stalls, and make them during the stall.
			up.holdAnswers(time.Now().Add(answerHold))
			sleepCtx(ctx, answerHold-answerHoldAfter)
			f, err := store.failover(ctx, frng)
			failoverEnd = time.Now()
			close(failoverDone)
			if err != nil {
				chaosFail(fmt.Errorf("failing the store over: %w", err))
				continue
			}
			failovers = append(failovers, f)
			t.Logf("chaos: %s: store failover at %s: %s", sc.name, time.Since(loadStart).Round(time.Millisecond), f)
		case <-tick.C:
			chaosMu.Lock()
			kills, parts := rep.Kills, len(rep.Partitions)
			chaosMu.Unlock()
			us := up.Stats()
			t.Logf("chaos: %s: %5.1fs  payments %6d  attempts %6d  replays %5d  409s %5d  kills %d  store-link faults %d  upstream executions %d",
				sc.name, time.Since(loadStart).Seconds(), st.Payments.Load(), st.Attempts.Load(), st.Replays.Load(), st.Conflicts.Load(), kills, parts, us.Executions)
		}
	}
	tick.Stop()
	rep.Drain = max(0, time.Since(loadEnd))
	stopChaos()
	chaosWG.Wait()
	for _, err := range chaosErrs {
		t.Errorf("chaos: %s: %v", sc.name, err)
	}

	// The end: no new requests, the gateways stopped gracefully (what is in flight
	// finishes and is recorded), then the lease is left to run out before the store is
	// read (directly, not through the store proxy).
	base.CloseIdleConnections()
	slowBase.CloseIdleConnections()
	for _, p := range proxies {
		rep.ClientFaults = addStats(rep.ClientFaults, p.Stats())
		_ = p.Close()
	}
	for _, r := range replicas {
		code, err := r.stop(15 * time.Second)
		switch {
		case err != nil:
			rep.BadStops = append(rep.BadStops, err.Error())
		case code != 0:
			rep.BadStops = append(rep.BadStops, fmt.Sprintf("%s: exit status %d on SIGTERM", r.name, code))
		}
	}
	for _, p := range upProxies {
		rep.UpstreamFaults = addStats(rep.UpstreamFaults, p.Stats())
		_ = p.Close()
	}
	if len(storeProxies) > 0 {
		s := storeProxies.Stats()
		rep.StoreLink = &s
		storeProxies.Close()
	}
	select {
	case <-ctx.Done():
	case <-time.After(lease + 500*time.Millisecond):
	}
	listed := time.Now()
	records, err := storeRecords(ctx, dsn, quiet)
	if err != nil {
		t.Fatalf("chaos: %s: %v", sc.name, err)
	}
	rows, err := up.Rows(ctx)
	if err != nil {
		t.Fatalf("chaos: %s: %v", sc.name, err)
	}
	closeUpstream()
	rep.Upstream = up.Stats()

	var all []Payment
	for _, ps := range payments {
		all = append(all, ps...)
	}
	for _, p := range all {
		if p.Pad > 0 {
			rep.LargePayments++
		}
	}
	rep.Attempts, rep.Resends, rep.Replays = st.Attempts.Load(), st.Resends.Load(), st.Replays.Load()
	rep.Conflicts, rep.ServerErrors, rep.TransportErrors = st.Conflicts.Load(), st.ServerErrors.Load(), st.TransportErrors.Load()
	rep.Outcomes = map[string]int64{}
	ev := Evidence{Lines: map[string][]GatewayLine{}, UpstreamTimeout: upstreamTimeout, Partitions: rep.Partitions, Failovers: failovers}
	for _, r := range replicas {
		o, warn := r.Outcomes()
		for k, v := range o {
			rep.Outcomes[k] += v
		}
		rep.GatewayWarnings += warn
		rep.UnexpectedExits = append(rep.UnexpectedExits, r.Unexpected()...)
		_, failed := r.Starts()
		rep.FailedStarts += failed
		for k, ls := range r.Lines() {
			ev.Lines[k] = append(ev.Lines[k], ls...)
		}
		ev.Processes = append(ev.Processes, r.Processes()...)
	}
	ev.BodyCuts, rep.SlowLarge = cuts.Cuts()
	for _, cs := range ev.BodyCuts {
		for _, c := range cs {
			rep.BodyCuts++
			if c.Slow {
				rep.SlowBodyCuts++
			}
		}
	}
	ev.Executions = up.Executions()
	for i, e := range ev.Executions {
		if f, ok := faults.byExec[e.ID]; ok {
			ev.Executions[i].Fault, ev.Executions[i].FaultRequest = f.Kind.String(), f.Request
		}
	}
	for _, f := range failovers { // when each request sent its completion: from the upstream's log
		rep.Failovers = append(rep.Failovers, failoverImpact(f, ev.Lines, ev.Executions))
	}
	rep.Checks = Check(all, rows, records, listed, ev.HeldAndLost)
	rep.Attribution = Attribute(ev)
	shown := map[Cause]int{}
	for _, x := range rep.Attribution.Extras {
		if x.Cause.Allowed() || shown[x.Cause] == 3 {
			continue
		}
		shown[x.Cause]++
		rep.Unallowed = append(rep.Unallowed, ev.Describe(x, 12))
	}
	rep.LedgerDisagrees, rep.LedgerEvidence = ledgerAgrees(rows, ev.Executions)
	// What the upstream and the gateways logged of the keys of the other failures.
	window := lease + upstreamTimeout + 5*time.Second
	var keyEvidence []string
	shownKind := map[string]int{}
	addKey := func(kind, key, what string) {
		shownKind[kind]++
		keyEvidence = append(keyEvidence, fmt.Sprintf("  %s: key %s (%s)\n%s", kind, key, what, ev.DescribeExecutions(key, window, 40)))
	}
	recs := map[string]StoreRecord{}
	for _, r := range records {
		recs[r.Key] = r
		if r.InProgress && !ev.HeldAndLost(r.Key) && shownKind["stuck"] < 3 {
			addKey("stuck", r.Key, "in progress in the store after the lease")
		}
	}
	rowsOfKey := map[string]int{}
	for _, r := range rows {
		rowsOfKey[r.User+"\x00"+r.Key]++
	}
	for _, p := range all {
		what := fmt.Sprintf("user %s, ref %s, pad %d, slow reader %v, final status %d", p.User, p.Ref, p.Pad, p.SlowReader, p.Status)
		switch rec, ok := recs[p.Key]; {
		case p.Key == "":
		case p.Status == 0 && shownKind["unfinished"] < 3:
			addKey("unfinished", p.Key, what)
		case p.Succeeded() && rowsOfKey[p.User+"\x00"+p.Key] == 0 && shownKind["lost"] < 3:
			addKey("lost", p.Key, what)
		case p.Succeeded() && (!ok || !rec.InProgress && (rec.Status != p.Status || rec.AnswerID != p.Answer.ID)) &&
			shownKind["store disagrees"] < 3: // one in progress is shown as stuck
			addKey("store disagrees", p.Key, what)
		}
	}
	rep.KeyEvidence = keyEvidence
	if dir := os.Getenv("RETRYSAFE_CHAOS_EVIDENCE"); dir != "" {
		var b strings.Builder
		for _, x := range rep.Attribution.Extras {
			b.WriteString(ev.Describe(x, 40) + "\n")
		}
		for _, e := range keyEvidence {
			b.WriteString(e + "\n")
		}
		for _, f := range failovers {
			b.WriteString(ev.DescribeFailover(f, 5*time.Second) + "\n")
		}
		path := filepath.Join(dir, sc.name+"-evidence.txt")
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Errorf("chaos: RETRYSAFE_CHAOS_EVIDENCE: %v", err)
		} else {
			t.Logf("chaos: %s: every extra execution and unfinished payment, and the gateways' requests through a failover, described in %s", sc.name, path)
		}
	}
	rep.Elapsed = time.Since(began)

	var buf bytes.Buffer
	rep.WriteTable(&buf)
	if testing.Verbose() {
		fmt.Print(buf.String()) // unindented: the table is wide
	} else {
		t.Log("\n" + buf.String())
	}
	if !rep.OK() {
		t.Errorf("chaos: %s: exactly-once did not hold: %s (details in the table above)", sc.name, rep.Verdict())
		if len(rep.UnexpectedExits)+len(rep.BadStops) > 0 {
			for _, r := range replicas {
				t.Logf("gateway %s, last log lines worth keeping:\n%s", r.name, r.Tail(30))
			}
		}
	}
	if rep.Checks.Succeeded == 0 || rep.Kills == 0 || rep.ClientFaults.Faults == 0 || rep.UpstreamFaults.Faults == 0 ||
		sc.restartPG && rep.PGRestarts != 1 || len(storeProxies) > 0 && load >= 20*time.Second && len(rep.Partitions) == 0 || rep.SlowLarge == 0 ||
		store.failover != nil && (len(rep.Failovers) != 1 || !rep.Failovers[0].HeldBack(500*time.Millisecond)) {
		heldBack := "" // whether the standby's stalled link held writes back, as a failover's fault must
		for _, f := range rep.Failovers {
			heldBack = fmt.Sprintf(" (the last write acknowledged %s from the stall's start: key %s, %s)", relative(f.LastExecuted.Sub(f.Start)), f.LastKey, f.LastLine)
		}
		t.Errorf("chaos: %s: the run did not exercise the system: %d payments succeeded, %d kills, %d client-link faults, %d upstream-link faults, %d PostgreSQL restarts, %d store-link faults, %d store failovers%s, %d large answers read slowly",
			sc.name, rep.Checks.Succeeded, rep.Kills, rep.ClientFaults.Faults, rep.UpstreamFaults.Faults, rep.PGRestarts, len(rep.Partitions), len(rep.Failovers), heldBack, rep.SlowLarge)
	}
}

// ledgerAgrees compares the ledger with the upstream's execution log: each payment
// (user, key) must have as many rows as logged executions that made one. It returns the
// number of payments that disagree and a few examples.
func ledgerAgrees(rows []Row, execs []Execution) (int, []string) {
	type userKey struct{ user, key string }
	n := map[userKey][2]int{}
	for _, r := range rows {
		c := n[userKey{r.User, r.Key}]
		c[0]++
		n[userKey{r.User, r.Key}] = c
	}
	for _, e := range execs {
		if e.Absorbed {
			continue
		}
		c := n[userKey{e.User, e.Key}]
		c[1]++
		n[userKey{e.User, e.Key}] = c
	}
	var bad []string
	for k, c := range n {
		if c[0] != c[1] {
			bad = append(bad, fmt.Sprintf("payment %s/%s: %d ledger rows, %d executions logged", k.user, k.key, c[0], c[1]))
		}
	}
	sort.Strings(bad)
	count := len(bad)
	if len(bad) > maxEvidence {
		bad = append(bad[:maxEvidence], fmt.Sprintf("… %d more", count-maxEvidence))
	}
	return count, bad
}

// storeRecords lists every record of the store dsn names.
func storeRecords(ctx context.Context, dsn string, logger *slog.Logger) ([]StoreRecord, error) {
	l, closeStore, err := openLister(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("opening the store to check it: %w", err)
	}
	defer closeStore()
	var out []StoreRecord
	f := idempotency.ListFilter{Limit: 1000}
	for {
		page, err := l.List(ctx, f)
		if err != nil {
			return nil, fmt.Errorf("listing the store: %w", err)
		}
		for _, rec := range page.Records {
			sr := StoreRecord{Key: rec.Key, InProgress: rec.State == idempotency.StateInProgress, LeaseUntil: rec.LeaseUntil}
			if rec.Response != nil {
				sr.Status = rec.Response.Status
				var a struct {
					ID int64 `json:"id"`
				}
				if json.Unmarshal(rec.Response.Body, &a) == nil {
					sr.AnswerID = a.ID
				}
			}
			out = append(out, sr)
		}
		if page.Next == "" {
			return out, nil
		}
		f.After = page.Next
	}
}

// storeLink is the proxies of the gateways' link to the store: one per server the
// gateways may reach, faulted together as one link.
type storeLink []*tcpproxy.Proxy

func (l storeLink) Cut() {
	for _, p := range l {
		p.Cut()
	}
}

func (l storeLink) Stall() {
	for _, p := range l {
		p.Stall()
	}
}

func (l storeLink) Restore() {
	for _, p := range l {
		p.Restore()
	}
}

func (l storeLink) SetLatency(d time.Duration) {
	for _, p := range l {
		p.SetLatency(d)
	}
}

func (l storeLink) Close() {
	for _, p := range l {
		_ = p.Close()
	}
}

// Stats sums the proxies' counts.
func (l storeLink) Stats() tcpproxy.Stats {
	var a tcpproxy.Stats
	for _, p := range l {
		b := p.Stats()
		a.Accepted += b.Accepted
		a.Refused += b.Refused
		a.Reset += b.Reset
		a.Stalled += b.Stalled
		a.DialErrors += b.DialErrors
		a.Cuts += b.Cuts
		a.Stalls += b.Stalls
		a.BytesToTarget += b.BytesToTarget
		a.BytesFromTarget += b.BytesFromTarget
	}
	return a
}

func addStats(a, b faultproxy.Stats) faultproxy.Stats {
	a.Connections += b.Connections
	a.Requests += b.Requests
	a.Forwarded += b.Forwarded
	a.Delayed += b.Delayed
	a.Refused += b.Refused
	a.BlackHoled += b.BlackHoled
	a.ReadTimeouts += b.ReadTimeouts
	a.Resets += b.Resets
	a.ResponsesLost += b.ResponsesLost
	a.ResponseResets += b.ResponseResets
	a.Faults += b.Faults
	a.OnReused += b.OnReused
	a.UpstreamErrors += b.UpstreamErrors
	return a
}

// openLister opens the store of one of storeCases' DSNs directly, through its package,
// to list what the gateways left in it.
func openLister(ctx context.Context, dsn string) (idempotency.Lister, func(), error) {
	if path, ok := strings.CutPrefix(dsn, "sqlite:"); ok {
		s, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: path})
		if err != nil {
			return nil, nil, err
		}
		return s, func() { _ = s.Close() }, nil
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, nil, err
	}
	q := u.Query()
	switch u.Scheme {
	case "postgres", "postgresql":
		schema := q.Get("schema")
		q.Del("schema")
		u.RawQuery = q.Encode()
		pool, err := pgxpool.New(ctx, u.String())
		if err != nil {
			return nil, nil, err
		}
		s, err := pgstore.New(pgstore.Config{Pool: pool, Schema: schema})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return s, pool.Close, nil
	case "redis":
		prefix := q.Get("prefix")
		// Listing waits for no replica: what a write needed is no concern of a read.
		q.Del("prefix")
		q.Del("wait")
		q.Del("wait_timeout")
		u.RawQuery = q.Encode()
		var c redis.UniversalClient
		if q.Has("master_name") { // through a Sentinel, to the master of now
			opt, err := redis.ParseFailoverURL(u.String())
			if err != nil {
				return nil, nil, err
			}
			c = redis.NewFailoverClient(opt)
		} else {
			opt, err := redis.ParseURL(u.String())
			if err != nil {
				return nil, nil, err
			}
			c = redis.NewClient(opt)
		}
		s, err := redisstore.New(redisstore.Config{Client: c, Prefix: prefix})
		if err != nil {
			_ = c.Close()
			return nil, nil, err
		}
		return s, func() { _ = c.Close() }, nil
	}
	return nil, nil, errors.New("unknown store " + u.Scheme)
}
