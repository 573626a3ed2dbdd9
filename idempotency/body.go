package idempotency

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// Why reading a request body failed. Each maps to its own answer.
var (
	errTooLarge    = errors.New("request body too large")
	errOverloaded  = errors.New("too many request body bytes held in memory")
	errBodyTimeout = errors.New("request body not received in time")
	errDeadline    = errors.New("the request's deadline passed while its body was read")
)

// bodyBudget counts the request-body bytes held in memory by all requests, against a
// ceiling, so that many large or slow uploads cannot exhaust the process's memory.
type bodyBudget struct {
	max  int64
	held atomic.Int64
}

// take reserves n bytes, or reports false (reserving nothing) when that would pass the
// ceiling.
func (b *bodyBudget) take(n int64) bool {
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

func (b *bodyBudget) give(n int64) { b.held.Add(-n) }

// readBody reads the request body into memory, at most maxBody bytes, within the body
// timeout and the request's deadline, reserving its bytes from the budget. The caller
// gives back reserved bytes (reserved is set even when err is not nil).
func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) (body []byte, reserved int64, err error) {
	if r.ContentLength > m.cfg.MaxBody {
		return nil, 0, errTooLarge
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
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

func setBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}
