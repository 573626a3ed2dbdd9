//go:build linux

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// upstream is the payments service behind the gateways: POST /payments records a
// payment in a PostgreSQL ledger and answers 201 with it. It has no idempotency layer of
// its own — the gateways provide that — but it is idempotency-aware the way DESIGN.md
// asks of an upstream: the gateway forwards the Idempotency-Key, and the ledger's UNIQUE
// (user_id, idempotency_key) makes a second delivery of a key find the payment instead
// of making another one (it answers the same 201).
//
// It counts every delivery of a key it had already recorded: a re-forward, what the
// gateway alone could not prevent (a replica killed after the upstream executed and
// before the completion was stored leaves the key in progress; after the lease a retry
// takes it over and forwards again). With naive set it has no UNIQUE constraint and
// inserts a row per delivery, as an upstream that is not idempotency-aware would: each
// re-forward then becomes a duplicate payment.
type upstream struct {
	pool  *pgxpool.Pool
	table string // quoted, schema-qualified
	naive bool
	srv   *http.Server
	addr  string
	done  chan struct{}

	mu   sync.Mutex
	keys map[string]*keyLog // by user + "\x00" + key
	st   UpstreamStats
	// afterAnswer holds each re-forward that followed a 201: the test matches it with
	// the gateways' logs and the kills.
	afterAnswer []reforward
}

// keyLog is what the upstream saw of one key.
type keyLog struct {
	deliveries int
	inFlight   int
	recorded   bool      // a delivery's insert committed (naive mode; in the other mode the row says so)
	last       int       // the status of the last delivery's answer; 0 before any
	answeredAt time.Time // when the last delivery was answered
	arrivedAt  time.Time // when the last delivery arrived
}

// startUpstream creates the ledger table in schema (dropping what was there) and
// serves the upstream on a free loopback port.
func startUpstream(ctx context.Context, dsn, schema string, naive bool, logger *slog.Logger) (*upstream, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	u := &upstream{pool: pool, naive: naive, keys: map[string]*keyLog{}, done: make(chan struct{})}
	s := pgx.Identifier{schema}.Sanitize()
	u.table = pgx.Identifier{schema, "ledger"}.Sanitize()
	unique := "UNIQUE (user_id, idempotency_key)"
	if naive {
		unique = "CHECK (true)"
	}
	ddl := `DROP SCHEMA IF EXISTS ` + s + ` CASCADE;
CREATE SCHEMA ` + s + `;
CREATE TABLE ` + u.table + ` (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id         text   NOT NULL,
    idempotency_key text   NOT NULL,
    ref             text   NOT NULL,
    amount          bigint NOT NULL CHECK (amount > 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    ` + unique + `
);`
	if _, err := pool.Exec(ctx, ddl); err != nil {
		pool.Close()
		return nil, fmt.Errorf("upstream: creating the ledger: %w", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("upstream: listen: %w", err)
	}
	u.addr = ln.Addr().String()
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	go func() {
		defer close(u.done)
		_ = u.srv.Serve(ln)
	}()
	return u, nil
}

// URL returns the upstream's base URL.
func (u *upstream) URL() string { return "http://" + u.addr }

// close shuts the server down and closes the pool.
func (u *upstream) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := u.srv.Shutdown(ctx); err != nil {
		_ = u.srv.Close()
	}
	<-u.done
	u.pool.Close()
}

// Stats returns a snapshot of the counts.
func (u *upstream) Stats() UpstreamStats {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.st
}

// reforward is a delivery of a key whose previous delivery had been answered 201.
type reforward struct {
	key        string
	arrivedAt  time.Time // when the previous delivery arrived
	answeredAt time.Time // when the previous delivery was answered
	at         time.Time // when this one arrived
}

// ReforwardsAfterAnswer returns the re-forwards counted in AfterAnswer.
func (u *upstream) ReforwardsAfterAnswer() []reforward {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]reforward(nil), u.afterAnswer...)
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
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/payments" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	key := r.Header.Get("Idempotency-Key")
	var in paymentBody
	err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&in)
	if !ok || user == "" || key == "" || err != nil || in.Ref == "" || in.Amount <= 0 {
		http.Error(w, "want Authorization: Bearer <user>, an Idempotency-Key and {\"ref\": …, \"amount\": >0}", http.StatusBadRequest)
		return
	}

	id := user + "\x00" + key
	u.mu.Lock()
	kl := u.keys[id]
	if kl == nil {
		kl = &keyLog{}
		u.keys[id] = kl
	}
	u.st.Deliveries++
	kl.deliveries++
	if kl.deliveries == 2 {
		u.st.KeysRedelivered++
	}
	inFlight, last, answeredAt, arrivedAt, recorded := kl.inFlight, kl.last, kl.answeredAt, kl.arrivedAt, kl.recorded
	kl.inFlight++
	kl.arrivedAt = time.Now()
	u.mu.Unlock()

	// The payment is made whatever happens to the gateway's connection: a request that
	// reached the ledger is finished, as a real service would.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 4*time.Second)
	defer cancel()
	row, existed, err := u.record(ctx, user, key, in)
	status := http.StatusCreated
	switch {
	case err != nil:
		status = http.StatusServiceUnavailable
	case existed && (row.Ref != in.Ref || row.Amount != in.Amount):
		status = http.StatusUnprocessableEntity
	}

	u.mu.Lock()
	kl.inFlight--
	kl.last, kl.answeredAt = status, time.Now()
	switch {
	case err != nil:
		u.st.DBErrors++
	case existed || u.naive && (recorded || inFlight > 0):
		u.st.Reforwards++
		switch {
		case inFlight > 0:
			u.st.Concurrent++
		case last == http.StatusCreated:
			u.st.AfterAnswer++
			u.afterAnswer = append(u.afterAnswer, reforward{key: key, arrivedAt: arrivedAt, answeredAt: answeredAt, at: time.Now()})
		default:
			u.st.AfterError++
		}
	}
	if err == nil && !existed {
		u.st.Recorded++
		kl.recorded = true
	}
	if status == http.StatusUnprocessableEntity {
		u.st.KeyReused++
	}
	u.mu.Unlock()

	switch status {
	case http.StatusServiceUnavailable:
		// The work was not done, or its commit's outcome is unknown: either way a retry
		// is safe (the UNIQUE constraint finds a committed payment), and 503 makes the
		// gateway release the key so that the retry comes here again.
		w.Header().Set("Retry-After", "1")
		http.Error(w, "ledger unavailable: "+err.Error(), status)
	case http.StatusUnprocessableEntity:
		http.Error(w, "this Idempotency-Key made another payment", status)
	default:
		body, _ := json.Marshal(row) // strings and integers always marshal
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Header().Set("Location", "/payments/"+strconv.FormatInt(row.ID, 10))
		w.WriteHeader(status)
		_, _ = w.Write(body)
	}
}

// record inserts the payment, or finds the one already recorded under its key.
func (u *upstream) record(ctx context.Context, user, key string, in paymentBody) (Row, bool, error) {
	r := Row{User: user, Key: key, Ref: in.Ref, Amount: in.Amount}
	if u.naive {
		err := u.pool.QueryRow(ctx, `INSERT INTO `+u.table+` (user_id, idempotency_key, ref, amount) VALUES ($1, $2, $3, $4) RETURNING id`,
			user, key, in.Ref, in.Amount).Scan(&r.ID)
		if err != nil {
			return Row{}, false, fmt.Errorf("insert: %w", err)
		}
		return r, false, nil
	}
	err := u.pool.QueryRow(ctx, `INSERT INTO `+u.table+` (user_id, idempotency_key, ref, amount) VALUES ($1, $2, $3, $4)
ON CONFLICT (user_id, idempotency_key) DO NOTHING RETURNING id`, user, key, in.Ref, in.Amount).Scan(&r.ID)
	if err == nil {
		return r, false, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Row{}, false, fmt.Errorf("insert: %w", err)
	}
	err = u.pool.QueryRow(ctx, `SELECT id, ref, amount FROM `+u.table+` WHERE user_id = $1 AND idempotency_key = $2`,
		user, key).Scan(&r.ID, &r.Ref, &r.Amount)
	if err != nil {
		return Row{}, false, fmt.Errorf("finding the recorded payment: %w", err)
	}
	return r, true, nil
}
