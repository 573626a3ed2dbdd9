package bench

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/harness/testenv"
)

// BenchmarkRoundTrips explains BenchmarkPayments: it runs the SQL of one payment
// directly (no HTTP, no middleware), with 32 concurrent goroutines, in the shapes a
// PostgreSQL idempotency store can take. Its tables are simplified copies of the ledger
// and of pgstore's (a claim is one INSERT ... ON CONFLICT DO NOTHING with a token from a
// sequence; a completion one fenced UPDATE):
//
//	insert                 the unprotected endpoint: 1 statement, 1 round trip, 1 commit
//	autocommit             the middleware mode: claim, insert, complete, each on its
//	                       own: 3 round trips, 3 commits
//	claim-then-tx          pgstore's transaction mode today: claim (autocommit), then
//	                       BEGIN, insert, complete, COMMIT: 5 round trips, 2 commits
//	claim-in-tx            BEGIN, claim, insert, complete, COMMIT: 5 round trips, 1 commit
//	claim-in-tx-pipelined  [BEGIN + claim], insert, [complete + COMMIT], each bracket one
//	                       pipelined pgx.Batch: 3 round trips, 1 commit
//	one-batch              all five statements in one pipeline: 1 round trip. A lower
//	                       bound only: a real handler runs between claim and complete.
//
// In the pipelined shapes the completion raises an error when the token is stale, so
// that the COMMIT queued after it rolls back instead.
func BenchmarkRoundTrips(b *testing.B) {
	for _, name := range []string{"insert", "autocommit", "claim-then-tx", "claim-in-tx", "claim-in-tx-pipelined", "one-batch"} {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			s := pgx.Identifier{testenv.Schema(b, "roundtrips")}.Sanitize() // before the pool: dropped after it is closed
			pool := testenv.PostgresPool(b, pgMaxConns)
			if _, err := pool.Exec(ctx, `CREATE SCHEMA `+s+`;
CREATE SEQUENCE `+s+`.seq;
CREATE TABLE `+s+`.idem (scope text, key text, fingerprint text NOT NULL, state text NOT NULL,
	token bigint NOT NULL, created_at timestamptz NOT NULL, status int, header jsonb, body bytea,
	PRIMARY KEY (scope, key));
CREATE TABLE `+s+`.payments (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, user_id text NOT NULL,
	idempotency_key text, amount bigint NOT NULL, currency text NOT NULL, created_at timestamptz NOT NULL,
	UNIQUE (user_id, idempotency_key))`); err != nil {
				b.Fatal(err)
			}
			var (
				insert = `INSERT INTO ` + s + `.payments (user_id, idempotency_key, amount, currency, created_at)
VALUES ($1, $2, 1250, 'EUR', $3) ON CONFLICT (user_id, idempotency_key) DO NOTHING RETURNING id`
				claim = `INSERT INTO ` + s + `.idem (scope, key, fingerprint, state, token, created_at)
VALUES ($1, $2, 'fp', 'in_progress', nextval('` + s + `.seq'), $3) ON CONFLICT DO NOTHING RETURNING token`
				complete = `UPDATE ` + s + `.idem SET state = 'done', status = 201, header = '{}', body = $4
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'`
				// completeOrFail divides by zero when the token is stale.
				completeOrFail = `WITH u AS (` + complete + ` RETURNING 1) SELECT 1 / count(*)::int FROM u`
				body           = []byte(`{"id":1,"amount":1250,"currency":"EUR"}`)
				errStale       = errors.New("stale token")
			)
			run := func(key string) error {
				now := time.Now()
				var id, token int64
				switch name {
				case "insert":
					return pool.QueryRow(ctx, insert, "bench", key, now).Scan(&id)
				case "autocommit":
					if err := pool.QueryRow(ctx, claim, "bench", key, now).Scan(&token); err != nil {
						return err
					}
					if err := pool.QueryRow(ctx, insert, "bench", key, now).Scan(&id); err != nil {
						return err
					}
					tag, err := pool.Exec(ctx, complete, "bench", key, token, body)
					if err == nil && tag.RowsAffected() != 1 {
						err = errStale
					}
					return err
				case "claim-then-tx":
					if err := pool.QueryRow(ctx, claim, "bench", key, now).Scan(&token); err != nil {
						return err
					}
					return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if err := tx.QueryRow(ctx, insert, "bench", key, now).Scan(&id); err != nil {
							return err
						}
						tag, err := tx.Exec(ctx, complete, "bench", key, token, body)
						if err == nil && tag.RowsAffected() != 1 {
							err = errStale
						}
						return err
					})
				case "claim-in-tx":
					return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if err := tx.QueryRow(ctx, claim, "bench", key, now).Scan(&token); err != nil {
							return err
						}
						if err := tx.QueryRow(ctx, insert, "bench", key, now).Scan(&id); err != nil {
							return err
						}
						tag, err := tx.Exec(ctx, complete, "bench", key, token, body)
						if err == nil && tag.RowsAffected() != 1 {
							err = errStale
						}
						return err
					})
				case "claim-in-tx-pipelined":
					return pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
						var bt pgx.Batch
						bt.Queue("BEGIN")
						bt.Queue(claim, "bench", key, now).QueryRow(func(r pgx.Row) error { return r.Scan(&token) })
						if err := c.SendBatch(ctx, &bt).Close(); err != nil {
							_, _ = c.Exec(ctx, "ROLLBACK")
							return err
						}
						if err := c.QueryRow(ctx, insert, "bench", key, now).Scan(&id); err != nil {
							_, _ = c.Exec(ctx, "ROLLBACK")
							return err
						}
						bt = pgx.Batch{}
						bt.Queue(completeOrFail, "bench", key, token, body)
						bt.Queue("COMMIT")
						if err := c.SendBatch(ctx, &bt).Close(); err != nil {
							_, _ = c.Exec(ctx, "ROLLBACK")
							return err
						}
						return nil
					})
				default: // one-batch
					return pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
						var bt pgx.Batch
						bt.Queue("BEGIN")
						bt.Queue(claim, "bench", key, now).QueryRow(func(r pgx.Row) error { return r.Scan(&token) })
						bt.Queue(insert, "bench", key, now).QueryRow(func(r pgx.Row) error { return r.Scan(&id) })
						bt.Queue(`WITH u AS (UPDATE `+s+`.idem SET state = 'done', status = 201, header = '{}', body = $3
WHERE scope = $1 AND key = $2 AND token = currval('`+s+`.seq') AND state = 'in_progress' RETURNING 1)
SELECT 1 / count(*)::int FROM u`, "bench", key, body)
						bt.Queue("COMMIT")
						if err := c.SendBatch(ctx, &bt).Close(); err != nil {
							_, _ = c.Exec(ctx, "ROLLBACK")
							return err
						}
						return nil
					})
				}
			}
			prefix := testenv.Name("rt")
			var seq atomic.Int64
			b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := run(prefix + "-" + strconv.FormatInt(seq.Add(1), 10)); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}
