// Package demo is `retrysafe demo`: a payments system under a failing network, run in
// process with no services, that shows retries made safe and checks it.
//
// Run wires, on 127.0.0.1:
//
//	N clients ──────── fault proxy ───── gateway ──────────────── payments upstream
//	retry.Transport    refuse,           package gateway:          in-memory ledger, NOT
//	with AutoKey       black hole,       Idempotency-Key on a      idempotency-aware:
//	                   read timeout,     SQLite store in a         every request it gets
//	                   reset, response   temporary directory       is a new payment
//	                   lost, latency
//
// Each client makes logical payments for Config.Duration, one after the other. A logical
// payment is one POST /payments that retry.Transport retries under one Idempotency-Key
// (AutoKey) until it gets a final answer. When a failure happens after Transport has
// returned the response — the fault proxy reset the connection while the body was being
// read — the client sends the payment again itself, with the same key (which it learns
// from the request its attempts carried): a failure Transport cannot see is still
// answered by "retry with the same key".
//
// At the end Run checks the ledger against what the clients saw:
//
//	duplicates  logical payments (keys) with more than one ledger row
//	lost        payments a client saw succeed (2xx) with no ledger row
//	mismatched  final responses naming another payment id than the ledger row of their
//	            key (a replay must return the original response)
//	phantoms    ledger rows that belong to no logical payment a client made
//
// and prints a table. Result.OK is true when all four are zero. With
// Config.Unprotected the idempotency layer is left out, and the same faults produce
// duplicates: the demonstration that the checker can fail.
//
// The gateway is package gateway's (the idempotency middleware on an
// httputil.ReverseProxy), as `retrysafe gateway` runs it, with its store on SQLite.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/retrysafe/retrysafe/harness/faultproxy"
	"github.com/retrysafe/retrysafe/harness/payclient"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
	"github.com/retrysafe/retrysafe/retry"
)

// Config configures Run. The zero value of every field is its documented default.
type Config struct {
	// Duration is how long the clients start new payments. Payments in flight at the
	// end are finished (within Drain). Default 5s.
	Duration time.Duration
	// Clients is the number of concurrent clients. Default 8.
	Clients int
	// Seed seeds the fault proxy's decisions and the payment amounts. Default 0: a seed
	// from the clock. The seed in use is printed and returned in Result.Seed.
	Seed uint64
	// FaultRate is the probability that a request meets a fault, spread evenly over read
	// timeout, reset, response lost and response reset; it is also the probability that a new connection
	// is refused or black-holed (half each). At most 1. Default 0.2; negative: no faults.
	FaultRate float64
	// Latency is added by the fault proxy to every request, plus a random part of up to
	// twice as much. Default 1ms; negative: none.
	Latency time.Duration
	// AttemptTimeout is how long a client waits for a response's headers before it
	// gives the attempt up and retries (what turns black holes and withheld responses
	// into retries). Default 250ms.
	AttemptTimeout time.Duration
	// SlowRate is the fraction of payments the upstream takes twice AttemptTimeout to
	// make: their clients retry while the gateway still waits, and get 409 (in flight)
	// until the payment is done, then its replay. Default 0.02; negative: none.
	SlowRate float64
	// Drain bounds how long payments still in flight after Duration may take to get
	// their final answer; those that do not are reported unfinished. Default 30s.
	Drain time.Duration
	// Unprotected leaves the idempotency layer out: the gateway forwards every attempt to
	// the upstream. It exists to demonstrate the failure — retries then pay twice, and
	// Result.OK is false. Default false.
	Unprotected bool
	// Logger receives the components' warnings (gateway, proxy). Default: discarded, so
	// that out carries only the demo's own report.
	Logger *slog.Logger
}

// Result is what a Run saw and checked.
type Result struct {
	Seed    uint64
	Elapsed time.Duration

	LogicalPayments int // payments the clients started
	Succeeded       int // ... that got a final 2xx
	Failed          int // ... that got a final answer other than a 2xx
	Unfinished      int // ... without a final answer when the run ended (interrupted, or Drain)

	HTTPAttempts int // requests sent by the clients' retry.Transport, each attempt counted
	Resends      int // payments sent again by a client, same key, after an error Transport could not retry
	Replays      int // responses marked Idempotent-Replayed: true
	Conflicts    int // 409 responses (the key was in flight)

	Faults faultproxy.Stats // what the fault proxy injected

	PaymentsRecorded int // ledger rows
	Duplicates       int // logical payments with more than one ledger row
	Lost             int // payments a client saw succeed with no ledger row
	Mismatched       int // final responses naming another payment than the ledger's
	Phantoms         int // ledger rows of no logical payment
}

// OK reports whether exactly-once held: no duplicate, no lost payment, every final
// response naming the ledger's payment, and no phantom row.
func (r Result) OK() bool {
	return r.Duplicates == 0 && r.Lost == 0 && r.Mismatched == 0 && r.Phantoms == 0
}

func (c *Config) defaults() error {
	if c.Duration < 0 || c.Clients < 0 || c.AttemptTimeout < 0 || c.Drain < 0 {
		return errors.New("demo: Config.Duration, Clients, AttemptTimeout and Drain must not be negative")
	}
	if c.FaultRate > 1 || c.FaultRate != c.FaultRate {
		return fmt.Errorf("demo: Config.FaultRate %v: want at most 1", c.FaultRate)
	}
	if c.SlowRate > 1 || c.SlowRate != c.SlowRate {
		return fmt.Errorf("demo: Config.SlowRate %v: want at most 1", c.SlowRate)
	}
	if c.Duration == 0 {
		c.Duration = 5 * time.Second
	}
	if c.Clients == 0 {
		c.Clients = 8
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	switch {
	case c.FaultRate == 0:
		c.FaultRate = 0.2
	case c.FaultRate < 0:
		c.FaultRate = 0
	}
	switch {
	case c.Latency == 0:
		c.Latency = time.Millisecond
	case c.Latency < 0:
		c.Latency = 0
	}
	if c.AttemptTimeout == 0 {
		c.AttemptTimeout = 250 * time.Millisecond
	}
	switch {
	case c.SlowRate == 0:
		c.SlowRate = 0.02
	case c.SlowRate < 0:
		c.SlowRate = 0
	}
	if c.Drain == 0 {
		c.Drain = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Run runs the demo and writes its live progress line and final table to out. It
// returns an error when the system could not be set up, or when ctx ended the run early
// (then with the Result of what ran, checked). A Result that is not OK is not an error:
// the caller decides (retrysafe demo exits 1).
func Run(ctx context.Context, cfg Config, out io.Writer) (Result, error) {
	if err := cfg.defaults(); err != nil {
		return Result{}, err
	}
	if out == nil {
		out = io.Discard
	}
	res := Result{Seed: cfg.Seed}

	// The payments upstream.
	led := newLedger(cfg.Seed, cfg.SlowRate, 2*cfg.AttemptTimeout)
	upstream, err := serve(ctx, led, cfg.Logger)
	if err != nil {
		return res, fmt.Errorf("demo: payments upstream: %w", err)
	}
	defer upstream.close()

	// The gateway, with the idempotency store on SQLite in a temporary directory.
	var store idempotency.Store
	storeDesc := "none — UNPROTECTED, every attempt is forwarded"
	if !cfg.Unprotected {
		dir, err := os.MkdirTemp("", "retrysafe-demo-*")
		if err != nil {
			return res, fmt.Errorf("demo: temporary directory: %w", err)
		}
		defer os.RemoveAll(dir)
		path := filepath.Join(dir, "idempotency.db")
		st, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: path})
		if err != nil {
			return res, fmt.Errorf("demo: SQLite store: %w", err)
		}
		defer st.Close()
		store, storeDesc = st, "SQLite "+path
	}
	gwTransport := &http.Transport{MaxIdleConnsPerHost: cfg.Clients + 4, IdleConnTimeout: 30 * time.Second}
	defer gwTransport.CloseIdleConnections()
	gwHandler, err := newGateway(&url.URL{Scheme: "http", Host: upstream.addr}, store, gwTransport, cfg.Logger)
	if err != nil {
		return res, fmt.Errorf("demo: gateway: %w", err)
	}
	gateway, err := serve(ctx, gwHandler, cfg.Logger)
	if err != nil {
		return res, fmt.Errorf("demo: gateway: %w", err)
	}
	// The gateway's server, then the gateway itself: its Shutdown stores the answers the
	// store could not take and stops its store probe.
	stopGateway := sync.OnceFunc(func() {
		gateway.close()
		if gw, ok := gwHandler.(interface{ Shutdown(context.Context) error }); ok {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := gw.Shutdown(sctx); err != nil {
				cfg.Logger.Warn("demo: gateway shutdown", "err", err)
			}
		}
	})
	defer stopGateway()

	// The failing network between the clients and the gateway.
	f := cfg.FaultRate
	proxy, err := faultproxy.Start(ctx, faultproxy.Config{
		Target: gateway.addr, Seed: cfg.Seed,
		Refuse: f / 2, BlackHole: f / 2,
		ReadTimeout: f / 4, Reset: f / 4, ResponseLost: f / 4, ResponseReset: f / 4,
		Latency: cfg.Latency, Jitter: 2 * cfg.Latency,
		Logger: cfg.Logger,
	})
	if err != nil {
		return res, fmt.Errorf("demo: fault proxy: %w", err)
	}
	defer proxy.Close()

	fmt.Fprintf(out, "retrysafe demo · seed %d · %d clients · %s · fault rate %.2f\n", cfg.Seed, cfg.Clients, cfg.Duration, cfg.FaultRate)
	fmt.Fprintf(out, "  clients   %d × retry.Transport with AutoKey, attempt timeout %s\n", cfg.Clients, cfg.AttemptTimeout)
	faults := "refuse, black hole, read timeout, reset, response lost, response reset"
	if cfg.FaultRate == 0 {
		faults = "no faults"
	}
	fmt.Fprintf(out, "  network   fault proxy %s: %s; latency %s–%s\n", proxy.Addr(), faults, cfg.Latency, 3*cfg.Latency)
	fmt.Fprintf(out, "  gateway   %s, idempotency store: %s\n", gateway.addr, storeDesc)
	fmt.Fprintf(out, "  upstream  %s, payments on an in-memory ledger that is not idempotency-aware\n\n", upstream.addr)

	// The clients.
	var cnt payclient.Counts
	base := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConnsPerHost: cfg.Clients,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	defer base.CloseIdleConnections()
	hc := &http.Client{Transport: &retry.Transport{
		Base:    &payclient.Observer{Base: base, Counts: &cnt},
		AutoKey: true,
		// Generous, so that every payment gets a final answer: many attempts, short
		// waits, no budget (the demo wants to finish, not to protect the upstream).
		Policy:         retry.Policy{MaxAttempts: 100, Base: 5 * time.Millisecond, Cap: 100 * time.Millisecond},
		NoBudget:       true,
		AttemptTimeout: cfg.AttemptTimeout,
	}}

	start := time.Now()
	stopStarting := start.Add(cfg.Duration)
	runCtx, cancel := context.WithDeadline(ctx, stopStarting.Add(cfg.Drain))
	defer cancel()

	records := make([][]record, cfg.Clients)
	var wg sync.WaitGroup
	for i := range cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &client{pc: &payclient.Client{HC: hc, URL: proxy.URL() + "/payments", User: fmt.Sprintf("client-%d", i+1),
				Counts: &cnt, Backoff: 10 * time.Millisecond}, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i)))}
			for time.Now().Before(stopStarting) && ctx.Err() == nil {
				records[i] = append(records[i], c.pay(runCtx))
			}
		}()
	}

	progress := func() {
		st := proxy.Stats()
		fmt.Fprintf(out, "\r  %5.1fs  payments %6d  attempts %6d  faults %5d  replays %5d  409s %4d ",
			time.Since(start).Seconds(), cnt.Payments.Load(), cnt.Attempts.Load(), st.Faults, cnt.Replays.Load(), cnt.Conflicts.Load())
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(250 * time.Millisecond)
	progress()
loop:
	for {
		select {
		case <-done:
			break loop
		case <-tick.C:
			progress()
		}
	}
	tick.Stop()
	progress()
	fmt.Fprintln(out)
	res.Elapsed = time.Since(start)

	// Stop the network and the gateway before reading the ledger, so that no request is
	// still executing.
	base.CloseIdleConnections()
	res.Faults = proxy.Stats()
	if err := proxy.Close(); err != nil {
		cfg.Logger.Warn("demo: closing the fault proxy", "err", err)
	}
	stopGateway()
	// Connections the gateway's transport dialed but never used are "new" to the
	// upstream's server, whose Shutdown would wait 5s for them: close them first.
	gwTransport.CloseIdleConnections()
	upstream.close()

	var all []record
	for _, rs := range records {
		all = append(all, rs...)
	}
	res.HTTPAttempts = int(cnt.Attempts.Load())
	res.Resends = int(cnt.Resends.Load())
	res.Replays = int(cnt.Replays.Load())
	res.Conflicts = int(cnt.Conflicts.Load())
	check(&res, all, led.snapshot())
	writeTable(out, cfg, res)
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("demo: interrupted: %w", err)
	}
	return res, nil
}

// server is an http.Server on a free loopback port.
type server struct {
	addr string
	srv  *http.Server
	done chan struct{}
	once sync.Once
}

func serve(ctx context.Context, h http.Handler, logger *slog.Logger) (*server, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s := &server{addr: ln.Addr().String(), done: make(chan struct{}),
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// close shuts the server down gracefully (in-flight requests finish), then waits for
// Serve to return. Calling it again does nothing.
func (s *server) close() {
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			_ = s.srv.Close()
		}
		<-s.done
	})
}
