package idempotency

import (
	"context"
	"log/slog"
	"time"
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
