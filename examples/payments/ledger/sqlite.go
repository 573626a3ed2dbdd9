package ledger

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
)

//go:embed sqlite.sql
var sqliteSchema string

// SQLiteConfig configures a Server on SQLite.
type SQLiteConfig struct {
	Config

	// Path is the database file holding the ledger and the idempotency records, created
	// when missing (SQLite keeps PATH-wal and PATH-shm next to it). Required.
	Path string

	// BusyTimeout is how long a write waits for another process's write lock. Default 5s.
	BusyTimeout time.Duration
}

// OpenSQLite opens (creating if needed) the database file, applies the migrations and
// returns a Server that owns the file: Close closes it.
//
// The file is opened twice, as sqlitestore.Open does: a write pool of one connection,
// shared by the ledger and the idempotency store (so that WithTx can put both in one
// transaction and writes queue in Go rather than in SQLite's busy handler), and a read
// pool for GET requests. Commits are fsynced (WAL, synchronous=FULL).
func OpenSQLite(ctx context.Context, cfg SQLiteConfig) (*Server, error) {
	if cfg.Path == "" || cfg.Path == ":memory:" {
		return nil, fmt.Errorf("ledger: SQLiteConfig.Path %q: a file path is required", cfg.Path)
	}
	if cfg.BusyTimeout < 0 {
		return nil, fmt.Errorf("ledger: negative SQLiteConfig.BusyTimeout %v", cfg.BusyTimeout)
	}
	if cfg.BusyTimeout == 0 {
		cfg.BusyTimeout = 5 * time.Second
	}
	path, err := filepath.Abs(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("ledger: path %q: %w", cfg.Path, err)
	}
	dsn := sqliteDSN(path, cfg.BusyTimeout)
	write, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("ledger: open %s: %w", path, err)
	}
	write.SetMaxOpenConns(1)
	write.SetMaxIdleConns(1)
	read, err := sql.Open("sqlite", dsn)
	if err != nil {
		_ = write.Close()
		return nil, fmt.Errorf("ledger: open %s: %w", path, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	read.SetMaxOpenConns(n)
	read.SetMaxIdleConns(n)
	b := &sqliteBackend{write: write, read: read}
	closeAll := func() error {
		var err error
		if b.store != nil {
			err = b.store.Close()
		}
		return errors.Join(err, read.Close(), write.Close())
	}
	srv, err := newSQLite(ctx, cfg, b, closeAll)
	if err != nil {
		_ = closeAll()
		return nil, err
	}
	return srv, nil
}

func newSQLite(ctx context.Context, cfg SQLiteConfig, b *sqliteBackend, closeAll func() error) (*Server, error) {
	var store idempotency.Store
	if cfg.Mode != ModeUnprotected {
		st, err := sqlitestore.New(ctx, b.write, sqlitestore.Config{Clock: cfg.Clock}) // migrates, prepares its statements
		if err != nil {
			return nil, fmt.Errorf("ledger: %w", err)
		}
		b.store, store = st, st
	}
	tx, err := b.write.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("ledger: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, sqliteSchema); err != nil {
		return nil, fmt.Errorf("ledger: migrate: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("ledger: migrate: %w", err)
	}
	return newServer(cfg.Config, b, store, closeAll)
}

// sqliteDSN is the modernc.org/sqlite DSN for the file at the absolute path: WAL,
// fsync on every commit, a busy timeout, and BEGIN IMMEDIATE transactions (the same
// settings sqlitestore.Open uses).
func sqliteDSN(path string, busy time.Duration) string {
	// SQLite decodes %HH in a file: URI and ends the path at '?' or '#'.
	path = strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	q := url.Values{}
	q.Add("_pragma", "busy_timeout("+strconv.FormatInt(busy.Milliseconds(), 10)+")")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

type sqliteBackend struct {
	write, read *sql.DB
	store       *sqlitestore.Store // nil in ModeUnprotected
}

const (
	sqliteCols   = `id, user_id, idempotency_key, amount, currency, created_at`
	sqliteInsert = `INSERT INTO payments (user_id, idempotency_key, amount, currency, created_at)
VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_id, idempotency_key) DO NOTHING RETURNING ` + sqliteCols
	sqliteByKey = `SELECT ` + sqliteCols + ` FROM payments WHERE user_id = ? AND idempotency_key = ?`
	sqliteByID  = `SELECT ` + sqliteCols + ` FROM payments WHERE user_id = ? AND id = ?`
	sqliteCount = `SELECT count(*) FROM payments WHERE ? = '' OR user_id = ?`
)

// sqliteQuerier is a *sql.DB or a *sql.Tx.
type sqliteQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (b *sqliteBackend) create(ctx context.Context, p Payment) (Payment, bool, error) {
	return b.createOn(ctx, b.write, p)
}

func (b *sqliteBackend) createOn(ctx context.Context, db sqliteQuerier, p Payment) (Payment, bool, error) {
	var key sql.NullString
	if p.IdempotencyKey != "" {
		key = sql.NullString{String: p.IdempotencyKey, Valid: true}
	}
	got, err := scanSQLite(db.QueryRowContext(ctx, sqliteInsert, p.User, key, p.Amount, p.Currency, p.CreatedAt.UnixMicro()))
	if err == nil {
		return got, false, nil
	}
	if !errors.Is(err, sql.ErrNoRows) || !key.Valid {
		return Payment{}, false, fmt.Errorf("ledger: insert: %w", err)
	}
	got, err = scanSQLite(db.QueryRowContext(ctx, sqliteByKey, p.User, key))
	if err != nil {
		return Payment{}, false, fmt.Errorf("ledger: insert: existing payment: %w", err)
	}
	return got, true, nil
}

func (b *sqliteBackend) createTx(ctx context.Context, p Payment, respond func(want, got Payment, existed bool) idempotency.Response) (idempotency.Response, error) {
	if b.store == nil {
		return idempotency.Response{}, errors.New("ledger: transaction mode without a store")
	}
	// ctx is the request's: WithTx detaches the transaction from it (idempotency.Detach),
	// so a client that gives up does not roll back the payment its retry will replay.
	return b.store.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) (idempotency.Response, error) {
		got, existed, err := b.createOn(ctx, tx, p)
		if err != nil {
			return idempotency.Response{}, err
		}
		return respond(p, got, existed), nil
	})
}

func (b *sqliteBackend) get(ctx context.Context, user string, id int64) (Payment, error) {
	p, err := scanSQLite(b.read.QueryRowContext(ctx, sqliteByID, user, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Payment{}, errNotFound
	}
	if err != nil {
		return Payment{}, fmt.Errorf("ledger: get: %w", err)
	}
	return p, nil
}

func (b *sqliteBackend) count(ctx context.Context, user string) (int64, error) {
	var n int64
	if err := b.read.QueryRowContext(ctx, sqliteCount, user, user).Scan(&n); err != nil {
		return 0, fmt.Errorf("ledger: count: %w", err)
	}
	return n, nil
}

// commitUnknown is false: a local commit either fails (rolled back) or succeeds.
func (b *sqliteBackend) commitUnknown(error) bool { return false }

func scanSQLite(row *sql.Row) (Payment, error) {
	var p Payment
	var key sql.NullString
	var created int64
	if err := row.Scan(&p.ID, &p.User, &key, &p.Amount, &p.Currency, &created); err != nil {
		return Payment{}, err
	}
	p.IdempotencyKey = key.String
	p.CreatedAt = time.UnixMicro(created).UTC()
	return p, nil
}
