// Command loadgen is a closed-loop HTTP load generator for Idempotency-Key endpoints:
// N concurrent clients POST for a duration (or a number of requests), each request
// with a key of its own, one shared key (a duplicate storm, then replays), or none. It
// prints throughput, latency quantiles and status counts, as text or one JSON line.
// The engine is package bench/load; this is flag parsing only.
//
//	cd bench && go run ./cmd/loadgen --url http://127.0.0.1:8081/payments -c 32 -d 10s \
//	    --body '{"amount":1250,"currency":"EUR"}' -H 'Content-Type: application/json' --users 32
//
// Exit status: 0 after a run (errors are counted in the result), 1 when the run could
// not be made, 2 for bad flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/retrysafe/retrysafe/bench/load"
)

const usage = `usage: loadgen --url URL [flags]

A closed-loop load generator: --clients concurrent clients, each sending its next
request when the previous one is answered, for --duration (after --warmup) or until
--requests are done. Every request carries an Idempotency-Key: a new one each time
(--keys unique), one for all (--keys shared), or none (--keys none).

flags:
`

// headers is a repeatable -H 'Name: value' flag.
type headers http.Header

func (h headers) String() string { return "" }

func (h headers) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" {
		return fmt.Errorf("header %q: want 'Name: value'", s)
	}
	http.Header(h).Add(name, strings.TrimSpace(value))
	return nil
}

// tags is a repeatable --tag key=value flag.
type tags map[string]string

func (t tags) String() string { return "" }

func (t tags) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("tag %q: want key=value", s)
	}
	t[k] = v
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, format, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 2
	}
	res, err := load.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 1
	}
	if format == "json" {
		b, err := json.Marshal(res)
		if err == nil {
			_, err = fmt.Fprintf(stdout, "%s\n", b)
		}
		if err != nil {
			fmt.Fprintf(stderr, "loadgen: %v\n", err)
			return 1
		}
		return 0
	}
	if err := res.WriteText(stdout); err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 1
	}
	return 0
}

func parse(args []string, stderr io.Writer) (load.Config, string, error) {
	var cfg load.Config
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	hdr := headers{}
	tg := tags{}
	var body, bodyFile, keys, format string
	fs.StringVar(&cfg.URL, "url", "", "target URL (required)")
	fs.StringVar(&cfg.Method, "method", "POST", "request method")
	fs.StringVar(&body, "body", "", "request body")
	fs.StringVar(&bodyFile, "body-file", "", "read the request body from this file")
	fs.Var(hdr, "H", "header 'Name: value' added to every request (repeatable)")
	fs.IntVar(&cfg.Clients, "c", 1, "concurrent clients (shorthand)")
	fs.IntVar(&cfg.Clients, "clients", 1, "concurrent clients")
	fs.DurationVar(&cfg.Duration, "d", 0, "measured duration (shorthand)")
	fs.DurationVar(&cfg.Duration, "duration", 0, "measured duration (default 10s unless --requests)")
	fs.Int64Var(&cfg.Requests, "n", 0, "stop after this many measured requests (shorthand)")
	fs.Int64Var(&cfg.Requests, "requests", 0, "stop after this many measured requests, over all clients")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "run this long before measuring")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "per-request timeout (default 30s)")
	fs.StringVar(&keys, "keys", "unique", "Idempotency-Key per request: unique, shared or none")
	fs.StringVar(&cfg.Key, "key", "", "the shared key of --keys shared (default random)")
	fs.StringVar(&cfg.KeyPrefix, "key-prefix", "", "prefix of unique keys (default random)")
	fs.IntVar(&cfg.Users, "users", 0, "client i sends Authorization with user i mod N (0: no header)")
	fs.StringVar(&cfg.AuthFormat, "auth-format", "Bearer user%d", "Authorization header of a user number (one %d)")
	fs.StringVar(&cfg.Preconnect, "preconnect", "", "URL every client GETs once before all start together")
	fs.Var(tg, "tag", "key=value copied into the result (repeatable)")
	fs.StringVar(&format, "format", "text", "output: text or json (one line)")
	if err := fs.Parse(args); err != nil {
		return cfg, "", err
	}
	if fs.NArg() > 0 {
		return cfg, "", fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if cfg.URL == "" {
		return cfg, "", errors.New("--url is required (see --help)")
	}
	if format != "text" && format != "json" {
		return cfg, "", fmt.Errorf("--format %q: want text or json", format)
	}
	km, err := load.ParseKeyMode(keys)
	if err != nil {
		return cfg, "", err
	}
	cfg.Keys = km
	switch {
	case body != "" && bodyFile != "":
		return cfg, "", errors.New("--body and --body-file exclude each other")
	case bodyFile != "":
		b, err := os.ReadFile(bodyFile)
		if err != nil {
			return cfg, "", fmt.Errorf("--body-file: %w", err)
		}
		cfg.Body = b
	case body != "":
		cfg.Body = []byte(body)
	}
	if len(hdr) > 0 {
		cfg.Header = http.Header(hdr)
	}
	if len(tg) > 0 {
		cfg.Tags = tg
	}
	if err := cfg.Validate(); err != nil {
		return cfg, "", err
	}
	return cfg, format, nil
}
