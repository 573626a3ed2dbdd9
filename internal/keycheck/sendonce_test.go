package keycheck

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"strconv"
	"sync"
	"testing"
)

// dropSecond is an HTTP/1.1 server on a bare TCP listener that answers the first request
// on each connection (keep-alive) and reads the second one whole, then closes the
// connection without answering. It counts the requests it read.
type dropSecond struct {
	ln    net.Listener
	mu    sync.Mutex
	reads int
	wg    sync.WaitGroup
}

func newDropSecond(t *testing.T) *dropSecond {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dropSecond{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s
}

func (s *dropSecond) Reads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

func (s *dropSecond) serve(c net.Conn) {
	defer c.Close()
	tp := textproto.NewReader(bufio.NewReader(c))
	for nth := 1; nth <= 2; nth++ {
		if _, err := tp.ReadLine(); err != nil { // the request line
			return
		}
		h, err := tp.ReadMIMEHeader()
		if err != nil {
			return
		}
		n, _ := strconv.ParseInt(h.Get("Content-Length"), 10, 64)
		if _, err := io.CopyN(io.Discard, tp.R, n); err != nil {
			return
		}
		s.mu.Lock()
		s.reads++
		s.mu.Unlock()
		if nth == 2 {
			return // read whole, never answered
		}
		const answer = `{"id":1}`
		if _, err := fmt.Fprintf(c, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer); err != nil {
			return
		}
	}
}

// Every request of the battery reaches the endpoint once: the client does not resend a
// keyed request by itself when its reused connection closes after the request was read,
// which would count as an execution the battery never asked for.
func TestNoHiddenResends(t *testing.T) {
	srv := newDropSecond(t)
	cfg := baseConfig("http://" + srv.ln.Addr().String() + "/payments")
	cfg.Concurrency = 2
	rep := run(t, cfg)
	if got := srv.Reads(); got != rep.Requests {
		t.Errorf("the endpoint read %d requests, the battery sent %d", got, rep.Requests)
	}
}
