// Command bareproxy is a reverse proxy with nothing but net/http in it: an
// httputil.ReverseProxy with the transport settings of the retrysafe gateway's default
// (up to 512 idle connections, 256 per host, HTTP/1.1 only), the same server timeouts
// and the same pool of copy buffers, and no idempotency, deadline, metrics or logs per
// request. bench/run.sh puts it beside the gateway, in front of the same upstream, so
// that what the gateway costs on top of net/http's proxying is told apart from what
// net/http itself costs. With --keyed it also keeps the Idempotency-Key contract in the
// plainest way (keyedProxy): what the contract's own work costs, written plainly.
//
//	cd bench && go run ./cmd/bareproxy --listen 127.0.0.1:8082 --upstream http://127.0.0.1:8081 [--keyed]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr, nil)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintf(os.Stderr, "bareproxy: %v\n", err)
		os.Exit(1)
	}
}

// run serves until ctx ends. ready, when set, receives the listening address.
func run(ctx context.Context, args []string, stderr io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("bareproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8082", "listen address (port 0 picks one)")
	upstream := fs.String("upstream", "", "upstream base URL, http:// (required)")
	keyed := fs.Bool("keyed", false, "keep the Idempotency-Key contract in the plainest way: body in memory, SHA-256 "+
		"fingerprint, a map under a mutex, the answer kept (a yardstick for the gateway's cost, not a product)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	rp, err := newProxy(*upstream)
	if err != nil {
		return err
	}
	var h http.Handler = rp
	if *keyed {
		h = newKeyedProxy(rp)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	errLog := log.New(stderr, "bareproxy: ", 0)
	// The gateway's server settings (gateway/run.go), so that only the handler differs.
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: errLog}
	mode := ""
	if *keyed {
		mode = " (keyed)"
	}
	fmt.Fprintf(stderr, "bareproxy: serving http://%s -> %s%s\n", ln.Addr(), *upstream, mode)
	if ready != nil {
		ready <- ln.Addr().String()
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// newProxy is the proxy to the upstream at rawURL.
func newProxy(rawURL string) (*httputil.ReverseProxy, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--upstream %q: want an absolute http:// or https:// URL", rawURL)
	}
	// The gateway's default transport (gateway/config.go, Config.withDefaults),
	// without retry.SendOnce: this proxy is net/http alone.
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 512
	t.MaxIdleConnsPerHost = 256
	t.Protocols = new(http.Protocols)
	t.Protocols.SetHTTP1(true)
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.SetXForwarded()
		},
		Transport:  t,
		BufferPool: &bufferPool{},
		ErrorLog:   log.New(io.Discard, "", 0),
	}, nil
}

// bufferPool is a pool of 32 KiB copy buffers, as the gateway's: without one,
// ReverseProxy allocates a buffer per request.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[32 << 10]byte); ok {
		return v[:]
	}
	return make([]byte, 32<<10)
}

// Put keeps buf as a pointer to its array, which needs no allocation.
func (b *bufferPool) Put(buf []byte) {
	if cap(buf) == 32<<10 {
		b.p.Put((*[32 << 10]byte)(buf[:32<<10]))
	}
}
