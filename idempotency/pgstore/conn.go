package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/idempotency"
)

// CancelGrace is how long a connection of a pool prepared by ConfigurePool waits for
// the server's answer to the cancel request it sends when a call's context ends, before
// it gives the connection up.
const CancelGrace = time.Second

// DefaultProbeTimeout is Config.ProbeTimeout's default: how long Ping waits for its
// write to be acknowledged before it reports the store not durable. A commit on a
// healthy server takes milliseconds; the bound is long enough that one slowed by a busy
// disk is not taken for a lost standby (which would refuse requests until the next
// ping), and short beside the store calls' own bound (5 s in the gateway).
const DefaultProbeTimeout = 3 * time.Second

// errNotDurable is what a write returns when the server reported success but warned
// that the commit's wait for a synchronous standby was cancelled.
var errNotDurable = fmt.Errorf("the server committed the write but warned that no synchronous standby may have it "+
	"(its wait for the standby was cancelled): %w", idempotency.ErrNotDurable)

// probeSQL is Ping's write: a transactional message in the WAL, which needs no
// privilege and no table, and whose commit, like any write's, waits for the synchronous
// standby. (A transaction that only takes a transaction ID, as pg_current_xact_id()
// does, writes no WAL before its commit record, and its commit does not wait.)
const probeSQL = `SELECT pg_logical_emit_message(true, 'retrysafe', '')`

// durabilityKey is the key of a connection's durability in PgConn.CustomData.
const durabilityKey = "github.com/retrysafe/retrysafe/idempotency/pgstore.durability"

// durability is what a connection of a pool made by ConfigurePool has seen of the
// warnings by which PostgreSQL says that a commit is not durable as configured. It is
// read and written only by the goroutine that holds the connection: notices are handled
// while that goroutine reads the statement's results.
type durability struct {
	warned bool
}

// ConfigurePool prepares the configuration of a Store's pool; NewPool applies it.
//
// It installs a notice handler (calling the one cfg has, if any) that catches the
// warning PostgreSQL sends instead of an error when a commit's wait for a synchronous
// standby is cancelled — by a cancel request, pg_cancel_backend or a shutdown — after
// the transaction committed on the primary alone: the statement then reports success,
// and only this warning tells that a failover may lose the write. With it, such a write
// returns an error wrapping idempotency.ErrNotDurable.
//
// It also makes a call whose context ends while the server works send a cancel request
// first (pgconn.CancelRequestContextWatcherHandler), and close the connection only when
// the server has not answered within CancelGrace, rather than close it at once (pgx's
// default). The server's answer then says what happened: a commit waiting for a
// synchronous standby that is away ends with the warning above (ErrNotDurable: the
// store knows at once that it cannot make writes durable, and the connection stays
// usable), a statement waiting for anything else is cancelled and rolled back (an error:
// nothing was written). Either way the server's backend stops waiting, so that
// backends stuck on a lost standby do not pile up.
//
// A Store on a pool without it still reports a write as failed when its own deadline
// interrupts it (pgx closes the connection, and sends a cancel request as it does), but
// cannot tell a write whose wait someone else cancelled from an acknowledged one.
func ConfigurePool(cfg *pgxpool.Config) {
	cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: CancelGrace}
	}
	notice := cfg.ConnConfig.OnNotice
	cfg.ConnConfig.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		if notDurableNotice(n) {
			if d, ok := c.CustomData()[durabilityKey].(*durability); ok {
				d.warned = true
			}
		}
		if notice != nil {
			notice(c, n)
		}
	}
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		c.PgConn().CustomData()[durabilityKey] = &durability{}
		if after != nil {
			return after(ctx, c)
		}
		return nil
	}
}

// NewPool returns a pool on connString (a URL or keyword/value string, with pgx's and
// pgxpool's parameters) prepared by ConfigurePool.
func NewPool(ctx context.Context, connString string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	ConfigurePool(cfg)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// notDurableNotice reports whether n is the warning of a commit whose wait for a
// synchronous standby was cancelled: "canceling wait for synchronous replication due to
// user request" (01000) or "canceling the wait for synchronous replication and
// terminating connection due to administrator command" (57P01), whose detail is "The
// transaction has already committed locally, but might not have been replicated to the
// standby." The messages may be translated, so the severity and the code decide: the
// store's own statements raise no other warning, and a warning of those codes from
// anything else on the connection (a trigger's RAISE WARNING) only makes a write's
// outcome unknown, which is safe.
func notDurableNotice(n *pgconn.Notice) bool {
	return cmp.Or(n.SeverityUnlocalized, n.Severity) == "WARNING" && (n.Code == "01000" || n.Code == "57P01")
}

// do runs fn on a connection of the pool. A write fn makes whose commit the server
// warned about (see ConfigurePool) returns errNotDurable.
//
// When the connection broke under fn (the server went away, a failover, a connection
// reset) while ctx still runs, fn runs once more, on a fresh connection: every idle
// connection of the pool is closed first (pgxpool.Pool.Reset), since a failover breaks
// them all, and pgxpool hands out one that has not been pinged for up to a second. That
// is safe for every statement of the store: a claim sent again with its ID finds its own
// record (one without an ID finds it someone else's, and reports it as in flight until
// its lease ends, as it would after the error this replaces), a completion sent again
// is confirmed, Extend and Abandon only repeat themselves, a release sent again reports
// ErrRecordGone, and the rest only read or delete.
func (s *Store) do(ctx context.Context, fn func(conn *pgx.Conn) error) error {
	broke, err := s.doOnce(ctx, fn)
	if !broke {
		return err
	}
	s.pool.Reset()
	_, err = s.doOnce(ctx, fn)
	return err
}

// doOnce runs fn on a connection of the pool, and reports whether the connection broke.
func (s *Store) doOnce(ctx context.Context, fn func(conn *pgx.Conn) error) (broke bool, err error) {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("no connection: %w", err)
	}
	defer pc.Release()
	conn := pc.Conn()
	d, _ := conn.PgConn().CustomData()[durabilityKey].(*durability)
	if d != nil {
		d.warned = false
	}
	if err := fn(conn); err != nil {
		return conn.IsClosed() && ctx.Err() == nil, err
	}
	if d != nil && d.warned {
		return false, errNotDurable
	}
	return false, nil
}

// Ping implements idempotency.Pinger: it makes a write (a message in the WAL, which
// needs no privilege) and waits for it to be acknowledged, for at most
// Config.ProbeTimeout. When it is not acknowledged in time, or the server warned that it
// is not durable, while the server answers (a second, read-only ping), Ping returns an
// error wrapping idempotency.ErrNotDurable: the server is up but a write cannot be made
// durable now — with synchronous replication, the synchronous standby is away. When
// the server does not answer, the error is the read-only ping's. A server that refuses
// the probe (its function's EXECUTE revoked) is pinged read-only.
func (s *Store) Ping(ctx context.Context) error {
	if s.probe < 0 {
		if err := s.pool.Ping(ctx); err != nil {
			return fmt.Errorf("pgstore: ping: %w", err)
		}
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, s.probe)
	defer cancel()
	err := s.do(pctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(pctx, probeSQL)
		return err
	})
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, idempotency.ErrNotDurable):
		return fmt.Errorf("pgstore: ping: %w", err)
	case errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "42883"): // no privilege, no function
	case ctx.Err() == nil && pctx.Err() != nil:
		if err := s.pool.Ping(ctx); err != nil {
			return fmt.Errorf("pgstore: ping: %w", err)
		}
		return fmt.Errorf("pgstore: ping: the server answers, but a write was not acknowledged within %v "+
			"(a synchronous standby away?): %w", s.probe, idempotency.ErrNotDurable)
	default:
		return fmt.Errorf("pgstore: ping: %w", err)
	}
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("pgstore: ping: %w", err)
	}
	return nil
}
