// Command payments serves a POST /payments endpoint that a retried request never pays
// twice: an Idempotency-Key on every payment, and the ledger write and the stored
// response committed in one transaction. The server itself is package ledger; this is the wiring.
//
//	go run ./examples/payments                     # SQLite file payments.db
//	go run ./examples/payments --store postgres://postgres@127.0.0.1:5432/test?sslmode=disable
//	go run ./examples/payments --no-idempotency    # the unprotected baseline
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/examples/payments/ledger"
)

const usage = `payments serves POST /payments with Idempotency-Key semantics.

Usage:
  go run ./examples/payments [flags]

Endpoints:
  POST /payments       body {"amount": <int > 0, minor units>, "currency": "<3 letters>"};
                       needs an Idempotency-Key header; 201 with the payment. The same key
                       and body again replays the stored 201 (Idempotent-Replayed: true);
                       the same key with another body is 422; while the first request
                       runs, 409.
  GET  /payments/{id}  one of your payments
  GET  /payments       {"count": n}, how many payments you have

The caller is "Authorization: Bearer <user>" (a demo stand-in for authentication; no
header is the user "anonymous"). Keys are scoped per user.

Example:
  curl -i -X POST http://127.0.0.1:8081/payments \
    -H 'Authorization: Bearer alice' \
    -H 'Content-Type: application/json' \
    -H "Idempotency-Key: $(uuidgen)" \
    -d '{"amount": 1250, "currency": "EUR"}'
  Send it again with the same key: the same payment comes back, and no second one is
  made (GET /payments counts them).

Flags:
`

type options struct {
	addr          string
	store         string
	schema        string
	tx            bool
	batch         bool
	noIdempotency bool
}

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err := run(context.Background(), os.Args[1:], os.Stderr, logger)
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		logger.Error("payments: exiting", "err", err)
		os.Exit(1)
	}
}

func parse(args []string, out io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("payments", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8081", "listen address")
	fs.StringVar(&o.store, "store", "sqlite:payments.db",
		"database of the ledger and the idempotency records: sqlite:<file>, or a postgres:// URL\n"+
			"(pool size: add pool_max_conns=N to the URL)")
	fs.StringVar(&o.schema, "schema", "retrysafe_payments", "PostgreSQL schema of the ledger and idempotency tables (created if missing)")
	fs.BoolVar(&o.tx, "tx", true,
		"transaction mode: the ledger insert and the stored response commit in one transaction\n"+
			"(the store's WithTx); --tx=false writes the ledger first and stores the response after")
	fs.BoolVar(&o.batch, "batch", true,
		"PostgreSQL: batch concurrent claims (and, with --tx=false, completions) into shared statements\n"+
			"(pgstore's Config.Batch, group commit)")
	fs.BoolVar(&o.noIdempotency, "no-idempotency", false,
		"serve POST /payments unprotected, without Idempotency-Key (the benchmark baseline; retries pay twice)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q (see --help)", fs.Args())
	}
	txSet := false
	fs.Visit(func(f *flag.Flag) { txSet = txSet || f.Name == "tx" })
	if o.noIdempotency && txSet && o.tx {
		return o, errors.New("--tx and --no-idempotency exclude each other")
	}
	return o, nil
}

func run(ctx context.Context, args []string, out io.Writer, logger *slog.Logger) error {
	o, err := parse(args, out)
	if err != nil {
		return err
	}
	cfg := ledger.Config{Mode: ledger.ModeTx, Logger: logger}
	switch {
	case o.noIdempotency:
		cfg.Mode = ledger.ModeUnprotected
	case !o.tx:
		cfg.Mode = ledger.ModeMiddleware
	}
	cfg.Idempotency.CanonicalJSON = true // {"currency":"EUR","amount":1} is the same request as {"amount":1,"currency":"EUR"}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	srv, closeAll, backend, err := open(ctx, o, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if err := closeAll(); err != nil {
			logger.Error("payments: closing the database", "err", err)
		}
	}()

	hs := &http.Server{Addr: o.addr, Handler: srv, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	logger.Info("payments: serving", "addr", "http://"+ln.Addr().String(), "store", backend, "mode", cfg.Mode.String())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("payments: shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// open makes the server on the database --store names. closeAll closes it and its
// pool; backend describes the database for logs.
func open(ctx context.Context, o options, cfg ledger.Config) (srv *ledger.Server, closeAll func() error, backend string, err error) {
	switch {
	case strings.HasPrefix(o.store, "sqlite:"):
		path := strings.TrimPrefix(o.store, "sqlite:")
		srv, err = ledger.OpenSQLite(ctx, ledger.SQLiteConfig{Config: cfg, Path: path})
		if err != nil {
			return nil, nil, "", err
		}
		return srv, srv.Close, "sqlite " + path, nil
	case strings.HasPrefix(o.store, "postgres://"), strings.HasPrefix(o.store, "postgresql://"):
		pool, err := pgxpool.New(ctx, o.store)
		if err != nil {
			return nil, nil, "", fmt.Errorf("postgres: %w", err)
		}
		srv, err = ledger.NewPostgres(ctx, ledger.PostgresConfig{Config: cfg, Pool: pool, Schema: o.schema, Batch: o.batch})
		if err != nil {
			pool.Close()
			return nil, nil, "", err
		}
		c := pool.Config().ConnConfig
		closeAll = func() error {
			err := srv.Close()
			pool.Close()
			return err
		}
		return srv, closeAll, fmt.Sprintf("postgres %s:%d/%s schema %s", c.Host, c.Port, c.Database, o.schema), nil
	default:
		return nil, nil, "", fmt.Errorf("--store %q: want sqlite:<file> or a postgres:// URL", o.store)
	}
}
