package idempotency

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Why reading a request body failed. Each maps to its own answer.
var (
	errTooLarge    = errors.New("request body too large")
	errOverloaded  = errors.New("too many body bytes held in memory")
	errBodyTimeout = errors.New("request body not received in time")
	errDeadline    = errors.New("the request's deadline passed while its body was read")
)

// bodyBudget counts the body bytes all keyed requests hold in memory, both ways — the
// request bodies read to be fingerprinted and forwarded, the answers held until they are
// stored and sent, the stored answers being replayed — against a ceiling, so that many
// large or slow requests or answers cannot exhaust the process's memory. The ceiling
// admits: a new request whose body would pass it, or that arrives when it is passed, is
// refused (take). It does not cut: an answer being received is finished whatever it
// holds (force), since its request has run and a retry must get it whole; its bytes keep
// new requests out until it is sent.
type bodyBudget struct {
	max  int64
	held atomic.Int64

	discard sync.Pool // *[]byte of discardSize: the buffers discardBody reads into
}

// discardSize is the buffer discardBody reads a refused body into: large enough that
// the body takes few reads (io.Discard's own reads 8 KiB at a time).
const discardSize = 64 << 10

func (b *bodyBudget) discardBuf() *[]byte {
	if buf, ok := b.discard.Get().(*[]byte); ok {
		return buf
	}
	buf := make([]byte, discardSize)
	return &buf
}

// BodyMemory returns the body bytes held in memory now, counted against MaxBodyMemory,
// through m and every middleware it shares its store state with (With): request bodies,
// answers kept until stored and sent, answers held for the store, replays being sent.
// It passes MaxBodyMemory while answers in progress are finished past it.
func (m *Middleware) BodyMemory() int64 { return m.bodies.held.Load() }

// take reserves n bytes for a new request, or reports false (reserving nothing) when
// that would pass the ceiling. A request without a body (n = 0) is refused once nothing
// is left below the ceiling: its answer will need memory too.
func (b *bodyBudget) take(n int64) bool {
	if n == 0 {
		return b.held.Load() < b.max
	}
	for {
		cur := b.held.Load()
		if cur+n > b.max {
			return false
		}
		if b.held.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// force counts n bytes that must be held whatever the ceiling: an answer in progress.
func (b *bodyBudget) force(n int64) { b.held.Add(n) }

func (b *bodyBudget) give(n int64) { b.held.Add(-n) }

// errBodyDropped is GetBody's error once the handler has dropped the body
// (Claim.DropBody).
var errBodyDropped = errors.New("idempotency: the request body was dropped (Claim.DropBody)")

// reqBody is a keyed request's body, read into memory, as its handler gets it: r.Body
// and the readers r.GetBody makes. Both are bytes.Readers inside io.NopCloser, which
// http.Transport recognizes as a body in memory and sends with its headers in one
// write. DropBody lets go of the bytes: every reader is emptied, so that nothing keeps
// them from the garbage collector.
type reqBody struct {
	size    int64       // len(b): the budget's bytes reserved for it until the request ends
	dropped atomic.Bool // set under mu

	mu     sync.Mutex
	b      []byte
	body   bytes.Reader    // r.Body's
	first  *bytes.Reader   // the first GetBody made (a proxy's, usually the only one): &firstR
	firstR bytes.Reader    // made with the body: most requests' GetBody is called once
	more   []*bytes.Reader // the others
}

// get is r.GetBody: a new reader of the body.
func (rb *reqBody) get() (io.ReadCloser, error) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if rb.dropped.Load() {
		return nil, errBodyDropped
	}
	rd := &rb.firstR
	if rb.first == nil {
		rd.Reset(rb.b)
		rb.first = rd
	} else {
		rd = bytes.NewReader(rb.b)
		rb.more = append(rb.more, rd)
	}
	return io.NopCloser(rd), nil // io.NopCloser's own type: see reqBody
}

// drop lets go of the bytes: r.Body and the readers GetBody made read nothing more, and
// GetBody fails.
func (rb *reqBody) drop() {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if rb.dropped.Load() {
		return
	}
	rb.b = nil
	rb.body.Reset(nil)
	if rb.first != nil {
		rb.first.Reset(nil)
	}
	for _, rd := range rb.more {
		rd.Reset(nil)
	}
	rb.first, rb.more = nil, nil
	rb.dropped.Store(true)
}

// room is how many bytes the request body leaves its answer: its size once it has been
// dropped (its reservation stays until the request ends, and the answer's first bytes
// are counted against it), none before.
func (rb *reqBody) room() int64 {
	if rb == nil || !rb.dropped.Load() {
		return 0
	}
	return rb.size
}

// DropBody tells the middleware that the handler needs the request body no more: a
// proxy has sent it upstream, or the handler has decoded it. The middleware lets go of
// the body's bytes — r.Body and the readers r.GetBody made read nothing more, and
// GetBody returns an error — and counts the memory they held, against
// Config.MaxBodyMemory, as room for the answer: an answer no larger than its request
// then holds nothing more of the ceiling. Call it only once nothing reads the body any
// more. The gateway calls it once the upstream has received the body. Without a body,
// or with a Claim not made by the middleware, it does nothing.
func (c *Claim) DropBody() {
	if c.body != nil {
		c.body.drop()
	}
}

// replay writes a stored answer, its body counted against the ceiling while it is
// sent.
func (m *Middleware) replay(w http.ResponseWriter, resp *Response) {
	n := int64(len(resp.Body))
	m.bodies.force(n)
	defer m.bodies.give(n)
	Replay(w, resp)
}

// readBody reads the request body into memory, at most maxBody bytes, within the body
// timeout and the request's deadline, reserving its bytes from the budget. The caller
// gives back reserved bytes (reserved is set even when err is not nil).
func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) (body []byte, reserved int64, err error) {
	if r.ContentLength > m.cfg.MaxBody {
		return nil, 0, errTooLarge
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		if !m.bodies.take(0) {
			return nil, 0, errOverloaded
		}
		return nil, 0, nil
	}
	deadline := time.Now().Add(m.cfg.BodyTimeout)
	byDeadline := false
	if d, ok := r.Context().Deadline(); ok && d.Before(deadline) {
		deadline, byDeadline = d, true
	}
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(deadline); err == nil {
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	timedOut := func(err error) error {
		if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		if byDeadline {
			return errDeadline
		}
		return errBodyTimeout
	}

	if r.ContentLength > 0 {
		// The length is known, and within MaxBody (the server reads no more of the body
		// than it): reserve it and read into one buffer of that size.
		if !m.bodies.take(r.ContentLength) {
			return nil, 0, errOverloaded
		}
		body = make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, r.ContentLength, timedOut(err)
		}
		return body, r.ContentLength, nil
	}
	// Unknown length (chunked): reserve as the body grows, up to MaxBody.
	src := http.MaxBytesReader(w, r.Body, m.cfg.MaxBody)
	var buf bytes.Buffer
	chunk := make([]byte, 32<<10)
	for {
		n, err := src.Read(chunk)
		if n > 0 {
			if !m.bodies.take(int64(n)) {
				return nil, reserved, errOverloaded
			}
			reserved += int64(n)
			buf.Write(chunk[:n])
		}
		if errors.Is(err, io.EOF) {
			if reserved == 0 && !m.bodies.take(0) {
				return nil, 0, errOverloaded
			}
			return buf.Bytes(), reserved, nil
		}
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, reserved, errTooLarge
		}
		if err != nil {
			return nil, reserved, timedOut(err)
		}
	}
}

// discardBody reads the rest of a refused request's body and throws it away, up to
// MaxBody bytes and within BodyTimeout, holding none of it. An HTTP/1 server that
// closes a connection with bytes of the body still coming resets it, and most clients
// (Go's among them), still sending, then report the reset, not the answer sent before
// it: the 503 must reach the client, and the connection stays usable. A client that
// asked to be told first (Expect: 100-continue) is not asked for its body.
func (m *Middleware) discardBody(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 1 || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 ||
		strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		return
	}
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(m.cfg.BodyTimeout)); err == nil {
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	buf := m.bodies.discardBuf()
	defer m.bodies.discard.Put(buf)
	for left := m.cfg.MaxBody; left > 0; {
		n, err := r.Body.Read((*buf)[:min(int64(len(*buf)), left)])
		left -= int64(n)
		if err != nil {
			return
		}
	}
}

// setBody gives r the body the middleware read, and returns it: see reqBody.
func setBody(r *http.Request, body []byte) *reqBody {
	rb := &reqBody{size: int64(len(body)), b: body}
	rb.body.Reset(body)
	r.Body = io.NopCloser(&rb.body) // see get
	r.ContentLength = int64(len(body))
	r.GetBody = rb.get
	return rb
}
