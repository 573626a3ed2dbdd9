package idempotency

import (
	"context"
	"log/slog"
	"time"

	"github.com/retrysafe/retrysafe/internal/durfmt"
)

// JanitorConfig configures RunJanitor. Zero fields mean the defaults documented on them.
type JanitorConfig struct {
	// Interval between sweeps. Default 1 minute.
	Interval time.Duration
	// Batch is the most records one DeleteExpired call deletes, so no sweep holds locks
	// or blocks the store for long. Default 500.
	Batch int
	// Logger receives sweep failures and, at debug level, sweep counts. Default slog.Default().
	Logger *slog.Logger
	// Middleware, when set, holds sweeps back as it holds takeovers back: while it has
	// seen its store fail within its longest lease, and for that lease after the process
	// started (it cannot know of an outage before), no sweep runs. An outage of every
	// replica that outlasts a record's TTL leaves the record of a live owner expired,
	// with its lease run out (the owner could not renew it) and its answer held until
	// the store returns; a sweep right after the outage would delete the record before
	// the owner stores the answer, and a retry would run the request again. Run the
	// janitor with the middleware of the same process, whose probe sees the outages of
	// the same link. Stores that cannot ping (Pinger) are not held back: without word
	// from them the middleware cannot tell an outage from quiet.
	Middleware *Middleware
}

// Sweep deletes every expired record (on the store's clock), in batches of at most
// batch, and returns how many it deleted. It stops early when ctx ends.
func Sweep(ctx context.Context, j Janitor, batch int) (int, error) {
	if batch <= 0 {
		batch = 500
	}
	total := 0
	for {
		n, err := j.DeleteExpired(ctx, batch)
		total += n
		if err != nil || n < batch {
			return total, err
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// RunJanitor sweeps expired records every cfg.Interval until ctx ends. Failures are
// logged and retried at the next interval. Several replicas may run it at once: a record
// is deleted by exactly one of them.
func RunJanitor(ctx context.Context, j Janitor, cfg JanitorConfig) {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		if wait := cfg.Middleware.sweepWait(ctx); wait > 0 {
			cfg.Logger.DebugContext(ctx, "idempotency: janitor held back: the store failed, or the process started, less than a lease ago", durfmt.Millis("wait_ms", wait))
			hold := time.NewTimer(min(wait, cfg.Interval))
			select {
			case <-ctx.Done():
				hold.Stop()
				return
			case <-hold.C:
			}
			continue
		}
		n, err := Sweep(ctx, j, cfg.Batch)
		switch {
		case err != nil && ctx.Err() == nil:
			cfg.Logger.WarnContext(ctx, "idempotency: janitor sweep failed", "deleted", n, "err", err)
		case n > 0:
			cfg.Logger.DebugContext(ctx, "idempotency: janitor swept expired records", "deleted", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweepWait returns how long the janitor must still leave records alone: as long as
// claims must leave expired leases alone (health.takeoverWait), and for a lease after
// the process started (health.startWait). It starts the store
// probe, which a middleware otherwise starts at its first keyed request, so that the
// middleware's word from the store stays fresh between sweeps. Zero for a nil m and
// for stores that cannot ping.
func (m *Middleware) sweepWait(ctx context.Context) time.Duration {
	if m == nil {
		return 0
	}
	if _, ok := m.cfg.Store.(Pinger); !ok {
		return 0
	}
	m.startProbe()
	if ctx.Err() != nil {
		return 0
	}
	return max(m.health.takeoverWait(), m.health.startWait())
}
