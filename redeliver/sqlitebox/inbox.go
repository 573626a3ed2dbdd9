// Package sqlitebox is redeliver's Inbox on SQLite, for a consumer whose business data
// lives in a SQLite database (modernc.org/sqlite, no cgo; any database/sql SQLite driver
// works). It is the SQLite twin of redeliver/pgbox's Inbox: Do records the message id
// with INSERT … ON CONFLICT DO NOTHING in the transaction of the handler's writes, and a
// duplicate rolls back and is acknowledged without running the handler again. Set it as
// the consumer's redeliver.Config.Inbox and make the handler's writes through Tx(ctx):
//
//	c, err := redeliver.New(redeliver.Config{Source: src, Inbox: inbox,
//		Handler: func(ctx context.Context, m *redeliver.Message) error {
//			_, err := sqlitebox.Tx(ctx).ExecContext(ctx, "INSERT INTO grants (grant_id) VALUES (?)", m.ID)
//			return err
//		}})
//
// The Consumer then acks a duplicate without running the handler and counts it
// (retrysafe_redeliver_duplicates_total). Inbox.Do and Inbox.Handler do the same outside
// a Consumer.
//
// # Transactions
//
// SQLite has one writer at a time. Open the database with a DSN that makes write
// transactions take the lock at BEGIN and wait for it rather than fail, for example
//
//	file:app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate
//
// (modernc.org/sqlite's parameters), or give the *sql.DB a single connection
// (SetMaxOpenConns(1)). Then two deliveries of one message are serialized: the second
// finds the first's row, or its place when the first rolled back.
package sqlitebox

import (
	"cmp"
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

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
var ErrNoID = errors.New("sqlitebox: message has no id")

// InboxConfig configures an Inbox. DB is required; the zero value of every other field
// means the default documented on it.
type InboxConfig struct {
	// DB is the database the handlers' business writes go to. Required; the Inbox never
	// closes it. See the package doc for its DSN.
	DB *sql.DB
	// Table is the table's name (letters, digits and underscores, not starting with a
	// digit). Default "retrysafe_inbox".
	Table string
	// TTL is how long a processed id is remembered. Default 7 days.
	TTL time.Duration
	// Clock is the time source of processing and expiry times. Nil means time.Now.
	Clock func() time.Time
}

// DefaultTTL is InboxConfig.TTL's default.
const DefaultTTL = 7 * 24 * time.Hour

// Inbox records processed message ids in SQLite. Make one with NewInbox.
type Inbox struct {
	db                                   *sql.DB
	ttl                                  time.Duration
	now                                  func() time.Time
	schema, insert, seen, deleteExpiredQ string
}

// NewInbox returns an Inbox. It does no I/O; call Migrate to create the table.
func NewInbox(cfg InboxConfig) (*Inbox, error) {
	if cfg.DB == nil {
		return nil, errors.New("sqlitebox: InboxConfig.DB is nil")
	}
	table := cmp.Or(cfg.Table, "retrysafe_inbox")
	if !sqlname.ValidAnyCase(table, 64) {
		return nil, fmt.Errorf("sqlitebox: invalid table name %q", table)
	}
	r := strings.NewReplacer("{table}", `"`+table+`"`, "{index}", `"`+table+`_expires_at"`)
	i := &Inbox{
		db:     cfg.DB,
		ttl:    cmp.Or(cfg.TTL, DefaultTTL),
		now:    cfg.Clock,
		schema: r.Replace(inboxSQL),
		insert: r.Replace(`INSERT INTO {table} (queue, message_id, processed_at, expires_at)
VALUES (?, ?, ?, ?) ON CONFLICT (queue, message_id) DO NOTHING`),
		seen: r.Replace(`SELECT EXISTS (SELECT 1 FROM {table} WHERE queue = ? AND message_id = ?)`),
		deleteExpiredQ: r.Replace(`DELETE FROM {table} WHERE (queue, message_id) IN (
	SELECT queue, message_id FROM {table} WHERE expires_at <= ? LIMIT ?)`),
	}
	if i.now == nil {
		i.now = time.Now
	}
	return i, nil
}

// Migrate creates the table and its index when they do not exist. Idempotent.
func (i *Inbox) Migrate(ctx context.Context) error {
	for _, stmt := range strings.Split(stripComments(i.schema), ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := i.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("sqlitebox: migrate: %w", err)
		}
	}
	return nil
}

func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if j := strings.Index(line, "--"); j >= 0 {
			line = line[:j]
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}

// Do runs fn in a transaction that first records (m.Queue, m.ID), and commits both
// together. A duplicate (the id is recorded) rolls back without calling fn and returns
// ran == false, nil. fn's error, or its panic, rolls back; the error is returned as it
// is. A message with an empty ID fails with ErrNoID, marked permanent.
//
// Called inside the transaction this Inbox (or one on the same database handle and
// table) opened for the same message — a Handler made by Inbox.Handler, run by a
// Consumer whose Config.Inbox is this Inbox — it runs fn in that transaction: the id is
// recorded once.
func (i *Inbox) Do(ctx context.Context, m *redeliver.Message, fn func(ctx context.Context, tx *sql.Tx) error) (ran bool, err error) {
	if m.ID == "" {
		return false, retry.Permanent(fmt.Errorf("sqlitebox: queue %q: %w", m.Queue, ErrNoID))
	}
	if cur, ok := ctx.Value(txKey{}).(*current); ok && cur.same(i) && cur.queue == m.Queue && cur.id == m.ID {
		return true, fn(ctx, cur.tx)
	}
	now := i.now()
	tx, err := i.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("sqlitebox: begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback() // also when fn panics: the write lock must not stay held
		}
	}()
	res, err := tx.ExecContext(ctx, i.insert, m.Queue, m.ID, now.UnixMilli(), now.Add(i.ttl).UnixMilli())
	if err != nil {
		return false, fmt.Errorf("sqlitebox: recording message %q: %w", m.ID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("sqlitebox: recording message %q: %w", m.ID, err)
	}
	if n == 0 {
		return false, nil
	}
	fctx := context.WithValue(ctx, txKey{}, &current{inbox: i, queue: m.Queue, id: m.ID, tx: tx})
	if err := fn(fctx, tx); err != nil {
		return true, err
	}
	committed = true
	if err := tx.Commit(); err != nil {
		return true, fmt.Errorf("sqlitebox: commit: %w", err)
	}
	return true, nil
}

// Once runs h through Do, with the transaction in h's context (Tx): it makes Inbox a
// redeliver.Inbox, for Config.Inbox.
func (i *Inbox) Once(ctx context.Context, m *redeliver.Message, h redeliver.Handler) (ran bool, err error) {
	return i.Do(ctx, m, func(ctx context.Context, _ *sql.Tx) error { return h(ctx, m) })
}

// Tx returns the transaction an Inbox opened for the message being handled, in which
// the handler makes its writes so that they commit with the message id; nil when ctx is
// not a handler's context under an Inbox (Config.Inbox, Do or Handler).
func Tx(ctx context.Context) *sql.Tx {
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
	tx        *sql.Tx
}

// same reports whether i records ids where cur's inbox does (one database handle, one
// table; two Inboxes made from one configuration are the same), so that a Do of i inside
// cur joins cur's transaction rather than waiting for its row lock.
func (cur *current) same(i *Inbox) bool {
	return cur.inbox.db == i.db && cur.inbox.insert == i.insert
}

// Handler returns a redeliver.Handler that runs fn through Do. Under a Consumer whose
// Config.Inbox is i, fn joins the transaction the Consumer's inbox opened (and the
// Consumer counts the duplicates); without it, the Handler opens its own.
func (i *Inbox) Handler(fn func(ctx context.Context, tx *sql.Tx, m *redeliver.Message) error) redeliver.Handler {
	return inbox.Handler(i.Do, fn)
}

// Seen reports whether the message id of queue is recorded.
func (i *Inbox) Seen(ctx context.Context, queue, id string) (bool, error) {
	var ok bool
	if err := i.db.QueryRowContext(ctx, i.seen, queue, id).Scan(&ok); err != nil {
		return false, fmt.Errorf("sqlitebox: reading inbox: %w", err)
	}
	return ok, nil
}

// DeleteExpired deletes up to batch ids (batch <= 0: 1000) whose TTL has passed and
// returns how many it deleted.
func (i *Inbox) DeleteExpired(ctx context.Context, batch int) (int, error) {
	if batch <= 0 {
		batch = inbox.DefaultDeleteBatch
	}
	res, err := i.db.ExecContext(ctx, i.deleteExpiredQ, i.now().UnixMilli(), batch)
	if err != nil {
		return 0, fmt.Errorf("sqlitebox: deleting expired inbox rows: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}
