package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/gateway/configfile"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/redisstore"
	"github.com/retrysafe/retrysafe/internal/bytesize"
	"github.com/retrysafe/retrysafe/internal/durfmt"
	"github.com/retrysafe/retrysafe/internal/gcfloor"
	"github.com/retrysafe/retrysafe/storedsn"
)

const gatewayIntro = `usage: retrysafe gateway --upstream URL [flags]
       retrysafe gateway --config FILE [flags]

A reverse proxy that gives any HTTP API Idempotency-Key semantics. Keyed requests
(POST and PATCH by default) are claimed in the store, forwarded, and their responses
stored; a retry with the same key gets the stored response (Idempotent-Replayed: true)
and never reaches the upstream twice. A duplicate of a request still in flight waits
for its answer (--conflict wait, bounded by --wait-timeout and --max-waiters; past
them 409 with Retry-After), or gets 409 at once (--conflict reject). 422 for a key
reused with another request, 400 without a key. The key is forwarded unchanged.

Upstream never reached: 502, key released. Upstream timed out after the request was
sent: 504, key kept until its lease ends (the request is never resent by the gateway
itself). Upstream 429/503: passed through, key released. Store unreachable when an
answer is to be stored: the client gets it, the gateway keeps it and stores it when the
store answers. SIGTERM/SIGINT: stop accepting, finish and record the requests in
flight, store the answers kept, exit 0 (1 if some could not be stored; each is logged).

The TTL must be longer than the lease and the upstream timeout, so that no record can
expire while its request may still run.

With --config, a YAML file gives each route (a net/http pattern: POST /payments,
/webhooks/) its own policy — required, optional or off; the key from a header or from
the JSON body; the scope; the fingerprint; limits; reject or wait; the upstream, by
name — and the flags set beside it override its defaults. retrysafe config check FILE
prints the route table it makes. SIGHUP reloads the file: the next requests have the
new routes, those in flight finish under theirs, and a file that fails to load is
refused with one log line while the running routes stay.

With --tls-cert and --tls-key, the proxy and the admin listener serve HTTPS (TLS 1.2
at least, HTTP/2 and HTTP/1.1); --admin-tls-cert and --admin-tls-key give the admin
listener its own pair. SIGHUP reads the certificate files again, with or without
--config: the next connections get the new certificate, and a pair that does not load
(half written, mismatched, expired) is refused with one log line while the served one
stays. Renew, then send SIGHUP.

flags (each can also be set from the environment: --max-body from RETRYSAFE_MAX_BODY,
--upstream from RETRYSAFE_UPSTREAM, and so on, all but --check; a flag on the command
line wins):
`

const gatewayOutro = `
Sizes: bytes, or 512KiB, 4MiB, 1GiB (also KB, MB, GB in powers of 1000).
Bad flags, an unreachable store, an unparsable upstream or a certificate that does not
load: one line on stderr per problem, exit 2. --check stops before the store is opened:
it finds all but the store's reachability and settings, and prints what would run.
A store whose settings break the promise that a keyed request runs once (a Redis that
may evict records, a PostgreSQL standby…, unless allowed; retrysafe doctor lists what
is checked): one line on stderr per such setting, exit 2; a setting that narrows the
promise: a WARN line of the log at every start.

examples:
  retrysafe gateway --upstream http://127.0.0.1:3000
  RETRYSAFE_ADMIN_TOKEN=… retrysafe gateway --upstream http://api:3000 --listen :8080 --admin :9090 \
      --store 'postgres://retrysafe@db:5432/app?schema=retrysafe' --log-format json
  RETRYSAFE_UPSTREAM=http://api:3000 RETRYSAFE_STORE=redis://cache:6379/0 retrysafe gateway
  retrysafe gateway --upstream http://api:3000 \
      --store 'redis://sentinel-1:26379/0?master_name=retrysafe&addr=sentinel-2:26379&wait=1'
  retrysafe gateway --check --config gateway.yaml --listen :8080 --admin :9090   # before a rollout
  retrysafe gateway --upstream http://api:3000 --listen :8443 \
      --tls-cert /etc/retrysafe/tls.crt --tls-key /etc/retrysafe/tls.key
  kill -HUP "$(pidof retrysafe)"   # after the certificate was renewed
  curl -i -X POST http://127.0.0.1:8080/payments -H 'Idempotency-Key: 7c0e…' -d '{"amount":100}'
`

type gatewayFlags struct {
	upstream, listen, admin, store, methods, scopeHeader, logFormat, logLevel, conflict string
	config                                                                              string
	check                                                                               bool
	keyHeader, keyPointer, fingerprintIgnore, scopeCookie                               string
	ttl, lease, upstreamTimeout, shutdownTimeout, bodyTimeout, waitTimeout              time.Duration
	requireKey, failOpen, scopeNone, otel, allowEvicting                                bool
	maxBody, maxResponse, maxBodyMemory                                                 byteSize
	maxWaiters                                                                          int
	adminToken, consoleMode                                                             string
	tlsCert, tlsKey, adminTLSCert, adminTLSKey                                          string
	amqpURL, natsURL                                                                    string // the console's dead letters
	queues                                                                              queueNames
	allowRisks                                                                          allowedRisks
}

// newGatewayFlags defines retrysafe gateway's flags, their defaults taken from the
// packages that own them (idempotency.Default…, gateway.Default…), and returns them with
// their documentation, from which --help is written: the defaults it shows are the
// flags' own, so the two cannot drift.
func newGatewayFlags() (*flag.FlagSet, *gatewayFlags, []flagDoc) {
	f := &gatewayFlags{maxBody: idempotency.DefaultMaxBody, maxResponse: idempotency.DefaultMaxResponse,
		maxBodyMemory: idempotency.DefaultMaxBodyMemory}
	fs := newFlagSet("retrysafe gateway")
	fs.StringVar(&f.config, "config", "", "")
	fs.BoolVar(&f.check, "check", false, "")
	fs.StringVar(&f.upstream, "upstream", "", "")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8080", "")
	fs.StringVar(&f.admin, "admin", "127.0.0.1:9090", "")
	fs.StringVar(&f.adminToken, "admin-token", "", "")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "")
	fs.StringVar(&f.tlsKey, "tls-key", "", "")
	fs.StringVar(&f.adminTLSCert, "admin-tls-cert", "", "")
	fs.StringVar(&f.adminTLSKey, "admin-tls-key", "", "")
	fs.StringVar(&f.consoleMode, "console", consoleOn, "")
	fs.StringVar(&f.amqpURL, "amqp", "", "")
	fs.StringVar(&f.natsURL, "nats", "", "")
	fs.Var(&f.queues, "queue", "")
	fs.StringVar(&f.store, "store", storedsn.Default, "")
	fs.BoolVar(&f.allowEvicting, "allow-evicting-store", false, "")
	fs.Var(&f.allowRisks, "allow-store-risk", "")
	fs.DurationVar(&f.ttl, "ttl", idempotency.DefaultTTL, "")
	fs.DurationVar(&f.lease, "lease", idempotency.DefaultLease, "")
	fs.StringVar(&f.methods, "methods", strings.Join(idempotency.DefaultMethods(), ","), "")
	fs.BoolVar(&f.requireKey, "require-key", true, "")
	fs.StringVar(&f.scopeHeader, "scope-header", "", "")
	fs.StringVar(&f.scopeCookie, "scope-cookie", "", "")
	fs.BoolVar(&f.scopeNone, "scope-none", false, "")
	fs.StringVar(&f.keyHeader, "key-header", idempotency.DefaultKeyHeader, "")
	fs.StringVar(&f.keyPointer, "key-pointer", "", "")
	fs.StringVar(&f.fingerprintIgnore, "fingerprint-ignore", "", "")
	fs.Var(&f.maxBody, "max-body", "")
	fs.DurationVar(&f.bodyTimeout, "body-timeout", idempotency.DefaultBodyTimeout, "")
	fs.Var(&f.maxBodyMemory, "max-body-memory", "")
	fs.Var(&f.maxResponse, "max-response", "")
	fs.DurationVar(&f.upstreamTimeout, "upstream-timeout", gateway.DefaultUpstreamTimeout, "")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 0, "")
	fs.BoolVar(&f.failOpen, "fail-open", false, "")
	fs.StringVar(&f.conflict, "conflict", string(configfile.DefaultConflict), "")
	fs.DurationVar(&f.waitTimeout, "wait-timeout", idempotency.DefaultWaitTimeout, "")
	fs.IntVar(&f.maxWaiters, "max-waiters", idempotency.DefaultMaxWaiters, "")
	fs.StringVar(&f.logFormat, "log-format", "text", "")
	fs.StringVar(&f.logLevel, "log-level", "info", "")
	fs.BoolVar(&f.otel, "otel", false, "")
	docs := []flagDoc{
		{name: "config", arg: "FILE", help: "a YAML file of routes, each with its own policy and upstream (see retrysafe config check --help and examples/gateway.yaml); the flags set beside it override its defaults; SIGHUP reloads it", def: "-"},
		{name: "check", help: "check the flags, the environment and the --config file as a start does, store DSN included, and connect to nothing (no store opened, no port bound): print a summary (store, upstreams, addresses, routes) and exit 0, or one line per problem on stderr and exit 2. For a deployment's configuration before it rolls out. Not read from the environment", def: "false"},
		{name: "upstream", arg: "URL", help: "the API to protect: http:// or https:// (required without --config)", def: "-"},
		{name: "listen", arg: "ADDR", help: "proxy address; port 0 picks one, and the address is logged"},
		{name: "admin", arg: "ADDR", help: `/healthz, /readyz, /metrics and the operator console at /; "off" disables`},
		{name: "admin-token", arg: "TOKEN", help: "the token the console and /metrics ask for (Authorization: Bearer, or the console's login form); required when --admin is not a loopback address and the console is on", def: "-"},
		{name: "tls-cert", arg: "FILE", help: "serve HTTPS on --listen, and on --admin unless --admin-tls-cert is set, with this certificate (PEM: the leaf, then any intermediates); needs --tls-key. TLS 1.2 at least; HTTP/2 and HTTP/1.1. SIGHUP reads both files again: the next connections get a pair that loads, and one that does not (half written, mismatched, expired) is refused with an ERROR line while the served one stays", def: "-"},
		{name: "tls-key", arg: "FILE", help: "the private key of --tls-cert (PEM)", def: "-"},
		{name: "admin-tls-cert", arg: "FILE", help: "the admin listener's own certificate, read again on SIGHUP as --tls-cert; needs --admin-tls-key", def: "--tls-cert's"},
		{name: "admin-tls-key", arg: "FILE", help: "the private key of --admin-tls-cert", def: "-"},
		{name: "console", arg: "on|off|read-only", help: "the operator console on the admin listener: keys (search, filter by route, evict), outcomes per route, routes; read-only hides and refuses the actions"},
		{name: "amqp", arg: "URL", help: "RabbitMQ (amqp://, amqps://) whose dead letters the console shows: the DLQ NAME.dlq of each --queue", def: "-"},
		{name: "nats", arg: "URL", help: "NATS JetStream (nats://, tls://) whose dead letters the console shows: the DLQ stream of each --queue", def: "-"},
		{name: "queue", arg: "NAME", help: "a redeliver work queue (RabbitMQ) or subject (JetStream) whose dead letters the console lists, replays and purges (repeatable; needs --amqp or --nats)", def: "-"},
		{name: "store", arg: "DSN", help: "sqlite:PATH, postgres://… (optional ?schema=NAME), redis://… (optional ?prefix=P), memory: — what is missing of the schema is applied at start (PostgreSQL: a role without CREATE may run the gateway once `retrysafe migrate` ran as the schema's owner). SQLite and PostgreSQL batch the writes of concurrent requests into shared commits (group commit); ?batch=false turns it off. PostgreSQL: several hosts (postgres://u@h1:5432,h2:5432/db) follow a promotion (target_session_attrs=read-write); the pool holds at most pool_max_conns=" + strconv.Itoa(storedsn.DefaultPoolMaxConns) + " connections and closes those idle for pool_max_conn_idle_time=" + durfmt.Format(storedsn.DefaultPoolMaxConnIdleTime) + " (pgx's pool_* parameters set them). Redis Sentinel: redis://SENTINEL:PORT/DB?master_name=NAME&addr=OTHER_SENTINEL:PORT, followed through failovers. Redis ?wait=N&wait_timeout=DUR: a claim or a completion counts only once N replicas acknowledged it (WAIT); short of that, claims get 503 and answers are held until they do. What the store's settings mean for the promise that a keyed request runs once is checked at start, as retrysafe doctor does: each risk is a WARN line, and a setting that breaks the promise (an evicting Redis, a PostgreSQL standby, SQLite on a network file system…) is refused, exit 2 (see --allow-store-risk)"},
		{name: "allow-evicting-store", help: "run on a Redis whose maxmemory-policy may evict records (anything but noeviction): a retry of a key whose record was evicted runs again. Without it such a Redis is refused at start, and a policy changed at run time turns /readyz 503; with it, a warning at every start; the same as --allow-store-risk redis.eviction", def: "false"},
		allowRiskDoc(),
		{name: "ttl", arg: "DURATION", field: "TTL", help: "how long responses are kept for replay"},
		{name: "lease", arg: "DURATION", field: "Lease", help: "how long a key stays in progress without its owner, e.g. after a crash or an upstream timeout"},
		{name: "methods", arg: "LIST", field: "Methods", help: "methods that need a key"},
		{name: "require-key", arg: "BOOL", help: "answer 400 to keyed methods without a key; false forwards them unprotected"},
		{name: "scope-header", arg: "NAME", field: "ScopeHeader", help: "trust this header, set by the auth layer in front, as the principal whose keys these are", def: "a hash of the Authorization header"},
		{name: "scope-cookie", arg: "NAME", field: "ScopeCookie", help: "the principal is this cookie's value (hashed), for callers with a session cookie: two cookies never share a record", def: "-"},
		{name: "scope-none", field: "ScopeNone", help: "one scope for all, for senders authenticated another way (a webhook's signature)", def: "-"},
		{name: "key-header", arg: "NAME", field: "KeyHeader", help: "the header the key is read from (X-GitHub-Delivery for GitHub's webhooks)"},
		{name: "key-pointer", arg: "POINTER", field: "KeyPointer", help: "read the key from the JSON body at this JSON pointer instead (/id for a Stripe event), for webhooks retried by their senders", def: "-"},
		{name: "fingerprint-ignore", arg: "LIST", field: "FingerprintIgnore", help: "JSON pointers, comma-separated, to body members the fingerprint leaves out (a timestamp the sender changes on every retry)", def: "-"},
		{name: "max-body", arg: "SIZE", field: "MaxBody", help: "largest request body on keyed methods, else 413"},
		{name: "body-timeout", arg: "DUR", field: "BodyTimeout", help: "time a keyed request's body gets to arrive, else 408"},
		{name: "max-body-memory", arg: "SIZE", field: "MaxBodyMemory", help: "ceiling on body bytes in memory, both ways: keyed requests' bodies and the answers kept until stored and sent. Past it, new keyed requests get 503 with Retry-After before anything is claimed; answers already coming in are finished and sent whole. Unless GOMEMLIMIT is set (or the store is memory:), Go's soft memory limit is set to 1.25 × it + " + bytesize.Format(memoryLimitBase) + ", so that the garbage collector keeps the process near it"},
		{name: "max-response", arg: "SIZE", field: "MaxResponse", help: "largest response body stored. Answers up to it are read whole from the upstream, stored, then sent at the client's pace; larger ones are passed on as they come and stored without their body"},
		{name: "upstream-timeout", arg: "DUR", field: "UpstreamTimeout", help: "bound on each upstream call until its answer is stored (an unkeyed call's: until its headers come); then only each wait for the upstream's bytes, at the client's pace"},
		{name: "shutdown-timeout", arg: "DUR", field: "ShutdownTimeout", help: "time the requests in flight get at shutdown, and then the answers the store could not take get to be stored",
			def: "upstream timeout + " + durfmt.Format(gateway.DefaultShutdownGrace)},
		{name: "fail-open", help: "forward unprotected when the store fails", def: "false: 503"},
		{name: "conflict", arg: "wait|reject", field: "Conflict", help: "a duplicate of a request in progress: wait waits for the first to finish and answers with its response, replayed — many clients retry a lost answer at once and take a 409 as final; reject answers 409 with Retry-After at once (the IETF draft's answer; a client retries later with the same key)"},
		{name: "wait-timeout", arg: "DUR", field: "WaitTimeout", help: "the longest a duplicate waits with --conflict wait; then 409 with Retry-After. A key whose request timed out upstream (504: outcome unknown, kept to its lease) is not waited for when its lease outlasts this: 409 at once, Retry-After the rest of the lease"},
		{name: "max-waiters", arg: "N", field: "MaxWaiters", help: "duplicates that may wait at once (--conflict wait), in the whole process; past it, and past " + strconv.Itoa(idempotency.DefaultMaxWaitersPerKey) + " for one key (max_waiters_per_key in --config), a duplicate gets 409 with Retry-After at once. Each waiter holds its request's body (counted in --max-body-memory) and a goroutine, and polls the store while its key's owner is another process"},
		{name: "log-format", arg: "text|json"},
		{name: "log-level", arg: "LEVEL", help: "debug, info, warn or error"},
		{name: "otel", help: otelHelp, def: "false"},
	}
	return fs, f, docs
}

// gatewayHelp is retrysafe gateway --help.
func gatewayHelp() string {
	fs, _, docs := newGatewayFlags()
	return gatewayIntro + flagHelp(fs, docs) + gatewayOutro
}

func runGateway(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const cmd = "retrysafe gateway"
	fs, f, docs := newGatewayFlags()
	if ok, status := parse(fs, args, gatewayHelp(), envFlags(fs, notFromEnv()...), false, stdout, stderr); !ok {
		return status
	}
	p, err := planGateway(fs, f, docs, stderr)
	if err != nil {
		return failConfig(stderr, cmd, err)
	}
	if f.check {
		p.writeSummary(stdout)
		return exitOK
	}
	s, cfg, logger := p.gatewaySetup, p.cfg, p.cfg.Logger
	adminAddr, consoleMode, adminToken, allowed := p.adminAddr, p.consoleMode, p.adminToken, p.allowed
	eviction := redisstore.EvictionRefuse
	if allowed.allows(redisstore.CheckEviction) {
		eviction = redisstore.EvictionAllow
	}
	store, err := storedsn.OpenWith(ctx, s.store, storedsn.Options{Logger: logger, Eviction: eviction})
	if errors.Is(err, storedsn.ErrEvicting) {
		return fail(stderr, cmd, fmt.Errorf("%w; set maxmemory-policy noeviction, or start with --allow-evicting-store or --allow-store-risk %s to accept that", err, redisstore.CheckEviction), exitUsage)
	}
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	defer store.Close()
	// What the store's settings mean for the promise, before anything is written. The
	// eviction a Redis store was opened with (allowed) was logged as it opened.
	var logged []string
	if eviction == redisstore.EvictionAllow {
		logged = append(logged, redisstore.CheckEviction)
	}
	if !checkStoreSetup(ctx, cmd, store, allowed, logger, stderr, logged...) {
		return exitUsage
	}
	if err := store.Migrate(ctx); err != nil {
		return fail(stderr, cmd, fmt.Errorf("applying the schema of %s: %w", store.Name, err), exitUsage)
	}
	cfg.Idempotency.Store = store.Store
	if reg := storeRegistry(store.Store); reg != nil {
		cfg.Registerer = reg
	}
	stopTracing, err := startTracing(ctx, f.otel || s.file != nil && s.file.Otel, &cfg, logger)
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	defer stopTracing() // after Run: the last requests' spans
	gw, err := gateway.New(cfg)
	if err != nil {
		return fail(stderr, cmd, flagError(err, docs), exitUsage)
	}
	routes := &routeTable{}
	routes.set(cmp.Or(s.file, &configfile.File{Gateway: cfg}))
	dls, closeDLQs, err := openConsoleDLQs(ctx, f.amqpURL, f.natsURL, f.queues)
	defer closeDLQs()
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	adminCfg, err := gatewayConsole(ctx, consoleMode, adminToken, gw, store, routes, dls, logger)
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	// SIGHUP reads the certificates and the file again; without either it is logged
	// and ignored rather than, as by default, ending the process. It is caught from
	// before the listeners, so that one sent as soon as the gateway says it listens
	// (a certificate renewed meanwhile) cannot end it.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	ln, err := net.Listen("tcp", s.listen)
	if err != nil {
		return fail(stderr, cmd, fmt.Errorf("--listen: %w", err), exitUsage)
	}
	ln = serveTLS(ln, p.certs.proxy)
	var adminLn net.Listener
	adminBound := "off"
	if adminAddr != "" {
		if adminLn, err = net.Listen("tcp", adminAddr); err != nil {
			_ = ln.Close()
			return fail(stderr, cmd, fmt.Errorf("--admin: %w", err), exitUsage)
		}
		adminBound = adminLn.Addr().String()
		adminLn = serveTLS(adminLn, p.certs.admin)
	}
	attrs := []any{"addr", ln.Addr().String(), "admin", adminBound}
	if on := p.certs.describe(); on != "" {
		attrs = append(attrs, "tls", on)
	}
	if cfg.Upstream != nil {
		attrs = append(attrs, "upstream", cfg.Upstream.Redacted())
	}
	if f.config != "" {
		attrs = append(attrs, "config", f.config, "routes", len(cfg.Routes))
	}
	memLimit := setMemoryLimit(os.Getenv("GOMEMLIMIT") != "", store.Kind, cfg)
	floor, gcFloor := startGCFloor(os.Getenv("GOGC") != "")
	defer floor.Stop()
	logger.Info("retrysafe gateway listening", append(attrs, "store", store.Name, "memory_limit", memLimit, "gc_floor", gcFloor, "version", version())...)

	runCtx, stopReloads := context.WithCancel(ctx)
	reloaded := make(chan struct{})
	go func() {
		defer close(reloaded)
		for {
			select {
			case <-runCtx.Done():
				return
			case <-hup:
				p.certs.reload()
				if p.reload == nil {
					if len(p.certs.pairs()) == 0 {
						logger.Warn("SIGHUP ignored: there is no --config file or TLS certificate to reload")
					}
					continue
				}
				before := s.file
				if s = reloadConfig(gw, p.reload, s, logger); s.file != before {
					routes.set(p.loaded)
				}
			}
		}
	}()
	err = gw.RunWith(ctx, ln, adminLn, adminCfg)
	stopReloads()
	<-reloaded
	if err != nil {
		logger.Error("retrysafe gateway stopped", "err", err)
		return exitFail
	}
	logger.Info("retrysafe gateway stopped")
	return exitOK
}

// gatewayPlan is the gateway that the flags, the environment and the --config file
// describe, checked as far as it can be without I/O beyond reading the file. The
// gateway's start and --check both make it with planGateway, so that --check accepts
// exactly what a start gets past before it opens the store and its listeners.
type gatewayPlan struct {
	gatewaySetup
	storeKind, storeName    string // storedsn's kind and redacted name of the store
	adminAddr               string // "" when the admin listener is off
	consoleMode, adminToken string
	allowed                 allowedRisks  // --allow-store-risk, and --allow-evicting-store as its check
	certs                   listenerCerts // the listeners' certificates, read from their files
	// reload reads the --config file again (nil without one); loaded is the file it
	// read last, for the console's route table once the gateway has taken it.
	reload func() (*configfile.File, error)
	loaded *configfile.File
}

// planGateway checks the parsed flags, the environment they were set from and the
// --config file, connecting to nothing. Its error joins one error per problem, each
// in the command line's terms.
func planGateway(fs *flag.FlagSet, f *gatewayFlags, docs []flagDoc, stderr io.Writer) (*gatewayPlan, error) {
	p := &gatewayPlan{}
	var errs []error
	// The console's dead letters are flags alone: checked whatever the rest says.
	dlqErr := checkDLQFlags(f.amqpURL, f.natsURL, f.queues)
	if f.config != "" {
		opts := configfile.Options{Overrides: flagOverrides(fs), CheckStore: checkStoreDSN}
		p.reload = func() (*configfile.File, error) {
			file, err := configfile.Load(f.config, opts)
			p.loaded = file
			return file, err
		}
		file, err := p.reload()
		if err == nil {
			p.gatewaySetup, err = fileSetup(f, file, stderr)
		}
		if err != nil {
			return nil, errors.Join(append(joined(err), dlqErr)...)
		}
	} else {
		s, err := flagSetup(f, docs, stderr)
		if err != nil {
			// The addresses and the store are the flags' still: checked below too.
			for _, e := range joined(err) {
				errs = append(errs, flagError(e, docs))
			}
			s = gatewaySetup{listen: f.listen, admin: f.admin, store: f.store}
		}
		p.gatewaySetup = s
	}
	if dlqErr != nil {
		errs = append(errs, dlqErr)
	}
	var err error
	if p.storeKind, p.storeName, err = storedsn.Describe(p.store); err != nil {
		errs = append(errs, fmt.Errorf("--store: %s", strings.TrimPrefix(err.Error(), "storedsn: ")))
	}
	p.adminAddr = p.admin
	if strings.EqualFold(p.adminAddr, "off") {
		p.adminAddr = ""
	}
	// The file's console and admin_token hold the flags' values when the flags were
	// given (they override the file), and are empty when neither set them.
	p.consoleMode, p.adminToken = f.consoleMode, f.adminToken
	if p.file != nil {
		p.consoleMode, p.adminToken = cmp.Or(p.file.Console, p.consoleMode), cmp.Or(p.file.AdminToken, p.adminToken)
	}
	if err := checkConsoleMode(p.consoleMode); err != nil {
		errs = append(errs, err)
	}
	if len(f.queues) > 0 && (p.adminAddr == "" || p.consoleMode == consoleOff) {
		errs = append(errs, errors.New("--queue shows dead letters in the console, which --admin off or --console off leaves out"))
	}
	if p.adminAddr != "" && p.consoleMode != consoleOff {
		if err := checkExposure("--admin", p.adminAddr, p.adminToken, ", or --console off"); err != nil {
			errs = append(errs, err)
		}
	}
	// Reading the certificate files is the one I/O a check does: a pair that does not
	// load would stop the start.
	logger := cmp.Or(p.cfg.Logger, slog.New(slog.DiscardHandler))
	if p.certs, err = loadListenerCerts(p.gatewaySetup, p.adminAddr != "", logger); err != nil {
		errs = append(errs, err)
	}
	p.allowed = slices.Clone(f.allowRisks)
	if f.allowEvicting {
		p.allowed = append(p.allowed, redisstore.CheckEviction)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

// writeSummary prints what a start would run, for --check: the store, the upstreams,
// the addresses and the routes, one per line, no secret shown.
func (p *gatewayPlan) writeSummary(w io.Writer) {
	var upstreams []string
	add := func(u *url.URL) {
		if u != nil && !slices.Contains(upstreams, u.Redacted()) {
			upstreams = append(upstreams, u.Redacted())
		}
	}
	add(p.cfg.Upstream)
	for _, r := range p.cfg.Routes {
		add(r.Upstream)
	}
	admin := "off"
	if p.adminAddr != "" {
		token := "no token"
		if p.adminToken != "" {
			token = "token set"
		}
		admin = fmt.Sprintf("%s (console %s, %s)", p.adminAddr, p.consoleMode, token)
	}
	routes := "none: one policy for every request"
	if p.file != nil {
		routes = fmt.Sprintf("%d (%s)", len(p.cfg.Routes), p.file.Path)
	}
	fmt.Fprintf(w, "retrysafe gateway --check: ok, nothing was connected to\n")
	fmt.Fprintf(w, "  store     %s (%s)\n", p.storeKind, p.storeName)
	fmt.Fprintf(w, "  upstream  %s\n", cmp.Or(strings.Join(upstreams, ", "), "none"))
	fmt.Fprintf(w, "  listen    %s\n", p.listen)
	fmt.Fprintf(w, "  admin     %s\n", admin)
	fmt.Fprintf(w, "  routes    %s\n", routes)
}

// envFlags names the flags of fs that parse sets from the environment: all but skip.
// notFromEnv lists the gateway's flags that are never read from the environment:
// --check, so that a variable left in a deployment cannot stop its gateways serving.
func notFromEnv() []string { return []string{"check"} }

func envFlags(fs *flag.FlagSet, skip ...string) []string {
	var out []string
	fs.VisitAll(func(fl *flag.Flag) {
		if !slices.Contains(skip, fl.Name) {
			out = append(out, fl.Name)
		}
	})
	return out
}

// gatewaySetup is what the flags or the file say to run: the gateway's Config (its
// Logger set, its Store not) and the addresses and store it needs.
type gatewaySetup struct {
	cfg                  gateway.Config
	listen, admin, store string
	tls, adminTLS        configfile.TLSFiles // the listeners' certificates; zero: plain HTTP
	file                 *configfile.File    // nil without --config
}

// flagSetup is the one-route gateway of the flags alone. Its error joins one error per
// problem found, so that a check lists them all.
func flagSetup(f *gatewayFlags, docs []flagDoc, stderr io.Writer) (gatewaySetup, error) {
	var errs []error
	logger, err := newLogger(stderr, f.logFormat, f.logLevel)
	if err != nil {
		errs = append(errs, err)
	}
	var upstream *url.URL
	if f.upstream == "" {
		errs = append(errs, errors.New("--upstream is required (the URL of the API to protect; see --help), or --config FILE"))
	} else if upstream, err = gateway.ParseUpstream(f.upstream); err != nil {
		errs = append(errs, err)
	}
	// Zero means "the default" to the packages; on the command line it is a mistake.
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--ttl", f.ttl}, {"--lease", f.lease}, {"--upstream-timeout", f.upstreamTimeout}, {"--body-timeout", f.bodyTimeout}, {"--wait-timeout", f.waitTimeout}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, not %s", d.name, d.v))
		}
	}
	if f.shutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout must not be negative"))
	}
	if f.maxBody <= 0 || f.maxResponse <= 0 || f.maxBodyMemory <= 0 {
		errs = append(errs, errors.New("--max-body, --max-body-memory and --max-response must be positive"))
	}
	if f.maxWaiters <= 0 {
		return gatewaySetup{}, fmt.Errorf("--max-waiters must be positive, not %d (--conflict reject waits for nothing)", f.maxWaiters)
	}
	methods := splitList(strings.ToUpper(f.methods))
	if len(methods) == 0 {
		errs = append(errs, errors.New("--methods is empty"))
	}
	if len(errs) > 0 {
		return gatewaySetup{}, errors.Join(errs...)
	}
	cfg := gateway.Config{
		Upstream:        upstream,
		ScopeHeader:     f.scopeHeader,
		ScopeCookie:     f.scopeCookie,
		ScopeNone:       f.scopeNone,
		UpstreamTimeout: f.upstreamTimeout,
		ShutdownTimeout: f.shutdownTimeout,
		Logger:          logger,
		Idempotency: idempotency.Config{
			Methods:           methods,
			KeyOptional:       !f.requireKey,
			TTL:               f.ttl,
			Lease:             f.lease,
			MaxBody:           int64(f.maxBody),
			BodyTimeout:       f.bodyTimeout,
			MaxBodyMemory:     int64(f.maxBodyMemory),
			MaxResponse:       int64(f.maxResponse),
			FailOpen:          f.failOpen,
			Conflict:          idempotency.Conflict(f.conflict),
			KeyHeader:         f.keyHeader,
			KeyPointer:        f.keyPointer,
			FingerprintIgnore: splitList(f.fingerprintIgnore),
			WaitTimeout:       f.waitTimeout,
			MaxWaiters:        f.maxWaiters,
		},
	}
	// The rules between options (the TTL longer than the lease and the upstream timeout,
	// …) are the packages', checked once, here before any I/O; their errors name the
	// Config fields, shown as the flags that set them.
	if _, err := cfg.Resolve(); err != nil {
		return gatewaySetup{}, flagError(err, docs)
	}
	return gatewaySetup{cfg: cfg, listen: f.listen, admin: f.admin, store: f.store,
		tls:      configfile.TLSFiles{Cert: f.tlsCert, Key: f.tlsKey},
		adminTLS: configfile.TLSFiles{Cert: f.adminTLSCert, Key: f.adminTLSKey}}, nil
}

// fileSetup is the gateway of a --config file, whose flags have been applied to it as
// overrides; what the file leaves unset has the flags' defaults.
func fileSetup(f *gatewayFlags, file *configfile.File, stderr io.Writer) (gatewaySetup, error) {
	logger, err := newLogger(stderr, cmp.Or(file.LogFormat, f.logFormat), cmp.Or(file.LogLevel, f.logLevel))
	if err != nil {
		return gatewaySetup{}, err
	}
	cfg := file.Gateway
	cfg.Logger = logger
	return gatewaySetup{cfg: cfg, listen: cmp.Or(file.Listen, f.listen), admin: cmp.Or(file.Admin, f.admin),
		store: cmp.Or(file.Store, f.store), tls: file.TLS, adminTLS: file.AdminTLS, file: file}, nil
}

// reloadConfig reads the file again and gives the gateway its routes. A file that
// does not load, or a gateway that refuses it, is logged on one line and changes
// nothing; what only a restart can change (the addresses, the store, the logging and
// the gateway-wide bounds) is logged and kept. It returns the setup now running.
func reloadConfig(gw *gateway.Gateway, load func() (*configfile.File, error), running gatewaySetup, logger *slog.Logger) gatewaySetup {
	file, err := load()
	if err != nil {
		logger.Error("config reload refused; the running configuration stays", "file", running.file.Path, "err", oneLine(err))
		return running
	}
	old := running.file
	cfg := file.Gateway
	var kept []string
	for _, c := range []struct {
		name     string
		was, now any
	}{
		{"listen", old.Listen, file.Listen}, {"admin", old.Admin, file.Admin}, {"store", old.Store, file.Store},
		{"tls", old.TLS, file.TLS}, {"admin_tls", old.AdminTLS, file.AdminTLS},
		{"log", old.LogFormat + " " + old.LogLevel, file.LogFormat + " " + file.LogLevel},
		{"otel", old.Otel, file.Otel},
		{"console", old.Console, file.Console}, {"admin_token", old.AdminToken != file.AdminToken, false},
		{"shutdown_timeout", old.Gateway.ShutdownTimeout, cfg.ShutdownTimeout},
		{"max_body_memory", old.Gateway.Idempotency.MaxBodyMemory, cfg.Idempotency.MaxBodyMemory},
		{"max_waiters", old.Gateway.Idempotency.MaxWaiters, cfg.Idempotency.MaxWaiters},
	} {
		if c.was != c.now {
			kept = append(kept, c.name)
		}
	}
	// The gateway keeps its own bounds; zero says so.
	cfg.Idempotency.MaxBodyMemory, cfg.Idempotency.MaxWaiters = 0, 0
	if err := gw.Reload(cfg); err != nil {
		logger.Error("config reload refused; the running configuration stays", "file", file.Path, "err", oneLine(err))
		return running
	}
	if len(kept) > 0 {
		logger.Warn("config reloaded, but these settings take effect only at a restart; the running ones stay", "file", file.Path, "settings", strings.Join(kept, ", "))
	}
	logger.Info("config reloaded", "file", file.Path, "routes", len(cfg.Routes))
	running.file = &configfile.File{Path: file.Path, Listen: old.Listen, Admin: old.Admin, Store: old.Store,
		LogFormat: old.LogFormat, LogLevel: old.LogLevel, Otel: old.Otel, Console: old.Console,
		AdminToken: old.AdminToken, TLS: old.TLS, AdminTLS: old.AdminTLS, Gateway: cfg}
	running.file.Gateway.ShutdownTimeout = old.Gateway.ShutdownTimeout
	running.file.Gateway.Idempotency.MaxBodyMemory = old.Gateway.Idempotency.MaxBodyMemory
	running.file.Gateway.Idempotency.MaxWaiters = old.Gateway.Idempotency.MaxWaiters
	return running
}

// overrideKeys are the keys of the file that the flags set, when given beside --config.
var overrideKeys = map[string]string{
	"upstream": "defaults.upstream", "listen": "listen", "admin": "admin", "store": "store",
	"ttl": "defaults.ttl", "lease": "defaults.lease", "methods": "defaults.methods",
	"scope-header": "defaults.scope.header", "scope-cookie": "defaults.scope.cookie",
	"key-header": "defaults.key.header", "key-pointer": "defaults.key.pointer",
	"fingerprint-ignore": "defaults.fingerprint.ignore", "max-body": "defaults.max_body",
	"body-timeout": "defaults.body_timeout", "max-body-memory": "max_body_memory",
	"max-response": "defaults.max_response", "upstream-timeout": "defaults.upstream_timeout",
	"shutdown-timeout": "shutdown_timeout", "conflict": "defaults.conflict",
	"wait-timeout": "defaults.wait_timeout", "max-waiters": "max_waiters", "log-format": "log.format", "log-level": "log.level",
	"console": "console", "admin-token": "admin_token",
	"tls-cert": "tls.cert", "tls-key": "tls.key", "admin-tls-cert": "admin_tls.cert", "admin-tls-key": "admin_tls.key",
}

// flagOverrides returns the flags set on the command line or from the environment as
// overrides of the file's keys.
func flagOverrides(fs *flag.FlagSet) []configfile.Override {
	var out []configfile.Override
	fs.Visit(func(fl *flag.Flag) {
		o := configfile.Override{Key: overrideKeys[fl.Name], Value: fl.Value.String(), Source: "--" + fl.Name}
		switch fl.Name {
		case "config", "check", "otel", "amqp", "nats", "queue", "allow-evicting-store", "allow-store-risk": // not keys of the file
			return
		case "tls-cert", "tls-key", "admin-tls-cert", "admin-tls-key":
			if o.Value == "" { // no file, as without --config (RETRYSAFE_TLS_CERT= in a template)
				return
			}
		case "require-key":
			o.Key, o.Value = "defaults.mode", map[bool]string{true: "required", false: "optional"}[fl.Value.String() == "true"]
		case "fail-open":
			o.Key, o.Value = "defaults.on_store_error", map[bool]string{true: "open", false: "closed"}[fl.Value.String() == "true"]
		case "scope-none":
			if fl.Value.String() != "true" {
				return
			}
			o.Key, o.Value = "defaults.scope", "none"
		}
		out = append(out, o)
	})
	return out
}

// failConfig prints each error of a file on its own line and returns exitUsage.
func failConfig(stderr io.Writer, cmd string, err error) int {
	for _, e := range joined(err) {
		fmt.Fprintf(stderr, "%s: %s\n", cmd, oneLine(e))
	}
	return exitUsage
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(s string) []string {
	var out []string
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// memoryLimitBase is what the soft memory limit the gateway sets itself allows the
// process beyond its bodies: its connections, their buffers and goroutines, the store's
// client, the metrics.
const memoryLimitBase = 64 << 20

// gcFloorBytes is how much the heap may grow between two garbage collections at the
// least (see startGCFloor).
const gcFloorBytes = 32 << 20

// startGCFloor keeps the garbage collector from running before the heap has grown by
// about gcFloorBytes since the last cycle, unless the environment sets GOGC (which then
// wins), and returns what it did, for the start-up line. The gateway's live heap is a
// few MiB (buffers, connections) while it allocates tens of KiB per request, so with
// GOGC=100 alone it collects some twenty times a second at a few thousand requests a
// second, and each cycle's fixed work costs several percent of its CPU: the floor
// saves most of it for at most gcFloorBytes more memory. Past a live heap of
// gcFloorBytes it changes nothing, and the soft memory limit still wins (see
// internal/gcfloor).
func startGCFloor(fromEnv bool) (*gcfloor.Floor, string) {
	f := &gcfloor.Floor{Bytes: gcFloorBytes}
	if fromEnv {
		return f, "GOGC"
	}
	f.Start()
	return f, bytesize.Format(gcFloorBytes)
}

// softMemoryLimit is the soft memory limit the gateway sets itself (see
// setMemoryLimit): the ceiling on bodies in memory, a quarter more for the garbage they
// leave between two collections and for answers finished past the ceiling, and
// memoryLimitBase for the rest of the process.
func softMemoryLimit(maxBodyMemory int64) int64 {
	return maxBodyMemory + maxBodyMemory/4 + memoryLimitBase
}

// setMemoryLimit sets Go's soft memory limit (runtime/debug.SetMemoryLimit) from the
// ceiling on bodies in memory of cfg (resolved: a file may leave it to its default),
// unless the environment sets GOMEMLIMIT (which then wins) or the store is the memory
// store, and returns what it did, for the start-up line. The ceiling bounds the bodies
// the process holds, but the garbage collector, by default, lets the heap grow to twice
// what was live at its last cycle (GOGC=100): a gateway at its ceiling would hold as
// much again in bodies already sent. With the limit, the collector runs sooner as the
// heap nears it, and no sooner below it; it is soft, so a process that needs more is not
// refused it, it collects more often (the runtime caps that at about half the CPU). The
// memory store keeps every record in the heap, beyond any ceiling: a limit under its
// records would have the collector run without end.
func setMemoryLimit(fromEnv bool, storeKind string, cfg gateway.Config) string {
	limit, what := memoryLimit(fromEnv, storeKind, cfg)
	if limit > 0 {
		debug.SetMemoryLimit(limit)
	}
	return what
}

// memoryLimit is the soft memory limit setMemoryLimit sets (0: none), and what the
// start-up line says of it.
func memoryLimit(fromEnv bool, storeKind string, cfg gateway.Config) (int64, string) {
	switch {
	case fromEnv:
		return 0, "GOMEMLIMIT"
	case storeKind == storedsn.KindMemory:
		return 0, "none (memory store)"
	}
	ceiling := cmp.Or(cfg.Idempotency.MaxBodyMemory, idempotency.DefaultMaxBodyMemory)
	if rc, err := cfg.Resolve(); err == nil {
		ceiling = rc.Idempotency.MaxBodyMemory
	}
	limit := softMemoryLimit(ceiling)
	return limit, bytesize.Format(limit)
}
