// Package faultproxy is a fault-injecting TCP proxy for HTTP/1.1: it sits between
// clients and a server and makes the network fail in the four ways a call can fail —
// connect failure, read timeout, reset, and succeeded-but-response-lost — plus added
// latency, at configured rates, with seeded (reproducible) randomness.
//
// # Faults
//
// Connection faults are decided once per accepted client connection, before any byte is
// read:
//
//	Refuse        the connection is reset at once (SetLinger(0) + Close). The kernel has
//	              already completed the handshake, so the client sees a successful dial
//	              followed by ECONNRESET or EOF — the request never reaches the server.
//	BlackHole     the connection is accepted and never answered; whatever the client sends
//	              is discarded until it gives up (its timeout) or the proxy closes. The
//	              server never sees the request.
//
// Request faults are decided once per HTTP request read from a client connection:
//
//	ReadTimeout   the request is forwarded and the server's whole response read, then the
//	              client connection is held open without a byte of it until the client
//	              gives up. The server executed the request.
//	Reset         the request is forwarded and the whole response read; a prefix of it
//	              (1 byte up to all but the last byte, chosen by the seed) is sent, then
//	              the connection is reset (RST). Depending on the cut the client fails in
//	              the response headers or, for all but tiny responses most often, while
//	              reading the body. The server executed the request.
//	ResponseLost  the request is forwarded and the whole response read, then the client
//	              connection is closed (FIN) without any of it. The server executed the
//	              request and the client got only an error: the dangerous case.
//	ResponseReset the request is forwarded and the whole response read, then the client
//	              connection is reset (RST) without a byte of it: the same danger, seen
//	              as ECONNRESET instead of EOF.
//
// On a reused keep-alive connection, ResponseLost and ResponseReset are exactly the
// failures after which Go's http.Transport sends a replayable request again by itself
// (any request with an Idempotency-Key header counts as replayable): the server then
// sees the request twice, and the layers above the transport never know. Reset sends at
// least one byte, so the transport does not resend after it.
//
// Latency (Config.Latency plus a uniform Config.Jitter) is added to every request before
// it is forwarded, whatever else is decided for it.
//
// # Per-request faults on keep-alive connections
//
// The proxy understands HTTP/1.1 framing: each client connection gets its own server
// connection (1:1, opened on the first request), and the proxy reads each request with
// http.ReadRequest, forwards it, reads the response with http.ReadResponse and forwards
// it, so faults hit individual requests on a keep-alive connection, as they would in
// production — including the requests Go's http.Transport sends on reused connections.
// A fault always ends the client connection (and its server connection). Responses
// that are not faulted are streamed; faulted ones are read whole first (the server
// finishes its work either way). Upgrades (101 Switching Protocols) are forwarded and
// then tunnelled byte for byte with no further faults. "Expect: 100-continue" is
// answered by the proxy itself and removed from the forwarded request. The request is
// written whole before the response is read, so a server that answers before reading a
// large body may stall the exchange; HTTP/1.1 only (no TLS, no HTTP/2).
//
// # Reproducibility
//
// Config.Seed seeds two math/rand/v2 PCG streams, one for connection decisions and one
// for request decisions; each decision consumes a fixed number of draws. The n-th
// connection decision and the n-th request decision are therefore the same for the
// same seed and Config, whatever happened before. Decisions are taken in the order
// connections are accepted and requests are read: with one client sending requests one
// after the other the whole run repeats exactly; with concurrent clients the sequence of
// decisions repeats but which request gets which depends on scheduling.
//
// Stats reports how many faults of each kind were injected; Config.OnFault and the
// Logger's Debug records describe each one (kind, connection, the request's number on
// it, method, path, Idempotency-Key, the withheld response's status and header). Close
// stops the proxy, closes every connection and waits for all of its goroutines.
package faultproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retrysafe/retrysafe/harness/internal/tcpconn"
)

// Kind is a kind of injected fault.
type Kind int

// The fault kinds. Refuse and BlackHole are decided per connection, the others per
// request.
const (
	Refuse        Kind = iota + 1 // connection reset before any byte is read
	BlackHole                     // connection never answered
	ReadTimeout                   // request executed, response withheld, connection held open
	Reset                         // request executed, part of the response sent, then RST
	ResponseLost                  // request executed, response read, connection closed without it
	ResponseReset                 // request executed, response read, connection reset without it
)

// Kinds returns every fault kind, in order.
func Kinds() []Kind {
	return []Kind{Refuse, BlackHole, ReadTimeout, Reset, ResponseLost, ResponseReset}
}

// String returns the kind's name: "refuse", "black-hole", "read-timeout", "reset",
// "response-lost" or "response-reset".
func (k Kind) String() string {
	switch k {
	case Refuse:
		return "refuse"
	case BlackHole:
		return "black-hole"
	case ReadTimeout:
		return "read-timeout"
	case Reset:
		return "reset"
	case ResponseLost:
		return "response-lost"
	case ResponseReset:
		return "response-reset"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Config configures a Proxy. The zero value of every field but Target is its default;
// the zero rates inject nothing, so a zero Config (with a Target) is a plain proxy.
type Config struct {
	// Target is the host:port requests are forwarded to. Required.
	Target string
	// Listen is the address the proxy listens on. Default "127.0.0.1:0" (a free port;
	// see Proxy.Addr).
	Listen string

	// Seed seeds the fault decisions: the same seed and rates give the same sequence of
	// decisions. Default 0, itself a fixed seed.
	Seed uint64

	// Refuse and BlackHole are probabilities per accepted connection, each in [0, 1],
	// their sum at most 1.
	Refuse    float64
	BlackHole float64

	// ReadTimeout, Reset, ResponseLost and ResponseReset are probabilities per request,
	// each in [0, 1], their sum at most 1.
	ReadTimeout   float64
	Reset         float64
	ResponseLost  float64
	ResponseReset float64

	// Latency is added to every request before it is forwarded, plus a uniform random
	// part in [0, Jitter). Default 0: none.
	Latency time.Duration
	Jitter  time.Duration

	// DialTimeout bounds the dial to Target. Default 5s. A failed dial resets the client
	// connection (the request was not forwarded).
	DialTimeout time.Duration

	// Logger receives one Debug record per injected fault and a Warn record per failed
	// dial to Target. Default nil: no logs.
	Logger *slog.Logger

	// OnFault, when set, is called once per injected fault, from the connection's
	// goroutine, before the fault takes effect on the client connection. It must not
	// block for long. Default nil.
	OnFault func(Fault)
}

// Fault describes one injected fault.
type Fault struct {
	Kind Kind
	At   time.Time // when it was injected
	// Conn numbers the client connection, from 1 in the order connections were
	// accepted; Client is its remote address.
	Conn   uint64
	Client string
	// Request numbers the request on its connection, from 1; 0 for a connection fault.
	// Above 1 the request came on a reused keep-alive connection.
	Request int
	// Method, Path and Key (the Idempotency-Key header) are the request's; empty for a
	// connection fault.
	Method, Path, Key string
	// Status and ResponseHeader are those of the response the fault withheld or cut off
	// (the server answered it); 0 and nil for a connection fault.
	Status         int
	ResponseHeader http.Header
}

func (c Config) validate() error {
	if c.Target == "" {
		return errors.New("faultproxy: Config.Target is required")
	}
	rates := []struct {
		name string
		v    float64
	}{{"Refuse", c.Refuse}, {"BlackHole", c.BlackHole}, {"ReadTimeout", c.ReadTimeout}, {"Reset", c.Reset},
		{"ResponseLost", c.ResponseLost}, {"ResponseReset", c.ResponseReset}}
	for _, r := range rates {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			return fmt.Errorf("faultproxy: Config.%s = %v: want a probability in [0, 1]", r.name, r.v)
		}
	}
	const slack = 1e-9
	if c.Refuse+c.BlackHole > 1+slack {
		return fmt.Errorf("faultproxy: Config.Refuse + Config.BlackHole = %v: want at most 1", c.Refuse+c.BlackHole)
	}
	if s := c.ReadTimeout + c.Reset + c.ResponseLost + c.ResponseReset; s > 1+slack {
		return fmt.Errorf("faultproxy: Config.ReadTimeout + Config.Reset + Config.ResponseLost + Config.ResponseReset = %v: want at most 1", s)
	}
	if c.Latency < 0 || c.Jitter < 0 || c.DialTimeout < 0 {
		return errors.New("faultproxy: Config.Latency, Config.Jitter and Config.DialTimeout must not be negative")
	}
	return nil
}

// Stats counts what a Proxy did. Faults is the sum of the six fault counts.
type Stats struct {
	Connections int64 // client connections accepted
	Requests    int64 // HTTP requests read from clients
	Forwarded   int64 // requests written to Target
	Delayed     int64 // requests given added latency

	Refused        int64
	BlackHoled     int64
	ReadTimeouts   int64
	Resets         int64
	ResponsesLost  int64
	ResponseResets int64
	Faults         int64
	// OnReused counts the request faults injected on a reused keep-alive connection
	// (not the connection's first request).
	OnReused int64

	// UpstreamErrors counts failed dials to Target and broken exchanges with it; the
	// client connection was closed.
	UpstreamErrors int64
}

// Count returns the number of faults of kind k.
func (s Stats) Count(k Kind) int64 {
	switch k {
	case Refuse:
		return s.Refused
	case BlackHole:
		return s.BlackHoled
	case ReadTimeout:
		return s.ReadTimeouts
	case Reset:
		return s.Resets
	case ResponseLost:
		return s.ResponsesLost
	case ResponseReset:
		return s.ResponseResets
	}
	return 0
}

type counters struct {
	conns, requests, forwarded, delayed, upstreamErrors, onReused atomic.Int64
	faults                                                        [ResponseReset + 1]atomic.Int64
}

// Proxy is a running fault-injecting proxy. Make one with Start.
type Proxy struct {
	cfg    Config
	ln     net.Listener
	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	dialer net.Dialer

	connDec, reqDec *decider
	stats           counters

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// Start validates cfg, listens on cfg.Listen and serves until Close. ctx bounds the
// listen only; the proxy lives until Close.
func Start(ctx context.Context, cfg Config) (*Proxy, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &Proxy{
		cfg: cfg, ln: ln, ctx: pctx, cancel: cancel,
		dialer:  net.Dialer{Timeout: cfg.DialTimeout},
		connDec: newDecider(cfg, streamConn),
		reqDec:  newDecider(cfg, streamRequest),
		conns:   map[net.Conn]struct{}{},
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the host:port the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns "http://" + Addr().
func (p *Proxy) URL() string { return "http://" + p.Addr() }

// Stats returns a snapshot of the counts.
func (p *Proxy) Stats() Stats {
	s := Stats{
		Connections:    p.stats.conns.Load(),
		Requests:       p.stats.requests.Load(),
		Forwarded:      p.stats.forwarded.Load(),
		Delayed:        p.stats.delayed.Load(),
		Refused:        p.stats.faults[Refuse].Load(),
		BlackHoled:     p.stats.faults[BlackHole].Load(),
		ReadTimeouts:   p.stats.faults[ReadTimeout].Load(),
		Resets:         p.stats.faults[Reset].Load(),
		ResponsesLost:  p.stats.faults[ResponseLost].Load(),
		ResponseResets: p.stats.faults[ResponseReset].Load(),
		OnReused:       p.stats.onReused.Load(),
		UpstreamErrors: p.stats.upstreamErrors.Load(),
	}
	s.Faults = s.Refused + s.BlackHoled + s.ReadTimeouts + s.Resets + s.ResponsesLost + s.ResponseResets
	return s
}

// Close stops accepting, closes every client and server connection (held ones
// included) and waits for every goroutine of the proxy to return. Calling it again
// does nothing and returns nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("faultproxy: close: %w", err)
	}
	return nil
}

// track registers c so Close closes it; it reports false (and closes c) when the
// proxy is closed already.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || p.ctx.Err() != nil {
				return
			}
			// A transient failure (too many open files...): wait a little and go on.
			p.logWarn("faultproxy: accept failed", "err", err)
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) logWarn(msg string, args ...any) {
	if p.cfg.Logger != nil {
		p.cfg.Logger.Warn(msg, args...)
	}
}

// clientConn is one accepted client connection.
type clientConn struct {
	net.Conn
	n        uint64 // from 1, in accept order
	requests int    // requests read from it
}

// injected counts a fault and reports it to OnFault and the Logger. req and resp are
// nil for a connection fault.
func (p *Proxy) injected(k Kind, c *clientConn, req *http.Request, resp *http.Response) {
	p.stats.faults[k].Add(1)
	f := Fault{Kind: k, At: time.Now(), Conn: c.n, Client: c.RemoteAddr().String()}
	if req != nil {
		f.Request, f.Method, f.Path, f.Key = c.requests, req.Method, req.URL.Path, req.Header.Get("Idempotency-Key")
		if f.Request > 1 {
			p.stats.onReused.Add(1)
		}
	}
	if resp != nil {
		f.Status, f.ResponseHeader = resp.StatusCode, resp.Header.Clone()
	}
	if p.cfg.OnFault != nil {
		p.cfg.OnFault(f)
	}
	if l := p.cfg.Logger; l != nil && l.Enabled(p.ctx, slog.LevelDebug) {
		attrs := []slog.Attr{slog.String("kind", k.String()), slog.String("client", f.Client), slog.Uint64("conn", f.Conn)}
		if req != nil {
			attrs = append(attrs, slog.Int("request", f.Request), slog.String("method", f.Method), slog.String("path", f.Path))
			if f.Key != "" {
				attrs = append(attrs, slog.String("key", f.Key))
			}
		}
		if resp != nil {
			attrs = append(attrs, slog.Int("status", f.Status))
		}
		l.LogAttrs(p.ctx, slog.LevelDebug, "faultproxy: fault injected", attrs...)
	}
}

// serve runs one client connection.
func (p *Proxy) serve(nc net.Conn) {
	defer p.wg.Done()
	defer p.untrack(nc)
	c := &clientConn{Conn: nc, n: uint64(p.stats.conns.Add(1))}
	switch d := p.connDec.next(); d.kind {
	case Refuse:
		p.injected(Refuse, c, nil, nil)
		tcpconn.Reset(nc)
		return
	case BlackHole:
		p.injected(BlackHole, c, nil, nil)
		hold(nc)
		return
	}

	cr := bufio.NewReader(c)
	cw := bufio.NewWriter(c)
	var up *upstream
	defer func() {
		if up != nil {
			p.untrack(up.conn)
		}
	}()
	for {
		req, err := http.ReadRequest(cr)
		if err != nil {
			return // the client closed, or sent something that is not HTTP/1.x
		}
		p.stats.requests.Add(1)
		c.requests++
		d := p.reqDec.next()
		if d.delay > 0 {
			p.stats.delayed.Add(1)
			if !p.sleep(d.delay) {
				return
			}
		}
		if up == nil {
			if up = p.dial(); up == nil {
				p.stats.upstreamErrors.Add(1)
				tcpconn.Reset(nc) // not forwarded: as if the server had refused
				return
			}
		}
		if expectContinue(req) {
			if _, err := cw.WriteString("HTTP/1.1 100 Continue\r\n\r\n"); err != nil || cw.Flush() != nil {
				return
			}
		}
		if !p.exchange(c, cr, cw, up, req, d) {
			return
		}
	}
}

// upstream is the server connection of one client connection.
type upstream struct {
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
}

func (p *Proxy) dial() *upstream {
	uc, err := p.dialer.DialContext(p.ctx, "tcp", p.cfg.Target)
	if err != nil {
		p.logWarn("faultproxy: dial target failed", "target", p.cfg.Target, "err", err)
		return nil
	}
	if !p.track(uc) {
		return nil
	}
	return &upstream{conn: uc, r: bufio.NewReader(uc), w: bufio.NewWriter(uc)}
}

// exchange forwards req and its response, or injects d's fault. It reports whether the
// client connection can serve another request.
func (p *Proxy) exchange(c *clientConn, cr *bufio.Reader, cw *bufio.Writer, up *upstream, req *http.Request, d decision) bool {
	if err := req.Write(up.w); err != nil || up.w.Flush() != nil {
		p.stats.upstreamErrors.Add(1) // or the client's body broke: either way, give up
		return false
	}
	p.stats.forwarded.Add(1)
	resp, err := p.readResponse(up, cw, req)
	if err != nil {
		p.stats.upstreamErrors.Add(1)
		return false
	}
	defer resp.Body.Close()

	switch d.kind {
	case ReadTimeout:
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			p.stats.upstreamErrors.Add(1)
			return false
		}
		p.injected(ReadTimeout, c, req, resp)
		hold(c.Conn)
		return false
	case ResponseLost, ResponseReset:
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			p.stats.upstreamErrors.Add(1)
			return false
		}
		p.injected(d.kind, c, req, resp)
		if d.kind == ResponseReset {
			tcpconn.Reset(c.Conn)
		}
		return false // serve closes c: FIN (ResponseLost), no response
	case Reset:
		var buf bytes.Buffer
		if err := resp.Write(&buf); err != nil {
			p.stats.upstreamErrors.Add(1)
			return false
		}
		b := buf.Bytes()
		cut := 0
		if len(b) > 1 {
			cut = 1 + int(d.cut*float64(len(b)-1)) // in [1, len-1]
			cut = min(cut, len(b)-1)
		}
		p.injected(Reset, c, req, resp)
		_, _ = c.Write(b[:cut])
		tcpconn.Reset(c.Conn)
		return false
	}

	if resp.StatusCode == http.StatusSwitchingProtocols {
		if resp.Write(cw) != nil || cw.Flush() != nil {
			return false
		}
		p.tunnel(c.Conn, cr, up)
		return false
	}
	if err := resp.Write(cw); err != nil {
		return false
	}
	if cw.Flush() != nil {
		return false
	}
	return !resp.Close && !req.Close
}

// readResponse reads the final response to req, forwarding informational (1xx)
// responses other than 101 to the client as they come.
func (p *Proxy) readResponse(up *upstream, cw *bufio.Writer, req *http.Request) (*http.Response, error) {
	for {
		resp, err := http.ReadResponse(up.r, req)
		if err != nil {
			return nil, fmt.Errorf("faultproxy: reading the response: %w", err)
		}
		if resp.StatusCode < 100 || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
		if resp.StatusCode == http.StatusContinue {
			continue // the proxy answered Expect: 100-continue itself
		}
		if _, err := fmt.Fprintf(cw, "HTTP/1.1 %s\r\n", resp.Status); err != nil {
			return nil, err
		}
		if err := resp.Header.Write(cw); err != nil {
			return nil, err
		}
		if _, err := cw.WriteString("\r\n"); err != nil {
			return nil, err
		}
		if err := cw.Flush(); err != nil {
			return nil, err
		}
	}
}

// tunnel copies bytes both ways after a protocol upgrade until either side closes.
func (p *Proxy) tunnel(c net.Conn, cr *bufio.Reader, up *upstream) {
	done := make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(done)
		_, _ = io.Copy(up.conn, cr)
		tcpconn.CloseWrite(up.conn)
	}()
	_, _ = io.Copy(c, up.r)
	tcpconn.CloseWrite(c)
	<-done
}

func expectContinue(req *http.Request) bool {
	for _, v := range req.Header.Values("Expect") {
		if strings.EqualFold(strings.TrimSpace(v), "100-continue") {
			req.Header.Del("Expect")
			return true
		}
	}
	return false
}

// sleep waits d, or until Close; it reports whether the proxy is still open.
func (p *Proxy) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.ctx.Done():
		return false
	}
}

// hold keeps c open without answering, discarding what the client sends, until the
// client closes it or Close does.
func hold(c net.Conn) {
	_, _ = io.Copy(io.Discard, c)
}
