package gateway

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
)

// Problem types of the gateway's own error answers (RFC 9457). The middleware's are in
// package idempotency.
const (
	// ProblemUpstreamUnreachable (502): the request never reached the upstream; the key
	// was released, so a retry forwards again.
	ProblemUpstreamUnreachable = "urn:retrysafe:problem:upstream-unreachable"
	// ProblemUpstreamTimeout (504): the request was sent and no answer came in time; the
	// outcome is unknown and the key stays in progress until its lease ends.
	ProblemUpstreamTimeout = "urn:retrysafe:problem:upstream-timeout"
	// ProblemUpstreamFailed (502): the request was sent and the connection broke before
	// an answer; the outcome is unknown and the key stays in progress until its lease
	// ends.
	ProblemUpstreamFailed = "urn:retrysafe:problem:upstream-failed"
)

// failure is what a failed upstream round trip means for the key.
type failure int

const (
	failNone failure = iota
	// failUnreachable: the upstream cannot have seen the request. Release the key.
	failUnreachable
	// failTimeout: the request was sent; no answer came before the deadline. Outcome
	// unknown: keep the key in progress until its lease ends.
	failTimeout
	// failBroken: the request was sent; the connection failed before an answer. Outcome
	// unknown, as for failTimeout.
	failBroken
	// failBody: the answer's status was passed on, then its body broke off. The upstream
	// acted; the stored answer would be incomplete: keep the key in progress.
	failBody
)

// String is the failure's name in logs and in the upstream metric's result label.
func (f failure) String() string {
	switch f {
	case failUnreachable:
		return "unreachable"
	case failTimeout:
		return "timeout"
	case failBroken:
		return "failed"
	case failBody:
		return "body-failed"
	}
	return ""
}

// classify tells a round trip that never reached the upstream from one whose outcome is
// unknown. sent reports whether the request's headers were written to a connection
// (httptrace's WroteHeaders, on any attempt: the transport may retry a request on a new
// connection). An HTTP server cannot act on a request whose headers it has not
// received, so an error before that point — dial, DNS, TLS, a budget spent before
// sending — means the upstream never saw the request, whatever the error says. After
// it, the upstream may have executed the request: a timeout (a context deadline or a
// net.Error that says Timeout) is failTimeout, anything else failBroken. err nil is
// failNone.
func classify(err error, sent bool) failure {
	if err == nil {
		return failNone
	}
	if !sent {
		return failUnreachable
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return failTimeout
	}
	return failBroken
}

// sentTrace returns a context whose round trips set *sent once a request's headers have
// been written.
func sentTrace(ctx context.Context, sent *atomic.Bool) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaders: func() { sent.Store(true) },
	})
}

// watchedBody wraps an upstream response body and remembers a read error other than
// io.EOF: the body broke off.
type watchedBody struct {
	io.ReadCloser
	mu  sync.Mutex
	err error
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
	}
	return n, err
}

func (b *watchedBody) failed() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}
