package ledger

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

//go:embed postgres.sql
var postgresSchema string

// PostgresConfig configures a Server on PostgreSQL.
type PostgresConfig struct {
	Config

	// Pool is the pool of the database holding the ledger and the idempotency records.
	// Required; Server.Close does not close it. Give it a connection per concurrent
	// request (pgxpool's default, max(4, GOMAXPROCS), queues requests beyond that).
	Pool *pgxpool.Pool

	// Schema holds the ledger table, "payments", and pgstore's table. It is created when
	// missing. Default "public".
	Schema string

	// Batch is pgstore's Config.Batch: concurrent claims (and, in middleware mode,
	// completions) share statements.
	Batch bool
}

// NewPostgres returns a Server on PostgreSQL. It applies the migrations (pgstore's and
// the ledger's) first.
func NewPostgres(ctx context.Context, cfg PostgresConfig) (*Server, error) {
	if cfg.Pool == nil {
		return nil, errors.New("ledger: PostgresConfig.Pool is nil")
	}
	schema := cmp.Or(cfg.Schema, "public")
	table := pgx.Identifier{schema, "payments"}.Sanitize()
	b := &pgBackend{pool: cfg.Pool, table: table}
	var store idempotency.Store
	if cfg.Mode != ModeUnprotected {
		st, err := pgstore.New(pgstore.Config{Pool: cfg.Pool, Schema: schema, Batch: cfg.Batch, Clock: cfg.Clock})
		if err != nil {
			return nil, fmt.Errorf("ledger: %w", err)
		}
		if err := st.Migrate(ctx); err != nil {
			return nil, fmt.Errorf("ledger: %w", err)
		}
		b.store, store = st, st
	}
	ddl := strings.NewReplacer("{schema}", pgx.Identifier{schema}.Sanitize(), "{table}", table).Replace(postgresSchema)
	err := pgx.BeginFunc(ctx, cfg.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, ddl) // no arguments: simple protocol, several statements
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: migrate: %w", err)
	}
	const cols = `id, user_id, idempotency_key, amount, currency, created_at`
	b.insert = `INSERT INTO ` + table + ` (user_id, idempotency_key, amount, currency, created_at)
VALUES ($1, $2, $3, $4, $5) ON CONFLICT (user_id, idempotency_key) DO NOTHING RETURNING ` + cols
	b.byKey = `SELECT ` + cols + ` FROM ` + table + ` WHERE user_id = $1 AND idempotency_key = $2`
	b.byID = `SELECT ` + cols + ` FROM ` + table + ` WHERE user_id = $1 AND id = $2`
	b.countAll = `SELECT count(*) FROM ` + table
	b.countUser = b.countAll + ` WHERE user_id = $1`
	return newServer(cfg.Config, b, store, nil)
}

type pgBackend struct {
	pool                                     *pgxpool.Pool
	store                                    *pgstore.Store // nil in ModeUnprotected
	table                                    string         // quoted, schema-qualified
	insert, byKey, byID, countAll, countUser string
}

// pgQuerier is a pool or a transaction.
type pgQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (b *pgBackend) create(ctx context.Context, p Payment) (Payment, bool, error) {
	return b.createOn(ctx, b.pool, p)
}

func (b *pgBackend) createOn(ctx context.Context, db pgQuerier, p Payment) (Payment, bool, error) {
	var key *string
	if p.IdempotencyKey != "" {
		key = &p.IdempotencyKey
	}
	got, err := scanPG(db.QueryRow(ctx, b.insert, p.User, key, p.Amount, p.Currency, p.CreatedAt))
	if err == nil {
		return got, false, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) || key == nil {
		return Payment{}, false, fmt.Errorf("ledger: insert: %w", err)
	}
	// The user already has a payment under this key.
	got, err = scanPG(db.QueryRow(ctx, b.byKey, p.User, key))
	if err != nil {
		return Payment{}, false, fmt.Errorf("ledger: insert: existing payment: %w", err)
	}
	return got, true, nil
}

func (b *pgBackend) createTx(ctx context.Context, p Payment, respond func(want, got Payment, existed bool) idempotency.Response) (idempotency.Response, error) {
	if b.store == nil {
		return idempotency.Response{}, errors.New("ledger: transaction mode without a store")
	}
	// ctx is the request's: WithTx detaches the transaction from it (idempotency.Detach),
	// so a client that gives up does not roll back the payment its retry will replay.
	return b.store.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error) {
		got, existed, err := b.createOn(ctx, tx, p)
		if err != nil {
			return idempotency.Response{}, err
		}
		return respond(p, got, existed), nil
	})
}

func (b *pgBackend) get(ctx context.Context, user string, id int64) (Payment, error) {
	p, err := scanPG(b.pool.QueryRow(ctx, b.byID, user, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, errNotFound
	}
	if err != nil {
		return Payment{}, fmt.Errorf("ledger: get: %w", err)
	}
	return p, nil
}

func (b *pgBackend) count(ctx context.Context, user string) (int64, error) {
	var n int64
	var err error
	if user == "" {
		err = b.pool.QueryRow(ctx, b.countAll).Scan(&n)
	} else {
		err = b.pool.QueryRow(ctx, b.countUser, user).Scan(&n)
	}
	if err != nil {
		return 0, fmt.Errorf("ledger: count: %w", err)
	}
	return n, nil
}

func (b *pgBackend) commitUnknown(err error) bool { return errors.Is(err, pgstore.ErrCommitUnknown) }

func scanPG(row pgx.Row) (Payment, error) {
	var p Payment
	var key *string
	if err := row.Scan(&p.ID, &p.User, &key, &p.Amount, &p.Currency, &p.CreatedAt); err != nil {
		return Payment{}, err
	}
	if key != nil {
		p.IdempotencyKey = *key
	}
	p.CreatedAt = p.CreatedAt.UTC()
	return p, nil
}
