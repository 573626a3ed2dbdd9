package main

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/retrysafe/retrysafe/cmd/retrysafe/internal/demo"
)

const demoHelp = `usage: retrysafe demo [--duration D] [--clients N]

Runs, in this process and with no services, a payments upstream behind the retrysafe
gateway (on SQLite in a temporary directory) and a network that drops responses and
resets connections, with concurrent clients retrying under Idempotency-Keys. It prints a
live progress line, then a table: logical payments, HTTP attempts, replays, 409s, faults
injected, payments recorded, duplicates. Exit status 1 if a duplicate or a lost payment
was ever seen.

flags:
  --duration D   how long the clients start new payments (default 5s)
  --clients N    concurrent clients (default 8)

examples:
  retrysafe demo
  retrysafe demo --duration 30s --clients 32
`

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const cmd = "retrysafe demo"
	var cfg demo.Config
	fs := newFlagSet(cmd)
	fs.DurationVar(&cfg.Duration, "duration", 0, "")
	fs.IntVar(&cfg.Clients, "clients", 0, "")
	if ok, status := parse(fs, args, demoHelp, []string{}, false, stdout, stderr); !ok {
		return status
	}
	if cfg.Duration < 0 || cfg.Duration > 24*time.Hour {
		return fail(stderr, cmd, errors.New("--duration must be between 0 and 24h"), exitUsage)
	}
	if cfg.Clients < 0 || cfg.Clients > 10000 {
		return fail(stderr, cmd, errors.New("--clients must be between 0 and 10000"), exitUsage)
	}
	res, err := demo.Run(ctx, cfg, stdout)
	if err != nil {
		return fail(stderr, cmd, err, exitFail)
	}
	if !res.OK() {
		return exitFail
	}
	return exitOK
}
