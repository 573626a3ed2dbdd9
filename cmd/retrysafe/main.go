// Command retrysafe makes retries safe. Its main job is `retrysafe gateway`, a reverse
// proxy that gives any HTTP API Idempotency-Key semantics; see `retrysafe help`.
//
// This file and its siblings only parse flags and wire the packages together: the
// behaviour is in package gateway, the stores and package storedsn.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1 // the command ran and failed (or the demo saw a duplicate)
	exitUsage = 2 // bad flags, or a setup error before serving
)

func main() {
	// go-redis logs its dial retries on stderr by itself; route them to debug logs, so
	// that a failure is reported once, on one line.
	redis.SetLogger(redisLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills the process the default way
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	commands := map[string]func(context.Context, []string, io.Writer, io.Writer) int{
		"gateway": runGateway, "migrate": runMigrate, "keys": runKeys, "demo": runDemo,
		"check": runCheck, "sim": runSim, "dlq": runDLQ, "config": runConfig, "console": runConsole,
		"doctor":  runDoctor,
		"version": runVersion, "--version": runVersion, "-version": runVersion, "-v": runVersion,
	}
	if run, ok := commands[cmd]; ok {
		return run(ctx, rest, stdout, stderr)
	}
	switch cmd {
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 {
			if rest[0] == referenceTopic { // not listed: it writes docs/configuration.md
				if err := writeReference(stdout); err != nil {
					return fail(stderr, "retrysafe help", err, exitFail)
				}
				return exitOK
			}
			if h, ok := helps()[rest[0]]; ok {
				fmt.Fprint(stdout, h)
				return exitOK
			}
			fmt.Fprintf(stderr, "retrysafe help: unknown command %q (commands: gateway, config, console, doctor, demo, keys, check, sim, dlq, migrate, version, help)\n", rest[0])
			return exitUsage
		}
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "retrysafe: unknown command %q (run retrysafe help)\n", cmd)
	return exitUsage
}

func helps() map[string]string {
	return map[string]string{
		"gateway": gatewayHelp(), "migrate": migrateHelp, "keys": keysHelp, "demo": demoHelp,
		"check": checkHelp, "sim": simHelp, "dlq": dlqHelp, "config": configHelp, "console": consoleHelp,
		"doctor":  doctorHelp(),
		"version": versionHelp,
		"help":    usage,
	}
}

const usage = `retrysafe makes retries safe.

usage: retrysafe <command> [flags]

commands:
  gateway   a reverse proxy that gives any HTTP API Idempotency-Key semantics
  config    check a gateway configuration file and print its route table (check FILE)
  demo      run the gateway against a flaky network for a few seconds, in process
  keys      list, show and delete idempotency records (list|show|delete)
  check     check whether an endpoint honours Idempotency-Key (sends real requests)
  sim       simulate what backoff, jitter and retry budgets buy (virtual time)
  dlq       inspect, replay and purge dead letters on RabbitMQ or NATS (list|show|replay|purge)
  console   the operator console (keys, dead letters) in a browser, without a gateway
  doctor    say what the store's setup guarantees: persistence, replication, eviction;
            and the queues' brokers' (RabbitMQ queue types, JetStream replicas)
  migrate   apply the store's schema
  version   print the version
  help      this text, or "retrysafe help <command>"

examples:
  retrysafe demo
  retrysafe gateway --upstream http://127.0.0.1:3000
  retrysafe gateway --upstream http://api:3000 --store postgres://app@db/app --listen :8080
  retrysafe config check examples/gateway.yaml
  retrysafe keys list --store sqlite:retrysafe.db --state in_progress
  retrysafe doctor --store postgres://app@db/app
  retrysafe migrate --store postgres://app@db/app

Every command takes --help.
`

// newLogger returns the logger the commands write to stderr with.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("invalid --log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("invalid --log-format %q: want text or json", format)
}

// redisLogger sends go-redis's own log lines to slog's default logger at debug level.
type redisLogger struct{}

func (redisLogger) Printf(ctx context.Context, format string, v ...any) {
	slog.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}
