package pgbox

import (
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

//go:embed outbox.sql
var outboxSQL string

// OutboxConfig configures an Outbox. Pool is required; the zero value of every other
// field means the default documented on it.
type OutboxConfig struct {
	// Pool is the connection pool. Required; the Outbox never closes it.
	Pool *pgxpool.Pool
	// Schema is the table's schema. Default "public".
	Schema string
	// Table is the table's name. Default "retrysafe_outbox".
	Table string
	// Batch is the most messages one relay transaction locks and publishes. Default 100.
	Batch int
	// PollInterval is how long Relay waits when the outbox is empty. Default 500ms.
	PollInterval time.Duration
	// Backoff spaces the attempts to publish a message whose publish failed. Only Base,
	// Cap, Jitter and Rand are used; attempts never stop. Default: full jitter from 1s,
	// capped at 1m.
	Backoff retry.Policy
	// Logger receives the relay's failures. Default slog.Default().
	Logger *slog.Logger
	// Clock is the time source of when messages are added and fall due. Nil means
	// time.Now.
	Clock func() time.Time
}

// Outbox is the producer side of a safe retry chain: messages are written in the
// business transaction (Add) and published by a relay (Relay, RelayOnce), so "state
// committed but message never sent" cannot happen. Make one with NewOutbox.
type Outbox struct {
	pool  *pgxpool.Pool
	cfg   OutboxConfig
	log   *slog.Logger
	sql   struct{ schema, insert, lock, delete, fail, pending string }
	batch int
}

// NewOutbox returns an Outbox. Schema and Table follow NewInbox's rules. It does no I/O;
// call Migrate to create the table.
func NewOutbox(cfg OutboxConfig) (*Outbox, error) {
	if cfg.Pool == nil {
		return nil, errors.New("pgbox: OutboxConfig.Pool is nil")
	}
	r, err := replacer(cfg.Schema, cfg.Table, "retrysafe_outbox", "_next_idx")
	if err != nil {
		return nil, err
	}
	cfg.Batch = cmp.Or(max(cfg.Batch, 0), 100)
	cfg.PollInterval = cmp.Or(max(cfg.PollInterval, 0), 500*time.Millisecond)
	if cfg.Backoff.Base <= 0 {
		cfg.Backoff.Base = time.Second
	}
	if cfg.Backoff.Cap <= 0 {
		cfg.Backoff.Cap = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	o := &Outbox{pool: cfg.Pool, cfg: cfg, log: cfg.Logger, batch: cfg.Batch}
	o.sql.schema = r.Replace(outboxSQL)
	o.sql.insert = r.Replace(`INSERT INTO {table} (queue, message_id, content_type, header, body, created_at, next_attempt_at)
VALUES ($1, $2, $3, $4, $5, $6, $6)`)
	// SKIP LOCKED: concurrent relays (replicas) take disjoint batches and never wait.
	o.sql.lock = r.Replace(`SELECT id, queue, message_id, content_type, header, body, attempts FROM {table}
WHERE next_attempt_at <= $1 ORDER BY next_attempt_at, id LIMIT $2 FOR UPDATE SKIP LOCKED`)
	o.sql.delete = r.Replace(`DELETE FROM {table} WHERE id = ANY ($1)`)
	o.sql.fail = r.Replace(`UPDATE {table} SET attempts = attempts + 1, next_attempt_at = $2, last_error = $3 WHERE id = $1`)
	o.sql.pending = r.Replace(`SELECT count(*) FROM {table}`)
	return o, nil
}

// Migrate creates the schema, the table and its index when they do not exist. It is
// idempotent and safe to run from several replicas at once.
func (o *Outbox) Migrate(ctx context.Context) error {
	return migrate(ctx, o.pool, o.sql.schema, "outbox")
}

// Add writes m (ID, Body, ContentType, Header) for queue in tx, the caller's business
// transaction: it is published after tx commits, and never if tx rolls back. An empty
// m.ID is set to a random 128-bit hex id, which the broker keeps so the consumer's
// inbox can deduplicate.
func (o *Outbox) Add(ctx context.Context, tx pgx.Tx, queue string, m *redeliver.Message) error {
	if queue == "" {
		return errors.New("pgbox: outbox: a queue is required")
	}
	if m.ID == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		m.ID = hex.EncodeToString(b[:])
	}
	header := m.Header
	if header == nil {
		header = map[string]string{}
	}
	h, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("pgbox: outbox: encoding header: %w", err)
	}
	body := m.Body
	if body == nil {
		body = []byte{}
	}
	if _, err := tx.Exec(ctx, o.sql.insert, queue, m.ID, m.ContentType, h, body, o.cfg.Clock()); err != nil {
		return fmt.Errorf("pgbox: outbox: adding message %q: %w", m.ID, err)
	}
	return nil
}

// RelayOnce publishes one batch: in one transaction it locks up to Batch due messages
// (FOR UPDATE SKIP LOCKED), publishes them in order through pub (each confirmed),
// deletes those published and reschedules the others with backoff. It returns how many
// it published.
//
// Delivery is at least once: when the process dies, or the commit fails, after a
// confirm, the message stays and is published again — with the same id, which the
// consumer's inbox absorbs. A publish the broker rejects as a duplicate
// (redeliver.ErrDuplicate: it stored the id within its window) counts as published.
func (o *Outbox) RelayOnce(ctx context.Context, pub redeliver.Publisher) (int, error) {
	published := 0
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		now := o.cfg.Clock()
		rows, err := tx.Query(ctx, o.sql.lock, now, o.batch)
		if err != nil {
			return fmt.Errorf("pgbox: outbox: locking batch: %w", err)
		}
		type row struct {
			id       int64
			queue    string
			m        redeliver.Message
			header   []byte
			attempts int
		}
		var batch []row
		for rows.Next() {
			var r row
			if err := rows.Scan(&r.id, &r.queue, &r.m.ID, &r.m.ContentType, &r.header, &r.m.Body, &r.attempts); err != nil {
				rows.Close()
				return fmt.Errorf("pgbox: outbox: reading batch: %w", err)
			}
			batch = append(batch, r)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("pgbox: outbox: reading batch: %w", err)
		}
		var done []int64
		for i := range batch {
			r := &batch[i]
			if err := json.Unmarshal(r.header, &r.m.Header); err != nil {
				r.m.Header = nil // a header the relay cannot read: publish without it
			}
			err := pub.Publish(ctx, r.queue, &r.m)
			if errors.Is(err, redeliver.ErrDuplicate) {
				// The broker holds this id already: an earlier relay's publish was stored
				// and only its confirm, or the commit after it, was lost. Done.
				err = nil
			}
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				wait := o.cfg.Backoff.Backoff(min(r.attempts, 30), 0)
				o.log.Warn("pgbox: outbox: publish failed", slog.String("queue", r.queue),
					slog.String("message_id", r.m.ID), slog.Int("attempts", r.attempts+1),
					slog.Duration("retry_in", wait), slog.Any("error", err))
				if _, err := tx.Exec(ctx, o.sql.fail, r.id, now.Add(wait), err.Error()); err != nil {
					return fmt.Errorf("pgbox: outbox: rescheduling %q: %w", r.m.ID, err)
				}
				continue
			}
			done = append(done, r.id)
		}
		if len(done) > 0 {
			if _, err := tx.Exec(ctx, o.sql.delete, done); err != nil {
				return fmt.Errorf("pgbox: outbox: deleting published: %w", err)
			}
		}
		published = len(done)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return published, nil
}

// Relay runs RelayOnce until ctx ends, at once again after a full batch and after
// PollInterval otherwise (or after an error, which it logs). It returns nil when ctx
// ends.
func (o *Outbox) Relay(ctx context.Context, pub redeliver.Publisher) error {
	for {
		n, err := o.RelayOnce(ctx, pub)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			o.log.Warn("pgbox: outbox: relay failed", slog.Any("error", err))
		}
		if err == nil && n >= o.batch {
			continue
		}
		t := time.NewTimer(o.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Pending returns the number of messages not yet published.
func (o *Outbox) Pending(ctx context.Context) (int, error) {
	var n int
	if err := o.pool.QueryRow(ctx, o.sql.pending).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgbox: outbox: counting: %w", err)
	}
	return n, nil
}
