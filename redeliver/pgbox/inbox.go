package pgbox

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/internal/pgddl"
	"github.com/retrysafe/retrysafe/internal/sqlname"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/internal/inbox"
	"github.com/retrysafe/retrysafe/retry"
)

//go:embed inbox.sql
var inboxSQL string

var _ redeliver.Inbox = (*Inbox)(nil)

// ErrNoID: a message without an id cannot be deduplicated. The inbox returns it marked
// permanent (retry.Permanent), so the Consumer dead-letters the message.
var ErrNoID = errors.New("pgbox: message has no id")

// InboxConfig configures an Inbox. Pool is required; the zero value of every other field
// means the default documented on it.
type InboxConfig struct {
	// Pool is the connection pool, the one the handlers' business writes use. Required;
	// the Inbox never closes it.
	Pool *pgxpool.Pool
	// Schema is the table's schema. Default "public".
	Schema string
	// Table is the table's name. Default "retrysafe_inbox".
	Table string
	// TTL is how long a processed id is remembered: a duplicate that arrives later runs
	// the handler again. Make it longer than any redelivery can take (the retry delays,
	// a consumer outage, a DLQ replay of a duplicate). Default 7 days.
	TTL time.Duration
	// Clock is the time source of processing and expiry times. Nil means time.Now.
	Clock func() time.Time
}

// DefaultTTL is InboxConfig.TTL's default.
const DefaultTTL = 7 * 24 * time.Hour

// Inbox makes a consumer idempotent: it records each processed message id in the
// transaction of the handler's business writes. Make one with NewInbox.
type Inbox struct {
	pool                                 *pgxpool.Pool
	ttl                                  time.Duration
	now                                  func() time.Time
	schemaSQL, insert, seen, deleteExpir string
}

// NewInbox returns an Inbox. Schema and Table must be lowercase SQL identifiers (letters,
// digits and underscores, not starting with a digit; at most 63 and 48 bytes). It does
// no I/O; call Migrate to create the table.
func NewInbox(cfg InboxConfig) (*Inbox, error) {
	if cfg.Pool == nil {
		return nil, errors.New("pgbox: InboxConfig.Pool is nil")
	}
	r, err := replacer(cfg.Schema, cfg.Table, "retrysafe_inbox", "_expires_at_idx")
	if err != nil {
		return nil, err
	}
	i := &Inbox{
		pool:      cfg.Pool,
		ttl:       cmp.Or(cfg.TTL, DefaultTTL),
		now:       cfg.Clock,
		schemaSQL: r.Replace(inboxSQL),
		insert: r.Replace(`INSERT INTO {table} (queue, message_id, processed_at, expires_at)
VALUES ($1, $2, $3, $4) ON CONFLICT (queue, message_id) DO NOTHING`),
		seen: r.Replace(`SELECT EXISTS (SELECT FROM {table} WHERE queue = $1 AND message_id = $2)`),
		deleteExpir: r.Replace(`DELETE FROM {table} WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM {table} WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED))`),
	}
	if i.now == nil {
		i.now = time.Now
	}
	return i, nil
}

// replacer validates the names and returns the replacer of the SQL templates.
func replacer(schema, table, defTable, indexSuffix string) (*strings.Replacer, error) {
	schema = cmp.Or(schema, "public")
	table = cmp.Or(table, defTable)
	if !sqlname.Valid(schema, 63) {
		return nil, fmt.Errorf("pgbox: invalid schema name %q", schema)
	}
	if !sqlname.Valid(table, 48) {
		return nil, fmt.Errorf("pgbox: invalid table name %q", table)
	}
	return strings.NewReplacer(
		"{schema}", pgx.Identifier{schema}.Sanitize(),
		"{table}", pgx.Identifier{schema, table}.Sanitize(),
		"{index}", pgx.Identifier{table + indexSuffix}.Sanitize(),
	), nil
}

// Migrate creates the schema, the table and its index when they do not exist. It is
// idempotent and safe to run from several replicas at once.
func (i *Inbox) Migrate(ctx context.Context) error {
	return migrate(ctx, i.pool, i.schemaSQL, "inbox")
}

func migrate(ctx context.Context, pool *pgxpool.Pool, ddl, what string) error {
	if err := pgddl.Apply(ctx, pool, ddl); err != nil {
		return fmt.Errorf("pgbox: migrate %s: %w", what, err)
	}
	return nil
}

// Do runs fn in a transaction that first records (m.Queue, m.ID) with INSERT … ON
// CONFLICT DO NOTHING, and commits both together. When the id was already recorded —
// a redelivered or republished duplicate of a message whose transaction committed — it
// rolls back without calling fn and returns ran == false and a nil error, so the
// duplicate is acknowledged without running again. When fn fails, nothing is recorded
// and its error is returned (wrapped by nothing: errors.Is and As see it as it was).
//
// Two deliveries of one message running at once are serialized by the primary key: the
// second insert waits for the first transaction and then finds the row (a duplicate)
// or, when the first rolled back, takes its place.
//
// A message with an empty ID fails with ErrNoID, marked permanent.
//
// Called inside the transaction this Inbox (or one on the same database handle and
// table) opened for the same message — a Handler made by Inbox.Handler, run by a
// Consumer whose Config.Inbox is this Inbox — it runs fn in that transaction: the id is
// recorded once.
func (i *Inbox) Do(ctx context.Context, m *redeliver.Message, fn func(ctx context.Context, tx pgx.Tx) error) (ran bool, err error) {
	if m.ID == "" {
		return false, retry.Permanent(fmt.Errorf("pgbox: queue %q: %w", m.Queue, ErrNoID))
	}
	if cur, ok := ctx.Value(txKey{}).(*current); ok && cur.same(i) && cur.queue == m.Queue && cur.id == m.ID {
		return true, fn(ctx, cur.tx)
	}
	now := i.now()
	err = pgx.BeginFunc(ctx, i.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, i.insert, m.Queue, m.ID, now, now.Add(i.ttl))
		if err != nil {
			return fmt.Errorf("pgbox: recording message %q: %w", m.ID, err)
		}
		if tag.RowsAffected() == 0 {
			return errDuplicate
		}
		ran = true
		ctx := context.WithValue(ctx, txKey{}, &current{inbox: i, queue: m.Queue, id: m.ID, tx: tx})
		return fn(ctx, tx)
	})
	switch {
	case errors.Is(err, errDuplicate):
		return false, nil
	case err != nil:
		return ran, err
	}
	return true, nil
}

// Once runs h through Do, with the transaction in h's context (Tx): it makes Inbox a
// redeliver.Inbox, for Config.Inbox.
func (i *Inbox) Once(ctx context.Context, m *redeliver.Message, h redeliver.Handler) (ran bool, err error) {
	return i.Do(ctx, m, func(ctx context.Context, _ pgx.Tx) error { return h(ctx, m) })
}

// Tx returns the transaction an Inbox opened for the message being handled, in which
// the handler makes its writes so that they commit with the message id; nil when ctx is
// not a handler's context under an Inbox (Config.Inbox, Do or Handler).
func Tx(ctx context.Context) pgx.Tx {
	if cur, ok := ctx.Value(txKey{}).(*current); ok {
		return cur.tx
	}
	return nil
}

// txKey is the context key of the current transaction.
type txKey struct{}

// current is the transaction an Inbox opened for one message.
type current struct {
	inbox     *Inbox
	queue, id string
	tx        pgx.Tx
}

// same reports whether i records ids where cur's inbox does (one database handle, one
// table; two Inboxes made from one configuration are the same), so that a Do of i inside
// cur joins cur's transaction rather than waiting for its row lock.
func (cur *current) same(i *Inbox) bool {
	return cur.inbox.pool == i.pool && cur.inbox.insert == i.insert
}

// errDuplicate rolls back a duplicate's transaction.
var errDuplicate = errors.New("pgbox: duplicate")

// Handler returns a redeliver.Handler that runs fn through Do: exactly once per message
// id, as far as the database's commits go. Under a Consumer whose Config.Inbox is i, fn
// joins the transaction the Consumer's inbox opened (and the Consumer counts the
// duplicates); without it, the Handler opens its own.
func (i *Inbox) Handler(fn func(ctx context.Context, tx pgx.Tx, m *redeliver.Message) error) redeliver.Handler {
	return inbox.Handler(i.Do, fn)
}

// Seen reports whether the message id of queue is recorded.
func (i *Inbox) Seen(ctx context.Context, queue, id string) (bool, error) {
	var ok bool
	if err := i.pool.QueryRow(ctx, i.seen, queue, id).Scan(&ok); err != nil {
		return false, fmt.Errorf("pgbox: reading inbox: %w", err)
	}
	return ok, nil
}

// DeleteExpired deletes up to batch ids (batch <= 0: 1000) whose TTL has passed and
// returns how many it deleted. Run it periodically; concurrent calls skip each other's
// rows. Until it runs, an expired id still absorbs duplicates.
func (i *Inbox) DeleteExpired(ctx context.Context, batch int) (int, error) {
	if batch <= 0 {
		batch = inbox.DefaultDeleteBatch
	}
	tag, err := i.pool.Exec(ctx, i.deleteExpir, i.now(), batch)
	if err != nil {
		return 0, fmt.Errorf("pgbox: deleting expired inbox rows: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
