package clients

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
)

// lidPattern matches a logical id in a body, JSON or form-encoded: PREFIX-N, the
// prefix of letters, digits and '_'.
var lidPattern = regexp.MustCompile(`rslid_[a-z0-9_]+-[0-9]+`)

// MaxLosses is the most answers of one logical request the proxy loses: the clients
// retry 3 times, and a request all 4 of whose answers are lost ends in a network error
// whatever the gateway does (at 30%, about one in 120). Its last attempt gets its
// answer, so that a request lost is one the gateway lost.
const MaxLosses = 3

// Proxy is the fault proxy: HTTP/1.1 over TCP, one connection to the gateway per
// client connection. Each request is read whole and forwarded; whether its answer is
// lost is decided by the seed, the request's logical id and its attempt number (and
// MaxLosses), so that a run loses the same answers whatever the interleaving of the
// clients' connections. A lost answer: the client's connection is closed at once after the
// request was forwarded; the gateway's answer is still read (and recorded), then
// dropped.
type Proxy struct {
	ln     net.Listener
	target string
	seed   uint64
	rate   float64

	mu    sync.Mutex
	lids  map[string]*lidState
	conns sync.WaitGroup
}

// lidState is what the proxy saw of one logical request.
type lidState struct {
	lost    []bool        // per attempt, whether its answer is lost
	retried chan struct{} // closed once the gateway answered an attempt after the first
}

// NewProxy listens on a loopback port and forwards to target (host:port), losing the
// answers of about rate of the requests.
func NewProxy(target string, seed uint64, rate float64) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, seed: seed, rate: rate, lids: map[string]*lidState{}}
	go p.accept()
	return p, nil
}

// URL is the proxy's base URL.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

// Close stops accepting and waits for the connections being served.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.conns.Wait()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.conns.Add(1)
		go func() {
			defer p.conns.Done()
			p.serve(c)
		}()
	}
}

// loses decides, from the seed alone, whether attempt n of lid has its answer lost.
func (p *Proxy) loses(lid string, n int) bool {
	h := sha256.Sum256([]byte(strconv.FormatUint(p.seed, 10) + "/" + lid + "/" + strconv.Itoa(n)))
	return float64(binary.BigEndian.Uint64(h[:])>>11)/float64(1<<53) < p.rate
}

func (p *Proxy) state(lid string) *lidState {
	s := p.lids[lid]
	if s == nil {
		s = &lidState{retried: make(chan struct{})}
		p.lids[lid] = s
	}
	return s
}

// begin records a new attempt of lid and returns its index and whether its answer is
// lost.
func (p *Proxy) begin(lid string) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.state(lid)
	n := len(s.lost)
	lose := n < MaxLosses && p.loses(lid, n)
	s.lost = append(s.lost, lose)
	return n, lose
}

// answered records that the gateway answered attempt n of lid.
func (p *Proxy) answered(lid string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.state(lid)
	if n > 0 {
		select {
		case <-s.retried:
		default:
			close(s.retried)
		}
	}
}

// AttemptHeader is the header the proxy adds to each request it forwards: the index
// of the attempt of its logical request (0 for the first), so that the upstream knows
// which attempt it executes. The gateway forwards it; it is not part of a request's
// fingerprint.
const AttemptHeader = "Bench-Attempt"

// Lost reports whether the answer of attempt n of lid is lost, and a channel closed
// once the gateway has answered a later attempt of lid.
func (p *Proxy) Lost(lid string, n int) (bool, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.state(lid)
	return n >= 0 && n < len(s.lost) && s.lost[n], s.retried
}

// Attempts returns, per logical id, how many requests were forwarded and how many of
// their answers were lost.
func (p *Proxy) Attempts() map[string][2]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][2]int, len(p.lids))
	for lid, s := range p.lids {
		lost := 0
		for _, l := range s.lost {
			if l {
				lost++
			}
		}
		out[lid] = [2]int{len(s.lost), lost}
	}
	return out
}

// serve relays one client connection.
func (p *Proxy) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	var back net.Conn
	var bbr *bufio.Reader
	defer func() {
		if back != nil {
			_ = back.Close()
		}
	}()
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		req.Body, req.ContentLength, req.TransferEncoding = io.NopCloser(bytes.NewReader(body)), int64(len(body)), nil
		lid := string(lidPattern.Find(body))
		n, lose := 0, false
		if lid != "" {
			n, lose = p.begin(lid)
			req.Header.Set(AttemptHeader, strconv.Itoa(n))
		}
		if back == nil {
			if back, err = (&net.Dialer{}).DialContext(context.Background(), "tcp", p.target); err != nil {
				return
			}
			bbr = bufio.NewReader(back)
		}
		if err := req.Write(back); err != nil {
			return
		}
		if lose {
			_ = c.Close() // the answer is lost: the request was sent, nothing comes back
		}
		res, err := http.ReadResponse(bbr, req)
		if err != nil {
			return
		}
		if lid != "" {
			p.answered(lid, n)
		}
		if lose {
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
			return
		}
		err = res.Write(c)
		_ = res.Body.Close()
		if err != nil || res.Close || req.Close {
			return
		}
	}
}
