package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/examples/payments/ledger"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// BenchmarkPostgresCPU measures what PostgreSQL spends on CPU per operation, which on a
// shared machine is steadier than throughput: another process's load slows a case down
// but hardly changes the CPU it costs the server. Each op of the benchmark is a round in
// which every case, in rotating order, runs a window of 2,048 operations from 32
// goroutines over one pool of 40 connections:
//
//	insert          the payments ledger's unprotected POST /payments (ledger.Server in
//	                ModeUnprotected, served in-process): one INSERT ... RETURNING
//	claim+complete  pgstore with Config.Batch, as the gateway runs it: Claim of a new key,
//	                then Complete with a 72-byte JSON body and three headers
//	replay          Claim on a completed key (one statement, a read)
//	get             Get of a completed key
//	gateway         the idempotency middleware on that store in front of the unprotected
//	                ledger (a table of its own), as the gateway puts it in front of an
//	                upstream: claim, the upstream's INSERT, completion. Minus insert, it
//	                is the store's share of a request where the upstream's write runs
//	                beside it
//	.../nobatch     the same without Config.Batch
//	tx              the ledger's POST /payments in ModeTx with batching (the payments
//	                example's default): the middleware's claim, then pgstore.WithTx
//	                around the ledger insert and the completion
//
// The tables start with 50,000 rows (PGCPU_PREFILL changes that) copied from the first
// ones the cases write, and after each window those the case writes are vacuumed and
// analyzed when autovacuum, with its default thresholds, would (the shared server may
// run without it): the plans and the index depths are those of tables in use, and the
// cleanup the writes cause is counted. CPU is the run time in /proc/PID/schedstat (the
// scheduler's count of time on a CPU, in nanoseconds: what utime+stime count in ticks
// of 10 ms):
//
//	pg-µs/op     every process of the PostgreSQL cluster (the postmaster and its
//	             children), over the window, minus the cluster's rate while idle in
//	             the 200 ms before it (other clients of a shared server)
//	be-µs/op     the pool's own backends alone, which other clients do not disturb
//	vac-µs/op    the backend that ran the vacuums and analyzes after the case's windows
//	go-µs/op     this process (getrusage), the client side, for information
//	stmts/op     statements the pool sent, those of pipelines included
//	trips/op     round trips: a statement, or a pipeline of them
//	WAL-B/op     the cluster's WAL, and syncs/op its flushes (pg_stat_wal); other
//	             clients' writes count too
//	ops/s        the windows' throughput
//
// The table (on stdout: a benchmark's log is cut short) gives each case's figures
// over all rounds and its ratios to insert; the per-round ratios of be show the
// spread. The figures to quote are claim+complete/insert, (gateway - insert)/insert
// and tx/insert. PGCPU_CASES, a regular expression, keeps only the cases it matches,
// and insert; PGCPU_CLIENTS replaces the 32 goroutines.
func BenchmarkPostgresCPU(b *testing.B) {
	const window = 2048
	ctx := context.Background()
	concurrency := clients
	if v := os.Getenv("PGCPU_CLIENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("PGCPU_CLIENTS=%q: want a positive number", v)
		}
		concurrency = n
	}
	counter := &stmtCounter{}
	backends := &pidSet{}
	var pools []*pgxpool.Pool
	// newPool makes a pool whose statements are counted and whose backends are measured;
	// edit, if not nil, adjusts its configuration.
	newPool := func(edit func(*pgxpool.Config)) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(b))
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = pgMaxConns
		cfg.ConnConfig.Tracer = counter
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			backends.add(int(c.PgConn().PID()))
			return nil
		}
		if edit != nil {
			edit(cfg)
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		pools = append(pools, pool)
		return pool
	}
	// Prepared for pgstore as the gateway prepares it (storedsn): its notice hook.
	pool := newPool(pgstore.ConfigurePool)

	postmaster, err := postmasterPID(ctx, pool)
	if err != nil {
		b.Fatal(err)
	}
	env := &pgcpuEnv{b: b, pool: pool, newPool: newPool, keys: &keySource{prefix: testenv.Name("pgcpu")},
		logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
	cases := []*cpuCase{env.ledgerCase("insert", ledger.ModeUnprotected, pool)}
	cases = append(cases, env.storeCases(newPgstore(b, "", pool, testenv.Schema(b, "pgcpu_store"), true))...)
	cases = append(cases, env.storeCases(newPgstore(b, "nobatch", pool, testenv.Schema(b, "pgcpu_nobatch"), false))...)
	cases = append(cases, env.ledgerCase("tx", ledger.ModeTx, pool))
	cases = append(cases, abCases(env)...)
	if re := os.Getenv("PGCPU_CASES"); re != "" {
		match, err := regexp.Compile(re)
		if err != nil {
			b.Fatal("PGCPU_CASES: ", err)
		}
		insert := cases[0]
		cases = slices.DeleteFunc(cases, func(c *cpuCase) bool { return c != insert && !match.MatchString(c.name) })
	}
	meter := &cpuMeter{postmaster: postmaster, backends: backends}
	// A first, unmeasured window of each case warms the connections and their
	// prepared statements. Every table then gets prefill copies of its rows, so that
	// the cases run on tables of a size a day of keys reaches rather than on empty ones,
	// and is analyzed, as autovacuum would (the shared server may run without it), so
	// that no plan is made for the empty tables of the start.
	for _, c := range cases {
		if err := runWindow(c.op, 256, concurrency); err != nil {
			b.Fatal(err)
		}
	}
	prefill := 50_000
	if v := os.Getenv("PGCPU_PREFILL"); v != "" {
		if prefill, err = strconv.Atoi(v); err != nil {
			b.Fatal("PGCPU_PREFILL: ", err)
		}
	}
	filled := map[string]bool{}
	for _, c := range cases {
		for _, t := range c.tables {
			if !filled[t] {
				filled[t] = true
				if err := fill(ctx, pool, t, prefill); err != nil {
					b.Fatal(err)
				}
			}
		}
		if _, err := maintain(ctx, pool, c.tables, true); err != nil {
			b.Fatal(err)
		}
	}

	round := 0
	for b.Loop() {
		for i := range cases {
			c := cases[(round+i)%len(cases)]
			idle, err := meter.idleRate(200 * time.Millisecond)
			if err != nil {
				b.Fatal(err)
			}
			wal0, err := walStats(ctx, pools)
			if err != nil {
				b.Fatal(err)
			}
			before, err := meter.read()
			if err != nil {
				b.Fatal(err)
			}
			stmts, trips := counter.stmts.Load(), counter.trips.Load()
			if err := runWindow(c.op, window, concurrency); err != nil {
				b.Fatal(c.name, ": ", err)
			}
			stmts, trips = counter.stmts.Load()-stmts, counter.trips.Load()-trips
			after, err := meter.read()
			if err != nil {
				b.Fatal(err)
			}
			wal, err := walStats(ctx, pools)
			if err != nil {
				b.Fatal(err)
			}
			c.wal.bytes += wal.bytes - wal0.bytes
			c.wal.syncs += wal.syncs - wal0.syncs
			c.add(before, after, idle, stmts, trips, window)
			vacuum, err := maintain(ctx, pool, c.tables, false)
			if err != nil {
				b.Fatal(err)
			}
			c.vacuum += vacuum
		}
		round++
	}
	insert := cases[0]
	// The table goes to stdout: a benchmark's log is cut after a few lines.
	fmt.Printf("%-24s %9s %9s %9s %9s %8s %8s %8s %8s %7s %8s %8s %8s %s\n", "case", "pg-µs/op", "be-µs/op", "vac-µs/op", "go-µs/op",
		"stmts/op", "trips/op", "WAL-B/op", "syncs/op", "ops/s", "pg/ins", "be/ins", "+vac/ins", "be/ins by round")
	for _, c := range cases {
		b.ReportMetric(c.perOp(c.cluster), c.name+"-pg-µs/op")
		b.ReportMetric(c.perOp(c.own), c.name+"-be-µs/op")
		byRound := make([]float64, len(c.rounds))
		for i := range c.rounds {
			byRound[i] = c.rounds[i] / insert.rounds[i]
		}
		fmt.Printf("%-24s %9.1f %9.1f %9.1f %9.1f %8.3f %8.3f %8.0f %8.3f %7.0f %8.3f %8.3f %8.3f %.2f\n", c.name, c.perOp(c.cluster), c.perOp(c.own),
			c.perOp(c.vacuum), c.perOp(c.client), float64(c.stmts)/float64(c.ops), float64(c.trips)/float64(c.ops), float64(c.wal.bytes)/float64(c.ops),
			float64(c.wal.syncs)/float64(c.ops), float64(c.ops)/c.wall.Seconds(), c.perOp(c.cluster)/insert.perOp(insert.cluster), c.perOp(c.own)/insert.perOp(insert.own),
			c.perOp(c.cluster+c.vacuum)/insert.perOp(insert.cluster+insert.vacuum), byRound)
		if c != insert {
			b.ReportMetric(c.perOp(c.cluster)/insert.perOp(insert.cluster), c.name+"/insert-pg")
		}
	}
}

// cpuCase is one case of BenchmarkPostgresCPU and its totals over the rounds.
type cpuCase struct {
	name string
	op   func() error
	// tables are the tables the case writes: after each of its windows, vacuumed and
	// analyzed when autovacuum would, on CPU of their own (vacuum).
	tables               []string
	cluster, own, client time.Duration
	vacuum               time.Duration
	wall                 time.Duration // of the windows
	stmts, trips, ops    int64
	wal                  walStat   // of the cluster
	rounds               []float64 // the pool's backends' µs/op in each round
}

func (c *cpuCase) add(before, after cpuSample, idle float64, stmts, trips int64, ops int) {
	cluster, own := after.since(before)
	cluster -= time.Duration(idle * float64(after.at.Sub(before.at)))
	c.cluster += cluster
	c.own += own
	c.client += after.client - before.client
	c.stmts += stmts
	c.trips += trips
	c.wall += after.at.Sub(before.at)
	c.ops += int64(ops)
	c.rounds = append(c.rounds, float64(own.Microseconds())/float64(ops))
}

func (c *cpuCase) perOp(d time.Duration) float64 {
	return float64(d.Nanoseconds()) / 1e3 / float64(c.ops)
}

// fill adds n copies of one of table's rows, each under a key of its own: a payment
// (payments) or a completed record (pgstore's table).
func fill(ctx context.Context, pool *pgxpool.Pool, table string, n int) error {
	var q string
	switch {
	case strings.HasSuffix(table, `."payments"`):
		q = `INSERT INTO ` + table + ` (user_id, idempotency_key, amount, currency, created_at)
SELECT p.user_id, CASE WHEN p.idempotency_key IS NOT NULL THEN 'prefill-' || g END, p.amount, p.currency, p.created_at
FROM (SELECT * FROM ` + table + ` LIMIT 1) AS p, generate_series(1, $1) AS g`
	default: // every column of a completed record, under another key
		q = `INSERT INTO ` + table + `
SELECT (jsonb_populate_record(r, jsonb_build_object('key', '\x' || encode(convert_to('prefill-' || g, 'UTF8'), 'hex')))).*
FROM (SELECT r FROM ` + table + ` AS r WHERE r.state = 'done' LIMIT 1) AS x, generate_series(1, $1) AS g`
	}
	if _, err := pool.Exec(ctx, q, n); err != nil {
		return fmt.Errorf("prefilling %s: %w", table, err)
	}
	return nil
}

// maintain vacuums and analyzes those of tables that autovacuum, with its default
// settings, would by now (always when force is set), on a connection of pool, and
// returns the CPU time its backend took: the maintenance a case's writes cost the
// server, which is PostgreSQL CPU too.
func maintain(ctx context.Context, pool *pgxpool.Pool, tables []string, force bool) (time.Duration, error) {
	if len(tables) == 0 {
		return 0, nil
	}
	c, err := pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Release()
	pid := int(c.Conn().PgConn().PID())
	t0, err := runTime(pid)
	if err != nil {
		return 0, err
	}
	for _, t := range tables {
		// autovacuum_vacuum_threshold 50 and scale factor 0.2, the insert threshold 1000
		// and scale factor 0.2, autovacuum_analyze_threshold 50 and scale factor 0.1.
		var vacuum, analyze bool
		if err := c.QueryRow(ctx, `SELECT s.n_dead_tup > 50 + 0.2 * greatest(c.reltuples, 0)
	OR s.n_ins_since_vacuum > 1000 + 0.2 * greatest(c.reltuples, 0),
	s.n_mod_since_analyze > 50 + 0.1 * greatest(c.reltuples, 0)
FROM pg_stat_user_tables AS s JOIN pg_class AS c ON c.oid = s.relid WHERE s.relid = $1::regclass`, t).Scan(&vacuum, &analyze); err != nil {
			return 0, err
		}
		q := ""
		switch {
		case force || vacuum && analyze:
			q = "VACUUM (ANALYZE) "
		case vacuum:
			q = "VACUUM "
		case analyze:
			q = "ANALYZE "
		default:
			continue
		}
		if _, err := c.Exec(ctx, q+t); err != nil {
			return 0, err
		}
	}
	t, err := runTime(pid)
	return t - t0, err
}

// runTime is the CPU time process pid has run (/proc/PID/schedstat).
func runTime(pid int) (time.Duration, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return 0, fmt.Errorf("/proc/%d/schedstat: empty", pid)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/schedstat: %w", pid, err)
	}
	return time.Duration(ns), nil
}

// walStat is the cluster's WAL position (bytes) and flushes to disk so far.
type walStat struct{ bytes, syncs int64 }

// walStats reads the cluster's WAL position and its count of WAL flushes (pg_stat_wal),
// after making every idle connection of pools report its pending statistics, which a
// backend otherwise does only every second or so.
func walStats(ctx context.Context, pools []*pgxpool.Pool) (walStat, error) {
	for _, p := range pools {
		for _, c := range p.AcquireAllIdle(ctx) {
			_, err := c.Exec(ctx, "SELECT pg_stat_force_next_flush()")
			c.Release()
			if err != nil {
				return walStat{}, err
			}
		}
	}
	var w walStat
	err := pools[0].QueryRow(ctx, "SELECT pg_current_wal_insert_lsn() - '0/0', wal_sync FROM pg_stat_wal").Scan(&w.bytes, &w.syncs)
	return w, err
}

// runWindow runs op n times from goroutines concurrent ones.
func runWindow(op func() error, n, goroutines int) error {
	var next atomic.Int64
	errs := make(chan error, goroutines)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := op(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// stmtCounter counts the statements a pool sends and the round trips they take: a
// query is one of each, a batch (pipeline) one round trip for all its statements (a
// pgx.QueryTracer and pgx.BatchTracer).
type stmtCounter struct{ stmts, trips atomic.Int64 }

func (s *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	s.stmts.Add(1)
	s.trips.Add(1)
	return ctx
}

func (s *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *stmtCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	s.stmts.Add(int64(d.Batch.Len()))
	s.trips.Add(1)
	return ctx
}

func (s *stmtCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (s *stmtCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// pidSet is the backend process IDs of a pool's connections.
type pidSet struct {
	mu   sync.Mutex
	pids []int
}

func (p *pidSet) add(pid int) {
	p.mu.Lock()
	p.pids = append(p.pids, pid)
	p.mu.Unlock()
}

func (p *pidSet) list() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.pids)
}

// postmasterPID is the parent of one of pool's backends.
func postmasterPID(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var pid int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return 0, err
	}
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("reading the backend's process (is PostgreSQL on this host?): %w", err)
	}
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	return strconv.Atoi(fields[1]) // state, then ppid
}

// cpuMeter reads the CPU time of a PostgreSQL cluster on this host.
type cpuMeter struct {
	postmaster int
	backends   *pidSet
}

// cpuSample is the run time of each process of the cluster at one instant, and this
// process's CPU time.
type cpuSample struct {
	at     time.Time
	procs  map[int]time.Duration
	own    map[int]bool // the pool's backends
	client time.Duration
}

// since is the CPU the cluster, and the pool's backends, spent from s0 to s: the sum over
// the processes alive at s of what each ran since s0 (all of it for a process started
// since). A process that exited in between is left out: the window is too short for
// that to matter, and counting its total instead would count what it ran before.
func (s cpuSample) since(s0 cpuSample) (cluster, own time.Duration) {
	for pid, t := range s.procs {
		d := t - s0.procs[pid]
		if d < 0 { // another process under a reused pid
			d = t
		}
		cluster += d
		if s.own[pid] {
			own += d
		}
	}
	return cluster, own
}

// read reads the run time of the postmaster and its children, and this process's user
// and system time.
func (m *cpuMeter) read() (cpuSample, error) {
	s := cpuSample{at: time.Now(), procs: map[int]time.Duration{}, own: map[int]bool{}}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return s, err
	}
	s.client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	for _, pid := range m.backends.list() {
		s.own[pid] = true
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return s, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pid != m.postmaster {
			raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			if err != nil {
				continue // exited
			}
			i := strings.LastIndexByte(string(raw), ')')
			fields := strings.Fields(string(raw[i+1:]))
			if len(fields) < 2 || fields[1] != strconv.Itoa(m.postmaster) {
				continue
			}
		}
		t, err := runTime(pid)
		if err != nil {
			continue // exited
		}
		s.procs[pid] = t
	}
	return s, nil
}

// idleRate is the cluster's CPU per second of wall time over d, with the pool idle.
func (m *cpuMeter) idleRate(d time.Duration) (float64, error) {
	a, err := m.read()
	if err != nil {
		return 0, err
	}
	time.Sleep(d)
	z, err := m.read()
	if err != nil {
		return 0, err
	}
	cluster, _ := z.since(a)
	return float64(cluster) / float64(z.at.Sub(a.at)), nil
}

// pgcpuEnv is what the cases of BenchmarkPostgresCPU are made with.
type pgcpuEnv struct {
	b testing.TB
	// pool is the pool of the cases; newPool makes another whose statements and
	// backends are measured in the same way.
	pool    *pgxpool.Pool
	newPool func(edit func(*pgxpool.Config)) *pgxpool.Pool
	keys    *keySource
	logger  *slog.Logger
}

// ledgerCase is the payments ledger's POST /payments in mode, in a new schema on pool
// (with batching, the example's default), each op a new payment under a new key, served
// in-process.
func (e *pgcpuEnv) ledgerCase(name string, mode ledger.Mode, pool *pgxpool.Pool) *cpuCase {
	srv, schema := e.ledger(mode, pool)
	tables := []string{pgx.Identifier{schema, "payments"}.Sanitize()}
	if mode != ledger.ModeUnprotected {
		tables = append(tables, pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize())
	}
	return &cpuCase{name: name, tables: tables, op: func() error {
		key := ""
		if mode != ledger.ModeUnprotected {
			key = e.keys.next()
		}
		return payInProcess(srv, key)
	}}
}

// ledger opens a ledger in mode in a new schema on pool, with batching.
func (e *pgcpuEnv) ledger(mode ledger.Mode, pool *pgxpool.Pool) (*ledger.Server, string) {
	e.b.Helper()
	schema := testenv.Schema(e.b, "pgcpu_"+mode.String())
	srv, err := ledger.NewPostgres(context.Background(), ledger.PostgresConfig{Config: ledger.Config{Mode: mode, Logger: e.logger},
		Pool: pool, Schema: schema, Batch: true})
	if err != nil {
		e.b.Fatal(err)
	}
	return srv, schema
}

// payInProcess serves one POST /payments in-process, under key unless it is empty.
func payInProcess(srv http.Handler, key string) error {
	req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(paymentBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer bench")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, req)
	if w.Code != http.StatusCreated {
		return &statusError{w.Code, w.Body.String()}
	}
	return nil
}

// namedStore is a store whose cases BenchmarkPostgresCPU runs, named by a suffix of the
// cases' names, and the table it writes.
type namedStore struct {
	suffix string
	store  idempotency.Store
	table  string // quoted, schema-qualified
}

// newPgstore returns a migrated pgstore in schema.
func newPgstore(b testing.TB, suffix string, pool *pgxpool.Pool, schema string, batch bool) namedStore {
	b.Helper()
	st, err := pgstore.New(pgstore.Config{Pool: pool, Schema: schema, Batch: batch})
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return namedStore{suffix, st, pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()}
}

// keySource issues new idempotency keys.
type keySource struct {
	prefix string
	n      atomic.Int64
}

func (k *keySource) next() string { return k.prefix + "-" + strconv.FormatInt(k.n.Add(1), 10) }

// pgcpuResponse is the stored response of the store cases: a payment's 201.
func pgcpuResponse() idempotency.Response {
	return idempotency.Response{Status: http.StatusCreated, Header: http.Header{
		"Content-Type": {"application/json"},
		"Location":     {"/payments/1234567"},
		"X-Request-Id": {"0f8fad5b-d9cb-469f-a165-70867728950e"},
	}, Body: []byte(`{"id":1234567,"user":"bench","amount":1250,"currency":"EUR","status":"ok"}`)}
}

// storeCases are the cases of one store, each name followed by st.suffix:
// claim+complete, replay and get on the store directly, and gateway, the idempotency
// middleware on the store in front of the unprotected ledger (in a schema of its own), as
// the gateway puts it in front of an upstream. It completes the keys the replays use
// first.
func (e *pgcpuEnv) storeCases(st namedStore) []*cpuCase {
	e.b.Helper()
	ctx := context.Background()
	fp := idempotency.Fingerprint(http.MethodPost, "/payments", "", "application/json", []byte(paymentBody), false)
	resp := pgcpuResponse()
	claimReq := func(key string) idempotency.ClaimRequest {
		return idempotency.ClaimRequest{Scope: "bench", Key: key, Fingerprint: fp,
			Lease: idempotency.DefaultLease, TTL: idempotency.DefaultTTL}
	}
	claimComplete := func(key string) error {
		req := claimReq(key)
		res, err := st.store.Claim(ctx, req)
		if err != nil {
			return err
		}
		if !res.Claimed {
			return fmt.Errorf("claim of new key %q: not claimed", key)
		}
		return st.store.Complete(ctx, idempotency.Completion{Scope: req.Scope, Key: key, Token: res.Token,
			Response: resp, TTL: req.TTL})
	}
	done := make([]string, 1024)
	for i := range done {
		done[i] = e.keys.next()
		if err := claimComplete(done[i]); err != nil {
			e.b.Fatal(err)
		}
	}
	upstream, schema := e.ledger(ledger.ModeUnprotected, e.pool)
	mw, err := idempotency.New(idempotency.Config{Store: st.store, Logger: e.logger,
		Scope: func(r *http.Request) string { u, _ := ledger.User(r); return u }})
	if err != nil {
		e.b.Fatal(err)
	}
	gateway := mw.Handler(upstream)
	var replays atomic.Int64
	suffix := ""
	if st.suffix != "" {
		suffix = "/" + st.suffix
	}
	return []*cpuCase{
		{name: "claim+complete" + suffix, tables: []string{st.table}, op: func() error { return claimComplete(e.keys.next()) }},
		{name: "replay" + suffix, op: func() error {
			res, err := st.store.Claim(ctx, claimReq(done[replays.Add(1)%int64(len(done))]))
			if err == nil && (res.Claimed || res.Existing.Response == nil) {
				err = errors.New("replay: no stored response")
			}
			return err
		}},
		{name: "get" + suffix, op: func() error {
			_, err := st.store.Get(ctx, "bench", done[replays.Add(1)%int64(len(done))])
			return err
		}},
		{name: "gateway" + suffix, tables: []string{st.table, pgx.Identifier{schema, "payments"}.Sanitize()},
			op: func() error { return payInProcess(gateway, e.keys.next()) }},
	}
}
