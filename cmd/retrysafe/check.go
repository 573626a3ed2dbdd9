package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/idempotency/endpointcheck"
)

const checkHelp = `usage: retrysafe check URL [--method POST] [--data @body.json | --data '{"a":1}']
                       [--header 'K: V' …] [--auth A [--auth B]] [--json] [--yes]

Checks whether an endpoint honours Idempotency-Key, from the outside: it sends a battery
of real requests with fresh random keys and prints one row per case, with what the IETF
draft or Stripe expects, what was observed, and pass, fail or n/a:

  missing key                 400 when keys are required (advisory: "keys optional")
  same key, same body         the same status and body; Idempotent-Replayed (advisory)
  same key, 20 concurrent     one execution: identical bodies, or 409s and one result
  same key, other body        422 (at least a 4xx that is not a replay)
  same key, other route       not the first route's response
  same key, two credentials   two independent executions (needs --auth twice)
  malformed keys              400 for an empty key, 256 characters, a control character
  409 Retry-After             every 409 says when to retry
  problem+json errors         application/problem+json (advisory)

The requests are real: valid ones may execute (create a payment, send a mail …). The
banner on stderr says how many. Point it at a test deployment; against a host that is
not loopback it refuses to run without --yes.

flags:
  --method M          request method (default POST)
  --data D            request body: a literal, or @FILE to read it from FILE
  --header 'K: V'     a header for every request (repeatable), e.g. a Content-Type
                      (default application/json when the body is JSON)
  --auth A            an Authorization value, e.g. 'Bearer sk_test_1' (repeatable, at
                      most twice: the second is the other credential of the scope case)
  --other-route R     the route of the other-route case: a path or a URL (default the
                      URL's path + /__retrysafe_check)
  --concurrency N     requests of the concurrent case (default 20)
  --timeout D         bound on each request (default 10s)
  --quoted-keys       send keys in the IETF draft's quoted form ("k") instead of bare
  --json              print the report as JSON
  --yes               run against a host that is not loopback

Exit status: 0 when every required case passed, 1 when one failed (or the endpoint did
not answer), 2 for bad flags or a non-loopback host without --yes.

examples:
  retrysafe check http://127.0.0.1:8080/payments --data '{"amount":100}'
  retrysafe check http://127.0.0.1:8080/payments --data @payment.json \
      --auth 'Bearer test-alice' --auth 'Bearer test-bob'
  retrysafe check https://staging.example.com/v1/charges --data @charge.json \
      --header 'Stripe-Version: 2024-06-20' --auth 'Bearer sk_test_…' --yes --json
`

// checkRepeated is a repeatable string flag.
type checkRepeated []string

func (l *checkRepeated) String() string     { return strings.Join(*l, ", ") }
func (l *checkRepeated) Set(v string) error { *l = append(*l, v); return nil }

func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const cmd = "retrysafe check"
	var (
		cfg            endpointcheck.Config
		data           string
		headers, auths checkRepeated
		asJSON, yes    bool
	)
	fs := newFlagSet(cmd)
	fs.StringVar(&cfg.Method, "method", endpointcheck.DefaultMethod, "")
	fs.StringVar(&data, "data", "", "")
	fs.Var(&headers, "header", "")
	fs.Var(&auths, "auth", "")
	fs.StringVar(&cfg.OtherRoute, "other-route", "", "")
	fs.IntVar(&cfg.Concurrency, "concurrency", endpointcheck.DefaultConcurrency, "")
	fs.DurationVar(&cfg.Timeout, "timeout", endpointcheck.DefaultTimeout, "")
	fs.BoolVar(&cfg.QuotedKeys, "quoted-keys", false, "")
	fs.BoolVar(&asJSON, "json", false, "")
	fs.BoolVar(&yes, "yes", false, "")
	// The URL may come before, between or after the flags.
	var positional []string
	for first := true; first || len(args) > 0; first = false {
		if first {
			if ok, status := parse(fs, args, checkHelp, []string{}, true, stdout, stderr); !ok {
				return status
			}
		} else if err := fs.Parse(args); err != nil {
			return fail(stderr, cmd, fmt.Errorf("%w (see %s --help)", err, cmd), exitUsage)
		}
		args = nil
		if fs.NArg() > 0 {
			positional = append(positional, fs.Arg(0))
			args = fs.Args()[1:]
		}
	}
	switch {
	case len(positional) == 0:
		return fail(stderr, cmd, errors.New("the URL of the endpoint is required (see --help)"), exitUsage)
	case len(positional) > 1:
		return fail(stderr, cmd, fmt.Errorf("unexpected argument %q: one URL only (see --help)", positional[1]), exitUsage)
	case cfg.Timeout <= 0:
		return fail(stderr, cmd, errors.New("--timeout must be positive"), exitUsage)
	}
	cfg.URL = positional[0]
	cfg.Auth = auths
	if len(auths) > 2 {
		return fail(stderr, cmd, fmt.Errorf("--auth given %d times: at most twice", len(auths)), exitUsage)
	}
	cfg.Header = http.Header{}
	for _, h := range headers {
		k, v, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return fail(stderr, cmd, fmt.Errorf("--header %q: want 'Name: value'", h), exitUsage)
		}
		cfg.Header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	if name, ok := strings.CutPrefix(data, "@"); ok {
		b, err := os.ReadFile(name)
		if err != nil {
			return fail(stderr, cmd, fmt.Errorf("--data: %w", err), exitUsage)
		}
		cfg.Body = b
	} else {
		cfg.Body = []byte(data)
	}
	n, err := endpointcheck.Requests(cfg)
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	host := cfg.URL
	if u, err := url.Parse(cfg.URL); err == nil {
		host = u.Host
	}
	if !endpointcheck.Loopback(cfg.URL) && !yes {
		return fail(stderr, cmd, fmt.Errorf("%s is not a loopback address: the check sends %d real requests, and the valid ones may execute (create payments, send mail …); run it against a test deployment and add --yes to confirm", host, n), exitUsage)
	}
	fmt.Fprintf(stderr, "%s: sending about %d real requests to %s %s; each valid one may execute\n", cmd, n, strings.ToUpper(cfg.Method), host)
	start := time.Now()
	rep, err := endpointcheck.Check(ctx, cfg)
	switch {
	case errors.Is(err, endpointcheck.ErrConfig):
		return fail(stderr, cmd, err, exitUsage)
	case err != nil:
		return fail(stderr, cmd, err, exitFail)
	}
	if asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return fail(stderr, cmd, err, exitFail)
	}
	fmt.Fprintf(stderr, "%s: %d requests in %s\n", cmd, rep.Requests, time.Since(start).Round(time.Millisecond))
	if rep.Failed() {
		return exitFail
	}
	return exitOK
}
