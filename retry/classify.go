package retry

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The classes of failure: auth, rate limit, not found, invalid, platform, conflict and
// canceled. Every error Classify returns matches exactly one of them with errors.Is.
var (
	// ErrAuth: 401 or 403. Never retried: the credentials are wrong and a person must act.
	ErrAuth = errors.New("retry: not authorized")
	// ErrRateLimited: 429. Retried after the time the server asks for.
	ErrRateLimited = errors.New("retry: rate limited")
	// ErrNotFound: 404 or 410. Never retried (a revoke may count it as success: see
	// WithStatusClass).
	ErrNotFound = errors.New("retry: not found")
	// ErrInvalid: any other 4xx (400, 405, 413, 422, a 409 without Retry-After …), and
	// failures no retry can fix (a bad certificate, an unsupported URL). Never retried.
	ErrInvalid = errors.New("retry: invalid request")
	// ErrPlatform: 5xx, connect errors, resets, timeouts, a response cut short. Retried.
	ErrPlatform = errors.New("retry: platform failure")
	// ErrConflict: 409 with Retry-After, from an idempotent server: the same key is still
	// being processed. Retried after the time the server asks for.
	ErrConflict = errors.New("retry: in progress elsewhere")
	// ErrCanceled: the caller's time is up: its context ended, or a server answered
	// that the caller's time budget is spent (a failure carrying BudgetExhaustedHeader).
	// Never retried.
	ErrCanceled = errors.New("retry: canceled")
)

// BudgetExhaustedHeader is the response header with which a server says that the
// caller's time budget is spent, as package deadline's Middleware does on its 504s and on
// any failure its handler answers once the caller's budget has run out:
//
//	Request-Budget-Exhausted: ?1
//
// (a structured-field boolean, RFC 9651). A failure that would be retried (5xx, 408,
// 429, a 409 with Retry-After) and carries it is final, of class ErrCanceled: the
// caller stopped waiting, so another attempt would reach a server with no time to work.
// Other failures keep their class.
const BudgetExhaustedHeader = "Request-Budget-Exhausted"

// errBudgetSpent is the StatusError.Err of an answer carrying BudgetExhaustedHeader.
var errBudgetSpent = errors.New("the server says the caller's time budget is spent")

// StatusError is a classified failure: an HTTP status that is not a success, or a
// transport error. It matches its Class with errors.Is, and unwraps to Err.
type StatusError struct {
	Class      error         // one of ErrAuth … ErrCanceled
	StatusCode int           // 0 for a transport error
	Delay      time.Duration // the wait the server asked for; 0 when it asked none
	Err        error         // the transport error, or what the answer said, when there is one
}

// Error reads "<class>[: HTTP <status>][: <error>]", on one line.
func (e *StatusError) Error() string {
	msg := message(e.Class)
	if e.StatusCode != 0 {
		msg += ": HTTP " + strconv.Itoa(e.StatusCode) + " " + http.StatusText(e.StatusCode)
	}
	if e.Err != nil {
		msg += ": " + message(e.Err)
	}
	return msg
}

// Is reports whether target is the error's class.
func (e *StatusError) Is(target error) bool { return target == e.Class }

// Unwrap returns the transport error, if any.
func (e *StatusError) Unwrap() error { return e.Err }

// RetryAfter reports the wait the server asked for.
func (e *StatusError) RetryAfter() (time.Duration, bool) { return e.Delay, e.Delay > 0 }

// Classify maps an HTTP exchange to nil (success: 1xx–3xx) or a *StatusError. resp may
// be nil when err is not. The server's requested delay is read at the time now. A class
// set with WithStatusClass on the context of resp.Request overrides the status's
// default class.
//
// An err that is already classified (it wraps a *StatusError, as every error Transport
// returns does, through http.Client's *url.Error too) is returned as it is, so its class
// is kept and its message does not repeat the class. To learn why Transport stopped at a
// response it returned, use StopReason.
func Classify(resp *http.Response, err error) error {
	ctx := context.Background()
	if resp != nil && resp.Request != nil {
		ctx = resp.Request.Context()
	}
	return classifyAt(ctx, resp, err, time.Now)
}

// classifyAt is Classify with the overrides of ctx; now is read only for a failing status.
func classifyAt(ctx context.Context, resp *http.Response, err error, now func() time.Time) error {
	if err != nil {
		var classified *StatusError
		if errors.As(err, &classified) {
			return err
		}
		return &StatusError{Class: classifyErr(err), Err: err}
	}
	if resp == nil {
		return &StatusError{Class: ErrPlatform, Err: errors.New("no response")}
	}
	c := classOfStatus(resp.StatusCode, resp.Header)
	var said error
	if (c == ErrPlatform || c == ErrRateLimited || c == ErrConflict) && budgetSpent(resp.Header) {
		c, said = ErrCanceled, errBudgetSpent
	}
	if o, ok := statusClassFrom(ctx, resp.StatusCode); ok {
		c, said = o, nil
	}
	if c == nil {
		return nil
	}
	e := &StatusError{Class: c, StatusCode: resp.StatusCode, Err: said}
	if d, ok := ServerDelay(resp.Header, now()); ok {
		e.Delay = d
	}
	return e
}

func classOfStatus(code int, h http.Header) error {
	switch {
	case code < 400:
		return nil
	case code == http.StatusUnauthorized, code == http.StatusForbidden:
		return ErrAuth
	case code == http.StatusTooManyRequests:
		return ErrRateLimited
	case code == http.StatusNotFound, code == http.StatusGone:
		return ErrNotFound
	case code == http.StatusConflict && h.Get("Retry-After") != "":
		return ErrConflict
	case code == http.StatusRequestTimeout:
		return ErrPlatform // the server gave up waiting for the request: safe to resend
	case code < 500:
		return ErrInvalid
	case code == http.StatusNotImplemented, code == http.StatusHTTPVersionNotSupported:
		return ErrInvalid // no retry makes these work
	default:
		return ErrPlatform
	}
}

// budgetSpent reports whether h says the caller's time budget is spent.
func budgetSpent(h http.Header) bool {
	return strings.TrimSpace(h.Get(BudgetExhaustedHeader)) == "?1"
}

// classifyErr is the one place net/http's untyped errors are matched.
func classifyErr(err error) error {
	var (
		x509Unknown  x509.UnknownAuthorityError
		x509Hostname x509.HostnameError
		x509Invalid  x509.CertificateInvalidError
		sysErr       syscall.Errno
		netErr       net.Error
	)
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ErrCanceled
	case errors.As(err, &x509Unknown), errors.As(err, &x509Hostname), errors.As(err, &x509Invalid):
		return ErrInvalid
	case errors.As(err, &sysErr) && (sysErr == syscall.ECONNREFUSED || sysErr == syscall.ECONNRESET ||
		sysErr == syscall.ECONNABORTED || sysErr == syscall.EPIPE || sysErr == syscall.ETIMEDOUT ||
		sysErr == syscall.EHOSTUNREACH || sysErr == syscall.ENETUNREACH):
		return ErrPlatform
	case errors.As(err, &netErr):
		return ErrPlatform // timeouts and other network failures
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return ErrPlatform // the connection closed mid-exchange
	case strings.Contains(err.Error(), "unsupported protocol scheme"):
		return ErrInvalid // net/http's untyped error for a URL no retry can fix
	}
	return ErrPlatform
}

// Retryable reports whether a retry can help with err: platform failures, rate limits
// and in-progress conflicts, and errors that carry no class. Permanent errors, auth,
// not found, invalid and canceled are not retryable.
func Retryable(err error) bool {
	var p *permanentError
	switch {
	case err == nil, errors.As(err, &p):
		return false
	case errors.Is(err, ErrAuth), errors.Is(err, ErrNotFound), errors.Is(err, ErrInvalid), errors.Is(err, ErrCanceled):
		return false
	}
	return true
}
