package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// newPool returns a pool on rawURL prepared by pgstore.ConfigurePool, as the gateway's
// is, closed when t ends. edit, if not nil, adjusts the configuration first.
func newPool(t *testing.T, rawURL string, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	pgstore.ConfigurePool(cfg)
	if edit != nil {
		edit(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newStore returns a migrated store in a fresh schema of pool, dropped when t ends.
func newStore(t *testing.T, pool *pgxpool.Pool) (*pgstore.Store, string) {
	t.Helper()
	return newStoreConfig(t, pgstore.Config{Pool: pool})
}

// newStoreConfig is newStore with cfg (its Schema is replaced).
func newStoreConfig(t *testing.T, cfg pgstore.Config) (*pgstore.Store, string) {
	t.Helper()
	st, schema := unmigratedConfig(t, cfg)
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return st, schema
}

// unmigrated returns a store in a schema that does not exist yet, dropped when t ends.
func unmigrated(t *testing.T, pool *pgxpool.Pool) (*pgstore.Store, string) {
	t.Helper()
	return unmigratedConfig(t, pgstore.Config{Pool: pool})
}

// unmigratedConfig is unmigrated with cfg (its Schema is replaced). The schema is dropped
// on a connection of its own, so cfg.Pool may be shared by stores of many schemas; its
// idle connections hold no lock that the drop would wait for.
func unmigratedConfig(t *testing.T, cfg pgstore.Config) (*pgstore.Store, string) {
	t.Helper()
	schema := testenv.Schema(t, "rs")
	cfg.Schema = schema
	st, err := pgstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st, schema
}

func TestConformance(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%t", batch), func(t *testing.T) {
			t.Parallel()
			conformance(t, batch)
		})
	}
}

func conformance(t *testing.T, batch bool) {
	pool := newPool(t, testenv.PostgresURL(t), func(c *pgxpool.Config) { c.MaxConns = 16 })
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T, clock func() time.Time) idempotency.Store {
			st, _ := newStoreConfig(t, pgstore.Config{Pool: pool, Batch: batch, Clock: clock})
			return st
		},
		Down: func(t *testing.T) idempotency.Store {
			dead := newPool(t, "postgres://postgres@"+testenv.DeadAddr(t)+"/test?sslmode=disable&connect_timeout=2", nil)
			st, err := pgstore.New(pgstore.Config{Pool: dead, Batch: batch})
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
	})
}

func TestNew(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://127.0.0.1:1/none") // lazy: never dialled
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, tc := range []struct {
		name string
		cfg  pgstore.Config
		ok   bool
	}{
		{"defaults", pgstore.Config{Pool: pool}, true},
		{"names", pgstore.Config{Pool: pool, Schema: "app_1", Table: "_keys"}, true},
		{"nil pool", pgstore.Config{}, false},
		{"upper case", pgstore.Config{Pool: pool, Schema: "App"}, false},
		{"quote", pgstore.Config{Pool: pool, Table: `a"; DROP TABLE x; --`}, false},
		{"leading digit", pgstore.Config{Pool: pool, Table: "1keys"}, false},
		{"schema too long", pgstore.Config{Pool: pool, Schema: strings.Repeat("s", 64)}, false},
		{"table too long", pgstore.Config{Pool: pool, Table: strings.Repeat("t", 49)}, false},
	} {
		if _, err := pgstore.New(tc.cfg); (err == nil) != tc.ok {
			t.Errorf("%s: New error %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestMigrateIdempotent(t *testing.T) {
	t.Parallel()
	pool := newPool(t, testenv.PostgresURL(t), nil)
	st, _ := newStore(t, pool) // migrated once
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}

	// Replicas starting together on a database without the schema.
	fresh, _ := unmigrated(t, pool)
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- fresh.Migrate(t.Context()) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Migrate: %v", err)
		}
	}
}

// counter counts the statements pgx runs (QueryTracer) and the writes on the wire: a
// round trip is one write of a request followed by the read of its answer.
type counter struct{ queries, writes atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.queries.Add(1)
	return ctx
}

func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

type countingConn struct {
	net.Conn
	c *counter
}

func (cc countingConn) Write(b []byte) (int, error) {
	cc.c.writes.Add(1)
	return cc.Conn.Write(b)
}

func (c *counter) reset() (queries, writes int64) { return c.queries.Swap(0), c.writes.Swap(0) }

func TestRoundTrips(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%t", batch), func(t *testing.T) {
			t.Parallel()
			roundTrips(t, batch)
		})
	}
}

func roundTrips(t *testing.T, batch bool) {
	var n counter
	pool := newPool(t, testenv.PostgresURL(t), func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1 // one connection, whose statements the warm-up prepares
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		cfg.ConnConfig.Tracer = &n
		dial := cfg.ConnConfig.DialFunc
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{conn, &n}, nil
		}
	})
	st, _ := newStoreConfig(t, pgstore.Config{Pool: pool, Batch: batch})
	ctx := t.Context()
	execute := func(key string) (idempotency.ClaimResult, error) {
		res, err := st.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "f",
			Lease: time.Minute, TTL: time.Hour})
		if err != nil || !res.Claimed {
			return res, err
		}
		return res, st.Complete(ctx, idempotency.Completion{Scope: "s", Key: key, Token: res.Token,
			Response: idempotency.Response{Status: 201, Body: []byte("ok")}, TTL: time.Hour})
	}
	if _, err := execute("warm-up"); err != nil {
		t.Fatal(err)
	}

	n.reset()
	if res, err := execute("k"); err != nil || !res.Claimed {
		t.Fatalf("first execution: %+v, %v", res, err)
	}
	if q, w := n.reset(); q > 2 || w > 2 {
		t.Errorf("first execution (claim + complete): %d statements, %d round trips; want at most 2", q, w)
	}
	res, err := execute("k")
	if err != nil || res.Claimed || res.Existing == nil || res.Existing.Response == nil || string(res.Existing.Response.Body) != "ok" {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	if q, w := n.reset(); q != 1 || w != 1 {
		t.Errorf("replay: %d statements, %d round trips; want 1", q, w)
	}
}

// The transaction-mode contract, on stores sharing a pool, each with its business table
// in its own schema.
func TestTx(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%t", batch), func(t *testing.T) {
			t.Parallel()
			pool := newPool(t, testenv.PostgresURL(t), func(c *pgxpool.Config) { c.MaxConns = 8 })
			idempotencytest.RunTx(t, idempotencytest.TxHarness{New: func(t *testing.T, clock func() time.Time) idempotencytest.TxStore {
				st, schema := newStoreConfig(t, pgstore.Config{Pool: pool, Batch: batch, Clock: clock})
				ledger := pgx.Identifier{schema, "ledger"}.Sanitize()
				if _, err := pool.Exec(t.Context(), "CREATE TABLE "+ledger+" (name text NOT NULL)"); err != nil {
					t.Fatal(err)
				}
				return idempotencytest.TxStore{
					Store: st,
					WithTx: func(ctx context.Context, work idempotencytest.TxWork) (idempotency.Response, error) {
						return st.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error) {
							return work(ctx, func(row string) error {
								_, err := tx.Exec(ctx, "INSERT INTO "+ledger+" VALUES ($1)", row)
								return err
							})
						})
					},
					Rows: func(t *testing.T, row string) int {
						t.Helper()
						var n int
						if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+ledger+" WHERE name = $1", row).Scan(&n); err != nil {
							t.Fatal(err)
						}
						return n
					},
				}
			}})
		})
	}
}

// A connection that fails during COMMIT leaves WithTx not knowing the outcome: it reads
// the record on another connection, whose completion witnesses the commit.
func TestWithTxCommitInterrupted(t *testing.T) {
	t.Parallel()
	pool := newPool(t, testenv.PostgresURL(t), nil)
	st, schema := newStore(t, pool) // on the server's clock
	ledger := schema + ".ledger"
	if _, err := pool.Exec(t.Context(), "CREATE TABLE "+ledger+" (key text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	const scope = `s\x41` + "\x00" // bytes that text or bytea literals would mangle
	want := idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Raw": {"\xff"}},
		Body: []byte(`{"id":1}`)}
	const ttl = 2 * time.Hour
	// claim claims key on st (a lease of a minute) and returns a context carrying the
	// claim.
	claim := func(t *testing.T, st *pgstore.Store, key string) (context.Context, int64) {
		t.Helper()
		res, err := st.Claim(t.Context(), idempotency.ClaimRequest{Scope: scope, Key: key, Fingerprint: "f",
			Lease: time.Minute, TTL: time.Hour})
		if err != nil || !res.Claimed {
			t.Fatalf("Claim %s: %+v, %v", key, res, err)
		}
		c := idempotency.NewClaim(scope, key, "f", res.Token, ttl)
		return idempotency.NewContext(t.Context(), c), res.Token
	}
	insert := func(key string) func(context.Context, pgx.Tx) (idempotency.Response, error) {
		return func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error) {
			_, err := tx.Exec(ctx, "INSERT INTO "+ledger+" VALUES ($1)", key)
			return want, err
		}
	}
	booked := func(t *testing.T, key string) bool {
		t.Helper()
		var n int
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+ledger+" WHERE key = $1", key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	record := func(t *testing.T, key string) *idempotency.Record {
		t.Helper()
		rec, err := st.Get(t.Context(), scope, key)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}

	t.Run("commit reply lost", func(t *testing.T) {
		t.Parallel()
		proxy := commitProxy(t, false)
		pst, err := pgstore.New(pgstore.Config{Pool: newPool(t, proxy.url, nil), Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		ctx, _ := claim(t, st, "lost-reply")
		if got, err := pst.WithTx(ctx, insert("lost-reply")); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("WithTx = %+v, %v; want the response: the commit happened", got, err)
		}
		if !proxy.broke.Load() {
			t.Fatal("the proxy saw no completion and COMMIT to break")
		}
		if rec := record(t, "lost-reply"); rec.State != idempotency.StateDone || !booked(t, "lost-reply") {
			t.Errorf("record state %s, booked %v; want done and booked", rec.State, booked(t, "lost-reply"))
		}
	})

	t.Run("commit never arrives", func(t *testing.T) {
		t.Parallel()
		proxy := commitProxy(t, true)
		pst, err := pgstore.New(pgstore.Config{Pool: newPool(t, proxy.url, nil), Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		ctx, tok := claim(t, st, "lost-commit")
		if _, err := pst.WithTx(ctx, insert("lost-commit")); !errors.Is(err, pgstore.ErrCommitUnknown) || !proxy.broke.Load() {
			t.Fatalf("WithTx error %v (proxy broke the round trip: %t), want ErrCommitUnknown (the transaction is still open)",
				err, proxy.broke.Load())
		}
		// The completion went with the COMMIT, so the open transaction holds no lock on
		// the record: the release WithTx asked for deletes it at once.
		if err := st.Release(t.Context(), scope, "lost-commit", tok); err != nil {
			t.Fatalf("Release: %v", err)
		}
		// The completion and COMMIT reach the server late: the completion finds no record,
		// and the transaction, business write included, cannot commit.
		proxy.deliver()
		aborted := func() bool {
			var n int
			if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
				WHERE state = 'idle in transaction (aborted)' AND position($1 in query) > 0`, schema).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n > 0
		}
		if !eventually(aborted) {
			t.Fatal("the late completion did not abort the transaction")
		}
		proxy.hangUp()
		if booked(t, "lost-commit") {
			t.Error("the business write committed")
		}
		if _, err := st.Get(t.Context(), scope, "lost-commit"); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("record after the release and the late completion: %v, want ErrNotFound", err)
		}
	})
}

// txProxy is a TCP proxy to the test database that breaks the round trip carrying a
// WithTx completion and its COMMIT (see commitProxy).
type txProxy struct {
	url string
	// hangUp closes every connection.
	hangUp func()
	// deliver sends the round trip that was held back to the server.
	deliver func()
	// broke is set once the proxy has broken the round trip.
	broke atomic.Bool
}

// commitProxy returns a proxy to the test database that breaks the first round trip of
// a WithTx completion and COMMIT: the write after the one that prepares the completion
// (pgx prepares a statement in a round trip of its own the first time a connection runs
// it). With loseCommit it holds that write back and hangs up on the client, while the
// server side stays open, in the transaction, until hangUp; deliver then sends it late.
// Otherwise it forwards the write, swallows the reply and hangs up on the client.
func commitProxy(t *testing.T, loseCommit bool) *txProxy {
	t.Helper()
	u, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	completion := []byte("SELECT 1 / count(*)::int FROM u")
	var (
		armed, prepared atomic.Bool
		mu              sync.Mutex
		conns           []net.Conn
		held            []byte
		heldOn          net.Conn
		wg              sync.WaitGroup
	)
	armed.Store(true)
	p := &txProxy{}
	p.hangUp = func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	}
	p.deliver = func() {
		mu.Lock()
		defer mu.Unlock()
		if heldOn != nil {
			if _, err := heldOn.Write(held); err != nil {
				t.Errorf("delivering the held round trip: %v", err)
			}
		}
	}
	t.Cleanup(func() { p.hangUp(); wg.Wait() })
	wg.Go(func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			var dropReply atomic.Bool
			wg.Go(func() { // client to server
				buf := make([]byte, 64<<10)
				for {
					n, err := client.Read(buf)
					if err != nil {
						return
					}
					switch {
					case armed.Load() && bytes.Contains(buf[:n], completion):
						prepared.Store(true)
					case prepared.Load() && armed.CompareAndSwap(true, false):
						p.broke.Store(true)
						if loseCommit {
							mu.Lock()
							held, heldOn = bytes.Clone(buf[:n]), server
							mu.Unlock()
							_ = client.Close()
							return
						}
						dropReply.Store(true)
					}
					if _, err := server.Write(buf[:n]); err != nil {
						return
					}
				}
			})
			wg.Go(func() { // server to client
				buf := make([]byte, 64<<10)
				for {
					n, err := server.Read(buf)
					if err != nil || dropReply.Load() {
						_ = client.Close()
						return
					}
					if _, err := client.Write(buf[:n]); err != nil {
						return
					}
				}
			})
		}
	})
	u.Host = l.Addr().String()
	p.url = u.String()
	return p
}

// A replay, a 409 and a 422 are reads: they take no row lock, so they neither queue
// behind each other nor behind a transaction holding the record (as a transaction-mode
// handler does while it runs), and they write no WAL.
func TestAnswersFromExistingRecordTakeNoLock(t *testing.T) {
	t.Parallel()
	pool := newPool(t, testenv.PostgresURL(t), nil)
	st, schema := newStore(t, pool)
	ctx := t.Context()
	req := func(key, fp string) idempotency.ClaimRequest {
		return idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour}
	}
	done, err := st.Claim(ctx, req("done", "f"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, idempotency.Completion{Scope: "s", Key: "done", Token: done.Token,
		Response: idempotency.Response{Status: 201}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Claim(ctx, req("busy", "f")); err != nil {
		t.Fatal(err)
	}

	// Another transaction locks both rows and keeps them locked.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	table := pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()
	if _, err := tx.Exec(ctx, "SELECT FROM "+table+" WHERE key IN ('\\x646f6e65'::bytea, '\\x62757379'::bytea) FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ key, fp string }{{"done", "f"}, {"busy", "f"}, {"done", "other"}} {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		res, err := st.Claim(cctx, req(c.key, c.fp))
		cancel()
		if err != nil || res.Claimed || res.Existing == nil {
			t.Errorf("Claim(%s, %s) behind a row lock: %+v, %v; want the existing record at once", c.key, c.fp, res, err)
		}
	}
}

// With Config.Batch, concurrent claims and completions share statements, and each call
// still gets its own outcome: claimed or not, its token, a stale completion refused, a
// completion the server rejects failing alone.
func TestBatch(t *testing.T) {
	t.Parallel()
	var n counter
	pool := newPool(t, testenv.PostgresURL(t), func(cfg *pgxpool.Config) {
		cfg.MaxConns = 4
		cfg.ConnConfig.Tracer = &n
	})
	st, schema := newStoreConfig(t, pgstore.Config{Pool: pool, Batch: true})
	// A rule of the database that refuses one completion (status 599), so that a batch
	// holding it fails on the server.
	table := pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()
	if _, err := pool.Exec(t.Context(), "ALTER TABLE "+table+" ADD CONSTRAINT no_599 CHECK (status <> 599)"); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// Keys of an even number are claimed without a route.
	route := func(i int) string {
		if i%2 == 0 {
			return ""
		}
		return fmt.Sprint("POST /k", i)
	}
	req := func(key string) idempotency.ClaimRequest {
		r := idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
		if i, err := strconv.Atoi(strings.TrimPrefix(key, "k")); err == nil {
			r.Route = route(i)
		}
		return r
	}
	// together runs f(0) … f(n-1) at once and waits for them.
	together := func(calls int, f func(i int)) {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range calls {
			wg.Go(func() {
				<-start
				f(i)
			})
		}
		close(start)
		wg.Wait()
	}
	const calls = 64
	n.reset()

	// 64 keys, claimed at once; and 16 claims of one more key.
	results := make([]idempotency.ClaimResult, calls)
	dup := make([]idempotency.ClaimResult, 16)
	errs := make(chan error, calls+len(dup))
	together(calls+len(dup), func(i int) {
		var err error
		if i < calls {
			results[i], err = st.Claim(ctx, req(fmt.Sprint("k", i)))
		} else {
			dup[i-calls], err = st.Claim(ctx, req("dup"))
		}
		if err != nil {
			errs <- err
		}
	})
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if q, _ := n.reset(); q > (calls+int64(len(dup)))/2 {
		t.Errorf("%d concurrent claims took %d statements; batching should need far fewer", calls+len(dup), q)
	} else {
		t.Logf("%d concurrent claims: %d statements", calls+len(dup), q)
	}
	tokens := map[int64]bool{}
	for i, r := range results {
		if !r.Claimed || tokens[r.Token] {
			t.Fatalf("claim %d: %+v (a claim of a new key must win, with a token of its own)", i, r)
		}
		tokens[r.Token] = true
	}
	won := 0
	for _, r := range dup {
		switch {
		case r.Claimed:
			won++
		case r.Existing == nil || r.Existing.State != idempotency.StateInProgress:
			t.Errorf("a losing claim of a key in progress: %+v", r)
		}
	}
	if won != 1 {
		t.Errorf("16 concurrent claims of one key: %d won, want 1", won)
	}

	// Complete them in two rounds of calls at once. The first: key 0 with a stale token
	// (refused), key 2 with no header and no body, key 3 with header bytes no text
	// column keeps (a NUL, bytes that are not UTF-8) and a trailer, the rest as they
	// should. The second (keys 48 to 63): key 48 with the status the table refuses,
	// which fails the batch's statement; each call is then retried alone, and only key
	// 48's fails.
	response := func(i int) *idempotency.Response {
		r := &idempotency.Response{Status: 201, Header: http.Header{"X-I": {fmt.Sprint(i)}}, Body: []byte(fmt.Sprint("body ", i))}
		switch i {
		case 2:
			r.Header, r.Body = nil, nil
		case 3:
			r.Header = http.Header{"X-Bytes": {"a\x00b", "\xff\xfe"}}
			r.Trailer = http.Header{"X-Sum": {"\x80"}}
		case 48:
			r.Status = 599
		}
		return r
	}
	completeErrs := make([]error, calls)
	complete := func(i int) {
		c := idempotency.Completion{Scope: "s", Key: fmt.Sprint("k", i), Token: results[i].Token,
			Response: *response(i), TTL: time.Hour}
		if i == 0 {
			c.Token--
		}
		completeErrs[i] = st.Complete(ctx, c)
	}
	together(48, complete)
	if q, _ := n.reset(); q > 24 {
		t.Errorf("48 concurrent completions took %d statements", q)
	}
	together(16, func(i int) { complete(48 + i) })
	if !errors.Is(completeErrs[0], idempotency.ErrLeaseLost) {
		t.Errorf("completion with a stale token: %v, want ErrLeaseLost", completeErrs[0])
	}
	if completeErrs[48] == nil || errors.Is(completeErrs[48], idempotency.ErrLeaseLost) {
		t.Errorf("completion the table refuses: %v, want the server's error", completeErrs[48])
	}
	for i := 1; i < calls; i++ {
		if i == 48 {
			continue
		}
		if completeErrs[i] != nil {
			t.Fatalf("completion %d: %v", i, completeErrs[i])
		}
		rec, err := st.Get(ctx, "s", fmt.Sprint("k", i))
		if err != nil {
			t.Fatal(err)
		}
		if want := response(i); rec.State != idempotency.StateDone || rec.Token != results[i].Token || rec.Route != route(i) ||
			!reflect.DeepEqual(rec.Response, want) {
			t.Errorf("record %d: %+v, response %+v; want done with token %d and %+v", i, rec, rec.Response, results[i].Token, want)
		}
	}
	for _, i := range []int{0, 48} {
		if rec, err := st.Get(ctx, "s", fmt.Sprint("k", i)); err != nil || rec.State != idempotency.StateInProgress {
			t.Errorf("record %d after a refused completion: %+v, %v; want still in progress", i, rec, err)
		}
	}
}
