package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// tokenHeader carries the claim's token from a wire replica's transport to the
// upstream, which counts executions by claim: the wire has no context to carry it.
const tokenHeader = "X-Sim-Token"

// wireTransport is a gateway replica's upstream through a real http.Transport: its
// connections are in-memory pipes (net.Pipe, no socket, virtual time) to an upstream
// that speaks HTTP/1.1 on them, and they are kept alive and reused. It is there for
// what only the real Transport does: a request it may replay (one carrying an
// Idempotency-Key header, with GetBody or no body), written on a reused connection
// that the upstream then closes without answering, it sends again by itself, and the
// upstream executes it twice under one claim.
type wireTransport struct {
	rep *replica
	t   *http.Transport
}

func newWireTransport(rep *replica) *wireTransport {
	wt := &wireTransport{rep: rep}
	wt.t = &http.Transport{
		DialContext:         wt.dial,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     time.Minute,
	}
	return wt
}

// RoundTrip sends a copy of req that names its claim's token (tokenHeader), through the
// real Transport; the copy keeps req's header map keys as they are, so the Transport
// sees the key exactly as the gateway hands it over.
func (wt *wireTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	out := req.Clone(req.Context())
	if c, ok := idempotency.ClaimFromContext(req.Context()); ok {
		out.Header.Set(tokenHeader, strconv.FormatInt(c.Token, 10))
	}
	return wt.t.RoundTrip(out)
}

// dial connects to the upstream: one end of a pipe, the upstream serving the other. A
// killed process reaches nothing.
func (wt *wireTransport) dial(context.Context, string, string) (net.Conn, error) {
	if wt.rep.isDead() {
		return nil, errNotSent
	}
	client, server := net.Pipe()
	go wt.rep.serveConn(server)
	return client, nil
}

// serveConn is the upstream on one connection: it reads each request in full, executes
// it as callUpstream's upstream does (the same draws of the link, the same accounting)
// and answers it; or, when the answer is lost or (on a reused connection) a drawn fault
// says so, closes the connection without answering. A connection the gateway closes
// while the upstream works (its upstream timeout, its context) is an owner that stopped
// waiting.
func (rep *replica) serveConn(c net.Conn) {
	w := rep.w
	defer c.Close()
	br := bufio.NewReader(c)
	// next reports when the gateway sends the next request or closes the connection;
	// while a request is served, only a close can come (HTTP/1.1 clients of Go do not
	// pipeline), so it is also how the upstream learns that its caller left.
	next := make(chan error, 1)
	peek := func() {
		go func() {
			_, err := br.Peek(1)
			next <- err
		}()
	}
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-next:
			return false
		}
	}
	peek()
	for n := 1; ; n++ {
		if err := <-next; err != nil {
			return
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		peek()
		var p payment
		if json.Unmarshal(body, &p) != nil {
			return
		}
		token, _ := strconv.ParseInt(req.Header.Get(tokenHeader), 10, 64)
		req.Header.Del(tokenHeader)
		in := upstreamRequest{Method: req.Method, Path: req.URL.EscapedPath(), Header: req.Header}
		scope := headerValue(in.Header, scopeHeader)
		there, took, _, lost := rep.drawLink(scope, p.Key)
		var cut bool
		w.draw("wire/"+rep.name+"/"+sk(scope, p.Key), func(r *rand.Rand) { cut = chance(r, 0.2) })
		if !wait(there) {
			return // the gateway stopped waiting before the request arrived
		}
		w.received(rep, p, in)
		ex := w.execute(rep, token, scope, p, in)
		if !wait(took) {
			w.answerLost(ex, "the owner stopped waiting for the upstream")
			return
		}
		var answer []byte
		status := http.StatusServiceUnavailable
		if ex != nil {
			switch {
			case rep.isDead():
				w.answerLost(ex, "its process was killed")
				return
			case lost || cut && n > 1:
				w.answerLost(ex, "the upstream closed the connection without answering")
				w.event("upstream", "exec #%d: read request %d of its connection from %s, closed it without answering", ex.N, n, rep.name)
				return
			}
			status = ex.Status
			answer, _ = json.Marshal(receipt{Exec: ex.N, Op: p.Op, Key: p.Key, Amount: p.Amount, Scope: scope, Path: in.Path})
		}
		var b bytes.Buffer
		fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", status, http.StatusText(status), len(answer))
		b.Write(answer)
		if _, err := c.Write(b.Bytes()); err != nil {
			w.answerLost(ex, "the owner stopped waiting for the upstream")
			return
		}
	}
}
