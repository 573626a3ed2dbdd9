// Package tcpproxy is a TCP proxy for tests that take a server away from the code that
// uses it — a PostgreSQL or a Redis shared with other tests — without touching the
// server. The code under test connects to Proxy.Addr instead of the server; the test
// then partitions the network between them and heals it.
//
// # Faults
//
//	Cut      a partition that refuses: every live connection is reset (SO_LINGER 0, then
//	         close: the peer gets ECONNRESET) on both sides, and every connection accepted
//	         until Restore is reset at once. This is a server that crashed or a firewall
//	         that rejects: the client notices at its next read or write, and a new dial
//	         fails immediately, so a client with retries fails fast.
//	Stall    a partition that black-holes: live connections and those accepted until
//	         Restore stay open, but not a byte is forwarded either way. This is a router
//	         that silently drops packets, the dangerous partition: nothing fails, every
//	         call hangs until its own timeout or context ends. A dial still succeeds (the
//	         proxy accepts it), as it would across a dropping link to a host whose kernel
//	         answers SYNs. At Restore the stalled connections are reset, as a router that
//	         dropped their packets for that long leaves them (the peers' retransmissions
//	         timed out; their state is gone): clients must reconnect.
//	Latency  SetLatency adds a delay to every chunk forwarded, in each direction. Each
//	         chunk is held until the moment it was read plus the delay, so latency adds
//	         to the round trip without limiting throughput: a slow link, not a narrow one.
//
// Restore ends Cut or Stall; latency stays until set to 0. Stats counts connections,
// resets, the bytes forwarded each way and the bytes a Stall held. OnHold reports each
// chunk a Stall holds as it arrives, so a test can wait until a request it expects has
// been sent into the partition. Close stops the proxy, closes every connection and
// waits for all of its goroutines.
package tcpproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retrysafe/retrysafe/harness/internal/tcpconn"
)

// dialTimeout bounds the dial to the target of each accepted connection.
const dialTimeout = 5 * time.Second

// chunkSize is the largest chunk read at once from either side.
const chunkSize = 32 << 10

// mode is the proxy's state.
type mode int

const (
	forwarding mode = iota
	cut
	stalled
)

// Stats counts what a Proxy did.
type Stats struct {
	Accepted   int64 // connections accepted
	Refused    int64 // ... reset as soon as they were accepted, during a Cut
	Reset      int64 // live connections reset by a Cut, or at the Restore that ended a Stall
	Stalled    int64 // connections held without forwarding during a Stall (live ones and new ones)
	DialErrors int64 // ... whose dial to the target failed; the client connection was reset

	Cuts, Stalls int64 // partitions begun

	BytesToTarget   int64 // bytes forwarded from clients to the target
	BytesFromTarget int64 // bytes forwarded from the target to clients
	BytesHeld       int64 // bytes read from clients while a Stall held their connection: never forwarded
}

type counters struct {
	accepted, refused, reset, stalled, dialErrors, cuts, stalls atomic.Int64
	toTarget, fromTarget, held                                  atomic.Int64
}

// Proxy is a running proxy. Make one with New.
type Proxy struct {
	target string
	ln     net.Listener
	stats  counters
	wg     sync.WaitGroup

	mu      sync.Mutex
	mode    mode
	latency time.Duration
	changed chan struct{} // closed and replaced whenever mode changes
	onHold  func([]byte)  // see OnHold
	closed  bool
	conns   map[*link]struct{}
}

// New listens on 127.0.0.1:0 and forwards every accepted connection to target
// (host:port).
func New(target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("tcpproxy: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tcpproxy: listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, changed: make(chan struct{}), conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the host:port to connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target returns the host:port the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Cut begins a partition that refuses: every live connection is reset, on both sides,
// and every new one is reset at once, until Restore. A Cut during a Stall resets the
// stalled connections.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.mode == cut {
		return
	}
	p.setModeLocked(cut)
	p.stats.cuts.Add(1)
	for l := range p.conns {
		p.stats.reset.Add(1)
		l.teardown(true)
	}
}

// Stall begins a partition that black-holes: live and new connections stay open but no
// byte is forwarded either way, until Restore, which then resets the stalled
// connections. A Stall during a Cut ends the Cut.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.mode == stalled {
		return
	}
	p.setModeLocked(stalled)
	p.stats.stalls.Add(1)
	for l := range p.conns {
		if !l.stalled {
			l.stalled = true
			p.stats.stalled.Add(1)
		}
	}
}

// Restore ends a Cut or a Stall: new connections are forwarded normally again. The
// connections a Stall held are reset.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.mode == forwarding {
		return
	}
	p.setModeLocked(forwarding)
	for l := range p.conns {
		if l.stalled {
			p.stats.reset.Add(1)
			l.teardown(true)
		}
	}
}

// SetLatency sets the delay added to every chunk forwarded, in each direction, from the
// next chunk read on. 0 (the default) adds none; a negative d counts as 0.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = max(d, 0)
	p.mu.Unlock()
}

// OnHold sets fn to be called with each chunk of bytes read from a client while a Stall
// holds its connection: bytes the target never receives. A test waits on it for the sign
// that the code under test sent a given request into the partition (a byte count cannot
// tell which request the bytes were), so that the request is lost with the connection at
// Restore. fn runs on the proxy's goroutines, possibly on several at once: it must not
// block, and must not keep b after it returns. nil (the default) removes it.
func (p *Proxy) OnHold(fn func(b []byte)) {
	p.mu.Lock()
	p.onHold = fn
	p.mu.Unlock()
}

// hold counts b, read from a client while a Stall held its connection, and reports it to
// fn, the OnHold function read with it (nil: none).
func (p *Proxy) hold(fn func([]byte), b []byte) {
	p.stats.held.Add(int64(len(b)))
	if fn != nil {
		fn(b)
	}
}

// holdWriter reports what is written to it as held (see OnHold), and drops it.
type holdWriter struct{ p *Proxy }

func (w holdWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	fn := w.p.onHold
	w.p.mu.Unlock()
	w.p.hold(fn, b)
	return len(b), nil
}

// Partitioned reports whether a Cut or a Stall is in force.
func (p *Proxy) Partitioned() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode != forwarding
}

// Stats returns a snapshot of the counts.
func (p *Proxy) Stats() Stats {
	return Stats{
		Accepted:        p.stats.accepted.Load(),
		Refused:         p.stats.refused.Load(),
		Reset:           p.stats.reset.Load(),
		Stalled:         p.stats.stalled.Load(),
		DialErrors:      p.stats.dialErrors.Load(),
		Cuts:            p.stats.cuts.Load(),
		Stalls:          p.stats.stalls.Load(),
		BytesToTarget:   p.stats.toTarget.Load(),
		BytesFromTarget: p.stats.fromTarget.Load(),
		BytesHeld:       p.stats.held.Load(),
	}
}

// Close stops accepting, closes every connection and waits for every goroutine of the
// proxy to return. Calling it again does nothing and returns nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	for l := range p.conns {
		l.teardown(false)
	}
	close(p.changed) // wakes stalled writers; they find their link torn down
	p.mu.Unlock()
	p.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("tcpproxy: close: %w", err)
	}
	return nil
}

// setModeLocked changes the mode and wakes every writer waiting for a change.
func (p *Proxy) setModeLocked(m mode) {
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient failure (too many open files...): wait a little and go on.
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		p.stats.accepted.Add(1)
		p.mu.Lock()
		switch {
		case p.closed:
			p.mu.Unlock()
			_ = c.Close()
			return
		case p.mode == cut:
			p.mu.Unlock()
			p.stats.refused.Add(1)
			tcpconn.Reset(c)
			continue
		}
		l := &link{p: p, client: c, done: make(chan struct{})}
		if p.mode == stalled {
			l.stalled = true
			p.stats.stalled.Add(1)
		}
		p.conns[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go l.run()
	}
}

// link is one accepted connection and its connection to the target.
type link struct {
	p      *Proxy
	client net.Conn
	done   chan struct{} // closed by teardown

	// Guarded by p.mu.
	target  net.Conn // nil until dialed
	stalled bool     // held by a Stall: reset at Restore
	down    bool     // torn down
}

// teardown closes both connections, with an RST when hard. Called with p.mu held.
func (l *link) teardown(hard bool) {
	if l.down {
		return
	}
	l.down = true
	close(l.done)
	for _, c := range []net.Conn{l.client, l.target} {
		if c == nil {
			continue
		}
		if hard {
			tcpconn.Reset(c)
		} else {
			_ = c.Close()
		}
	}
}

// remove tears the link down (hard: with an RST) and forgets it.
func (l *link) remove(hard bool) {
	l.p.mu.Lock()
	l.teardown(hard)
	delete(l.p.conns, l)
	l.p.mu.Unlock()
}

func (l *link) run() {
	defer l.p.wg.Done()
	if !l.dial() {
		return
	}
	var wg sync.WaitGroup
	var hardEnd atomic.Bool
	wg.Go(func() {
		if !l.pipe(l.client, l.target, true, &l.p.stats.toTarget) {
			hardEnd.Store(true)
		}
	})
	wg.Go(func() {
		if !l.pipe(l.target, l.client, false, &l.p.stats.fromTarget) {
			hardEnd.Store(true)
		}
	})
	wg.Wait()
	l.remove(hardEnd.Load())
}

// dial connects to the target, unless the link is stalled (it is then held without a
// target connection until it is torn down). It reports whether the link should run.
func (l *link) dial() bool {
	l.p.mu.Lock()
	held := l.stalled
	l.p.mu.Unlock()
	if held {
		// Nothing will be forwarded: read and drop what the client sends (reported as
		// held) until the link is torn down (at Restore, a Cut or Close) or the client
		// leaves.
		_, _ = io.Copy(holdWriter{l.p}, l.client)
		l.remove(true)
		return false
	}
	t, err := net.DialTimeout("tcp", l.p.target, dialTimeout)
	if err != nil {
		l.p.stats.dialErrors.Add(1)
		l.remove(true) // as if the target had refused
		return false
	}
	l.p.mu.Lock()
	if l.down {
		l.p.mu.Unlock()
		tcpconn.Reset(t)
		return false
	}
	l.target = t
	l.p.mu.Unlock()
	return true
}

// chunk is bytes read from one side, due for the other side at due.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe forwards src to dst until src ends; fromClient says src is the client, whose
// bytes read while a Stall holds the link are reported as held. A clean end (EOF) is
// passed on as a half-close and reported true; an error, or the link torn down, tears
// the link down with an RST and reports false.
func (l *link) pipe(src, dst net.Conn, fromClient bool, count *atomic.Int64) (ok bool) {
	chunks := make(chan chunk, 16)
	readErr := make(chan error, 1)
	go func() {
		defer close(chunks)
		for {
			b := make([]byte, chunkSize)
			n, err := src.Read(b)
			if n > 0 {
				l.p.mu.Lock()
				due := time.Now().Add(l.p.latency)
				held, onHold := fromClient && l.stalled, l.p.onHold
				l.p.mu.Unlock()
				if held {
					// A stalled link is never forwarded again (Restore resets it).
					l.p.hold(onHold, b[:n])
				}
				select {
				case chunks <- chunk{b: b[:n], due: due}:
				case <-l.done:
					readErr <- net.ErrClosed
					return
				}
			}
			if err != nil {
				readErr <- err
				return
			}
		}
	}()
	defer func() {
		if !ok {
			l.remove(true) // closes src: the reader's Read returns
		}
		// Wait for the reader so that no goroutine outlives the link.
		for range chunks {
		}
	}()
	for c := range chunks {
		if !l.wait(c.due) {
			return false
		}
		n, err := dst.Write(c.b)
		count.Add(int64(n))
		if err != nil {
			return false
		}
	}
	if err := <-readErr; !errors.Is(err, io.EOF) {
		return false
	}
	tcpconn.CloseWrite(dst)
	return true
}

// wait blocks until due and until no Stall is in force, and reports whether the link
// is still up.
func (l *link) wait(due time.Time) bool {
	if d := time.Until(due); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			return false
		}
	}
	for {
		l.p.mu.Lock()
		down, m, changed := l.down, l.p.mode, l.p.changed
		l.p.mu.Unlock()
		switch {
		case down || m == cut:
			return false
		case m == forwarding:
			return true
		}
		select {
		case <-changed:
		case <-l.done:
			return false
		}
	}
}
