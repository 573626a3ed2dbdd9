package retry

import (
	"net/http"
)

// SendOnce returns a RoundTripper that sends each request through base (nil means
// http.DefaultTransport) and keeps base, when it is an http.Transport, from sending a
// request with an unsafe method (anything but GET, HEAD, OPTIONS and TRACE) a second time
// on its own.
//
// http.Transport resends a request that failed on a reused keep-alive connection after it
// was written (the server closed or reset the connection before the first byte of a
// response) when it deems the request replayable: a GET, HEAD, OPTIONS or TRACE, or any
// request with an Idempotency-Key or X-Idempotency-Key header, provided it has no body or
// has GetBody. A keyed POST the server read whole is then sent again, once and silently,
// and a server that does not deduplicate it executes it twice; a retry layer above never
// sees that attempt. Through SendOnce such a request fails with the connection's error
// instead, and the caller decides.
//
// How: http.Transport finds those two headers by a plain lookup of their canonical names
// in the header map. On a copy of the request (the caller's is not modified), SendOnce
// moves their values to the lower-case map keys idempotency-key and x-idempotency-key,
// which that lookup does not find. The header still goes on the wire with its value:
// HTTP/1.1 writes each map key as it is (Header.Write), header names are
// case-insensitive, and HTTP/2 lowercases every name anyway. A test of this package
// guards that behaviour of net/http, which is not documented.
//
// What stays, because it does not depend on those headers: http.Transport still resends
// a request of which nothing was written (it failed before a byte of it left, on a
// connection that turned out to be dead), and its HTTP/2 client still resends a stream
// the server refused or did not process (REFUSED_STREAM, or a GOAWAY whose last stream
// ID excludes it): the server never executed those. (It also resends, whatever the
// method, a stream the server reset with PROTOCOL_ERROR, a request the server rejected.)
// Keep the request's GetBody: it lets the transport resend a body in those cases. Safe
// methods pass through as they are, and keep their resend.
//
// The response's Request is the request given to RoundTrip. A RoundTripper in base
// between SendOnce and the http.Transport sees the keys under the lower-case map keys:
// Header.Get does not find them there; read req.Header["idempotency-key"], or put such a
// RoundTripper outside SendOnce. SendOnce of a RoundTripper SendOnce returned is that
// RoundTripper.
func SendOnce(base http.RoundTripper) http.RoundTripper {
	if s, ok := base.(*sendOnce); ok {
		return s
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &sendOnce{base: base}
}

type sendOnce struct{ base http.RoundTripper }

// xIdempotencyKeyHeader is the other header that makes http.Transport resend any method.
const xIdempotencyKeyHeader = "X-Idempotency-Key"

// HideIdempotencyKeys does to req, in place, what SendOnce does to a copy of it: when
// its method is unsafe, the values of its Idempotency-Key and X-Idempotency-Key headers
// move to the lower-case map keys, which http.Transport's check for a request it may
// send again does not find and which go on the wire with their values (see SendOnce).
// It is for a caller that owns the request it sends, such as a reverse proxy's outbound
// copy: SendOnce below it then finds nothing to hide, and sends the request without
// copying it. req.Header must be the caller's own.
func HideIdempotencyKeys(req *http.Request) {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return
	}
	hideKey(req.Header, IdempotencyKeyHeader, "idempotency-key")
	hideKey(req.Header, xIdempotencyKeyHeader, "x-idempotency-key")
}

func (s *sendOnce) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return s.base.RoundTrip(req)
	}
	_, key := req.Header[IdempotencyKeyHeader]
	_, xkey := req.Header[xIdempotencyKeyHeader]
	if !key && !xkey {
		return s.base.RoundTrip(req)
	}
	h := make(http.Header, len(req.Header))
	for name, vv := range req.Header {
		h[name] = vv
	}
	hideKey(h, IdempotencyKeyHeader, "idempotency-key")
	hideKey(h, xIdempotencyKeyHeader, "x-idempotency-key")
	out := req.WithContext(req.Context()) // a shallow copy: same body, GetBody, context
	out.Header = h
	resp, err := s.base.RoundTrip(out)
	if resp != nil {
		resp.Request = req
	}
	return resp, err
}

// hideKey moves the values of the map entry canonical to lower, its lower-case map key.
func hideKey(h http.Header, canonical, lower string) {
	vv, ok := h[canonical]
	if !ok {
		return
	}
	// The canonical entry goes before the lower-case one is added, so that a map at the
	// size where one more entry makes it grow (a proxy's outbound headers often are)
	// does not grow for an entry that only changes its name.
	delete(h, canonical)
	// HTTP/1.1 writes the map keys sorted, the canonical one before the lower-case one:
	// its values keep their place before those of a lower-case entry of the caller's own.
	h[lower] = append(vv[:len(vv):len(vv)], h[lower]...)
}

// CloseIdleConnections closes the idle connections of the base, when it can.
func (s *sendOnce) CloseIdleConnections() {
	if c, ok := s.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
