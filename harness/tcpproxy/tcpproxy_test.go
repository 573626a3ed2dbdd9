package tcpproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// echo is a real TCP echo server: it sends back every byte it reads, and closes its
// side when the client closes its own.
type echo struct {
	ln       net.Listener
	accepted atomic.Int64
	received atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	// closed receives a value each time a connection has been closed and removed from
	// conns, so a test waits for the server's side to go instead of polling conns.
	closed chan struct{}
}

func newEcho(t *testing.T) *echo {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echo{ln: ln, conns: map[net.Conn]struct{}{}, closed: make(chan struct{}, 64)}
	e.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.accepted.Add(1)
			e.mu.Lock()
			e.conns[c] = struct{}{}
			e.mu.Unlock()
			e.wg.Go(func() {
				defer func() {
					e.mu.Lock()
					delete(e.conns, c)
					e.mu.Unlock()
					_ = c.Close()
					select {
					case e.closed <- struct{}{}:
					default: // nobody counts this many closes
					}
				}()
				buf := make([]byte, 32<<10)
				for {
					n, err := c.Read(buf)
					e.received.Add(int64(n))
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		e.mu.Lock()
		for c := range e.conns {
			_ = c.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
	return e
}

func (e *echo) addr() string { return e.ln.Addr().String() }

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// tryRoundTrip dials p and makes a round trip of msg within d, and returns the first
// error. A connection the proxy resets as soon as it accepts it fails in the dial or in
// the round trip, depending on when the RST arrives.
func tryRoundTrip(p *Proxy, msg []byte, d time.Duration) error {
	c, err := net.DialTimeout("tcp", p.Addr(), d)
	if err != nil {
		return err
	}
	defer c.Close()
	return roundTrip(c, msg, d)
}

// roundTrip writes msg on c and reads it back within d.
func roundTrip(c net.Conn, msg []byte, d time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(d))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return errors.New("echo differs")
	}
	return nil
}

// isReset reports whether err says the peer reset the connection.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func TestForward(t *testing.T) {
	t.Parallel()
	e := newEcho(t)
	p := newProxy(t, e.addr())
	c := dial(t, p)
	if err := roundTrip(c, []byte("hello"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// A large payload both ways at once, then a half-close: the echo server sees EOF,
	// closes, and the client reads everything and then EOF.
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(big)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		errc <- err
	}()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the echo: %v", err)
	}
	if werr := <-errc; werr != nil {
		t.Fatal(werr)
	}
	if !bytes.Equal(got, big) {
		t.Fatalf("echo of %d bytes differs (got %d)", len(big), len(got))
	}
	// The counts are final: each direction counts a chunk before it writes the next,
	// and passes the end of its stream on only after the last one. The client's EOF
	// comes after both ends: the echo server closes once the proxy has passed the
	// client's half-close on, and the proxy passes that close on to the client.
	want := int64(len(big) + 5)
	if s := p.Stats(); s.BytesToTarget != want || s.BytesFromTarget != want {
		t.Errorf("bytes forwarded %d to the target, %d from it; want %d each way", s.BytesToTarget, s.BytesFromTarget, want)
	}
	if s := p.Stats(); s.Accepted != 1 || s.Refused != 0 || s.Reset != 0 || s.Stalled != 0 || s.DialErrors != 0 {
		t.Errorf("stats: %+v", s)
	}
}

func TestCut(t *testing.T) {
	t.Parallel()
	e := newEcho(t)
	p := newProxy(t, e.addr())
	live := dial(t, p)
	if err := roundTrip(live, []byte("before"), 5*time.Second); err != nil {
		t.Fatal(err)
	}

	p.Cut()
	if !p.Partitioned() {
		t.Error("Partitioned() = false during a Cut")
	}
	// The live connection is reset: the client learns at once, not at a timeout.
	start := time.Now()
	_ = live.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := live.Read(make([]byte, 1)); !isReset(err) {
		t.Errorf("read on a live connection after Cut: %v, want ECONNRESET", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the reset took %s to arrive", d)
	}
	// The server's side is gone too: the Cut reset the proxy's connection to it.
	select {
	case <-e.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the server's connection is still open 5s after the Cut")
	}
	e.mu.Lock()
	if n := len(e.conns); n != 0 {
		t.Errorf("the server holds %d connections after the Cut, want 0", n)
	}
	e.mu.Unlock()
	// A new connection is accepted by the kernel and reset at once; nothing reaches
	// the server.
	if err := tryRoundTrip(p, []byte("during"), 5*time.Second); !isReset(err) {
		t.Errorf("round trip on a new connection during Cut: %v, want ECONNRESET", err)
	}
	if n := e.accepted.Load(); n != 1 {
		t.Errorf("the server accepted %d connections, want 1 (none during the Cut)", n)
	}

	p.Restore()
	if p.Partitioned() {
		t.Error("Partitioned() = true after Restore")
	}
	after := dial(t, p)
	if err := roundTrip(after, []byte("after"), 5*time.Second); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
	if s := p.Stats(); s.Accepted != 3 || s.Refused != 1 || s.Reset != 1 || s.Cuts != 1 {
		t.Errorf("stats: %+v, want 3 accepted, 1 refused, 1 reset, 1 cut", s)
	}
}

func TestStall(t *testing.T) {
	t.Parallel()
	e := newEcho(t)
	p := newProxy(t, e.addr())
	live := dial(t, p)
	if err := roundTrip(live, []byte("before"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	received := e.received.Load()

	p.Stall()
	if !p.Partitioned() {
		t.Error("Partitioned() = false during a Stall")
	}
	// Nothing fails and nothing arrives: the write succeeds, the read times out, and the
	// server never sees the bytes.
	if err := roundTrip(live, []byte("during"), 300*time.Millisecond); !isTimeout(err) {
		t.Errorf("round trip on a live connection during Stall: %v, want a timeout", err)
	}
	fresh := dial(t, p) // the dial succeeds
	if err := roundTrip(fresh, []byte("new"), 300*time.Millisecond); !isTimeout(err) {
		t.Errorf("round trip on a new connection during Stall: %v, want a timeout", err)
	}
	if got := e.received.Load(); got != received {
		t.Errorf("the server received %d bytes during the Stall", got-received)
	}
	if n := e.accepted.Load(); n != 1 {
		t.Errorf("the server accepted %d connections, want 1 (none during the Stall)", n)
	}

	// Restore resets the connections the Stall held; new ones work.
	p.Restore()
	for name, c := range map[string]net.Conn{"live": live, "new": fresh} {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !isReset(err) {
			t.Errorf("read on the %s stalled connection after Restore: %v, want ECONNRESET", name, err)
		}
	}
	if got := e.received.Load(); got != received {
		t.Errorf("the server received %d bytes held by the Stall", got-received)
	}
	after := dial(t, p)
	if err := roundTrip(after, []byte("after"), 5*time.Second); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
	if s := p.Stats(); s.Stalled != 2 || s.Reset != 2 || s.Refused != 0 || s.Stalls != 1 {
		t.Errorf("stats: %+v, want 2 stalled, 2 reset, 1 stall", s)
	}
}

// isTimeout reports whether err is a deadline that passed.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestCutDuringStall(t *testing.T) {
	t.Parallel()
	e := newEcho(t)
	p := newProxy(t, e.addr())
	c := dial(t, p)
	if err := roundTrip(c, []byte("x"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !isReset(err) {
		t.Errorf("read on a stalled connection after Cut: %v, want ECONNRESET", err)
	}
	p.Restore()
	if err := roundTrip(dial(t, p), []byte("after"), 5*time.Second); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
}

func TestLatency(t *testing.T) {
	t.Parallel()
	e := newEcho(t)
	p := newProxy(t, e.addr())
	c := dial(t, p)
	if err := roundTrip(c, []byte("warm"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	const d = 500 * time.Millisecond
	p.SetLatency(d)
	start := time.Now()
	if err := roundTrip(c, []byte("ping"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 2*d {
		t.Errorf("round trip with %s latency each way took %s, want at least %s", d, rtt, 2*d)
	}

	// Latency delays chunks; the delays overlap instead of adding up: 1 MiB, 32 chunks
	// or more each way, comes back in a few delays (2 s), where a delay per chunk in turn
	// would take over 32 (16 s). The round trip's deadline of 10 s lies between the two,
	// each 6 s or more away: no timing of the round trip, which a busy machine stretches.
	big := bytes.Repeat([]byte("z"), 1<<20)
	if err := roundTrip(c, big, 10*time.Second); err != nil {
		t.Fatalf("1 MiB echoed with %s latency: %v: the delays add up instead of overlapping", d, err)
	}

	// SetLatency(0) ends the delay. Checked after an hour's latency, not by timing a
	// round trip against d, which a busy machine can exceed without any latency: a delay
	// left in force would hold the chunks far past the round trip's deadline.
	p.SetLatency(time.Hour)
	p.SetLatency(0)
	if err := roundTrip(c, []byte("pong"), 10*time.Second); err != nil {
		t.Errorf("round trip after SetLatency(0): %v, want the echo, undelayed", err)
	}
}

func TestDialError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()
	p := newProxy(t, dead)
	if err := tryRoundTrip(p, []byte("x"), 5*time.Second); !isReset(err) {
		t.Errorf("read through a proxy whose target refuses: %v, want ECONNRESET", err)
	}
	// The proxy counts the failed dial before it resets the client's connection: the
	// count is in by the time the client has seen the reset.
	if n := p.Stats().DialErrors; n != 1 {
		t.Errorf("%d dial errors counted, want 1", n)
	}
}

// TestCloseReleasesEverything closes a proxy with a busy, a stalled and a latent
// connection; Close must return promptly with every goroutine gone (goleak checks the
// rest at the end).
func TestCloseReleasesEverything(t *testing.T) {
	t.Parallel()
	e := newEcho(t)
	p, err := New(e.addr())
	if err != nil {
		t.Fatal(err)
	}
	a := dial(t, p)
	if err := roundTrip(a, []byte("a"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.SetLatency(time.Hour)
	_, _ = a.Write([]byte("held by the latency"))
	p.Stall()
	b := dial(t, p)
	_, _ = b.Write([]byte("held by the stall"))

	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	for name, c := range map[string]net.Conn{"busy": a, "stalled": b} {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Errorf("the %s connection after Close: %v, want it closed", name, err)
		}
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Error("the proxy still accepts after Close")
	}
}

func TestNewBadTarget(t *testing.T) {
	t.Parallel()
	if _, err := New("no-port"); err == nil {
		t.Error("New accepted a target without a port")
	}
}

// OnHold reports the bytes a Stall holds, on a live connection and on one accepted
// during the Stall, and only those: nothing forwarded before or after it.
func TestOnHold(t *testing.T) {
	t.Parallel()
	e := newEcho(t)
	p := newProxy(t, e.addr())
	var mu sync.Mutex
	var held []byte
	got := make(chan struct{}, 1) // a wake-up: the waiter reads held again
	p.OnHold(func(b []byte) {
		mu.Lock()
		held = append(held, b...)
		mu.Unlock()
		select {
		case got <- struct{}{}:
		default:
		}
	})
	// waitHeld waits until the held bytes contain want.
	waitHeld := func(want string) {
		t.Helper()
		timeout := time.NewTimer(10 * time.Second)
		defer timeout.Stop()
		for {
			mu.Lock()
			ok := bytes.Contains(held, []byte(want))
			mu.Unlock()
			if ok {
				return
			}
			select {
			case <-got:
			case <-timeout.C:
				t.Fatalf("%q never reported as held", want)
			}
		}
	}
	live := dial(t, p)
	if err := roundTrip(live, []byte("before"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	if _, err := live.Write([]byte("during")); err != nil {
		t.Fatal(err)
	}
	waitHeld("during")
	fresh := dial(t, p)
	if _, err := fresh.Write([]byte("new")); err != nil {
		t.Fatal(err)
	}
	waitHeld("new")
	p.Restore()
	if err := roundTrip(dial(t, p), []byte("after"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(held) != len("duringnew") || bytes.Contains(held, []byte("before")) || bytes.Contains(held, []byte("after")) {
		t.Errorf("held %q, want the bytes written during the Stall only", held)
	}
	if s := p.Stats(); s.BytesHeld != int64(len("duringnew")) {
		t.Errorf("BytesHeld %d, want %d", s.BytesHeld, len("duringnew"))
	}
}
