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
	// slow readers begin none in the last slowStop of the load, so that they do not
	// stretch the drain.
	slowPatience, slowStop = 30 * time.Second, 15 * time.Second

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
	// of the others.
	padMin, padMax = 1_000_000, 3_000_000
	padRateFast    = 0.005
)

// slowReading is how the slow readers read: 8 KiB/s for longer than the upstream timeout.
var slowReading = slowRead{For: upstreamTimeout + 2500*time.Millisecond, Chunk: 1 << 10, Every: 125 * time.Millisecond}

// storeCase is one store the suite runs against.
type storeCase struct {
	name      string
	replicas  int
	load      time.Duration // default load duration
	restartPG bool          // restart the disposable PostgreSQL once (it holds the store)
	// proxied puts a tcpproxy between the gateways and the store (the dsn's host).
	proxied bool
	dsn     func(t *testing.T, c *pgCluster) (dsn, desc string)
}

func storeCases() []storeCase {
	return []storeCase{
		{name: "postgres", replicas: 2, load: 40 * time.Second, restartPG: true, proxied: true,
			dsn: func(t *testing.T, c *pgCluster) (string, string) {
				return c.URL() + "&schema=idem_chaos&pool_max_conns=16",
					"PostgreSQL, the disposable cluster (schema idem_chaos), shared by both replicas through one store proxy"
			}},
		{name: "sqlite", replicas: 1, load: 25 * time.Second,
			dsn: func(t *testing.T, _ *pgCluster) (string, string) {
				path := filepath.Join(t.TempDir(), "keys.db")
				return "sqlite:" + path, "SQLite file " + path + ", kept across the kills (a local file: no store link to fault)"
			}},
		{name: "redis", replicas: 2, load: 25 * time.Second, proxied: true,
			dsn: func(t *testing.T, _ *pgCluster) (string, string) {
				base := testenv.RedisURL(t)
				prefix := testenv.Name("chaos") + ":"
				t.Cleanup(func() { deleteRedisPrefix(base, prefix) })
				sep := "?"
				if strings.Contains(base, "?") {
					sep = "&"
				}
				return base + sep + "prefix=" + url.QueryEscape(prefix),
					"the machine's shared Redis, key prefix " + prefix + ", shared by both replicas through one store proxy (Redis itself is not restarted)"
			}},
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
// links to the upstream and to the store fail too, to a payments upstream that executes
// every request it gets; every execution beyond the first of a payment must have a
// documented cause, and the ledger, the store and what the clients saw are checked
// against each other. See the package doc.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: the exactly-once chaos suite takes about 2 minutes; skipped with -short")
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
	cluster := startCluster(ctx, t)
	bin := buildBinary(ctx, t)
	t.Logf("chaos: seed %d (RETRYSAFE_CHAOS_SEED to repeat the schedule)", set.seed)
	for _, sc := range cases {
		t.Run(sc.name, func(t *testing.T) {
			runStore(t, cluster, bin, sc, set, set.seed)
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

// proxiedDSN returns dsn with its host replaced by addr.
func proxiedDSN(dsn, addr string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", err
	}
	u.Host = addr
	return u.String(), nil
}

// runStore runs the suite against one store.
func runStore(t *testing.T, cluster *pgCluster, bin string, sc storeCase, set settings, seed uint64) {
	ctx := t.Context()
	began := time.Now()
	load := cmpOr(set.load, sc.load)
	quiet := slog.New(slog.DiscardHandler)
	rep := Report{Store: sc.name, Replicas: sc.replicas, Seed: seed, Lease: lease, UpstreamTimeout: upstreamTimeout,
		Load: load, Clients: clients, SlowClients: slowClients, Dedup: set.dedup}

	dsn, storeDesc := sc.dsn(t, cluster) // skips t when Redis is absent

	// The gateways' link to the store: one proxy shared by every replica.
	gwDSN := dsn
	var storeProxy *tcpproxy.Proxy
	if sc.proxied {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatalf("chaos: %v", err)
		}
		if storeProxy, err = tcpproxy.New(u.Host); err != nil {
			t.Fatalf("chaos: store proxy: %v", err)
		}
		t.Cleanup(func() { _ = storeProxy.Close() })
		if gwDSN, err = proxiedDSN(dsn, storeProxy.Addr()); err != nil {
			t.Fatalf("chaos: %v", err)
		}
	}

	names := make([]string, sc.replicas)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", sc.name, i+1)
	}
	// The payments upstream, its ledger in the disposable cluster (reached directly).
	up, err := startUpstream(ctx, upstreamConfig{dsn: cluster.URL(), schema: "ledger_" + sc.name, replicas: names, dedup: set.dedup,
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
	upDesc := "executes every request it gets (no deduplication): each forward is a ledger row"
	if set.dedup {
		upDesc = "deduplicates on the forwarded Idempotency-Key (RETRYSAFE_CHAOS_DEDUP_UPSTREAM): the ledger's UNIQUE (user_id, idempotency_key)"
	}
	storeLink := "none (a local file)"
	if sc.proxied {
		storeLink = fmt.Sprintf("one tcpproxy shared by the replicas: a partition (cut or stall, %s–%s) after every %s–%s, a latency spike (%s–%s for %s–%s) in %.0f%% of the gaps",
			partitionMin, partitionMax, partitionGapMin, partitionGapMax, spikeMin, spikeMax, spikeForMin, spikeForMax, 100*spikeRate)
	}
	rep.Setup = []string{
		fmt.Sprintf("clients   %d × retry.Transport with AutoKey (attempt timeout %s, no budget), each attempt to the next replica in turn; %d of them, straight to the replicas over narrow connections (16 KiB receive buffer, 1 KiB segments), ask for %d–%d B answers and read the first answer of each payment at %d B per %s for %s; the others, through the client fault proxies, %.1f%% of the time",
			clients, attemptTimeout, slowClients, padMin, padMax, slowReading.Chunk, slowReading.Every, slowReading.For, 100*padRateFast),
		fmt.Sprintf("client    a fault proxy per replica: refuse %.0f%%, black hole %.0f%% of connections; read timeout %.0f%%, reset %.0f%%, response lost %.0f%% of requests; latency 1–3ms",
			100*rateRefuse, 100*rateBlackHole, 100*rateReadTimeout, 100*rateReset, 100*rateResponseLost),
		fmt.Sprintf("gateways  %d × `retrysafe gateway` process, --lease %s, --upstream-timeout %s, store: %s", len(replicas), lease, upstreamTimeout, storeDesc),
		fmt.Sprintf("upstream  a fault proxy per replica: read timeout %.1f%%, reset %.1f%%, response lost %.1f%%, response reset %.1f%% of requests; latency 1–5ms; the upstream answers %.1f%% late (%s–%s)",
			100*upReadTimeout, 100*upReset, 100*upResponseLost, 100*upResponseReset, 100*upSlowRate, upSlowMin, upSlowMax),
		"store     " + storeLink,
		"ledger    POST /payments on a PostgreSQL ledger (disposable cluster, fsync on), no idempotency layer; " + upDesc,
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
	chaosWG.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 0x6b696c6c)) // "kill"
		for {
			wait := 1500*time.Millisecond + time.Duration(rng.Int64N(int64(3500*time.Millisecond)))
			r := replicas[rng.IntN(len(replicas))]
			down := time.Duration(rng.Int64N(int64(time.Second)))
			if !sleep(wait) {
				return
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
	if storeProxy != nil {
		chaosWG.Go(func() {
			defer func() {
				storeProxy.Restore()
				storeProxy.SetLatency(0)
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
					storeProxy.SetLatency(spikeLat)
					p := Partition{Kind: "latency", Start: time.Now(), Latency: spikeLat}
					ok := sleep(min(spikeFor, gap/2))
					storeProxy.SetLatency(0)
					p.End = time.Now()
					record(p)
					if !ok || !sleep(gap-gap/3-min(spikeFor, gap/2)) {
						return
					}
				} else if !sleep(gap) {
					return
				}
				if time.Now().Add(dur + time.Second).After(loadEnd) {
					return // no partition past the load: the drain is not the place for one
				}
				p := Partition{Kind: "cut", Start: time.Now()}
				if stall {
					p.Kind = "stall"
					storeProxy.Stall()
				} else {
					storeProxy.Cut()
				}
				ok := sleep(dur)
				storeProxy.Restore()
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
			downtime, err := cluster.restart(ctx, 300*time.Millisecond)
			if err != nil {
				chaosFail(fmt.Errorf("restarting PostgreSQL: %w\n%s", err, cluster.logTail()))
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
progress:
	for {
		select {
		case <-clientsDone:
			break progress
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
	if storeProxy != nil {
		s := storeProxy.Stats()
		rep.StoreLink = &s
		_ = storeProxy.Close()
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
	ev := Evidence{Lines: map[string][]GatewayLine{}, UpstreamTimeout: upstreamTimeout, Partitions: rep.Partitions}
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
		path := filepath.Join(dir, sc.name+"-evidence.txt")
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Errorf("chaos: RETRYSAFE_CHAOS_EVIDENCE: %v", err)
		} else {
			t.Logf("chaos: %s: every extra execution and unfinished payment described in %s", sc.name, path)
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
		sc.restartPG && rep.PGRestarts != 1 || sc.proxied && load >= 20*time.Second && len(rep.Partitions) == 0 || rep.SlowLarge == 0 {
		t.Errorf("chaos: %s: the run did not exercise the system: %d payments succeeded, %d kills, %d client-link faults, %d upstream-link faults, %d PostgreSQL restarts, %d store-link faults, %d large answers read slowly",
			sc.name, rep.Checks.Succeeded, rep.Kills, rep.ClientFaults.Faults, rep.UpstreamFaults.Faults, rep.PGRestarts, len(rep.Partitions), rep.SlowLarge)
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
		q.Del("prefix")
		u.RawQuery = q.Encode()
		opt, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, nil, err
		}
		c := redis.NewClient(opt)
		s, err := redisstore.New(redisstore.Config{Client: c, Prefix: prefix})
		if err != nil {
			_ = c.Close()
			return nil, nil, err
		}
		return s, func() { _ = c.Close() }, nil
	}
	return nil, nil, errors.New("unknown store " + u.Scheme)
}
