// Command payments serves a POST /payments endpoint that a retried request never pays
// twice: an Idempotency-Key on every payment, and the ledger write and the stored
// response committed in one transaction. The server itself is package ledger; this is the wiring.
//
//	go run ./examples/payments                     # SQLite file payments.db
//	go run ./examples/payments --store postgres://postgres@127.0.0.1:5432/test?sslmode=disable
//	go run ./examples/payments --no-idempotency    # the unprotected baseline
package main

import (
	"bytes"
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
	"strconv"
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
	pad           int
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
	fs.IntVar(&o.pad, "pad", 0,
		"pad every application/json answer to this many bytes with a \"pad\" member (benchmarks of body sizes;\n"+
			"0: none). Added in front of the idempotency middleware: a stored response is the unpadded one")
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
	if o.pad < 0 || o.pad > maxPad {
		return o, fmt.Errorf("--pad %d: want 0 to %d", o.pad, maxPad)
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

	var h http.Handler = srv
	if o.pad > 0 {
		h = padJSON(srv, o.pad)
	}
	hs := &http.Server{Addr: o.addr, Handler: h, ReadHeaderTimeout: 10 * time.Second,
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

// maxPad bounds --pad: a benchmark's large body, not a memory test.
const maxPad = 16 << 20

// padJSON makes every application/json answer of h that is a JSON object at least n
// bytes long, by adding a "pad" member of 'x's before its closing brace; other answers,
// and those already that long, pass unchanged. The answer is held whole to be padded,
// so Content-Length stays exact.
func padJSON(h http.Handler, n int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pw := &padWriter{w: w, header: http.Header{}}
		h.ServeHTTP(pw, r)
		pw.flush(n)
	})
}

// padWriter holds an answer until its handler returns.
type padWriter struct {
	w      http.ResponseWriter
	header http.Header
	status int
	body   []byte
}

func (p *padWriter) Header() http.Header { return p.header }

func (p *padWriter) WriteHeader(code int) {
	if p.status == 0 {
		p.status = code
	}
}

func (p *padWriter) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	p.body = append(p.body, b...)
	return len(b), nil
}

func (p *padWriter) flush(n int) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	body := padded(p.header.Get("Content-Type"), p.body, n)
	h := p.w.Header()
	for k, v := range p.header {
		h[k] = v
	}
	if len(p.body) > 0 || h.Get("Content-Length") != "" {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	p.w.WriteHeader(p.status)
	_, _ = p.w.Write(body)
}

// padded is body, a JSON object of content type ct, grown to n bytes with a "pad"
// member; body itself when it is no JSON object, or when it is n bytes or more.
func padded(ct string, body []byte, n int) []byte {
	mt, _, _ := strings.Cut(ct, ";")
	if !strings.EqualFold(strings.TrimSpace(mt), "application/json") {
		return body
	}
	trimmed := bytes.TrimRight(body, " \t\r\n")
	end := len(trimmed) - 1
	if end < 1 || trimmed[0] != '{' || trimmed[end] != '}' {
		return body
	}
	sep := `,"pad":"`
	if len(bytes.TrimSpace(trimmed[1:end])) == 0 {
		sep = `"pad":"`
	}
	fill := n - len(body) - len(sep) - 1 // the closing quote
	if fill < 0 {
		return body
	}
	out := make([]byte, 0, n)
	out = append(out, trimmed[:end]...)
	out = append(out, sep...)
	out = append(out, bytes.Repeat([]byte{'x'}, fill)...)
	out = append(out, '"')
	return append(out, body[end:]...) // the brace and the white space after it
}
