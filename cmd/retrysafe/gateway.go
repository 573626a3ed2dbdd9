package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/cmd/retrysafe/internal/storedsn"
	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
)

const gatewayHelp = `usage: retrysafe gateway --upstream URL [flags]

A reverse proxy that gives any HTTP API Idempotency-Key semantics. Keyed requests
(POST and PATCH by default) are claimed in the store, forwarded, and their responses
stored; a retry with the same key gets the stored response (Idempotent-Replayed: true)
and never reaches the upstream twice. 409 while in flight, 422 for a key reused with
another request, 400 without a key. The key is forwarded unchanged.

Upstream never reached: 502, key released. Upstream timed out after the request was
sent: 504, key kept until its lease ends (the request is never resent by the gateway
itself). Upstream 429/503: passed through, key released. Store unreachable when an
answer is to be stored: the client gets it, the gateway keeps it and stores it when the
store answers. SIGTERM/SIGINT: stop accepting, finish and record the requests in
flight, store the answers kept, exit 0 (1 if some could not be stored; each is logged).

The TTL must be longer than the lease and the upstream timeout, so that no record can
expire while its request may still run.

flags (each can also be set from the environment: --max-body from RETRYSAFE_MAX_BODY,
--upstream from RETRYSAFE_UPSTREAM, and so on; a flag on the command line wins):
  --upstream URL           the API to protect: http:// or https:// (required)
  --listen ADDR            proxy address (default 127.0.0.1:8080; port 0 picks one, and
                           the address is logged)
  --admin ADDR             /healthz, /readyz, /metrics (default 127.0.0.1:9090; "off"
                           disables)
  --store DSN              sqlite:PATH (default sqlite:retrysafe.db), postgres://…
                           (optional ?schema=NAME), redis://… (optional ?prefix=P),
                           memory: — the schema is applied at start. SQLite and
                           PostgreSQL batch the writes of concurrent requests into
                           shared commits (group commit); ?batch=false turns it off
  --ttl DURATION           how long responses are kept for replay (default 24h)
  --lease DURATION         how long a key stays in progress without its owner, e.g.
                           after a crash or an upstream timeout (default 30s)
  --methods LIST           methods that need a key (default POST,PATCH)
  --require-key BOOL       answer 400 to keyed methods without a key (default true;
                           false forwards them unprotected)
  --scope-header NAME      trust this header, set by the auth layer in front, as the
                           principal whose keys these are (default: a hash of the
                           Authorization header)
  --max-body SIZE          largest request body on keyed methods, else 413 (default 1MiB)
  --body-timeout DUR       time a keyed request's body gets to arrive, else 408
                           (default 30s)
  --max-body-memory SIZE   request-body bytes all keyed requests together may hold in
                           memory; past it 503 with Retry-After (default 256MiB)
  --max-response SIZE      largest response body stored (default 4MiB). Answers up to
                           it are read whole from the upstream, stored, then sent at the
                           client's pace; larger ones are passed on as they come and
                           stored without their body
  --upstream-timeout DUR   bound on each upstream call until its answer is stored
                           (default 30s); then only each wait for the upstream's bytes
  --shutdown-timeout DUR   time the requests in flight get at shutdown, and then the
                           answers the store could not take get to be stored (default
                           upstream timeout + 5s)
  --fail-open              forward unprotected when the store fails (default: 503)
  --log-format text|json   (default text)
  --log-level LEVEL        debug, info, warn or error (default info)

Sizes: bytes, or 512KiB, 4MiB, 1GiB (also KB, MB, GB in powers of 1000).
Bad flags, an unreachable store or an unparsable upstream: one line on stderr, exit 2.

examples:
  retrysafe gateway --upstream http://127.0.0.1:3000
  retrysafe gateway --upstream http://api:3000 --listen :8080 --admin :9090 \
      --store 'postgres://retrysafe@db:5432/app?schema=retrysafe' --log-format json
  RETRYSAFE_UPSTREAM=http://api:3000 RETRYSAFE_STORE=redis://cache:6379/0 retrysafe gateway
  curl -i -X POST http://127.0.0.1:8080/payments -H 'Idempotency-Key: 7c0e…' -d '{"amount":100}'
`

type gatewayFlags struct {
	upstream, listen, admin, store, methods, scopeHeader, logFormat, logLevel string
	ttl, lease, upstreamTimeout, shutdownTimeout, bodyTimeout                 time.Duration
	requireKey, failOpen                                                      bool
	maxBody, maxResponse, maxBodyMemory                                       byteSize
}

func runGateway(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const cmd = "retrysafe gateway"
	f := gatewayFlags{maxBody: idempotency.DefaultMaxBody, maxResponse: idempotency.DefaultMaxResponse,
		maxBodyMemory: idempotency.DefaultMaxBodyMemory}
	fs := newFlagSet(cmd)
	fs.StringVar(&f.upstream, "upstream", "", "")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8080", "")
	fs.StringVar(&f.admin, "admin", "127.0.0.1:9090", "")
	fs.StringVar(&f.store, "store", storedsn.Default, "")
	fs.DurationVar(&f.ttl, "ttl", idempotency.DefaultTTL, "")
	fs.DurationVar(&f.lease, "lease", idempotency.DefaultLease, "")
	fs.StringVar(&f.methods, "methods", "POST,PATCH", "")
	fs.BoolVar(&f.requireKey, "require-key", true, "")
	fs.StringVar(&f.scopeHeader, "scope-header", "", "")
	fs.Var(&f.maxBody, "max-body", "")
	fs.DurationVar(&f.bodyTimeout, "body-timeout", idempotency.DefaultBodyTimeout, "")
	fs.Var(&f.maxBodyMemory, "max-body-memory", "")
	fs.Var(&f.maxResponse, "max-response", "")
	fs.DurationVar(&f.upstreamTimeout, "upstream-timeout", gateway.DefaultUpstreamTimeout, "")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 0, "")
	fs.BoolVar(&f.failOpen, "fail-open", false, "")
	fs.StringVar(&f.logFormat, "log-format", "text", "")
	fs.StringVar(&f.logLevel, "log-level", "info", "")
	if ok, status := parse(fs, args, gatewayHelp, nil, false, stdout, stderr); !ok {
		return status
	}

	// Everything that can be checked without I/O, before the store is opened.
	logger, err := newLogger(stderr, f.logFormat, f.logLevel)
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	if f.upstream == "" {
		return fail(stderr, cmd, errors.New("--upstream is required (the URL of the API to protect; see --help)"), exitUsage)
	}
	upstream, err := gateway.ParseUpstream(f.upstream)
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--ttl", f.ttl}, {"--lease", f.lease}, {"--upstream-timeout", f.upstreamTimeout}, {"--body-timeout", f.bodyTimeout}} {
		if d.v <= 0 {
			return fail(stderr, cmd, fmt.Errorf("%s must be positive, not %s", d.name, d.v), exitUsage)
		}
	}
	if f.shutdownTimeout < 0 {
		return fail(stderr, cmd, fmt.Errorf("--shutdown-timeout must not be negative"), exitUsage)
	}
	if f.ttl <= f.lease {
		return fail(stderr, cmd, fmt.Errorf("--ttl (%s) must be longer than --lease (%s)", f.ttl, f.lease), exitUsage)
	}
	if f.ttl <= f.upstreamTimeout {
		return fail(stderr, cmd, fmt.Errorf("--ttl (%s) must be longer than --upstream-timeout (%s), or a record could expire while its request still runs", f.ttl, f.upstreamTimeout), exitUsage)
	}
	if f.maxBody <= 0 || f.maxResponse <= 0 || f.maxBodyMemory <= 0 {
		return fail(stderr, cmd, errors.New("--max-body, --max-body-memory and --max-response must be positive"), exitUsage)
	}
	if f.maxBodyMemory < f.maxBody {
		return fail(stderr, cmd, fmt.Errorf("--max-body-memory (%s) must be at least --max-body (%s)", &f.maxBodyMemory, &f.maxBody), exitUsage)
	}
	var methods []string
	for m := range strings.SplitSeq(f.methods, ",") {
		if m = strings.TrimSpace(m); m != "" {
			methods = append(methods, strings.ToUpper(m))
		}
	}
	if len(methods) == 0 {
		return fail(stderr, cmd, errors.New("--methods is empty"), exitUsage)
	}
	adminAddr := f.admin
	if strings.EqualFold(adminAddr, "off") {
		adminAddr = ""
	}

	store, err := storedsn.Open(ctx, f.store, logger)
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return fail(stderr, cmd, fmt.Errorf("applying the schema of %s: %w", store.Name, err), exitUsage)
	}
	gw, err := gateway.New(gateway.Config{
		Upstream:        upstream,
		ScopeHeader:     f.scopeHeader,
		UpstreamTimeout: f.upstreamTimeout,
		ShutdownTimeout: f.shutdownTimeout,
		Logger:          logger,
		Idempotency: idempotency.Config{
			Store:         store.Store,
			Methods:       methods,
			KeyOptional:   !f.requireKey,
			TTL:           f.ttl,
			Lease:         f.lease,
			MaxBody:       int64(f.maxBody),
			BodyTimeout:   f.bodyTimeout,
			MaxBodyMemory: int64(f.maxBodyMemory),
			MaxResponse:   int64(f.maxResponse),
			FailOpen:      f.failOpen,
		},
	})
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fail(stderr, cmd, fmt.Errorf("--listen: %w", err), exitUsage)
	}
	var adminLn net.Listener
	adminBound := "off"
	if adminAddr != "" {
		if adminLn, err = net.Listen("tcp", adminAddr); err != nil {
			_ = ln.Close()
			return fail(stderr, cmd, fmt.Errorf("--admin: %w", err), exitUsage)
		}
		adminBound = adminLn.Addr().String()
	}
	logger.Info("retrysafe gateway listening", "addr", ln.Addr().String(), "admin", adminBound,
		"upstream", upstream.Redacted(), "store", store.Name, "version", version())
	err = gw.Run(ctx, ln, adminLn)
	if err != nil {
		logger.Error("retrysafe gateway stopped", "err", err)
		return exitFail
	}
	logger.Info("retrysafe gateway stopped")
	return exitOK
}
