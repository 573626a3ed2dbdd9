package retry

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// rawRequest is one request as a rawServer read it off the wire.
type rawRequest struct {
	Method, Target string
	Lines          []string // the header lines as sent, without their CRLF
	Body           string
	Conn, Nth      int // the connection's number (1 is the first) and the request's index on it
}

// Header returns the values of the header lines whose name is name in any case, in the
// order they were sent.
func (r *rawRequest) Header(name string) []string {
	var vals []string
	for _, l := range r.Lines {
		n, v, _ := strings.Cut(l, ":")
		if strings.EqualFold(strings.TrimSpace(n), name) {
			vals = append(vals, strings.TrimSpace(v))
		}
	}
	return vals
}

// Drop modes of a rawServer's reply.
const (
	keepConn  = iota // answer and keep the connection alive
	closeConn        // close the connection (FIN) without answering
	resetConn        // reset the connection (RST, SetLinger(0)) without answering
)

// rawReply is what a rawServer does with a request it has read whole.
type rawReply struct {
	Status int    // answered when Drop is keepConn; default 200
	Header string // extra header lines, each ending in \r\n
	Body   string
	Drop   int
}

// rawServer is an HTTP/1.1 server on a bare TCP listener, so that a test decides what
// happens on each connection: it reads every request whole (raw header lines and body,
// Content-Length or chunked), records it, and answers it or drops the connection without
// a byte of response, as reply says.
type rawServer struct {
	ln    net.Listener
	reply func(r *rawRequest) rawReply

	mu    sync.Mutex
	reqs  []*rawRequest
	conns map[net.Conn]bool
	nconn int
	wg    sync.WaitGroup
}

func newRawServer(t testing.TB, reply func(r *rawRequest) rawReply) *rawServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln, reply: reply, conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *rawServer) URL() string { return "http://" + s.ln.Addr().String() }

// Requests returns the requests read so far.
func (s *rawServer) Requests() []*rawRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*rawRequest(nil), s.reqs...)
}

// Count returns how many of the requests read so far carry the header name (in any case)
// with the value v.
func (s *rawServer) Count(name, v string) int {
	n := 0
	for _, r := range s.Requests() {
		for _, got := range r.Header(name) {
			if got == v {
				n++
				break
			}
		}
	}
	return n
}

func (s *rawServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.nconn++
		n := s.nconn
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handle(c, n)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

func (s *rawServer) handle(c net.Conn, conn int) {
	defer c.Close()
	br := bufio.NewReader(c)
	for nth := 1; ; nth++ {
		r, err := readRawRequest(br)
		if err != nil {
			return
		}
		r.Conn, r.Nth = conn, nth
		s.mu.Lock()
		s.reqs = append(s.reqs, r)
		s.mu.Unlock()
		rep := s.reply(r)
		switch rep.Drop {
		case resetConn:
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			return
		case closeConn:
			return
		}
		status := rep.Status
		if status == 0 {
			status = 200
		}
		if _, err := fmt.Fprintf(c, "HTTP/1.1 %d Status\r\n%sContent-Length: %d\r\n\r\n%s", status, rep.Header, len(rep.Body), rep.Body); err != nil {
			return
		}
	}
}

func readRawRequest(br *bufio.Reader) (*rawRequest, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return nil, err
	}
	f := strings.Fields(line)
	if len(f) != 3 {
		return nil, fmt.Errorf("bad request line %q", line)
	}
	r := &rawRequest{Method: f[0], Target: f[1]}
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			return nil, err
		}
		l = strings.TrimRight(l, "\r\n")
		if l == "" {
			break
		}
		r.Lines = append(r.Lines, l)
	}
	var body io.Reader = strings.NewReader("")
	chunked := false
	if te := r.Header("Transfer-Encoding"); len(te) > 0 && strings.EqualFold(te[0], "chunked") {
		body, chunked = httputil.NewChunkedReader(br), true
	} else if cl := r.Header("Content-Length"); len(cl) > 0 {
		n, err := strconv.ParseInt(cl[0], 10, 64)
		if err != nil {
			return nil, err
		}
		body = io.LimitReader(br, n)
	}
	b, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	r.Body = string(b)
	for chunked { // the trailer section, up to its empty line
		l, err := br.ReadString('\n')
		if err != nil {
			return nil, err
		}
		chunked = strings.TrimRight(l, "\r\n") != ""
	}
	return r, nil
}
