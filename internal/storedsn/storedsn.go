// Package storedsn opens an idempotency store from one string, the --store flag of the
// retrysafe command:
//
//	sqlite:PATH                 SQLite file at PATH (created when missing; its directory must
//	                            exist). "sqlite:" alone, and the empty string, mean
//	                            sqlite:retrysafe.db. sqlite:///abs/path is /abs/path.
//	                            Concurrent writes share transactions (sqlitestore's
//	                            Config.Batch: group commit); sqlite:PATH?batch=false turns
//	                            that off (a '?' always starts parameters).
//	postgres://…, postgresql://…
//	                            PostgreSQL through a pgxpool. Every pgx and pgxpool parameter
//	                            works (sslmode, pool_max_conns, …). One more, schema=NAME,
//	                            puts the table in that schema (default public), and
//	                            batch=false turns off pgstore's batching of concurrent claims
//	                            and completions (group commit; on by default); both are
//	                            removed from the URL before connecting, because PostgreSQL
//	                            would take them for run-time parameters and refuse the
//	                            connection.
//	redis://…, rediss://…       Redis through go-redis (redis.ParseURL: user, password, db
//	                            number in the path, client options as query parameters).
//	                            One more, prefix=P, sets the key prefix (default
//	                            "retrysafe:idem:"); it is removed before parsing. Extra
//	                            addr=HOST:PORT parameters make it a Redis Cluster client
//	                            (redis.ParseClusterURL).
//	memory:                     the in-process memstore: nothing survives the process.
//
// Open checks that the backend answers (a ping bounded by a few seconds) and returns
// errors on one line, with any password redacted.
package storedsn

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

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

// Sentinel errors of Open. Match them with errors.Is.
var (
	// ErrUnknownScheme: the DSN is none of the forms in the package doc.
	ErrUnknownScheme = errors.New("storedsn: unknown store")
	// ErrInvalid: the DSN has a known scheme but cannot be parsed or used.
	ErrInvalid = errors.New("storedsn: invalid store")
	// ErrUnreachable: the backend did not answer the ping.
	ErrUnreachable = errors.New("storedsn: store unreachable")
)

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

// Open opens the store named by dsn (see the package doc) and checks that it answers.
// logger nil means slog.Default().
func Open(ctx context.Context, dsn string, logger *slog.Logger) (*Opened, error) {
	if logger == nil {
		logger = slog.Default()
	}
	dsn = strings.TrimSpace(cmp.Or(strings.TrimSpace(dsn), Default))
	scheme, rest, ok := strings.Cut(dsn, ":")
	if !ok {
		return nil, fmt.Errorf("%w %q: want sqlite:PATH, postgres://…, redis://… or memory:", ErrUnknownScheme, redactRaw(dsn))
	}
	var (
		o   *Opened
		err error
	)
	switch strings.ToLower(scheme) {
	case "sqlite", "sqlite3":
		o, err = openSQLite(ctx, rest)
	case "postgres", "postgresql":
		o, err = openPostgres(ctx, dsn)
	case "redis", "rediss":
		o, err = openRedis(ctx, dsn)
	case "memory", "mem":
		if rest != "" && rest != "//" {
			return nil, fmt.Errorf("%w %q: memory: takes no argument", ErrInvalid, dsn)
		}
		s := memstore.New()
		o = &Opened{Store: s, Kind: KindMemory, Name: "memory:", Janitor: s, close: s.Close}
	default:
		return nil, fmt.Errorf("%w %q: want sqlite:PATH, postgres://…, redis://… or memory:", ErrUnknownScheme, redactRaw(dsn))
	}
	if err != nil {
		return nil, err
	}
	logger.DebugContext(ctx, "store opened", "store", o.Name)
	return o, nil
}

func openSQLite(ctx context.Context, path string) (*Opened, error) {
	if strings.HasPrefix(path, "//") { // sqlite:///abs/path, sqlite://rel/path
		path = path[2:]
	}
	batch := true
	if p, query, ok := strings.Cut(path, "?"); ok {
		q, err := url.ParseQuery(query)
		if err != nil {
			return nil, fmt.Errorf("%w: sqlite parameters %q: %s", ErrInvalid, query, oneLine(err.Error()))
		}
		for k, v := range q {
			b, err := strconv.ParseBool(v[len(v)-1])
			if k != "batch" || err != nil {
				return nil, fmt.Errorf("%w: sqlite parameter %s=%q: the only one is batch=true|false", ErrInvalid, k, v[len(v)-1])
			}
			batch = b
		}
		path = p
	}
	if path == "" {
		path = strings.TrimPrefix(Default, "sqlite:")
	}
	name := "sqlite:" + path
	pctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	s, err := sqlitestore.Open(pctx, sqlitestore.Config{Path: path, Batch: batch})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, name, err)
	}
	return &Opened{Store: s, Kind: KindSQLite, Name: name, Janitor: s, migrate: s.Migrate, close: s.Close}, nil
}

func openPostgres(ctx context.Context, dsn string) (*Opened, error) {
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
	q.Del("schema")
	q.Del("batch")
	u.RawQuery = q.Encode()
	name := u.Redacted()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, fmt.Errorf("%w %s: %s", ErrInvalid, name, oneLine(err.Error()))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrInvalid, name, err)
	}
	s, err := pgstore.New(pgstore.Config{Pool: pool, Schema: schema, Batch: batch})
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
	return &Opened{Store: s, Kind: KindPostgres, Name: name, Janitor: s, migrate: s.Migrate,
		close: func() error { pool.Close(); return nil }}, nil
}

func openRedis(ctx context.Context, dsn string) (*Opened, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: redis URL: %s", ErrInvalid, oneLine(urlErr(err)))
	}
	q := u.Query()
	prefix := q.Get("prefix")
	q.Del("prefix")
	cluster := q.Has("addr")
	u.RawQuery = q.Encode()
	name := u.Redacted()
	var client redis.UniversalClient
	if cluster {
		opt, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("%w %s: %s", ErrInvalid, name, oneLine(err.Error()))
		}
		client = redis.NewClusterClient(opt)
	} else {
		opt, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("%w %s: %s", ErrInvalid, name, oneLine(err.Error()))
		}
		client = redis.NewClient(opt)
	}
	s, err := redisstore.New(redisstore.Config{Client: client, Prefix: prefix})
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("%w %s: %w", ErrInvalid, name, err)
	}
	pctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	if err := s.Ping(pctx); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, name, err)
	}
	return &Opened{Store: s, Kind: KindRedis, Name: name, close: client.Close}, nil
}

// urlErr returns the message of a url.Parse error without the URL itself, which may
// hold a password.
func urlErr(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return "unparsable"
}

// redactRaw hides what looks like a password in a string that did not parse as a URL.
func redactRaw(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		return u.Redacted()
	}
	if at := strings.LastIndex(s, "@"); at >= 0 {
		if i := strings.Index(s, "://"); i >= 0 && i < at {
			return s[:i+3] + "xxxxx" + s[at:]
		}
	}
	return s
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
