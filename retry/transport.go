package retry

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

var (
	// ErrUnknownOutcome: a non-idempotent request without an Idempotency-Key failed after
	// it may have reached the server (it was written, then the connection broke or the
	// response was lost). Transport did not resend it: that could execute it twice. Ask
	// the server (see WithStatusCheck), or send such requests with a key (Transport.AutoKey).
	ErrUnknownOutcome = errors.New("retry: outcome unknown: the request may have been executed and is not safe to resend")
	// ErrAttemptTimeout: an attempt outlived Transport.AttemptTimeout. Retried like any
	// platform failure.
	ErrAttemptTimeout = errors.New("retry: attempt timed out")
)

// errChecked stops the loop when a status check answered with a response.
var errChecked = errors.New("retry: the status check answered")

const (
	// IdempotencyKeyHeader is the header that makes a POST or PATCH safe to retry.
	IdempotencyKeyHeader = "Idempotency-Key"

	// DefaultMaxBufferedBody is Transport.MaxBufferedBody's default: 1 MiB.
	DefaultMaxBufferedBody = 1 << 20
	// budgetSweep is the number of hosts a Transport keeps budgets for before it drops
	// those that are full (they hold nothing a new budget would not).
	budgetSweep = 64
	// drainLimit is how much of a discarded response body is read so its connection can
	// be reused; a longer body closes the connection.
	drainLimit = 64 << 10
)

// Transport is an http.RoundTripper that retries what is safe to retry, and only that:
//
//   - GET, HEAD, OPTIONS, PUT, DELETE and TRACE are retried on retryable failures
//     (Classify, then Policy.Retryable): connect errors, resets, timeouts, 5xx, 408, 429,
//     and 409 with Retry-After. Auth failures (401, 403), 404, 410 and other 4xx are
//     returned at once.
//   - POST, PATCH and any other method are retried only when the request carries an
//     Idempotency-Key header (set a fresh one per call with AutoKey), the same key on
//     every attempt. Header names are case-insensitive: a map entry of any case
//     (req.Header["idempotency-key"]) is the key, and is sent as one header.
//   - A keyed request's answer is read whole before RoundTrip returns it (up to
//     MaxBufferedResponse; streams such as text/event-stream are not read ahead): an
//     answer whose body breaks off on its way (a connection reset mid-body) is an answer
//     lost, which the key makes safe to ask for again, so it is retried like a failure
//     before the headers, and the caller never reads a truncated body. On HTTP/2, where
//     one cut connection ends every stream on it, this is most answers in flight.
//   - Such a request without a key is resent only when it provably never left the client:
//     no connection was ever obtained for it (a refused or failed dial, observed with
//     net/http/httptrace). Once it may have been written, a failure is an unknown outcome:
//     Transport asks the status check of the request's context (WithStatusCheck) if there
//     is one, and otherwise returns the failure (a response as it is, an error matching
//     ErrUnknownOutcome), never resending blindly.
//
// Waits follow Policy (backoff with jitter and a cap; the server's Retry-After or
// rate-limit reset honoured up to Policy.MaxServerDelay), never outlive the request
// context's deadline (no retry starts with less than Policy.MinAttempt left), and stop
// when the retry budget is spent. An answer that says the caller's time budget is spent
// (BudgetExhaustedHeader, as package deadline's Middleware sends) is final.
//
// What it returns follows one rule. When Transport stops at an HTTP answer, it returns
// that response, its body intact, and a nil error, whatever the status: a success, an
// answer no retry can fix (401, 404, a 409 without Retry-After …), an answer it may not
// resend (a 503 to a POST without a key), or the last of retryable answers when it gives
// up (attempts, budget, deadline, a server delay too long). net/http requires it: a
// RoundTripper that obtained a response returns a nil error, and http.Client drops, and
// never closes, a response returned together with an error. StopReason(resp) tells why
// Transport stopped there (nil for a success, else a *StatusError, an *ExhaustedError,
// or an error matching ErrUnknownOutcome) without classifying the answer again.
//
// An error is returned only when there is no answer to return: after transport errors
// an *ExhaustedError (its Last is a *StatusError wrapping the last transport error); a
// non-retryable transport error as a *StatusError; an unknown outcome as an error
// matching ErrUnknownOutcome; and, when the request's context ends while Transport waits
// to retry, an *ExhaustedError whose Reason is the context's cause (the last response is
// closed: its body could not be read any more). http.Client wraps these in a *url.Error;
// errors.Is and errors.As see through it, and Classify returns them as they are.
//
// Every attempt goes through SendOnce(Base). Go's http.Transport would otherwise resend,
// by itself and silently, a keyed request that failed on a reused keep-alive connection
// after the server had read it: an attempt the Policy, the budget, OnRetry and
// ExhaustedError.Attempts would never see, and a duplicate to a server that does not
// deduplicate. So a request with an unsafe method reaches the server once per attempt
// Transport counts. GET, HEAD, OPTIONS and TRACE keep Go's own resend (they are safe to
// repeat; a server may see one more of them than Transport counts). A RoundTripper in
// Base sees a keyed request's key under the lower-case map key idempotency-key (see
// SendOnce). Transport counts only Idempotency-Key as a key, not X-Idempotency-Key.
//
// Set the fields before the first request and do not change them afterwards; do not
// copy a Transport after first use. A Transport is safe for concurrent use.
type Transport struct {
	// Base sends each attempt. Default http.DefaultTransport.
	Base http.RoundTripper

	// Policy says how often and how long to retry; its zero value is DefaultPolicy()
	// (5 attempts, full jitter from 300ms, waits capped at 10s). Its Retryable is asked
	// about the classified failure (a *StatusError); its Budget is used when Budget is
	// nil; its OnRetry is called as well as Transport's; its Clock times the waits and
	// reads Retry-After dates.
	Policy Policy

	// Budget is a retry budget shared by all the requests of this Transport, whatever
	// their host. Default: Policy.Budget when set; otherwise a budget per host (the
	// scheme and host:port of the request's URL) that the Transport keeps,
	// NewBudget(DefaultBudgetTokens, DefaultBudgetRatio): retries go on while at least
	// a third of a host's attempts succeed, and stop, for that host only, when fewer do,
	// until successes earn them back. Set one Budget on the Transports of one dependency
	// to share it among them.
	Budget *Budget
	// NoBudget turns the retry budget off. Default false.
	NoBudget bool
	// OnBudgetExhausted, when set, is called when a retry budget starts refusing retries
	// (its first refusal since it last allowed one), with the request whose retry it
	// refused. The refusals that follow are not reported again until the budget has
	// allowed a retry; Budget.Refused counts them all, and each such call ends with an
	// error or StopReason matching ErrBudget. Default nil.
	OnBudgetExhausted func(*http.Request)

	// AutoKey, when true, gives each POST and PATCH without an Idempotency-Key a fresh
	// random (UUIDv4) key, once per RoundTrip and before the first attempt, and sends the
	// same key on every attempt (on a clone: the caller's request is not modified). The
	// server must honour the key (see package idempotency). A 307 or 308 redirect
	// repeats the same logical request, so the request http.Client sends to follow it
	// (whose Response is the redirect, and that response's Request the keyed request)
	// gets the key of the request redirected; the response's Request is the keyed
	// request. A 301, 302 or 303 turns a POST into a GET, which needs no key. Default
	// false.
	AutoKey bool

	// MaxBufferedBody is how much of a request body without GetBody is buffered so it can
	// be resent. A larger body (or one whose ContentLength says it is larger) is sent once
	// and never retried. Default DefaultMaxBufferedBody (1 MiB); negative means never
	// buffer. Requests made with http.NewRequest from a bytes.Buffer, bytes.Reader or
	// strings.Reader have GetBody and need no buffer.
	MaxBufferedBody int64

	// MaxBufferedResponse is how much of a keyed request's answer is read before
	// RoundTrip returns it, so that a body that breaks off is retried. A longer body is
	// returned with the rest still streaming, and a failure in that rest is the caller's.
	// The reading ahead is part of the attempt: AttemptTimeout bounds it, so allow for
	// the largest answer at the slowest link the client expects. Default 0: the answer
	// is returned as its headers arrive, and its body is the caller's to read (and a
	// break in it the caller's to see), which suits large answers and slow links.
	MaxBufferedResponse int64

	// AttemptTimeout bounds each attempt until its response headers arrive (and the
	// reading ahead of MaxBufferedResponse, and the draining of a response that is
	// discarded). It uses the real clock. The body of the returned response is bounded
	// only by the request's context, which also bounds the whole call, waits included.
	// Default 0: no per-attempt bound.
	AttemptTimeout time.Duration

	// OnRetry, when set, is called before each wait with the caller's request. Default nil.
	OnRetry func(*http.Request, Attempt)
	// OnAuthFailure, when set, is called when a response is an auth failure (401 or 403,
	// or a status WithStatusClass maps to ErrAuth), for alerting: a person must act. The
	// response is then returned to the caller as it is, never retried. The hook must not
	// read or close the body. Default nil.
	OnAuthFailure func(*http.Request, *http.Response)
	// Logger receives a record per retry (Info), auth failure (Warn), unknown outcome
	// (Warn), give-up (Warn), and one when a retry budget starts refusing retries (Warn).
	// Default nil: no logs (a library does not write to the application's default logger
	// unasked; OnRetry, OnAuthFailure and OnBudgetExhausted carry the same events).
	Logger *slog.Logger

	once   sync.Once
	policy Policy            // with its defaults, and no Budget: budget() chooses it
	shared *Budget           // Budget or Policy.Budget; nil with NoBudget or per host
	hosts  *hostBudgets      // the budgets per host, when neither is set
	send   http.RoundTripper // SendOnce(Base)
}

func (t *Transport) init() {
	p := t.Policy.withDefaults()
	switch {
	case t.NoBudget:
	case t.Budget != nil:
		t.shared = t.Budget
	case p.Budget != nil:
		t.shared = p.Budget
	default:
		t.hosts = &hostBudgets{m: map[string]*Budget{}, sweep: budgetSweep}
	}
	p.Budget = nil
	t.policy = p
	t.send = SendOnce(t.Base)
}

// budget returns the retry budget for req: the shared one, its host's, or nil.
func (t *Transport) budget(req *http.Request) *Budget {
	if t.hosts == nil {
		return t.shared
	}
	host := ""
	if u := req.URL; u != nil {
		host = strings.ToLower(u.Scheme + "://" + u.Host)
	}
	return t.hosts.get(host)
}

// hostBudgets holds a Transport's budgets, one per host.
type hostBudgets struct {
	mu    sync.Mutex
	m     map[string]*Budget
	sweep int // drop the full budgets when the map reaches this size
}

func (h *hostBudgets) get(host string) *Budget {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b, ok := h.m[host]; ok {
		return b
	}
	if len(h.m) >= h.sweep {
		// A full budget is a new one: dropping it loses nothing, so the map holds only the
		// hosts that failed lately. A call still holding a dropped budget updates a budget
		// no one else sees, as if it had begun before the drop.
		for k, b := range h.m {
			if b.full() {
				delete(h.m, k)
			}
		}
		h.sweep = max(budgetSweep, 2*len(h.m))
	}
	b := NewBudget(DefaultBudgetTokens, DefaultBudgetRatio)
	h.m[host] = b
	return b
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

// CloseIdleConnections closes the idle connections of Base, when it can.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// RoundTrip sends req, retrying as the Transport's documentation says.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.once.Do(t.init)
	c := &call{t: t, ctx: req.Context(), orig: req, base: req}
	if err := c.prepare(); err != nil {
		return nil, err
	}
	p := t.policy
	p.Budget = t.budget(req)
	return c.result(p.run(c.ctx, c.attempt, c.retrying, c.budgetRefused))
}

// call is one RoundTrip: one logical request and its attempts.
type call struct {
	t    *Transport
	ctx  context.Context
	orig *http.Request // the caller's request, never modified
	base *http.Request // what each attempt copies: orig, or a clone with a key or a buffered body

	getBody    func() (io.ReadCloser, error) // rewinds the body; nil when there is none
	rewindable bool                          // the body can be sent again
	safe       bool                          // idempotent method, or an Idempotency-Key
	keyed      bool                          // an Idempotency-Key: the answer is read ahead

	// The last response, kept until a retry discards it or it is returned, and the
	// cancellation of its attempt's context (nil without AttemptTimeout).
	resp   *http.Response
	cancel context.CancelCauseFunc
	timer  *time.Timer
}

func idempotentMethod(m string) bool {
	switch m {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodPut, http.MethodDelete, http.MethodTrace:
		return true
	}
	return false
}

// prepare decides whether the request may be resent, sets its key and makes its body
// rewindable. On error the caller's body has been closed.
func (c *call) prepare() error {
	req := c.orig
	keys, odd := keyValues(req.Header)
	c.keyed = len(keys) > 0 && keys[0] != ""
	c.safe = idempotentMethod(req.Method) || c.keyed
	if odd { // one canonical entry, so one header on the wire
		c.clone()
		setKey(c.base.Header, keys...)
	}
	if !c.safe && c.t.AutoKey && (req.Method == http.MethodPost || req.Method == http.MethodPatch) {
		key := redirectedKey(req)
		if key == "" {
			key = NewKey()
		}
		c.clone()
		setKey(c.base.Header, key)
		c.safe, c.keyed = true, true
	}
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		c.rewindable = true
	case req.GetBody != nil:
		c.getBody, c.rewindable = req.GetBody, true
	default:
		return c.buffer()
	}
	return nil
}

// clone makes base a copy of the caller's request whose header can be changed.
func (c *call) clone() {
	if c.base != c.orig {
		return
	}
	c.base = c.orig.Clone(c.ctx)
	if c.base.Header == nil {
		c.base.Header = make(http.Header)
	}
}

// keyValues returns the values of the Idempotency-Key header whatever the case of its map
// keys (the canonical entry's first, then the others' in the order of their names,
// repeated values once), and odd true when the header map does not hold exactly those in
// its one canonical entry.
func keyValues(h http.Header) (vals []string, odd bool) {
	canonical := h[IdempotencyKeyHeader]
	var others []string
	for name := range h {
		if name != IdempotencyKeyHeader && strings.EqualFold(name, IdempotencyKeyHeader) {
			others = append(others, name)
		}
	}
	if len(others) == 0 && !hasRepeats(canonical) {
		return canonical, false
	}
	slices.Sort(others)
	for _, name := range append([]string{IdempotencyKeyHeader}, others...) {
		for _, v := range h[name] {
			if !slices.Contains(vals, v) {
				vals = append(vals, v)
			}
		}
	}
	return vals, true
}

func hasRepeats(vals []string) bool {
	for i, v := range vals {
		if slices.Contains(vals[:i], v) {
			return true
		}
	}
	return false
}

// setKey makes vals the values of the Idempotency-Key header, in its canonical entry
// only.
func setKey(h http.Header, vals ...string) {
	for name := range h {
		if strings.EqualFold(name, IdempotencyKeyHeader) {
			delete(h, name)
		}
	}
	h[IdempotencyKeyHeader] = vals
}

// redirectedKey returns the key of the request a 307 or 308 redirected req from, when req
// repeats its method, or "".
func redirectedKey(req *http.Request) string {
	prev := req.Response
	if prev == nil || (prev.StatusCode != http.StatusTemporaryRedirect && prev.StatusCode != http.StatusPermanentRedirect) ||
		prev.Request == nil || prev.Request.Method != req.Method {
		return ""
	}
	if keys, _ := keyValues(prev.Request.Header); len(keys) > 0 {
		return keys[0]
	}
	return ""
}

// buffer reads a body without GetBody into memory, up to MaxBufferedBody.
func (c *call) buffer() error {
	limit := c.t.MaxBufferedBody
	if limit == 0 {
		limit = DefaultMaxBufferedBody
	}
	body := c.orig.Body
	if limit < 0 || c.orig.ContentLength > limit {
		return nil // sent once, as it is
	}
	buf, err := io.ReadAll(io.LimitReader(body, min(limit, math.MaxInt64-1)+1))
	if err != nil {
		body.Close()
		return errorf("retry: reading the request body: %w", err)
	}
	if c.base == c.orig {
		c.base = c.orig.WithContext(c.ctx) // a shallow copy whose body can be set
	}
	if int64(len(buf)) > limit {
		// Too large: send what was read and the rest, once.
		c.base.Body = readCloser{io.MultiReader(bytes.NewReader(buf), body), body}
		return nil
	}
	body.Close()
	if len(buf) == 0 {
		c.base.Body, c.base.GetBody, c.base.ContentLength = http.NoBody, nil, 0
		c.rewindable = true
		return nil
	}
	c.getBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	c.base.Body, _ = c.getBody()
	c.base.GetBody = c.getBody // lets http.Transport rewind it too
	if c.base.ContentLength <= 0 {
		c.base.ContentLength = int64(len(buf))
	}
	c.rewindable = true
	return nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// attempt sends attempt n and classifies its outcome for run: nil for a success, a
// retryable error, or a Permanent error to stop. The response stays in c.resp.
func (c *call) attempt(_ context.Context, n int) error {
	var body io.ReadCloser
	if n > 1 {
		body = c.base.Body
		if c.getBody != nil {
			var err error
			if body, err = c.getBody(); err != nil {
				return Permanent(errorf("retry: rewinding the request body: %w", err))
			}
		}
	}
	actx := c.ctx
	var cancel context.CancelCauseFunc
	var timer *time.Timer
	if d := c.t.AttemptTimeout; d > 0 {
		actx, cancel = context.WithCancelCause(actx)
		timer = time.AfterFunc(d, func() { cancel(ErrAttemptTimeout) })
	}
	var connected *atomic.Bool
	if !c.safe {
		connected = new(atomic.Bool)
		actx = httptrace.WithClientTrace(actx, &httptrace.ClientTrace{
			GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
		})
	}
	r := c.base
	if n > 1 || actx != c.ctx {
		r = c.base.WithContext(actx)
		if n > 1 {
			r.Body = body
		}
	}

	resp, err := c.t.send.RoundTrip(r)
	if err != nil {
		if resp != nil && resp.Body != nil {
			resp.Body.Close() // a RoundTripper returns one or the other
		}
		timedOut := cancel != nil && c.ctx.Err() == nil && errors.Is(context.Cause(actx), ErrAttemptTimeout)
		stopAttempt(timer, cancel)
		var serr error
		if timedOut {
			if !errors.Is(err, ErrAttemptTimeout) { // net/http returns the context's cause
				err = fmt.Errorf("%w: %w", ErrAttemptTimeout, err)
			}
			serr = &StatusError{Class: ErrPlatform, Err: err}
		} else {
			serr = classifyAt(c.ctx, nil, err, nil)
		}
		switch {
		case !c.t.policy.Retryable(serr) || !c.rewindable:
			return Permanent(serr)
		case c.safe || !connected.Load():
			return serr // idempotent, keyed, or never left the client
		}
		return c.unknown(serr)
	}
	resp.Request = c.base // the keyed request, which a redirect to follow starts from
	if c.keyed && c.t.MaxBufferedResponse > 0 && readAhead(resp) {
		if err := c.readAhead(resp); err != nil {
			// The answer broke off: the server answered and the answer was lost, which the
			// key makes safe to ask for again.
			timedOut := cancel != nil && c.ctx.Err() == nil && errors.Is(context.Cause(actx), ErrAttemptTimeout)
			stopAttempt(timer, cancel)
			var serr error = &StatusError{Class: ErrPlatform, Err: err}
			if !timedOut {
				serr = classifyAt(c.ctx, nil, err, nil)
			}
			if !c.t.policy.Retryable(serr) || !c.rewindable {
				return Permanent(serr)
			}
			return serr
		}
	}
	c.resp, c.cancel, c.timer = resp, cancel, timer
	serr := classifyAt(c.ctx, resp, nil, c.t.policy.Clock.Now)
	switch {
	case serr == nil:
		return nil
	case errors.Is(serr, ErrAuth):
		c.log(slog.LevelWarn, "retry: auth failure", slog.Int("status", resp.StatusCode))
		if c.t.OnAuthFailure != nil {
			c.t.OnAuthFailure(c.orig, resp)
		}
		return Permanent(serr)
	case !c.t.policy.Retryable(serr) || !c.rewindable:
		return Permanent(serr)
	case c.safe:
		return serr
	}
	return c.unknown(serr)
}

// readAhead reports whether an answer is read whole before it is returned: not a
// stream, whose end may be far off.
func readAhead(resp *http.Response) bool {
	if resp.Body == nil || resp.Body == http.NoBody {
		return false
	}
	ct := resp.Header.Get("Content-Type")
	for _, stream := range []string{"text/event-stream", "application/connect+", "application/grpc",
		"application/x-ndjson", "application/jsonl", "multipart/"} {
		if strings.HasPrefix(ct, stream) {
			return false
		}
	}
	return true
}

// readAhead reads resp's body, up to MaxBufferedResponse, and gives resp a body that
// reads it from memory (and the rest, past the limit, from the connection). On error the
// body is closed.
func (c *call) readAhead(resp *http.Response) error {
	limit := c.t.MaxBufferedResponse
	if limit <= 0 {
		return nil
	}
	buf, err := io.ReadAll(io.LimitReader(resp.Body, min(limit, math.MaxInt64-1)+1))
	if err != nil {
		resp.Body.Close()
		return fmt.Errorf("retry: reading the answer: %w", err)
	}
	if int64(len(buf)) > limit {
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(buf), resp.Body), resp.Body}
		return nil
	}
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(buf))
	return nil
}

// unknown handles a retryable failure of a request that is not safe to resend and may
// have been executed: it asks the status check, or gives up.
func (c *call) unknown(serr error) error {
	check := statusCheckFrom(c.ctx)
	if check == nil {
		c.log(slog.LevelWarn, "retry: outcome unknown, not resending", slog.String("reason", serr.Error()))
		return Permanent(errorf("%w: %w", ErrUnknownOutcome, serr))
	}
	resp, err := check(c.ctx)
	switch {
	case err != nil:
		if resp != nil && resp.Body != nil {
			resp.Body.Close()
		}
		c.log(slog.LevelWarn, "retry: outcome unknown, status check failed", slog.String("reason", serr.Error()), slog.String("check", message(err)))
		return Permanent(errorf("%w: %w (status check: %w)", ErrUnknownOutcome, serr, err))
	case resp != nil:
		c.discard()
		if resp.Body == nil {
			resp.Body = http.NoBody
		}
		c.resp = resp
		return Permanent(errChecked)
	}
	return serr // the check says it did not happen: resending is safe
}

// retrying is run's hook before each wait.
func (c *call) retrying(a Attempt) {
	c.discard()
	c.log(slog.LevelInfo, "retry: retrying request", slog.Int("attempt", a.N), slog.Duration("wait", a.Wait), slog.String("reason", a.Err.Error()))
	if c.t.OnRetry != nil {
		c.t.OnRetry(c.orig, a)
	}
}

// budgetRefused is run's hook when the budget starts refusing retries.
func (c *call) budgetRefused() {
	c.log(slog.LevelWarn, "retry: retry budget exhausted, retries stop until successes earn them back")
	if c.t.OnBudgetExhausted != nil {
		c.t.OnBudgetExhausted(c.orig)
	}
}

// discard drains (up to drainLimit) and closes the last response, then ends its attempt.
func (c *call) discard() {
	if c.resp != nil && c.resp.Body != nil {
		_, _ = io.CopyN(io.Discard, c.resp.Body, drainLimit)
		c.resp.Body.Close()
	}
	c.resp = nil
	stopAttempt(c.timer, c.cancel)
	c.timer, c.cancel = nil, nil
}

func stopAttempt(timer *time.Timer, cancel context.CancelCauseFunc) {
	if timer != nil {
		timer.Stop()
	}
	if cancel != nil {
		cancel(context.Canceled)
	}
}

// result turns run's outcome into RoundTrip's.
func (c *call) result(err error) (*http.Response, error) {
	if err == nil {
		return c.keep(nil), nil
	}
	if ex, ok := err.(*ExhaustedError); ok {
		if c.resp == nil || c.ctx.Err() != nil {
			c.discard()
			c.log(slog.LevelWarn, "retry: giving up", slog.Int("attempts", ex.Attempts), slog.String("reason", ex.Error()))
			return nil, err
		}
		c.log(slog.LevelWarn, "retry: giving up, returning the last response", slog.Int("attempts", ex.Attempts),
			slog.Int("status", c.resp.StatusCode), slog.String("reason", message(ex.Reason)))
		return c.keep(ex), nil
	}
	var perm *permanentError
	if errors.As(err, &perm) {
		err = perm.err
	}
	if c.resp != nil {
		if err == errChecked {
			return c.keep(nil), nil // the status check's answer: Transport did not stop at it
		}
		return c.keep(err), nil
	}
	return nil, err
}

// keep hands the last response to the caller: its attempt's context now lives until the
// body is closed. A non-nil stop is why Transport stopped at it, for StopReason.
func (c *call) keep(stop error) *http.Response {
	resp := c.resp
	if c.cancel != nil {
		c.timer.Stop()
		resp.Body = newCancelBody(resp.Body, c.cancel)
	}
	if stop != nil && resp.Request != nil {
		resp.Request = resp.Request.WithContext(context.WithValue(resp.Request.Context(), stopKey{}, stopReason{stop}))
	}
	return resp
}

type stopKey struct{}

type stopReason struct{ err error }

// StopReason tells why Transport stopped at resp, a response its RoundTrip returned, so
// that a caller need not classify the answer again:
//
//   - nil: resp is a success (its status, or the class WithStatusClass gave it);
//   - a *StatusError: the answer is one no retry can fix (401 or 403, 404, a 409 without
//     Retry-After, 422, an answer that says the caller's budget is spent …), or a
//     retryable one whose request body could not be sent again;
//   - an *ExhaustedError: Transport gave up after retryable answers, resp being the
//     last; its Reason says why (ErrMaxAttempts, ErrBudget, ErrDeadline,
//     ErrServerDelay, ErrMaxElapsed), Attempts how many were made, and Last (a
//     *StatusError) is resp's class;
//   - an error matching ErrUnknownOutcome and resp's class: a request that is not safe
//     to resend (a POST or PATCH without an Idempotency-Key) got a retryable answer.
//
// Match them with errors.Is and errors.As. For a response Transport did not return, or
// one a status check (WithStatusCheck) gave, StopReason is Classify(resp, nil).
// StopReason(nil) is nil.
func StopReason(resp *http.Response) error {
	if resp == nil {
		return nil
	}
	if resp.Request != nil {
		if s, ok := resp.Request.Context().Value(stopKey{}).(stopReason); ok {
			return s.err
		}
	}
	return Classify(resp, nil)
}

// cancelBody ends an attempt's context when the response body is closed.
type cancelBody struct {
	io.ReadCloser
	once   sync.Once
	cancel context.CancelCauseFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.cancel(context.Canceled) })
	return err
}

// cancelRWBody keeps the io.Writer of a 101 Switching Protocols body.
type cancelRWBody struct {
	*cancelBody
	w io.Writer
}

func (b cancelRWBody) Write(p []byte) (int, error) { return b.w.Write(p) }

func newCancelBody(body io.ReadCloser, cancel context.CancelCauseFunc) io.ReadCloser {
	if body == nil {
		body = http.NoBody
	}
	cb := &cancelBody{ReadCloser: body, cancel: cancel}
	if w, ok := body.(io.Writer); ok {
		return cancelRWBody{cb, w}
	}
	return cb
}

func (c *call) log(level slog.Level, msg string, attrs ...slog.Attr) {
	l := c.t.Logger
	if l == nil || !l.Enabled(c.ctx, level) {
		return
	}
	target := ""
	if u := c.orig.URL; u != nil {
		target = u.Scheme + "://" + u.Host + u.Path // no user info, no query: they may hold secrets
	}
	attrs = append(attrs, slog.String("method", c.orig.Method), slog.String("url", target))
	l.LogAttrs(c.ctx, level, msg, attrs...)
}

// NewKey returns a fresh random UUIDv4 (RFC 9562) for an Idempotency-Key: generate one
// per logical operation, outside the retry loop, and send it on every attempt.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])  // crypto/rand.Read never fails (Go 1.24+)
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // variant 10
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}
