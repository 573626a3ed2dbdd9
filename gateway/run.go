package gateway

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/retrysafe/retrysafe/idempotency"
)

// readyTimeout bounds the store check of /readyz.
const readyTimeout = 2 * time.Second

// Admin returns the admin handler:
//
//	GET /healthz   200 while the process serves (liveness)
//	GET /readyz    200 when the store answers its ping (stores that cannot ping are
//	               assumed ready); 503 when it does not, or when Run is shutting down
//	GET /metrics   the Prometheus metrics (see the package doc)
func (g *Gateway) Admin() http.Handler { return g.AdminWith(AdminConfig{}) }

// AdminWith returns the admin handler of Admin with what c adds: the operator console
// at / and the token /metrics asks for.
func (g *Gateway) AdminWith(c AdminConfig) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		plain(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if g.draining.Load() {
			plain(w, http.StatusServiceUnavailable, "shutting down")
			return
		}
		if p, ok := g.cfg.Idempotency.Store.(idempotency.Pinger); ok {
			ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
			defer cancel()
			start := time.Now()
			err := p.Ping(ctx)
			g.metrics.observeStore(string(idempotency.StorePing), time.Since(start), err)
			if err != nil {
				plain(w, http.StatusServiceUnavailable, "store: "+err.Error())
				return
			}
		}
		plain(w, http.StatusOK, "ok")
	})
	if g.gatherer != nil {
		mux.Handle("GET /metrics", bearer(c.Token, promhttp.HandlerFor(g.gatherer, promhttp.HandlerOpts{
			ErrorLog: log.New(slogWriter{g.cfg.Logger, slog.LevelWarn}, "metrics: ", 0),
		})))
	}
	if c.Console != nil {
		mux.Handle("/", c.Console)
	}
	return mux
}

func plain(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg + "\n"))
}

// ErrRunning is returned by Run when the Gateway is already running.
var ErrRunning = errors.New("gateway: already running")

// Run serves the proxy on ln and Admin on adminLn (nil: no admin listener) until ctx
// ends or a listener fails, and runs the store's janitor (idempotency.RunJanitor) when
// the store is an idempotency.Janitor. Then it shuts down gracefully: /readyz turns 503,
// the listeners close, requests in flight get Config.ShutdownTimeout to finish, and the
// connections of those still running are then closed — but Run still waits for their
// handlers, so that every upstream answer received is recorded before it returns.
// Answers the store could not take when their requests finished (it was unreachable)
// then get another Config.ShutdownTimeout to be stored; each one still not stored is
// logged with its key, and Run's error says how many. It closes the listeners, not the
// store. It returns nil after a shutdown asked for by ctx and completed in time.
func (g *Gateway) Run(ctx context.Context, ln, adminLn net.Listener) error {
	return g.RunWith(ctx, ln, adminLn, AdminConfig{})
}

// RunWith is Run with an admin listener that serves AdminWith(c).
func (g *Gateway) RunWith(ctx context.Context, ln, adminLn net.Listener, c AdminConfig) error {
	if ln == nil {
		return errors.New("gateway: Run with a nil listener")
	}
	if !g.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	errLog := log.New(slogWriter{g.cfg.Logger, slog.LevelWarn}, "", 0)
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: errLog}
	servers := []*http.Server{srv}
	errc := make(chan error, 2)
	go func() { errc <- serve(srv, ln, "proxy") }()
	if adminLn != nil {
		admin := &http.Server{Handler: g.AdminWith(c), ReadHeaderTimeout: 10 * time.Second, ErrorLog: errLog}
		servers = append(servers, admin)
		go func() { errc <- serve(admin, adminLn, "admin") }()
	}

	jctx, stopJanitor := context.WithCancel(context.WithoutCancel(ctx))
	janitorDone := make(chan struct{})
	if j, ok := g.cfg.Idempotency.Store.(idempotency.Janitor); ok {
		go func() {
			defer close(janitorDone)
			idempotency.RunJanitor(jctx, timedJanitor{j, g.metrics}, idempotency.JanitorConfig{Logger: g.cfg.Logger, Middleware: g.root})
		}()
	} else {
		close(janitorDone)
	}

	var failed error
	pending := len(servers)
	select {
	case <-ctx.Done():
	case failed = <-errc:
		pending--
	}
	g.draining.Store(true)

	// The proxy first, the admin server (its /readyz says 503 meanwhile) after.
	var errs []error
	for _, s := range servers {
		sctx, cancel := context.WithTimeout(context.Background(), g.cfg.ShutdownTimeout)
		err := s.Shutdown(sctx)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("gateway: graceful shutdown: %w", err))
			_ = s.Close()
		}
	}
	// Handlers whose connections were closed above still record their answers.
	g.active.wait()
	// Then the answers the store could not take get their chance to be stored.
	sctx, cancel := context.WithTimeout(context.Background(), g.cfg.ShutdownTimeout)
	if err := g.Shutdown(sctx); err != nil {
		errs = append(errs, err)
	}
	cancel()
	stopJanitor()
	<-janitorDone
	for ; pending > 0; pending-- {
		if err := <-errc; err != nil && failed == nil {
			failed = err
		}
	}
	return errors.Join(append([]error{failed}, errs...)...)
}

// Shutdown stops the gateway's background work: it waits, until ctx ends, for the
// answers the store could not take when their requests finished to be stored, logs
// each one it could not store, and stops the store probe. Run calls it; call it
// yourself, after your server has stopped, when you serve the Gateway another way.
func (g *Gateway) Shutdown(ctx context.Context) error {
	if err := g.root.Shutdown(ctx); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	return nil
}

func serve(s *http.Server, ln net.Listener, name string) error {
	if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("gateway: %s listener: %w", name, err)
	}
	return nil
}

// tracker counts the requests being served. Unlike a sync.WaitGroup it may be waited
// on while requests still arrive (through a server other than Run's).
type tracker struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to zero; nil when no one waits
}

func (t *tracker) add() {
	t.mu.Lock()
	t.n++
	t.mu.Unlock()
}

func (t *tracker) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
	t.mu.Unlock()
}

// wait returns when no request is being served.
func (t *tracker) wait() {
	t.mu.Lock()
	if t.n == 0 {
		t.mu.Unlock()
		return
	}
	if t.idle == nil {
		t.idle = make(chan struct{})
	}
	idle := t.idle
	t.mu.Unlock()
	<-idle
}
