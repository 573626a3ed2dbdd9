package deadline

import (
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Transport is an http.RoundTripper that tells the next hop how long its caller will
// wait: on every request whose context has a deadline it sets the Header header to the
// time remaining, minus Reserve, in whole milliseconds (rounded down). The zero value is
// usable: it wraps http.DefaultTransport, uses DefaultHeader and reserves nothing.
//
// A request whose context has no deadline is sent unchanged, without the header (a value
// the caller set itself is left as it is). When the remaining budget minus Reserve is
// below one millisecond (so in particular when the budget is at most Reserve), the
// request is not sent: RoundTrip closes its body and returns an error that matches both
// ErrExhausted and context.DeadlineExceeded with errors.Is. A request that cannot finish
// in time is not worth starting; the next hop would answer 504 anyway, after doing some
// of the work.
//
// Under Middleware, Transport reports back: when it refuses a request made with the
// handler's request context for lack of budget, or the next hop answers with
// ExhaustedHeader, the caller's budget is spent, and the middleware marks the handler's
// failure answer with ExhaustedHeader (see Middleware), so no hop above resends.
//
// Put Transport below a retry layer (&retry.Transport{Base: deadline.Transport{…}}), so
// each attempt carries the budget remaining when it is sent. The request given to Base is
// a copy with a header map of its own (the header values, the URL and the body are the
// caller's); the caller's request is never modified, unless InPlace says it may be.
type Transport struct {
	// Base sends the requests. Default http.DefaultTransport.
	Base http.RoundTripper

	// Header is the header the budget is written to. Default DefaultHeader
	// (Request-Budget-Ms). Use the same name as the next hop's Config.Header.
	Header string

	// Reserve is kept back from the budget sent: the hop's own latency (the request's
	// transit and queueing, the response's way back) and the time this side needs to use
	// the answer, which the next hop cannot see. Default 0: the next hop is told all the
	// time that is left. Negative means 0.
	Reserve time.Duration

	// InPlace sets the header on the request given, not on a copy. It is for a caller
	// whose request is its own, sent once and not read afterwards, such as the outbound
	// request of an httputil.ReverseProxy (a copy, with a header map of its own): it
	// saves a copy of the request and of its header map per call. Default false: the
	// request is not modified, as http.RoundTripper asks.
	InPlace bool
}

// RoundTrip implements http.RoundTripper.
func (t Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	left, ok := Remaining(req.Context())
	if !ok {
		return base.RoundTrip(req)
	}
	reserve := max(t.Reserve, 0)
	ms, ok := budgetMillis(left, reserve)
	if !ok {
		if req.Body != nil {
			_ = req.Body.Close() // a RoundTripper closes the body, even on error
		}
		noteSpent(req.Context())
		return nil, fmt.Errorf("%w: %v left, %v reserved: request not sent",
			ErrExhausted, max(left, 0).Round(time.Microsecond), reserve)
	}
	header := t.Header
	if header == "" {
		header = DefaultHeader
	}
	// A copy of the request with a header map of its own, which shares the caller's
	// values: only the budget's entry is replaced, so nothing of the caller's request
	// changes, and the rest need not be copied (a RoundTripper modifies nothing of the
	// request it is given).
	out := req
	if !t.InPlace {
		out = new(http.Request)
		*out = *req
		out.Header = make(http.Header, len(req.Header)+1)
		maps.Copy(out.Header, req.Header)
	} else if out.Header == nil {
		out.Header = make(http.Header, 1)
	}
	out.Header.Set(header, strconv.FormatInt(ms, 10))
	resp, err := base.RoundTrip(out)
	if err == nil && resp != nil && exhaustedAnswer(resp.Header) {
		noteSpent(req.Context())
	}
	return resp, err
}

// exhaustedAnswer reports whether h carries ExhaustedHeader: the next hop says the
// budget it was given is spent.
func exhaustedAnswer(h http.Header) bool {
	return strings.TrimSpace(h.Get(ExhaustedHeader)) == "?1"
}

// budgetMillis returns the whole milliseconds of left − reserve, and false when that is
// less than one.
func budgetMillis(left, reserve time.Duration) (int64, bool) {
	reserve = max(reserve, 0)
	if left <= reserve { // also keeps left − reserve from overflowing
		return 0, false
	}
	rest := left - reserve
	if rest < time.Millisecond {
		return 0, false
	}
	return int64(rest / time.Millisecond), true
}
