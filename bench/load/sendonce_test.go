package load

import (
	"bufio"
	"context"
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
	reads int64
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

func (s *dropSecond) Reads() int64 {
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
		if _, err := fmt.Fprint(c, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}

// Each measured request reaches the server once: the default client does not resend a
// keyed request by itself when its reused connection closes after the request was read,
// which would hide the failure and fold two executions into one latency.
func TestRunNoHiddenResends(t *testing.T) {
	t.Parallel()
	srv := newDropSecond(t)
	res, err := Run(context.Background(), Config{URL: "http://" + srv.ln.Addr().String() + "/payments", Clients: 1,
		Requests: 10, Keys: KeyUnique, Body: []byte(`{"amount":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if got := srv.Reads(); got != res.Requests || res.Requests != 10 || res.Errors == 0 {
		t.Errorf("the server read %d requests; measured %d (%d responses, %d errors), want 10 reads with errors for the dropped ones",
			got, res.Requests, res.Responses, res.Errors)
	}
}
