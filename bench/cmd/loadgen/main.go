// Command loadgen is a closed-loop HTTP load generator for Idempotency-Key endpoints:
// N concurrent clients POST for a duration (or a number of requests), each request
// with a key of its own, one shared key (a duplicate storm, then replays), or none. It
// prints throughput, latency quantiles and status counts, as text or one JSON line.
// The engine is package bench/load; this is flag parsing only.
//
//	cd bench && go run ./cmd/loadgen --url http://127.0.0.1:8081/payments -c 32 -d 10s \
//	    --body '{"amount":1250,"currency":"EUR"}' -H 'Content-Type: application/json' --users 32
//
// With --cpu NAME=PID (repeatable), the processor time of each named process and its
// descendants in the measured window is reported too, in seconds and µs per response;
// --idle D measures only that, over D, sending nothing (a shared server's background).
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/retrysafe/retrysafe/bench/load"
)

const usage = `usage: loadgen --url URL [flags]

A closed-loop load generator: --clients concurrent clients, each sending its next
request when the previous one is answered, for --duration (after --warmup) or until
--requests are done. Every request carries an Idempotency-Key: a new one each time
(--keys unique), one for all (--keys shared), or none (--keys none). --rate R paces
it: requests are due at R a second over all clients, each sent when due (at once when
the clients have fallen behind), so that two servers are compared at one load.

--cpu NAME=PID (repeatable; PID "self" is loadgen) adds the processor time each
process and its descendants used in the measured window, from /proc (Linux);
NAME=PID:MATCH counts only PID's descendants whose command line holds MATCH (the
backends of one PostgreSQL role). --idle D sends nothing and measures only that, over
D; --url is then not needed.

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

// procs is a repeatable --cpu NAME=PID[:MATCH] flag; PID "self" is this process.
type procs []load.Process

func (p *procs) String() string { return "" }

func (p *procs) Set(s string) error {
	name, v, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("cpu %q: want NAME=PID or NAME=PID:MATCH", s)
	}
	v, match, _ := strings.Cut(v, ":")
	pid := os.Getpid()
	if v != "self" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("cpu %q: PID %q is not a positive number or self", s, v)
		}
		pid = n
	}
	*p = append(*p, load.Process{Name: name, PID: pid, Match: match})
	return nil
}

// options are the flags that are not load.Config's.
type options struct {
	format string
	idle   time.Duration
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, o, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 2
	}
	var res *load.Result
	if o.idle > 0 {
		res, err = load.MeasureIdle(ctx, load.IdleConfig{CPU: cfg.CPU, Duration: o.idle, ClockTicks: cfg.ClockTicks, Tags: cfg.Tags})
	} else {
		res, err = load.Run(ctx, cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 1
	}
	if o.format == "json" {
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

func parse(args []string, stderr io.Writer) (load.Config, options, error) {
	var cfg load.Config
	var o options
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	hdr := headers{}
	tg := tags{}
	var body, bodyFile, keys string
	var cpu procs
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
	fs.Float64Var(&cfg.Rate, "rate", 0, "pace the run: requests a second over all clients, each sent when due or,\n"+
		"when the clients have fallen behind, at once; latency counts from the due time (0: as fast as the clients go)")
	fs.StringVar(&keys, "keys", "unique", "Idempotency-Key per request: unique, shared or none")
	fs.StringVar(&cfg.Key, "key", "", "the shared key of --keys shared (default random)")
	fs.StringVar(&cfg.KeyPrefix, "key-prefix", "", "prefix of unique keys (default random)")
	fs.IntVar(&cfg.Users, "users", 0, "client i sends Authorization with user i mod N (0: no header)")
	fs.StringVar(&cfg.AuthFormat, "auth-format", "Bearer user%d", "Authorization header of a user number (one %d)")
	fs.StringVar(&cfg.Preconnect, "preconnect", "", "URL every client GETs once before all start together")
	fs.Var(tg, "tag", "key=value copied into the result (repeatable)")
	fs.StringVar(&o.format, "format", "text", "output: text or json (one line)")
	fs.Var(&cpu, "cpu", "NAME=PID[:MATCH]: report the processor time of PID and its descendants, or of those of its\n"+
		"descendants whose command line holds MATCH (repeatable; PID self is loadgen)")
	fs.IntVar(&cfg.ClockTicks, "clk-tck", load.DefaultClockTicks, "unit of /proc's CPU times (getconf CLK_TCK)")
	fs.DurationVar(&o.idle, "idle", 0, "send nothing: measure the --cpu processes over this long")
	if err := fs.Parse(args); err != nil {
		return cfg, o, err
	}
	if fs.NArg() > 0 {
		return cfg, o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.format != "text" && o.format != "json" {
		return cfg, o, fmt.Errorf("--format %q: want text or json", o.format)
	}
	if len(tg) > 0 {
		cfg.Tags = tg
	}
	cfg.CPU = cpu
	if o.idle < 0 {
		return cfg, o, errors.New("--idle: negative duration")
	}
	if o.idle > 0 {
		if len(cpu) == 0 {
			return cfg, o, errors.New("--idle needs at least one --cpu")
		}
		return cfg, o, nil
	}
	if cfg.URL == "" {
		return cfg, o, errors.New("--url is required (see --help)")
	}
	km, err := load.ParseKeyMode(keys)
	if err != nil {
		return cfg, o, err
	}
	cfg.Keys = km
	switch {
	case body != "" && bodyFile != "":
		return cfg, o, errors.New("--body and --body-file exclude each other")
	case bodyFile != "":
		b, err := os.ReadFile(bodyFile)
		if err != nil {
			return cfg, o, fmt.Errorf("--body-file: %w", err)
		}
		cfg.Body = b
	case body != "":
		cfg.Body = []byte(body)
	}
	if len(hdr) > 0 {
		cfg.Header = http.Header(hdr)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, o, err
	}
	return cfg, o, nil
}
