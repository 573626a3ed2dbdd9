// Package storedsn opens an idempotency store from one string: the --store flag of the
// retrysafe command, the store key of its configuration file, and the store of the Caddy
// module (github.com/retrysafe/retrysafe/caddy):
//
//	sqlite:PATH                 SQLite file at PATH (created when missing; its directory must
//	                            exist). "sqlite:" alone, and the empty string, mean
//	                            sqlite:retrysafe.db. sqlite:///abs/path is /abs/path.
//	                            Concurrent writes share transactions (sqlitestore's
//	                            Config.Batch: group commit); sqlite:PATH?batch=false turns
//	                            that off (a '?' always starts parameters), and gather=DUR
//	                            sets how long, under concurrent load, a transaction waits
//	                            for more writes (Config.Gather; 0: never; default 2ms).
//	postgres://…, postgresql://…
//	                            PostgreSQL through a pgxpool. Every pgx and pgxpool parameter
//	                            works (sslmode, connect_timeout, pool_max_conns, …). Three
//	                            more: schema=NAME puts the table in that schema (default
//	                            public), batch=false turns off pgstore's batching of
//	                            concurrent claims and completions (group commit; on by
//	                            default), and gather=DUR sets how long, under concurrent
//	                            load, a batch waits for more calls (Config.Gather; 0: never;
//	                            default 5ms). They are removed from the URL before
//	                            connecting, because PostgreSQL would take them for run-time
//	                            parameters and refuse the connection.
//	redis://…, rediss://…       Redis through go-redis (redis.ParseURL: user, password, db
//	                            number in the path, client options as query parameters).
//	                            With master_name=NAME it is Redis Sentinel: the host is
//	                            a Sentinel, extra addr=HOST:PORT parameters name more
//	                            Sentinels, the user info is the Sentinels' and password=
//	                            the master's (redis.ParseFailoverURL); the store follows
//	                            a failover to the master the Sentinels name, without a
//	                            restart. Without master_name, extra addr=HOST:PORT
//	                            parameters make it a Redis Cluster client
//	                            (redis.ParseClusterURL). Three more parameters, removed
//	                            before go-redis parses the URL: prefix=P sets the key
//	                            prefix (default "retrysafe:idem:"); wait=N makes a
//	                            claim, a renewal or a completion count only once N
//	                            replicas acknowledged it (WAIT), and wait_timeout=DUR
//	                            bounds that wait (default 1s; redisstore.Config.Wait
//	                            and WaitTimeout).
//	memory:                     the in-process memstore: nothing survives the process.
//
// The PostgreSQL and Redis forms are URLs with a host part ("//" after the scheme);
// anything else after their scheme is an error, not a keyword/value string. An SQLite
// path holding a control character is an error too.
//
// Open checks that the backend answers (a ping bounded by a few seconds) and returns
// errors on one line, with any password redacted: the user info's, and the value of any
// query parameter or keyword whose name holds "password" (PostgreSQL's password and
// sslpassword). The same goes for Opened.Name.
//
// A Redis whose maxmemory-policy may evict records (anything but noeviction: every
// record has a TTL, so volatile-* policies evict them too) loses keys, and the retry of
// an evicted key runs again. Open reads the policy (CONFIG GET, or INFO memory where
// CONFIG is disabled, as on managed Redis) and refuses such a Redis with an error
// matching ErrEvicting, unless Options.Eviction allows it (then it logs a warning) or
// ignores it (tools that claim nothing). The store's Ping reads the policy again, so a
// policy changed at run time makes it fail (redisstore.EvictionError). A Redis with
// wait=N whose replicas do not acknowledge at start is opened: its store answers
// claims with errors wrapping idempotency.ErrNotDurable until they do. What the rest of
// a store's settings mean for "runs once" is not Open's to say: the stores' Inspect
// (idempotency.Inspector) reads them, for retrysafe doctor and the gateway's start.
//
// # PostgreSQL: connections
//
// The pool opens connections as requests need them and closes them when they have been
// idle a while, so that gateways at rest leave a small server's connection slots to its
// other clients. Unless the URL sets them: pool_max_conns=DefaultPoolMaxConns (4: with
// batching, the claims and the completions of any number of concurrent requests take one
// connection each), pool_min_conns=0, pool_max_conn_idle_time=DefaultPoolMaxConnIdleTime
// (10s) and pool_health_check_period=DefaultPoolHealthCheckPeriod (1s: how often idle
// connections are looked at, and those idle too long closed). Size max_connections for
// pool_max_conns times the gateway replicas, plus the other clients.
//
// # PostgreSQL: replication and failover
//
// A URL may name several hosts, postgres://user@primary:5432,standby:5432/app?…; with
// target_session_attrs=read-write (the default here when there are several hosts) pgx
// connects to the first that accepts writes, so that after a standby is promoted the
// store reconnects to it: a store call whose connection the failover broke runs once
// more on a fresh connection (pgstore), which finds the new primary. Set connect_timeout
// (seconds) so that a host that does not answer at all is given up soon.
//
// What a failover keeps is what the replication promised when the store's writes were
// acknowledged (see pgstore's "Durability and replication"). With a synchronous standby
// (synchronous_standby_names naming it, synchronous_commit on) a claim or a completion
// counts only once the standby has it, so a promoted standby holds every one: no key runs
// twice. While that standby is away, writes cannot be acknowledged: the store says so
// (idempotency.ErrNotDurable), /readyz answers 503, and new keys get 503
// store-not-durable without being forwarded, until it is back. With asynchronous
// standbys only, a failover may lose the last acknowledged claims and completions, and
// their keys may run again.
//
// # PostgreSQL: privileges
//
// Opened.Migrate (retrysafe migrate, and the gateway as it starts) creates nothing when
// the schema is complete: the gateway may then run as a role with only USAGE on the
// schema, SELECT, INSERT, UPDATE and DELETE on its table and USAGE on its sequence, once
// the schema's owner has run retrysafe migrate. When something is missing and the role
// may not create it, the error says to run retrysafe migrate as the owner.
package storedsn

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
	"github.com/retrysafe/retrysafe/idempotency/redisstore"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
)

// Default is the store used when the DSN is empty.
const Default = "sqlite:retrysafe.db"

// PingTimeout bounds the reachability check of Open.
const PingTimeout = 5 * time.Second

// The PostgreSQL pool's settings when the URL does not set them (see the package doc).
const (
	DefaultPoolMaxConns          = 4                // pool_max_conns
	DefaultPoolMaxConnIdleTime   = 10 * time.Second // pool_max_conn_idle_time
	DefaultPoolHealthCheckPeriod = time.Second      // pool_health_check_period
)

// Sentinel errors of Open. Match them with errors.Is.
var (
	// ErrUnknownScheme: the DSN is none of the forms in the package doc.
	ErrUnknownScheme = errors.New("storedsn: unknown store")
	// ErrInvalid: the DSN has a known scheme but cannot be parsed or used.
	ErrInvalid = errors.New("storedsn: invalid store")
	// ErrUnreachable: the backend did not answer the ping.
	ErrUnreachable = errors.New("storedsn: store unreachable")
	// ErrEvicting: the store is a Redis whose maxmemory-policy may evict records, and
	// Options.Eviction does not allow it. The error wraps a *redisstore.EvictionError.
	ErrEvicting = errors.New("storedsn: store may evict records")
)

// Options are what OpenWith takes beside the DSN.
type Options struct {
	// Logger receives the store's log lines. Default slog.Default().
	Logger *slog.Logger
	// Eviction is what a Redis store does about a maxmemory-policy that may evict
	// records: redisstore.EvictionRefuse (the default) fails OpenWith with ErrEvicting,
	// and the store's Ping should the policy change later; EvictionAllow opens it with
	// a warning; EvictionIgnore reads no policy, for tools that claim nothing.
	Eviction redisstore.Eviction
}

// Kinds of store, in Opened.Kind.
const (
	KindSQLite   = "sqlite"
	KindPostgres = "postgres"
	KindRedis    = "redis"
	KindMemory   = "memory"
)

// Opened is an open store and what its owner needs to run and close it.
type Opened struct {
	// Store is the idempotency store.
	Store idempotency.Store
	// Kind is one of KindSQLite, KindPostgres, KindRedis and KindMemory.
	Kind string
	// Name describes the store for logs, with any password redacted.
	Name string
	// Janitor is the store as an idempotency.Janitor when expired records must be deleted
	// by the caller (SQLite, PostgreSQL, memory), or nil when the backend expires them
	// itself (Redis).
	Janitor idempotency.Janitor

	migrate func(ctx context.Context) error
	close   func() error
}

// Migrate applies the store's schema. It is idempotent; for Redis and memory it does
// nothing.
func (o *Opened) Migrate(ctx context.Context) error {
	if o.migrate == nil {
		return nil
	}
	return o.migrate(ctx)
}

// Close releases the store's connections. Calling it again does nothing.
func (o *Opened) Close() error {
	if o.close == nil {
		return nil
	}
	c := o.close
	o.close = nil
	return c()
}

// Open opens the store named by dsn (see the package doc) and checks that it answers,
// refusing a Redis that may evict records. logger nil means slog.Default().
func Open(ctx context.Context, dsn string, logger *slog.Logger) (*Opened, error) {
	return OpenWith(ctx, dsn, Options{Logger: logger})
}

// OpenWith is Open with opt.
func OpenWith(ctx context.Context, dsn string, opt Options) (*Opened, error) {
	logger := opt.Logger
	if logger == nil {
		logger = slog.Default()
	}
	sp, err := parse(dsn)
	if err != nil {
		return nil, err
	}
	var o *Opened
	switch sp.kind {
	case KindSQLite:
		o, err = openSQLite(ctx, sp)
	case KindPostgres:
		o, err = openPostgres(ctx, sp)
	case KindRedis:
		o, err = openRedis(ctx, sp, opt.Eviction, logger)
	default:
		s := memstore.New()
		o = &Opened{Store: s, Kind: KindMemory, Name: sp.name, Janitor: s, close: s.Close}
	}
	if err != nil {
		return nil, err
	}
	logger.DebugContext(ctx, "store opened", "store", o.Name)
	return o, nil
}

// spec is a parsed DSN: what Open needs to open its store, nothing opened or dialled yet.
type spec struct {
	kind string // one of the Kind constants
	name string // Opened.Name: the DSN without its password

	path   string        // sqlite
	batch  bool          // sqlite, postgres
	gather time.Duration // sqlite, postgres: the stores' Config.Gather (negative: none)
	schema string        // postgres
	pg     *pgxpool.Config
	prefix string // redis
	redis  *redis.Options
	// cluster, when set, replaces redis: a Redis Cluster client.
	cluster *redis.ClusterOptions
	// failover, when set, replaces redis: a Sentinel failover client.
	failover    *redis.FailoverOptions
	wait        int           // redis: replicas to wait for
	waitTimeout time.Duration // redis: bound on each wait
}

// Check reports whether Open would accept dsn, without opening or connecting to
// anything: for checking a configuration before it runs. Its errors are Open's for a
// DSN it cannot parse, and never show a password.
func Check(dsn string) error {
	_, err := parse(dsn)
	return err
}

// Describe is Check that also returns the kind of store dsn names (one of the Kind
// constants) and its name as Opened.Name gives it (any password redacted), without
// opening or connecting to anything.
func Describe(dsn string) (kind, name string, err error) {
	sp, err := parse(dsn)
	if err != nil {
		return "", "", err
	}
	return sp.kind, sp.name, nil
}

// parse reads dsn (see the package doc) without opening anything. Its errors match
// ErrUnknownScheme or ErrInvalid.
func parse(dsn string) (*spec, error) {
	dsn = strings.TrimSpace(cmp.Or(strings.TrimSpace(dsn), Default))
	scheme, rest, ok := strings.Cut(dsn, ":")
	if !ok {
		return nil, fmt.Errorf("%w %q: want sqlite:PATH, postgres://…, redis://… or memory:", ErrUnknownScheme, redactRaw(dsn))
	}
	switch strings.ToLower(scheme) {
	case "sqlite", "sqlite3":
		return parseSQLite(rest)
	case "postgres", "postgresql", "redis", "rediss":
		if !strings.HasPrefix(rest, "//") {
			// Not a URL with a host part: PostgreSQL's driver would read the rest as
			// keyword/value settings whose first keyword starts with "postgres:".
			return nil, fmt.Errorf("%w %q: want %s://…", ErrInvalid, redactRaw(dsn), strings.ToLower(scheme))
		}
		if strings.HasPrefix(strings.ToLower(scheme), "redis") {
			return parseRedis(dsn)
		}
		return parsePostgres(dsn)
	case "memory", "mem":
		if rest != "" && rest != "//" {
			return nil, fmt.Errorf("%w %q: memory: takes no argument", ErrInvalid, redactRaw(dsn))
		}
		return &spec{kind: KindMemory, name: "memory:"}, nil
	}
	if strings.HasPrefix(strings.ToLower(scheme), "redis+") || strings.HasPrefix(strings.ToLower(scheme), "rediss+") {
		return nil, fmt.Errorf("%w %q: for Redis Sentinel, want redis://SENTINEL:PORT/DB?master_name=NAME&addr=OTHER_SENTINEL:PORT", ErrUnknownScheme, redactRaw(dsn))
	}
	return nil, fmt.Errorf("%w %q: want sqlite:PATH, postgres://…, redis://… or memory:", ErrUnknownScheme, redactRaw(dsn))
}

func parseSQLite(path string) (*spec, error) {
	if strings.HasPrefix(path, "//") { // sqlite:///abs/path, sqlite://rel/path
		path = path[2:]
	}
	batch := true
	var gather time.Duration
	if p, query, ok := strings.Cut(path, "?"); ok {
		q, err := url.ParseQuery(query)
		if err != nil {
			return nil, fmt.Errorf("%w: sqlite parameters %q: %s", ErrInvalid, query, oneLine(err.Error()))
		}
		for _, k := range slices.Sorted(maps.Keys(q)) { // the same error every time
			v := q[k][len(q[k])-1]
			switch k {
			case "batch":
				if batch, err = strconv.ParseBool(v); err != nil {
					return nil, fmt.Errorf("%w: sqlite parameter batch=%q: want true or false", ErrInvalid, v)
				}
			case "gather":
				if gather, err = parseGather(v); err != nil {
					return nil, fmt.Errorf("%w: sqlite parameter %w", ErrInvalid, err)
				}
			default:
				return nil, fmt.Errorf("%w: sqlite parameter %q: want batch=true|false or gather=DURATION", ErrInvalid, k+"="+v)
			}
		}
		path = p
	}
	if path == "" {
		path = strings.TrimPrefix(Default, "sqlite:")
	}
	if strings.ContainsFunc(path, unicode.IsControl) {
		// It would break the one-line errors and the logs that name the store.
		return nil, fmt.Errorf("%w: sqlite path %q holds a control character", ErrInvalid, path)
	}
	return &spec{kind: KindSQLite, name: "sqlite:" + path, path: path, batch: batch, gather: gather}, nil
}

// parseGather reads a gather parameter: a duration, 0 for none. It returns the stores'
// Config.Gather, where 0 is the default and a negative value none.
func parseGather(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if v == "0" {
		d, err = 0, nil
	}
	switch {
	case err != nil || d < 0:
		return 0, fmt.Errorf("gather=%q: want a duration such as 2ms, or 0 for none", v)
	case d == 0:
		return -1, nil
	}
	return d, nil
}

func openSQLite(ctx context.Context, sp *spec) (*Opened, error) {
	pctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	s, err := sqlitestore.Open(pctx, sqlitestore.Config{Path: sp.path, Batch: sp.batch, Gather: sp.gather})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, sp.name, err)
	}
	return &Opened{Store: s, Kind: KindSQLite, Name: sp.name, Janitor: s, migrate: s.Migrate, close: s.Close}, nil
}

func parsePostgres(dsn string) (*spec, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: postgres URL: %s", ErrInvalid, oneLine(urlErr(err)))
	}
	q := u.Query()
	schema := q.Get("schema")
	batch := true
	if v := q.Get("batch"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("%w: postgres URL: batch=%q: want true or false", ErrInvalid, v)
		}
		batch = b
	}
	var gather time.Duration
	if q.Has("gather") {
		if gather, err = parseGather(q.Get("gather")); err != nil {
			return nil, fmt.Errorf("%w: postgres URL: %w", ErrInvalid, err)
		}
	}
	q.Del("schema")
	q.Del("batch")
	q.Del("gather")
	// Several hosts: the store must write, so it connects to the one that accepts writes
	// (the primary, which a promotion may change), unless told otherwise.
	if (strings.Contains(u.Host, ",") || strings.Contains(q.Get("host"), ",")) && !q.Has("target_session_attrs") &&
		os.Getenv("PGTARGETSESSIONATTRS") == "" {
		q.Set("target_session_attrs", "read-write")
	}
	u.RawQuery = q.Encode()
	// No fragment: it means nothing to PostgreSQL, and pgx's own URL parser does not
	// read it as one (a "#?batch=false" would reach the server as a parameter).
	u.Fragment, u.RawFragment = "", ""
	name := redactURL(u)
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, fmt.Errorf("%w %s: %s", ErrInvalid, name, oneLine(driverErr(err)))
	}
	if !q.Has("pool_max_conns") {
		cfg.MaxConns = DefaultPoolMaxConns
	}
	if !q.Has("pool_max_conn_idle_time") {
		cfg.MaxConnIdleTime = DefaultPoolMaxConnIdleTime
	}
	if !q.Has("pool_health_check_period") {
		cfg.HealthCheckPeriod = DefaultPoolHealthCheckPeriod
	}
	if cfg.MinConns > cfg.MaxConns {
		return nil, fmt.Errorf("%w %s: pool_min_conns=%d is more than pool_max_conns=%d", ErrInvalid, name, cfg.MinConns, cfg.MaxConns)
	}
	pgstore.ConfigurePool(cfg)
	return &spec{kind: KindPostgres, name: name, schema: schema, batch: batch, gather: gather, pg: cfg}, nil
}

func openPostgres(ctx context.Context, sp *spec) (*Opened, error) {
	name := sp.name
	pool, err := pgxpool.NewWithConfig(ctx, sp.pg)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrInvalid, name, err)
	}
	s, err := pgstore.New(pgstore.Config{Pool: pool, Schema: sp.schema, Batch: sp.batch, Gather: sp.gather})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w %s: %w", ErrInvalid, name, err)
	}
	pctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, name, err)
	}
	migrate := func(ctx context.Context) error {
		err := s.Migrate(ctx)
		var se *pgstore.SchemaError
		switch {
		case !errors.As(err, &se):
			return err
		case se.PermissionDenied():
			return fmt.Errorf("%w; the role may not create it: run `retrysafe migrate --store %s` as the schema's owner (or a role that may create it), then start again", err, name)
		case len(se.Denied) > 0:
			return fmt.Errorf("%w; grant them to it, or run the gateway as a role that has them", err)
		}
		return err
	}
	return &Opened{Store: s, Kind: KindPostgres, Name: name, Janitor: s, migrate: migrate,
		close: func() error { pool.Close(); return nil }}, nil
}

func parseRedis(dsn string) (*spec, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: redis URL: %s", ErrInvalid, oneLine(urlErr(err)))
	}
	q := u.Query()
	prefix := q.Get("prefix")
	sentinel, cluster := q.Has("master_name"), q.Has("addr")
	wait, waitTimeout := 0, redisstore.DefaultWaitTimeout
	if v := q.Get("wait"); q.Has("wait") {
		if wait, err = strconv.Atoi(v); err != nil || wait < 0 {
			return nil, fmt.Errorf("%w: redis URL: wait=%q: want the number of replicas (0 or more)", ErrInvalid, v)
		}
	}
	if v := q.Get("wait_timeout"); q.Has("wait_timeout") {
		if waitTimeout, err = time.ParseDuration(v); err != nil || waitTimeout <= 0 {
			return nil, fmt.Errorf("%w: redis URL: wait_timeout=%q: want a positive duration (500ms, 2s)", ErrInvalid, v)
		}
	}
	// The name keeps wait and wait_timeout, which say what the store promises.
	q.Del("prefix")
	u.RawQuery = q.Encode()
	sp := &spec{kind: KindRedis, name: redactURL(u), prefix: prefix, wait: wait, waitTimeout: waitTimeout}
	q.Del("wait")
	q.Del("wait_timeout")
	u.RawQuery = q.Encode()
	var readTimeout *time.Duration
	switch {
	case sentinel:
		if sp.failover, err = redis.ParseFailoverURL(u.String()); err == nil {
			readTimeout = &sp.failover.ReadTimeout
		}
	case cluster:
		if sp.cluster, err = redis.ParseClusterURL(u.String()); err == nil {
			readTimeout = &sp.cluster.ReadTimeout
		}
	default:
		if sp.redis, err = redis.ParseURL(u.String()); err == nil {
			readTimeout = &sp.redis.ReadTimeout
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w %s: %s", ErrInvalid, sp.name, oneLine(driverErr(err)))
	}
	if wait > 0 {
		// WAIT runs in a pipeline, whose reply go-redis waits for no longer than the
		// read timeout: it must outlast wait_timeout.
		switch rt := *readTimeout; {
		case rt == 0: // go-redis's default, 3s
			*readTimeout = max(3*time.Second, waitTimeout+time.Second)
		case rt > 0 && rt <= waitTimeout:
			return nil, fmt.Errorf("%w %s: read_timeout (%s) must be longer than wait_timeout (%s)", ErrInvalid, sp.name, rt, waitTimeout)
		}
	}
	return sp, nil
}

func openRedis(ctx context.Context, sp *spec, eviction redisstore.Eviction, logger *slog.Logger) (*Opened, error) {
	name := sp.name
	var client redis.UniversalClient
	switch {
	case sp.failover != nil:
		client = redis.NewFailoverClient(sp.failover)
	case sp.cluster != nil:
		client = redis.NewClusterClient(sp.cluster)
	default:
		client = redis.NewClient(sp.redis)
	}
	s, err := redisstore.New(redisstore.Config{Client: client, Prefix: sp.prefix, Wait: sp.wait,
		WaitTimeout: sp.waitTimeout, Eviction: eviction, Logger: logger})
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("%w %s: %w", ErrInvalid, name, err)
	}
	pctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	if eviction != redisstore.EvictionIgnore {
		var ee *redisstore.EvictionError
		switch err := s.EvictionPolicy(pctx); {
		case errors.As(err, &ee) && eviction == redisstore.EvictionRefuse:
			_ = client.Close()
			return nil, fmt.Errorf("%w: %s: %w", ErrEvicting, name, err)
		case errors.As(err, &ee):
			logger.Warn("the store may evict idempotency records, as allowed by the configuration: a retry of a key whose record was evicted runs again",
				"store", name, "maxmemory_policy", ee.Policy, "node", ee.Node)
		case err != nil:
			_ = client.Close()
			return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, name, err)
		}
	}
	// A store whose replicas do not acknowledge now (wait=N) serves all the same: its
	// claims fail until they do, and it logs so.
	if err := s.Ping(pctx); err != nil && !errors.Is(err, idempotency.ErrNotDurable) {
		_ = client.Close()
		return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, name, err)
	}
	return &Opened{Store: s, Kind: KindRedis, Name: name, close: client.Close}, nil
}

// urlErr returns the message of a url.Parse error without the URL itself, which may
// hold a password, and without the pieces of it the message quotes (an invalid port or
// escape is often a piece of a password holding a '/' or a '%').
func urlErr(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return unquote(ue.Err.Error())
	}
	return "unparsable"
}

// driverErr returns the message of a driver's parse error without the connection string
// it quotes between backquotes (pgx redacts passwords there on a best-effort basis only;
// the error names the store, redacted) and without the pieces of input it quotes.
func driverErr(err error) string {
	msg := err.Error()
	if i := strings.IndexByte(msg, '`'); i >= 0 {
		if j := strings.IndexByte(msg[i+1:], '`'); j >= 0 {
			msg = strings.TrimRight(msg[:i], " ") + msg[i+1+j+1:]
		}
	}
	return unquote(msg)
}

// unquote replaces each string quoted with %q in msg by "…".
func unquote(msg string) string {
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		if msg[i] != '"' {
			b.WriteByte(msg[i])
			continue
		}
		for i++; i < len(msg) && msg[i] != '"'; i++ {
			if msg[i] == '\\' {
				i++
			}
		}
		b.WriteString(`"…"`)
	}
	return b.String()
}

// redactURL is u as a string without its secrets: the password of its user info and the
// values of its query parameters whose name holds "password" (PostgreSQL's password and
// sslpassword) are xxxxx, and the fragment, which no store reads, is left out.
func redactURL(u *url.URL) string {
	v := *u
	v.Fragment, v.RawFragment = "", ""
	q := v.Query() // drops what it cannot parse, so nothing unparsed stays behind
	secret := false
	for k, vals := range q {
		if strings.Contains(strings.ToLower(k), "password") {
			secret = true
			for i := range vals {
				vals[i] = "xxxxx"
			}
		}
	}
	if secret {
		v.RawQuery = q.Encode()
	}
	return v.Redacted()
}

// redactRaw hides what looks like a password in a string that may not parse as a URL:
// the values of keywords whose name holds "password" (password=…, as in PostgreSQL's
// keyword/value form), then the password of the URL it is, or the user info of what
// looks like one (with or without the "//").
func redactRaw(s string) string {
	s = redactKeywords(s)
	if u, err := url.Parse(s); err == nil && u.Opaque == "" {
		return redactURL(u)
	}
	if at := strings.LastIndex(s, "@"); at >= 0 {
		if i := strings.Index(s, "://"); i >= 0 && i < at {
			return s[:i+3] + "xxxxx" + s[at:]
		}
		// scheme:user:password@host, written without "//": the user info is what
		// follows the scheme's colon.
		if i := strings.Index(s, ":"); i >= 0 && i < at {
			return s[:i+1] + "xxxxx" + s[at:]
		}
	}
	return s
}

// redactKeywords replaces by xxxxx the value of each key=value word of s whose key holds
// "password", wherever such a word starts: at the start of s or after a space, tab, &,
// ?, ; or #. A value ends before a space, tab, & or #.
func redactKeywords(s string) string {
	const starts, ends = " \t&?;#", " \t&#"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if i == 0 || strings.IndexByte(starts, s[i-1]) >= 0 {
			eq := strings.IndexByte(s[i:], '=')
			if eq >= 0 && !strings.ContainsAny(s[i:i+eq], starts) && strings.Contains(strings.ToLower(s[i:i+eq]), "password") {
				val := i + eq + 1
				n := strings.IndexAny(s[val:], ends)
				if n < 0 {
					n = len(s) - val
				}
				b.WriteString(s[i:val] + "xxxxx")
				i = val + n - 1
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
