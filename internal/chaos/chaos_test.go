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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/faultproxy"
	"github.com/retrysafe/retrysafe/internal/payclient"
	"github.com/retrysafe/retrysafe/internal/storedsn"
	"github.com/retrysafe/retrysafe/internal/testenv"
	"github.com/retrysafe/retrysafe/retry"
)

// The suite's fixed parameters.
const (
	clients        = 32
	lease          = 2 * time.Second
	attemptTimeout = time.Second
	patience       = 60 * time.Second // one logical payment's bound; also the drain's
	// Fault rates of each proxy: per connection, then per request.
	rateRefuse, rateBlackHole                    = 0.02, 0.02
	rateReadTimeout, rateReset, rateResponseLost = 0.03, 0.04, 0.04
)

// storeCase is one store the suite runs against.
type storeCase struct {
	name      string
	replicas  int
	load      time.Duration // default load duration
	restartPG bool          // restart the disposable PostgreSQL once (it holds the store)
	dsn       func(t *testing.T, c *pgCluster) (dsn, desc string)
}

func storeCases() []storeCase {
	return []storeCase{
		{name: "postgres", replicas: 2, load: 40 * time.Second, restartPG: true,
			dsn: func(t *testing.T, c *pgCluster) (string, string) {
				return c.URL() + "&schema=idem_chaos&pool_max_conns=16",
					"PostgreSQL, the disposable cluster (schema idem_chaos), shared by both replicas"
			}},
		{name: "sqlite", replicas: 1, load: 25 * time.Second,
			dsn: func(t *testing.T, _ *pgCluster) (string, string) {
				path := filepath.Join(t.TempDir(), "keys.db")
				return "sqlite:" + path, "SQLite file " + path + ", kept across the kills"
			}},
		{name: "redis", replicas: 2, load: 25 * time.Second,
			dsn: func(t *testing.T, _ *pgCluster) (string, string) {
				base := testenv.RedisURL(t)
				prefix := testenv.Name("chaos") + ":"
				t.Cleanup(func() { deleteRedisPrefix(base, prefix) })
				sep := "?"
				if strings.Contains(base, "?") {
					sep = "&"
				}
				return base + sep + "prefix=" + url.QueryEscape(prefix),
					"the machine's shared Redis, key prefix " + prefix + ", shared by both replicas (Redis itself is not restarted)"
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
	naive bool
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
	if v := os.Getenv("RETRYSAFE_CHAOS_NAIVE_UPSTREAM"); v == "1" || strings.EqualFold(v, "true") {
		s.naive = true
	}
	return s
}

// TestChaos is the exactly-once chaos suite: for each store, 32 clients make payments
// through fault proxies and gateway processes that are killed and restarted, to a
// payments upstream on a PostgreSQL ledger, and the ledger, the store and what the
// clients saw are checked against each other. See the package doc.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: the exactly-once chaos suite takes about 3 minutes; skipped with -short")
	}
	set := readSettings(t)
	cases := storeCases()
	planned := time.Duration(0)
	for _, sc := range cases {
		planned += cmpOr(set.load, sc.load) + 20*time.Second // setup, drain, the lease, checks
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

// runStore runs the suite against one store.
func runStore(t *testing.T, cluster *pgCluster, bin string, sc storeCase, set settings, seed uint64) {
	ctx := t.Context()
	began := time.Now()
	load := cmpOr(set.load, sc.load)
	quiet := slog.New(slog.DiscardHandler)
	rep := Report{Store: sc.name, Replicas: sc.replicas, Seed: seed, Lease: lease, Load: load, Clients: clients, NaiveUpstream: set.naive}

	dsn, storeDesc := sc.dsn(t, cluster) // skips t when Redis is absent

	// The payments upstream, its ledger in the disposable cluster.
	up, err := startUpstream(ctx, cluster.URL(), "ledger_"+sc.name, set.naive, quiet)
	if err != nil {
		t.Fatalf("chaos: %v", err)
	}
	var upClose sync.Once
	closeUpstream := func() { upClose.Do(up.close) }
	t.Cleanup(closeUpstream)

	// The gateway replicas: processes of the binary, one store.
	gwArgs := []string{"--upstream", up.URL(), "--store", dsn, "--lease", lease.String(), "--ttl", "1h", "--upstream-timeout", "6s"}
	replicas := make([]*replica, sc.replicas)
	for i := range replicas {
		r := newReplica(fmt.Sprintf("%s-%d", sc.name, i+1), bin, gwArgs...)
		if err := r.start(ctx); err != nil {
			t.Fatalf("chaos: gateway %v", err)
		}
		t.Cleanup(func() { r.kill() })
		replicas[i] = r
	}

	// A fault proxy in front of each replica.
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
	upDesc := "dedupes on the forwarded Idempotency-Key: the ledger's UNIQUE (user_id, idempotency_key)"
	if set.naive {
		upDesc = "NOT idempotency-aware (RETRYSAFE_CHAOS_NAIVE_UPSTREAM): a row per delivery"
	}
	rep.Setup = []string{
		fmt.Sprintf("clients   %d × retry.Transport with AutoKey (attempt timeout %s, no budget), each attempt to the next proxy in turn", clients, attemptTimeout),
		fmt.Sprintf("network   a fault proxy per replica: refuse %.0f%%, black hole %.0f%% of connections; read timeout %.0f%%, reset %.0f%%, response lost %.0f%% of requests; latency 1–3ms",
			100*rateRefuse, 100*rateBlackHole, 100*rateReadTimeout, 100*rateReset, 100*rateResponseLost),
		fmt.Sprintf("gateways  %d × `retrysafe gateway` process, --lease %s, store: %s", len(replicas), lease, storeDesc),
		"upstream  POST /payments on a PostgreSQL ledger (disposable cluster, fsync on), no idempotency layer; " + upDesc,
		"chaos     " + chaos,
	}

	// The clients.
	var st payclient.Counts
	base := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConnsPerHost: clients,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	defer base.CloseIdleConnections()
	hc := &http.Client{Transport: &retry.Transport{
		Base:    &payclient.Observer{Base: base, Counts: &st, Targets: targets},
		AutoKey: true,
		// Many attempts and short waits, no budget: the clients want a final answer. The
		// server's Retry-After (409, 503) is honoured.
		Policy:         retry.Policy{MaxAttempts: 40, Base: 10 * time.Millisecond, Cap: 250 * time.Millisecond},
		NoBudget:       true,
		AttemptTimeout: attemptTimeout,
	}}

	loadStart := time.Now()
	loadEnd := loadStart.Add(load)
	runCtx, cancelRun := context.WithDeadline(ctx, loadEnd.Add(patience))
	defer cancelRun()
	payments := make([][]Payment, clients)
	var clientsWG sync.WaitGroup
	for i := range clients {
		clientsWG.Go(func() {
			c := &client{pc: &payclient.Client{HC: hc, URL: "http://" + targets[0] + "/payments", User: fmt.Sprintf("client-%02d", i+1),
				Counts: &st, Backoff: 20 * time.Millisecond, Patience: patience, Final: payclient.FinalStatus},
				rng: rand.New(rand.NewPCG(seed, uint64(i)))}
			for n := 0; time.Now().Before(loadEnd) && runCtx.Err() == nil; n++ {
				payments[i] = append(payments[i], c.pay(runCtx, fmt.Sprintf("%s-c%02d-%06d", sc.name, i+1, n)))
			}
		})
	}

	// The chaos: kills and restarts of the replicas and, once, of PostgreSQL.
	chaosCtx, stopChaos := context.WithDeadline(ctx, loadEnd)
	defer stopChaos()
	var chaosWG sync.WaitGroup
	var chaosMu sync.Mutex
	var chaosErrs []error
	var killTimes []kill
	chaosFail := func(err error) {
		chaosMu.Lock()
		chaosErrs = append(chaosErrs, err)
		chaosMu.Unlock()
	}
	chaosWG.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 0x6b696c6c)) // "kill"
		for {
			wait := 1500*time.Millisecond + time.Duration(rng.Int64N(int64(3500*time.Millisecond)))
			r := replicas[rng.IntN(len(replicas))]
			down := time.Duration(rng.Int64N(int64(time.Second)))
			select {
			case <-chaosCtx.Done():
				return
			case <-time.After(wait):
			}
			killedAt := time.Now()
			killed := r.kill()
			time.Sleep(down)
			if err := r.start(ctx); err != nil {
				chaosFail(fmt.Errorf("restarting gateway %w", err))
				return
			}
			chaosMu.Lock()
			if killed {
				rep.Kills++
				killTimes = append(killTimes, kill{replica: r.name, t: killedAt})
			}
			rep.Restarts++
			chaosMu.Unlock()
		}
	})
	if sc.restartPG {
		chaosWG.Go(func() {
			rng := rand.New(rand.NewPCG(seed, 0x70677265)) // "pgre"
			at := load*3/10 + time.Duration(rng.Int64N(int64(load*3/10)))
			select {
			case <-chaosCtx.Done():
				return
			case <-time.After(at):
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
			kills := rep.Kills
			chaosMu.Unlock()
			t.Logf("chaos: %s: %5.1fs  payments %6d  attempts %6d  replays %5d  409s %5d  kills %d",
				sc.name, time.Since(loadStart).Seconds(), st.Payments.Load(), st.Attempts.Load(), st.Replays.Load(), st.Conflicts.Load(), kills)
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
	// read.
	base.CloseIdleConnections()
	for _, p := range proxies {
		rep.Faults = addStats(rep.Faults, p.Stats())
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
	rep.Upstream = up.Stats()
	attributeReforwards(&rep, up.ReforwardsAfterAnswer(), replicas, killTimes)
	closeUpstream()

	var all []Payment
	for _, ps := range payments {
		all = append(all, ps...)
	}
	rep.Checks = Check(all, rows, records, listed)
	rep.Attempts, rep.Resends, rep.Replays = st.Attempts.Load(), st.Resends.Load(), st.Replays.Load()
	rep.Conflicts, rep.ServerErrors, rep.TransportErrors = st.Conflicts.Load(), st.ServerErrors.Load(), st.TransportErrors.Load()
	rep.Outcomes = map[string]int64{}
	for _, r := range replicas {
		o, warn := r.Outcomes()
		for k, v := range o {
			rep.Outcomes[k] += v
		}
		rep.GatewayWarnings += warn
		rep.UnexpectedExits = append(rep.UnexpectedExits, r.Unexpected()...)
		_, failed := r.Starts()
		rep.FailedStarts += failed
	}
	rep.Elapsed = time.Since(began)

	var buf bytes.Buffer
	rep.WriteTable(&buf)
	t.Log("\n" + buf.String())
	if testing.Verbose() {
		fmt.Print(buf.String())
	}
	if !rep.OK() {
		for _, r := range replicas {
			t.Logf("gateway %s, last log lines worth keeping:\n%s", r.name, r.Tail(30))
		}
		t.Errorf("chaos: %s: exactly-once did not hold (see the table)", sc.name)
	}
	if rep.Checks.Succeeded == 0 || rep.Kills == 0 || rep.Faults.Faults == 0 || sc.restartPG && rep.PGRestarts != 1 {
		t.Errorf("chaos: %s: the run did not exercise the system: %d payments succeeded, %d kills, %d faults, %d PostgreSQL restarts",
			sc.name, rep.Checks.Succeeded, rep.Kills, rep.Faults.Faults, rep.PGRestarts)
	}
}

// storeRecords lists every record of the store dsn names.
func storeRecords(ctx context.Context, dsn string, logger *slog.Logger) ([]StoreRecord, error) {
	o, err := storedsn.Open(ctx, dsn, logger)
	if err != nil {
		return nil, fmt.Errorf("opening the store to check it: %w", err)
	}
	defer o.Close()
	l, ok := o.Store.(idempotency.Lister)
	if !ok {
		return nil, errors.New("the store cannot list its records")
	}
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

// kill is one SIGKILL of a replica.
type kill struct {
	replica string
	t       time.Time
}

// attributeReforwards finds out, from the gateways' request logs and the kills, why
// each re-forward after a 201 happened: why the gateway that got that 201 never stored
// it.
func attributeReforwards(rep *Report, rfs []reforward, replicas []*replica, kills []kill) {
	for _, rf := range rfs {
		var outs []string
		for _, r := range replicas {
			outs = append(outs, r.KeyOutcomes(rf.key)...)
		}
		executed, storeErr, leaseLost := 0, false, false
		for _, o := range outs {
			o, _, _ = strings.Cut(o, "@")
			name, status, _ := strings.Cut(o, "/")
			switch {
			case name == "executed":
				executed++
			case name == "store-error" && status != "503": // 503: the claim failed, nothing ran
				storeErr = true
			case name == "lease-lost":
				leaseLost = true
			}
		}
		// A replica killed while the upstream executed the first delivery, or after it
		// answered and before the completion: the upstream finishes what reached it
		// whatever happens to the gateway's connection.
		var killed []string
		for _, k := range kills {
			if k.t.After(rf.arrivedAt.Add(-100*time.Millisecond)) && k.t.Before(rf.at) {
				killed = append(killed, k.replica+" at "+k.t.Format("15:04:05.000"))
			}
		}
		switch {
		case storeErr:
			rep.ReforwardStoreError++
		case leaseLost:
			rep.ReforwardLeaseLost++
		case executed <= 1 && len(killed) > 0:
			// The first delivery's gateway never logged the request: it died first.
			rep.ReforwardKilled++
		default:
			rep.ReforwardOther++
			if len(rep.ReforwardEvidence) < 5 {
				rep.ReforwardEvidence = append(rep.ReforwardEvidence, fmt.Sprintf(
					"key %s: arrived %s, answered 201 %s, delivered again %s; gateway request lines %q; kills in between %v",
					rf.key, rf.arrivedAt.Format("15:04:05.000"), rf.answeredAt.Format("15:04:05.000"), rf.at.Format("15:04:05.000"), outs, killed))
			}
		}
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
	a.Faults += b.Faults
	a.UpstreamErrors += b.UpstreamErrors
	return a
}
