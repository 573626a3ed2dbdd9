package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/retrysafe/retrysafe/console"
	"github.com/retrysafe/retrysafe/console/history"
	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/gateway/configfile"
	"github.com/retrysafe/retrysafe/idempotency/redisstore"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/storedsn"
)

// The values of retrysafe gateway --console.
const (
	consoleOn       = "on"
	consoleOff      = "off"
	consoleReadOnly = "read-only"
)

// checkConsoleMode checks a --console value.
func checkConsoleMode(mode string) error {
	switch mode {
	case consoleOn, consoleOff, consoleReadOnly:
		return nil
	}
	return fmt.Errorf("--console %q: want on, off or read-only", mode)
}

// isLoopback reports whether the listen address addr (HOST:PORT) binds only the
// loopback interface: a loopback IP or "localhost". An empty host binds every
// interface; any other name may resolve to anything.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkExposure refuses a console reachable from other hosts without a token: anyone
// who reaches it could evict keys (making requests execute twice) or replay and purge
// dead letters, and read stored responses.
// Other ways out, such as --console off, are in also.
func checkExposure(flagName, addr, token, also string) error {
	if token != "" || isLoopback(addr) {
		return nil
	}
	return fmt.Errorf("%s %s is not a loopback address, and the console it serves would let anyone who reaches it read and evict keys: "+
		"set --admin-token (or RETRYSAFE_ADMIN_TOKEN), or bind %s to 127.0.0.1%s", flagName, addr, flagName, also)
}

// routeTable is the route table the console shows: the running configuration's, which
// a reload replaces.
type routeTable struct {
	file atomic.Pointer[configfile.File]
}

func (t *routeTable) set(f *configfile.File) {
	if f != nil {
		t.file.Store(f)
	}
}

func (t *routeTable) write(w io.Writer) error {
	f := t.file.Load()
	if f == nil {
		return errors.New("no route table")
	}
	return f.WriteTable(w)
}

// gatewayConsole returns what the gateway's admin listener serves beside its probes:
// the console (unless mode is off), with the history of the gateway's outcomes sampled
// until ctx ends and the dead letters dls, and the admin token.
func gatewayConsole(ctx context.Context, mode, token string, gw *gateway.Gateway, store *storedsn.Opened,
	routes *routeTable, dls map[string]redeliver.DeadLetters, logger *slog.Logger) (gateway.AdminConfig, error) {
	cfg := gateway.AdminConfig{Token: token}
	if mode == consoleOff {
		return cfg, nil
	}
	opt := console.Options{Store: store.Store, StoreName: store.Name, RouteTable: routes.write, DeadLetters: dls,
		ReadOnly: mode == consoleReadOnly, AdminToken: token, Logger: logger}
	if g := gw.Gatherer(); g != nil {
		h := history.New(g, history.Options{})
		go h.Run(ctx)
		opt.History = h
	}
	c, err := console.New(opt)
	if err != nil {
		return cfg, err
	}
	cfg.Console = c
	return cfg, nil
}

const consoleHelp = `usage: retrysafe console [--store DSN] [--amqp URL] [--nats URL] [--queue NAME …]
                        [--listen ADDR] [--admin-token T] [--read-only]

Serves the operator console without a gateway: the idempotency keys of a store (search
by key and scope, filter by the gateway route a key was claimed under, by state and by
age, "stuck" keys in progress past their lease; a record's route, stored status,
headers and body; evict after a confirmation) and the
dead letters of redeliver work queues on RabbitMQ or NATS JetStream (list, show,
replay one or a selection with a fresh attempt count, purge after a confirmation).
The outcomes per route come from a gateway's counters: the console of retrysafe
gateway, on its admin listener (--admin), shows them too.

Every action is a POST with a CSRF token; --read-only hides and refuses them. On an
address other than loopback the console refuses to start without --admin-token, which
every request must then carry (Authorization: Bearer T, or the login form's cookie).

flags:
  --store DSN          sqlite:PATH (default sqlite:retrysafe.db), postgres://…[?schema=NAME],
                       redis://…[?prefix=P] (also RETRYSAFE_STORE)
  --amqp URL           RabbitMQ (amqp:// or amqps://): the DLQ of each --queue is
                       NAME.dlq (also RETRYSAFE_AMQP)
  --nats URL           NATS JetStream (nats:// or tls://): the DLQ stream of each
                       --queue, default names (also RETRYSAFE_NATS)
  --queue NAME         a work queue (RabbitMQ) or subject (JetStream) whose dead
                       letters are shown (repeatable; needs --amqp or --nats)
  --listen ADDR        the console's address (default 127.0.0.1:9091; port 0 picks
                       one, and the address is logged)
  --admin-token T      the token every request must carry (also
                       RETRYSAFE_ADMIN_TOKEN); required off loopback
  --read-only          show, never evict, replay or purge
  --log-format F       text or json (default text)
  --log-level LEVEL    debug, info, warn or error (default info)

Bad flags, a store or broker that cannot be reached, a DLQ that does not exist: one
line on stderr, exit 2. SIGTERM/SIGINT: stop, exit 0.

examples:
  retrysafe console --store 'postgres://ops@db/app?schema=retrysafe'
  retrysafe console --store sqlite:retrysafe.db --read-only
  RETRYSAFE_ADMIN_TOKEN=… retrysafe console --listen :9091 --store redis://cache:6379/0 \
      --amqp amqp://ops:…@mq:5672/ --queue emitter.access --queue ledger.refunds
`

// queueNames is the repeatable --queue flag.
type queueNames []string

func (q *queueNames) String() string     { return strings.Join(*q, ",") }
func (q *queueNames) Set(v string) error { *q = append(*q, v); return nil }

// consoleShutdown bounds the console's graceful shutdown.
const consoleShutdown = 5 * time.Second

func runConsole(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const cmd = "retrysafe console"
	fs := newFlagSet(cmd)
	var (
		dsn, amqpURL, natsURL, listen, token, logFormat, logLevel string
		queues                                                    queueNames
		readOnly                                                  bool
	)
	fs.StringVar(&dsn, "store", storedsn.Default, "")
	fs.StringVar(&amqpURL, "amqp", "", "")
	fs.StringVar(&natsURL, "nats", "", "")
	fs.Var(&queues, "queue", "")
	fs.StringVar(&listen, "listen", "127.0.0.1:9091", "")
	fs.StringVar(&token, "admin-token", "", "")
	fs.BoolVar(&readOnly, "read-only", false, "")
	fs.StringVar(&logFormat, "log-format", "text", "")
	fs.StringVar(&logLevel, "log-level", "info", "")
	if ok, status := parse(fs, args, consoleHelp, []string{"store", "amqp", "nats", "admin-token"}, false, stdout, stderr); !ok {
		return status
	}
	logger, err := newLogger(stderr, logFormat, logLevel)
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	if err := checkDLQFlags(amqpURL, natsURL, queues); err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	if err := checkExposure("--listen", listen, token, ""); err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}

	store, err := storedsn.OpenWith(ctx, dsn, storedsn.Options{Logger: logger, Eviction: redisstore.EvictionIgnore})
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	defer store.Close()
	dls, closeDLQs, err := openConsoleDLQs(ctx, amqpURL, natsURL, queues)
	defer closeDLQs()
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	c, err := console.New(console.Options{Store: store.Store, StoreName: store.Name, DeadLetters: dls,
		ReadOnly: readOnly, AdminToken: token, Logger: logger})
	if err != nil {
		return fail(stderr, cmd, err, exitUsage)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fail(stderr, cmd, fmt.Errorf("--listen: %w", err), exitUsage)
	}
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	logger.Info("retrysafe console listening", "addr", "http://"+ln.Addr().String()+"/", "store", store.Name,
		"queues", len(dls), "read_only", readOnly, "token", token != "", "version", version())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), consoleShutdown)
		err = srv.Shutdown(sctx)
		cancel()
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.Error("retrysafe console stopped", "err", err)
		return exitFail
	}
	logger.Info("retrysafe console stopped")
	return exitOK
}

// checkDLQFlags checks --amqp, --nats and --queue before anything is opened: a queue
// needs a broker, a broker a queue, and a queue a plain name.
func checkDLQFlags(amqpURL, natsURL string, queues []string) error {
	switch {
	case len(queues) > 0 && amqpURL == "" && natsURL == "":
		return errors.New("--queue needs --amqp or --nats (the broker of its dead letters)")
	case len(queues) == 0 && (amqpURL != "" || natsURL != ""):
		return errors.New("--amqp and --nats need at least one --queue (the work queue whose dead letters to show)")
	}
	for _, q := range queues {
		if q == "" || strings.ContainsAny(q, "/ ") {
			return fmt.Errorf("--queue %q: want a queue name, without '/' or spaces", q)
		}
	}
	return nil
}

// openConsoleDLQs opens the dead letters of each queue on each broker given. With both
// brokers, a queue's name in the console says which: NAME@rabbitmq, NAME@nats. The
// returned func closes what was opened, also after an error.
func openConsoleDLQs(ctx context.Context, amqpURL, natsURL string, queues []string) (map[string]redeliver.DeadLetters, func(), error) {
	out := map[string]redeliver.DeadLetters{}
	closeAll := func() {
		for _, d := range out {
			_ = d.Close()
		}
	}
	brokers := []struct{ url, suffix, flag string }{{amqpURL, "@rabbitmq", "--amqp"}, {natsURL, "@nats", "--nats"}}
	for _, b := range brokers {
		if b.url == "" {
			continue
		}
		if amqpURL == "" || natsURL == "" {
			b.suffix = ""
		}
		for _, q := range queues {
			octx, cancel := context.WithTimeout(ctx, dlqConnectTimeout)
			dl, err := openConsoleDLQ(octx, b.flag, b.url, q)
			cancel()
			if err != nil {
				return out, closeAll, err
			}
			out[q+b.suffix] = scrubbedDLQ{dl, b.url}
		}
	}
	return out, closeAll, nil
}

func openConsoleDLQ(ctx context.Context, flag, broker, queue string) (redeliver.DeadLetters, error) {
	scheme, _, _ := strings.Cut(broker, "://")
	scheme = strings.ToLower(scheme)
	switch {
	case flag == "--amqp" && scheme != "amqp" && scheme != "amqps":
		return nil, fmt.Errorf("--amqp %s: want amqp:// or amqps://", redactBroker(broker, broker))
	case flag == "--nats" && scheme != "nats" && scheme != "tls":
		return nil, fmt.Errorf("--nats %s: want nats:// or tls://", redactBroker(broker, broker))
	}
	dl, err := openDLQ(ctx, broker, queue)
	switch {
	case errors.Is(err, redeliver.ErrNotFound):
		return nil, fmt.Errorf("no dead-letter queue for queue %q on %s (has a consumer of it run yet?)", queue, redactBroker(broker, broker))
	case errors.Is(err, context.DeadlineExceeded):
		return nil, fmt.Errorf("%s %s unreachable: no connection within %v", flag, redactBroker(broker, broker), dlqConnectTimeout)
	case err != nil:
		return nil, fmt.Errorf("%s: %s", flag, redactBroker(err.Error(), broker))
	}
	return dl, nil
}

// scrubbedDLQ hides the broker's password in the errors the console shows.
type scrubbedDLQ struct {
	redeliver.DeadLetters
	broker string
}

func (s scrubbedDLQ) scrub(err error) error {
	if err == nil || errors.Is(err, redeliver.ErrNotFound) {
		return err
	}
	return errors.New(redactBroker(err.Error(), s.broker))
}

func (s scrubbedDLQ) List(ctx context.Context, limit int) ([]redeliver.DeadLetter, error) {
	l, err := s.DeadLetters.List(ctx, limit)
	return l, s.scrub(err)
}

func (s scrubbedDLQ) Get(ctx context.Context, id string) (*redeliver.DeadLetter, error) {
	d, err := s.DeadLetters.Get(ctx, id)
	return d, s.scrub(err)
}

func (s scrubbedDLQ) Replay(ctx context.Context, ids ...string) (int, error) {
	n, err := s.DeadLetters.Replay(ctx, ids...)
	return n, s.scrub(err)
}

func (s scrubbedDLQ) Purge(ctx context.Context, ids ...string) (int, error) {
	n, err := s.DeadLetters.Purge(ctx, ids...)
	return n, s.scrub(err)
}
