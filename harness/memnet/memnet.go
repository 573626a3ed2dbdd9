// Package memnet is an in-memory network for tests that run HTTP servers and clients in a
// testing/synctest bubble.
//
// A goroutine blocked on a socket is never durably blocked, so a bubble whose server
// waits on a loopback connection never becomes idle and its virtual clock never moves.
// The connections of a Listener are the two ends of a net.Pipe, which block only on
// channels: a bubble waits them out, and a timeout in the code under test runs on the
// bubble's clock, whatever the machine's load.
//
//	l := memnet.New()
//	srv := &http.Server{Handler: h}
//	go srv.Serve(l)
//	client := &http.Client{Transport: &http.Transport{DialContext: l.DialContext}}
//
// Create the Listener inside the bubble that uses it. The package imports only the
// standard library.
package memnet

import (
	"context"
	"net"
	"sync"
)

// Listener is an in-memory net.Listener: each DialContext hands Accept the other end of
// a new net.Pipe. The zero value is not usable; call New.
type Listener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// New returns a Listener ready to accept.
func New() *Listener {
	return &Listener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept waits for the next DialContext; once the Listener is closed it returns
// net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept and DialContext; connections already made stay open. Closing twice
// is allowed.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr returns the Listener's address, network "mem".
func (l *Listener) Addr() net.Addr { return addr{} }

// DialContext connects to the Listener, whatever network and address it is given; it has
// the signature of http.Transport's DialContext. It waits for Accept, and fails with
// net.ErrClosed once the Listener is closed, or with ctx's error when ctx ends first.
func (l *Listener) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		client.Close()
		server.Close()
		return nil, net.ErrClosed
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, ctx.Err()
	}
}

type addr struct{}

func (addr) Network() string { return "mem" }
func (addr) String() string  { return "mem" }
