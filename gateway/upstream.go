package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"
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

// errUpstreamTimeout is the cause of an upstream call cut by the upstream timeout.
var errUpstreamTimeout = fmt.Errorf("gateway: upstream timeout: %w", context.DeadlineExceeded)

// upstreamCall bounds one upstream call. Until its answer is settled the whole call is
// bounded by the upstream timeout; after, only each wait for the upstream's bytes is:
// the copy to the client goes at the client's pace, and a slow client must not make
// the upstream look late. A keyed call is settled when its answer is stored (the
// middleware's Claim.Stored), which for an answer it keeps whole is after the upstream
// sent all of it; another call when its response headers arrive.
type upstreamCall struct {
	ctx     context.Context
	cancel  context.CancelCauseFunc
	timeout time.Duration
	settled <-chan struct{} // nil: settle is called by the gateway

	mu    sync.Mutex
	total *time.Timer
	done  bool // settled
}

func startUpstreamCall(parent context.Context, timeout time.Duration, settled <-chan struct{}) *upstreamCall {
	ctx, cancel := context.WithCancelCause(parent)
	deadline := time.Now().Add(timeout)
	if d, ok := parent.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c := &upstreamCall{cancel: cancel, timeout: timeout, settled: settled}
	// The deadline the upstream is told of (Request-Budget-Ms): the gateway's wait.
	c.ctx = deadlineContext{Context: ctx, deadline: deadline}
	c.total = time.AfterFunc(timeout, c.expire)
	return c
}

func (c *upstreamCall) expire() { c.cancel(errUpstreamTimeout) }

// settle ends the bound on the whole call.
func (c *upstreamCall) settle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done {
		c.done = true
		c.total.Stop()
	}
}

// read runs one read of the upstream's body, bounded by the timeout once the call is
// settled.
func (c *upstreamCall) read(f func() (int, error)) (int, error) {
	if c.settled != nil {
		select {
		case <-c.settled:
			c.settle()
		default:
		}
	}
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	if !done {
		return f()
	}
	t := time.AfterFunc(c.timeout, c.expire)
	defer t.Stop()
	return f()
}

func (c *upstreamCall) stop() {
	c.total.Stop()
	c.cancel(nil)
}

// deadlineContext reports deadline as its deadline while its cancellation is its own:
// the upstream timeout can be lifted once the answer is settled.
type deadlineContext struct {
	context.Context
	deadline time.Time
}

func (c deadlineContext) Deadline() (time.Time, bool) { return c.deadline, true }

// watchedBody wraps an upstream response body: it remembers a read error other than
// io.EOF (the body broke off), and bounds each read as the call says.
type watchedBody struct {
	io.ReadCloser
	call *upstreamCall
	mu   sync.Mutex
	err  error
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.call.read(func() (int, error) { return b.ReadCloser.Read(p) })
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
