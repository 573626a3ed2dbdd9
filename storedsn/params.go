package storedsn

import (
	"strconv"

	"github.com/retrysafe/retrysafe/idempotency/pgstore"
	"github.com/retrysafe/retrysafe/idempotency/redisstore"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
	"github.com/retrysafe/retrysafe/internal/durfmt"
)

// Param documents one query parameter of a store DSN that this package reads or gives a
// default of its own. The drivers read many more (every pgx and pgxpool parameter, every
// go-redis client option): Params lists those whose meaning or default is this
// package's.
type Param struct {
	Kind    string // KindSQLite, KindPostgres or KindRedis
	Name    string // as written in the DSN's query
	Value   string // what it takes
	Default string // its value when left out
	Doc     string // what it does
	Example string // a valid value, for the documentation and the tests
}

// Params returns the DSN parameters of the package doc, store by store.
func Params() []Param {
	dur := durfmt.Format
	return []Param{
		{KindSQLite, "batch", "true or false", "true", "concurrent claims and completions share transactions (group commit: one fsync per batch)", "false"},
		{KindSQLite, "gather", "a duration, or 0 for none", dur(sqlitestore.DefaultGather), "while writes come from several requests at once, the longest a transaction waits for more (half the requests open, at most 16) before it begins; a lone request never waits", "0"},

		{KindPostgres, "schema", "a schema name", "public", "the schema of the records table; removed from the URL before connecting", "retrysafe"},
		{KindPostgres, "batch", "true or false", "true", "concurrent claims and completions share statements (group commit); removed from the URL before connecting", "false"},
		{KindPostgres, "gather", "a duration, or 0 for none", dur(pgstore.DefaultGather), "while calls come from several requests at once, the longest a batch waits for more (half the requests open, at most 16) before it is sent: fewer, larger batches cost PostgreSQL less per request; a lone request never waits; removed from the URL before connecting", "1ms"},
		{KindPostgres, "host", "HOST[,HOST…] (pgx's)", "the URL's host part", "the servers; several hosts, here or in the URL, make target_session_attrs default to read-write", "h3,h4"},
		{KindPostgres, "target_session_attrs", "pgx's: read-write, any, …", "read-write when the URL names several hosts", "which host to connect to: with read-write, the one that accepts writes, so that the store follows a promotion", "read-write"},
		{KindPostgres, "pool_max_conns", "a whole number", strconv.Itoa(DefaultPoolMaxConns), "the most connections the pool opens; size max_connections for it times the gateway replicas, plus the other clients", "8"},
		{KindPostgres, "pool_min_conns", "a whole number, at most pool_max_conns", "0", "connections kept open when idle", "1"},
		{KindPostgres, "pool_max_conn_idle_time", "a duration", dur(DefaultPoolMaxConnIdleTime), "a connection idle this long is closed, so that gateways at rest leave a small server's slots to others", "30s"},
		{KindPostgres, "pool_health_check_period", "a duration", dur(DefaultPoolHealthCheckPeriod), "how often idle connections are looked at, and those idle too long closed", "5s"},
		{KindPostgres, "connect_timeout", "seconds", "none (pgx's)", "give up a host that does not answer; set it with several hosts, so that a dead primary is passed over soon", "2"},

		{KindRedis, "prefix", "a string", "retrysafe:idem:", "the prefix of the records' keys; removed from the URL before go-redis parses it", "app1:"},
		{KindRedis, "wait", "a whole number of replicas", "0", "a claim, a renewal or a completion counts only once this many replicas acknowledged it (WAIT); short of that, claims get 503 store-not-durable and answers are held", "1"},
		{KindRedis, "wait_timeout", "a duration, under the gateway's store-call bound (5s)", dur(redisstore.DefaultWaitTimeout), "the longest each WAIT waits", "2s"},
		{KindRedis, "master_name", "the Sentinel master's name", "none: not Sentinel", "the host is a Sentinel, and the store follows a failover to the master the Sentinels name, without a restart", "retrysafe"},
		{KindRedis, "addr", "HOST:PORT, repeatable", "none", "with master_name, more Sentinels; without it, the nodes of a Redis Cluster", "redis-2:6379"},
		{KindRedis, "read_timeout", "a duration", "go-redis's (3s); with wait, raised to outlast wait_timeout", "the longest a reply is waited for; with wait it must be longer than wait_timeout", "5s"},
	}
}
