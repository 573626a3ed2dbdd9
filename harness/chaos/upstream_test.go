//go:build linux

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// maxPad bounds the padding a payment may ask for: with the rest of the answer it stays
// below the gateway's default 4 MiB stored-response limit.
const maxPad = 3_500_000

// execIDHeader carries the upstream's number for an execution in its answer, so that the
// upstream link's fault reports (which see the answer's header) name the execution.
const execIDHeader = "X-Exec-Id"

// upstreamConfig configures the payments upstream.
type upstreamConfig struct {
	dsn      string   // the ledger's PostgreSQL
	schema   string   // dropped and created
	replicas []string // one listener per gateway replica, by name
	// dedup makes the ledger deduplicate on (user, Idempotency-Key), as an
	// idempotency-aware service would; otherwise every request executes.
	dedup bool
	// slowRate is the probability that an answer is delayed by a uniform time in
	// [slowMin, slowMax) after the payment was recorded.
	slowRate         float64
	slowMin, slowMax time.Duration
	seed             uint64
	logger           *slog.Logger
}

// upstream is the payments service behind the gateways: POST /payments records a
// payment in a PostgreSQL ledger and answers 201 with it. It has no idempotency layer of
// its own. By default it does not deduplicate either: every request it receives executes
// and makes a ledger row, so every forward the gateways make beyond the first of a
// payment is visible as an extra execution. With dedup the ledger's UNIQUE (user_id,
// idempotency_key) makes a second delivery find the payment instead (it answers the same
// 201), as an idempotency-aware service would.
//
// It listens once per gateway replica (each replica reaches it through its own
// upstream-link fault proxy), so every execution names the replica whose connection
// brought it, the connection (numbered at the upstream) and the request's number on it.
// Each execution is logged: arrival, the start of its answer, an added delay, padding,
// and whether the answer was written whole. An answer carries X-Exec-Id. A body's
// "pad": N asks for an answer with N bytes of JSON padding. When a write to the ledger
// fails, the upstream learns whether the row was committed (by its execution number)
// before it answers: 503 only when it was not, so a 503 always means "not done".
type upstream struct {
	cfg    upstreamConfig
	pool   *pgxpool.Pool
	table  string // quoted, schema-qualified
	srvs   []*http.Server
	addrs  []string
	ctx    context.Context // canceled by close: ends the handlers' ledger work
	cancel context.CancelFunc
	serve  sync.WaitGroup
	active sync.WaitGroup // handlers running

	nextExec, nextConn atomic.Uint64
	// holdUntil (UnixNano) holds every answer ready before it back until then.
	holdUntil atomic.Int64

	mu    sync.Mutex
	rng   *rand.Rand
	execs []*Execution
	st    UpstreamStats
}

type connInfoKey struct{}

// connInfo is one connection the upstream accepted.
type connInfo struct {
	n        uint64
	requests atomic.Int64
}

// startUpstream creates the ledger table in cfg.schema (dropping what was there) and
// serves the upstream on one free loopback port per replica.
func startUpstream(ctx context.Context, cfg upstreamConfig) (*upstream, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.dsn)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	pcfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	uctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	u := &upstream{cfg: cfg, pool: pool, ctx: uctx, cancel: cancel, rng: rand.New(rand.NewPCG(cfg.seed, 0x736c6f77))} // "slow"
	s := pgx.Identifier{cfg.schema}.Sanitize()
	u.table = pgx.Identifier{cfg.schema, "ledger"}.Sanitize()
	unique := "CHECK (true)"
	if cfg.dedup {
		unique = "UNIQUE (user_id, idempotency_key)"
	}
	ddl := `DROP SCHEMA IF EXISTS ` + s + ` CASCADE;
CREATE SCHEMA ` + s + `;
CREATE TABLE ` + u.table + ` (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    exec_id         bigint NOT NULL UNIQUE,
    user_id         text   NOT NULL,
    idempotency_key text   NOT NULL,
    ref             text   NOT NULL,
    amount          bigint NOT NULL CHECK (amount > 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    ` + unique + `
);`
	if _, err := pool.Exec(ctx, ddl); err != nil {
		cancel()
		pool.Close()
		return nil, fmt.Errorf("upstream: creating the ledger: %w", err)
	}
	for _, name := range cfg.replicas {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
		if err != nil {
			u.close()
			return nil, fmt.Errorf("upstream: listen: %w", err)
		}
		srv := &http.Server{
			Handler:           u.handler(name),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(cfg.logger.Handler(), slog.LevelWarn),
			ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
				return context.WithValue(ctx, connInfoKey{}, &connInfo{n: u.nextConn.Add(1)})
			},
		}
		u.srvs = append(u.srvs, srv)
		u.addrs = append(u.addrs, ln.Addr().String())
		u.serve.Go(func() { _ = srv.Serve(ln) })
	}
	return u, nil
}

// holdAnswers makes the upstream hold back every answer ready before until, until then,
// as a service in a slow spell does: the requests keep arriving and executing, and their
// answers all leave at until. At a failover's start it puts completions in flight when
// the standby's link stalls.
func (u *upstream) holdAnswers(until time.Time) { u.holdUntil.Store(until.UnixNano()) }

// Addr returns the address of the listener of replica i.
func (u *upstream) Addr(i int) string { return u.addrs[i] }

// close shuts the servers down, ends the handlers' ledger work, waits for them and
// closes the pool. Calling it again does nothing harmful.
func (u *upstream) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range u.srvs {
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
	}
	u.cancel()
	u.serve.Wait()
	u.active.Wait()
	u.pool.Close()
}

// Stats returns a snapshot of the counts.
func (u *upstream) Stats() UpstreamStats {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.st
}

// Executions returns a copy of the execution log.
func (u *upstream) Executions() []Execution {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]Execution, len(u.execs))
	for i, e := range u.execs {
		out[i] = *e
	}
	return out
}

// Rows returns the ledger.
func (u *upstream) Rows(ctx context.Context) ([]Row, error) {
	rows, err := u.pool.Query(ctx, `SELECT id, user_id, idempotency_key, ref, amount FROM `+u.table+` ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("reading the ledger: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Row, error) {
		var r Row
		err := row.Scan(&r.ID, &r.User, &r.Key, &r.Ref, &r.Amount)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading the ledger: %w", err)
	}
	return out, nil
}

type paymentBody struct {
	Ref    string `json:"ref"`
	Amount int64  `json:"amount"`
	Pad    int    `json:"pad"`
}

// answer is the body of a 201: the ledger row, and the padding asked for.
type answer struct {
	Row
	Pad string `json:"pad,omitempty"`
}

func (u *upstream) handler(replica string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.active.Add(1)
		defer u.active.Done()
		u.serveHTTP(w, r, replica)
	})
}

func (u *upstream) serveHTTP(w http.ResponseWriter, r *http.Request, replica string) {
	arrived := time.Now()
	if r.Method != http.MethodPost || r.URL.Path != "/payments" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	key := r.Header.Get("Idempotency-Key")
	var in paymentBody
	err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&in)
	if !ok || user == "" || key == "" || err != nil || in.Ref == "" || in.Amount <= 0 || in.Pad < 0 || in.Pad > maxPad {
		http.Error(w, "want Authorization: Bearer <user>, an Idempotency-Key and {\"ref\": …, \"amount\": >0, \"pad\": 0…3500000}", http.StatusBadRequest)
		return
	}
	e := &Execution{ID: u.nextExec.Add(1), User: user, Key: key, Ref: in.Ref, Replica: replica, Arrived: arrived, Pad: in.Pad}
	if ci, ok := r.Context().Value(connInfoKey{}).(*connInfo); ok {
		e.Conn, e.Request = ci.n, int(ci.requests.Add(1))
	}
	u.mu.Lock()
	u.st.Deliveries++
	u.mu.Unlock()

	// The payment is made whatever happens to the gateway's connection: a request that
	// reached the ledger is finished, as a real service would.
	ctx, cancel := context.WithTimeout(u.ctx, 30*time.Second)
	defer cancel()
	row, existed, resolved, err := u.record(ctx, e.ID, user, key, in)
	status := http.StatusCreated
	switch {
	case err != nil:
		status = http.StatusServiceUnavailable
	case existed && (row.Ref != in.Ref || row.Amount != in.Amount):
		status = http.StatusUnprocessableEntity
	}
	u.mu.Lock()
	switch {
	case err != nil:
		u.st.NotDone++
	case existed:
		u.st.Absorbed++
	default:
		u.st.Executions++
	}
	if resolved {
		u.st.Resolved++
	}
	if status == http.StatusUnprocessableEntity {
		u.st.KeyReused++
	}
	var delay time.Duration
	if err == nil && u.rng.Float64() < u.cfg.slowRate {
		delay = u.cfg.slowMin + time.Duration(u.rng.Int64N(int64(u.cfg.slowMax-u.cfg.slowMin)))
		u.st.SlowAnswers++
	}
	if err == nil && in.Pad > 0 {
		u.st.LargeAnswers++
	}
	var held time.Duration
	if h := time.Until(time.Unix(0, u.holdUntil.Load())); err == nil && h > delay {
		held = h
		u.st.HeldAnswers++
	}
	if err == nil {
		e.RowID, e.Absorbed, e.Slow, e.Held = row.ID, existed, delay, held
		u.execs = append(u.execs, e)
	}
	u.mu.Unlock()

	if status == http.StatusServiceUnavailable {
		// Not done (the row is known not to exist): 503 makes the gateway release the key
		// so that a retry comes here again.
		w.Header().Set("Retry-After", "1")
		http.Error(w, "ledger unavailable: "+err.Error(), status)
		return
	}
	if delay = max(delay, held); delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-r.Context().Done(): // the gateway gave up: the answer cannot arrive anyway
			t.Stop()
		}
	}
	var body []byte
	if status == http.StatusUnprocessableEntity {
		body = []byte("this Idempotency-Key made another payment\n")
	} else {
		body, _ = json.Marshal(answer{Row: row, Pad: strings.Repeat("x", in.Pad)}) // strings and integers always marshal
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/"+strconv.FormatInt(row.ID, 10))
	}
	w.Header().Set(execIDHeader, strconv.FormatUint(e.ID, 10))
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	answered := time.Now()
	w.WriteHeader(status)
	_, werr := w.Write(body)
	if werr == nil {
		werr = http.NewResponseController(w).Flush()
	}
	u.mu.Lock()
	e.Answered = answered
	if werr != nil {
		e.WriteErr = werr.Error()
	}
	u.mu.Unlock()
}

// record inserts the payment as execution id (or, with dedup, finds the one already
// recorded under its key, existed true). When the insert fails, the commit may or may
// not have happened: record asks the ledger whether execution id's row exists until it
// gets an answer or ctx ends (resolved true), and reports an error only when the row is
// known not to exist or nothing could be learned.
func (u *upstream) record(ctx context.Context, id uint64, user, key string, in paymentBody) (Row, bool, bool, error) {
	r := Row{User: user, Key: key, Ref: in.Ref, Amount: in.Amount}
	q := `INSERT INTO ` + u.table + ` (exec_id, user_id, idempotency_key, ref, amount) VALUES ($1, $2, $3, $4, $5) RETURNING id`
	if u.cfg.dedup {
		q = `INSERT INTO ` + u.table + ` (exec_id, user_id, idempotency_key, ref, amount) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (user_id, idempotency_key) DO NOTHING RETURNING id`
	}
	err := u.pool.QueryRow(ctx, q, int64(id), user, key, in.Ref, in.Amount).Scan(&r.ID)
	switch {
	case err == nil:
		return r, false, false, nil
	case u.cfg.dedup && errors.Is(err, pgx.ErrNoRows):
		err = u.pool.QueryRow(ctx, `SELECT id, ref, amount FROM `+u.table+` WHERE user_id = $1 AND idempotency_key = $2`,
			user, key).Scan(&r.ID, &r.Ref, &r.Amount)
		if err != nil {
			return Row{}, false, false, fmt.Errorf("finding the recorded payment: %w", err)
		}
		return r, true, false, nil
	}
	insertErr := err
	for {
		err := u.pool.QueryRow(ctx, `SELECT id FROM `+u.table+` WHERE exec_id = $1`, int64(id)).Scan(&r.ID)
		switch {
		case err == nil:
			return r, false, true, nil
		case errors.Is(err, pgx.ErrNoRows):
			return Row{}, false, true, fmt.Errorf("insert: %w", insertErr)
		}
		select {
		case <-ctx.Done():
			return Row{}, false, false, fmt.Errorf("insert: %w; its outcome unknown: %w", insertErr, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
