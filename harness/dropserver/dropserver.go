// Package dropserver is an HTTP/1.1 server for tests of hidden resends. It answers the
// first request of each connection (keep-alive) and reads the second one whole, then
// closes the connection without answering — or resets it — as an upstream does that
// crashes, hits its WriteTimeout or is cut off by a load balancer. That is the case in
// which Go's http.Transport sends a request again by itself, on another connection,
// when it deems the request replayable (a keyed POST among them). The server counts
// every request it read, by Idempotency-Key, so a test sees each execution.
package dropserver

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
)

// Server is a running dropserver. Make one with New.
type Server struct {
	ln    net.Listener
	reset bool
	wg    sync.WaitGroup

	mu    sync.Mutex
	reads map[string]int // by Idempotency-Key ("" for none)
	total int
}

// New starts a Server on 127.0.0.1, closed when t ends. With reset, a dropped
// connection is reset (RST) rather than closed.
func New(t testing.TB, reset bool) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{ln: ln, reset: reset, reads: map[string]int{}}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Go(func() { s.serve(c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		s.wg.Wait()
	})
	return s
}

// URL is the server's base URL.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Reads returns how many requests the server read.
func (s *Server) Reads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// ReadsOf returns how many requests with Idempotency-Key key the server read.
func (s *Server) ReadsOf(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads[key]
}

func (s *Server) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for nth := 1; ; nth++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
		s.mu.Lock()
		s.reads[req.Header.Get("Idempotency-Key")]++
		s.total++
		s.mu.Unlock()
		if nth == 2 {
			if tc, ok := c.(*net.TCPConn); ok && s.reset {
				_ = tc.SetLinger(0)
			}
			return // read whole, never answered
		}
		if _, err := io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"id\":1}"); err != nil {
			return
		}
	}
}
