package idempotency

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// overflower is told when the answer passes the recorder's limit: the execution whose
// answer it is (an interface, where a method value would cost every request an
// allocation).
type overflower interface{ overflowed() }

// recorder holds the handler's response until the middleware has stored it, then sends
// it to the client: a client is never shown an answer its retry might not get again,
// and a slow client does not keep the key from being completed. The body is kept up to
// limit bytes. A response that passes the limit calls overflow once (the middleware
// completes the record without the body: the work is done and its status and headers
// are final) and is then passed through to the client as the handler writes it. The
// memory the kept body takes counts against the middleware's body budget until the
// request ends (release), less the room its request body left when dropped.
type recorder struct {
	w        http.ResponseWriter // the client's
	h        http.Header         // the handler's header map
	limit    int64
	overflow overflower // nil once called, or when nothing is to be told
	budget   *bodyBudget
	req      *reqBody // the request's body; nil without one
	counted  int64    // what the kept body holds of the budget

	status int
	// The handler's headers when it wrote the status, trailers aside, copied: header
	// holds those a replay carries (the stored Response.Header), sentOnly the others,
	// which the client is sent too (sentOnlyBuf is its room for the usual few).
	header      http.Header
	sentOnly    []headerField
	sentOnlyBuf [4]headerField
	declared    []string // trailer names the handler declared (the Trailer header)
	body        []byte
	omitted     bool // the body passed the limit
	sent        bool // the status and headers went to the client
}

// init readies r to record the answer to w, counting what it keeps in budget.
func (r *recorder) init(w http.ResponseWriter, limit int64, overflow overflower, budget *bodyBudget, req *reqBody) {
	r.w, r.h, r.limit, r.overflow = w, make(http.Header), limit, overflow
	r.budget, r.req = budget, req
}

// count brings what the kept body holds of the budget to the memory its buffer takes
// now, less the room its request body left. An answer is never refused memory: it is
// finished, and its bytes keep new requests out meanwhile.
func (r *recorder) count() {
	need := max(0, int64(cap(r.body))-r.req.room())
	if need != r.counted {
		r.budget.force(need - r.counted)
		r.counted = need
	}
}

// release gives back what the kept body holds of the budget, when the request ends.
func (r *recorder) release() {
	if r.counted != 0 {
		r.budget.give(r.counted)
		r.counted = 0
	}
}

// Header returns the handler's header map; it reaches the client when the response is
// sent.
func (r *recorder) Header() http.Header { return r.h }

func (r *recorder) WriteHeader(code int) {
	if r.status != 0 {
		return // net/http ignores (and logs) superfluous calls; so do we
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		// Informational (103 Early Hints): not the final status, passed on at once.
		copyHeader(r.w.Header(), r.h)
		r.w.WriteHeader(code)
		return
	}
	r.status = code
	for _, v := range r.h["Trailer"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = http.CanonicalHeaderKey(strings.TrimSpace(name)); name != "" {
				r.declared = append(r.declared, name)
			}
		}
	}
	r.snapshot()
	// A body announced larger than the limit will not be kept: complete now, and pass
	// it through without holding any of it.
	if n, err := strconv.ParseInt(first(r.h, "Content-Length"), 10, 64); err == nil && n > r.limit {
		r.passThrough()
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if r.sent {
		return r.w.Write(p)
	}
	if int64(len(r.body)+len(p)) > r.limit {
		r.passThrough()
		return r.w.Write(p)
	}
	c := cap(r.body)
	if r.body == nil {
		if n, err := strconv.Atoi(r.sentValue("Content-Length")); err == nil && n >= len(p) && int64(n) <= r.limit {
			r.body = make([]byte, 0, n) // one allocation for a body of known length
		}
	}
	r.body = append(r.body, p...)
	if cap(r.body) != c {
		r.count()
	}
	return len(p), nil
}

// passThrough gives up keeping the body: the record is completed without it, and what
// was held is sent.
func (r *recorder) passThrough() {
	r.omitted = true
	if r.overflow != nil {
		r.overflow.overflowed()
		r.overflow = nil
	}
	r.sendHead(false)
	if len(r.body) > 0 {
		_, _ = r.w.Write(r.body)
	}
	r.body = nil
	r.count()
}

// Flush implements http.Flusher. It flushes only a response that is passed through: a
// response being held is sent whole once stored.
func (r *recorder) Flush() {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if r.sent {
		_ = http.NewResponseController(r.w).Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// ErrHijackKeyed is returned by the Hijack of a keyed request's ResponseWriter: its
// response is stored and replayed, which a hijacked connection's bytes cannot be.
// Unkeyed requests are not wrapped and hijack as usual.
var ErrHijackKeyed = errors.New("idempotency: a keyed request's response is stored and cannot be hijacked")

// Hijack implements http.Hijacker by refusing: see ErrHijackKeyed. It lets a handler's
// unchecked assertion w.(http.Hijacker) get an error instead of a panic.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, ErrHijackKeyed
}

// wrote reports whether the handler produced a response at all.
func (r *recorder) wrote() bool { return r.status != 0 }

// incomplete reports whether the handler declared a Content-Length its body did not
// reach (or passed): an answer cut short, which must be neither stored nor sent as
// whole.
func (r *recorder) incomplete() bool {
	if r.omitted || r.status == 0 || !bodyAllowed(r.status) {
		return false
	}
	n, err := strconv.ParseInt(r.sentValue("Content-Length"), 10, 64)
	return err == nil && n != int64(len(r.body))
}

// sendHead sends the status and the headers (without trailer values) to the client.
// whole says the body is complete in r.body, so its length is known.
func (r *recorder) sendHead(whole bool) {
	if r.sent {
		return
	}
	r.sent = true
	status := r.status
	if status == 0 { // the handler returned without writing: net/http sends 200
		status = http.StatusOK
		r.snapshot()
	}
	h := r.w.Header()
	for k, v := range r.header {
		h[k] = v
	}
	for _, f := range r.sentOnly {
		h[f.name] = f.values
	}
	switch {
	case !whole, r.incomplete():
		// Streamed, or cut short: the handler's Content-Length stands, and net/http
		// cuts the connection of a body that does not reach it.
	case len(r.trailers()) == 0:
		setLength(h, len(r.body))
	default:
		h.Del("Content-Length") // trailers need a chunked body
	}
	r.w.WriteHeader(status)
}

// send delivers the response to the client: whole, or the rest of one passed through.
func (r *recorder) send() {
	if !r.sent {
		r.sendHead(true)
		if len(r.body) > 0 && bodyAllowed(r.status) {
			_, _ = r.w.Write(r.body)
		}
	}
	for k, v := range r.trailers() {
		if !hasName(r.declared, k) {
			k = http.TrailerPrefix + k
		}
		r.w.Header()[k] = v
	}
}

func (r *recorder) isTrailer(name string) bool {
	return strings.HasPrefix(name, http.TrailerPrefix) || hasName(r.declared, name)
}

// trailers returns the trailer values the handler set: those of declared names, and
// those it set with http.TrailerPrefix.
func (r *recorder) trailers() http.Header {
	var t http.Header
	for k, v := range r.h {
		name, prefixed := strings.CutPrefix(k, http.TrailerPrefix)
		if !prefixed && !hasName(r.declared, k) {
			continue
		}
		if t == nil {
			t = make(http.Header)
		}
		t[name] = v
	}
	return t
}

func hasName(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

// response is what the middleware stores. It shares the recorder's body.
func (r *recorder) response() Response {
	status := r.status
	if status == 0 {
		status = http.StatusOK
		r.snapshot()
	}
	resp := Response{Status: status, Header: r.header, BodyOmitted: r.omitted}
	if !r.omitted {
		resp.Body = r.body
		if t := r.trailers(); t != nil {
			resp.Trailer = storedHeader(t)
		}
	}
	return resp
}

// headerField is one header's name and values.
type headerField struct {
	name   string
	values []string
}

// snapshot records the handler's headers as they are now, once (a handler that never
// wrote the status is recorded when its answer is stored or sent): trailers aside,
// those a replay carries in r.header, which is the stored Response.Header as it is, and
// the others in r.sentOnly. The values are copied, in one allocation, so that nothing
// the handler changes in place later reaches either; each is capped, so that an append
// to it copies. r.header's map is made once, where a copy of every header and then a
// second map of the stored ones cost two.
func (r *recorder) snapshot() {
	if r.header != nil {
		return
	}
	listed := connectionListed(r.h)
	n := 0
	for _, v := range r.h {
		n += len(v)
	}
	values := make([]string, n)
	r.header = make(http.Header, len(r.h))
	r.sentOnly = r.sentOnlyBuf[:0]
	for k, v := range r.h {
		if r.isTrailer(k) {
			continue
		}
		var c []string
		if len(v) > 0 {
			c = values[:len(v):len(v)]
			copy(c, v)
			values = values[len(v):]
		}
		if unstored(k) || slices.Contains(listed, k) {
			r.sentOnly = append(r.sentOnly, headerField{k, c})
			continue
		}
		r.header[k] = c
	}
}

// connectionListed returns the names h's Connection header lists, canonical: they are
// for this hop alone, and never stored.
func connectionListed(h http.Header) []string {
	var listed []string
	for _, f := range h["Connection"] {
		for name := range strings.SplitSeq(f, ",") {
			listed = append(listed, http.CanonicalHeaderKey(strings.TrimSpace(name)))
		}
	}
	return listed
}

// sentValue returns the first value of the recorded header name (canonical) that the
// client is sent but a replay does not carry, such as Content-Length.
func (r *recorder) sentValue(name string) string {
	for _, f := range r.sentOnly {
		if f.name == name && len(f.values) > 0 {
			return f.values[0]
		}
	}
	return ""
}

// storedHeader returns the trailers a replay carries: all of h but the unstored names
// and the names h's Connection header lists. It shares h's value slices, capped so that
// an append to either copies.
func storedHeader(h http.Header) http.Header {
	listed := connectionListed(h)
	out := make(http.Header, len(h))
	for k, v := range h {
		if unstored(k) || slices.Contains(listed, k) {
			continue
		}
		if len(v) == 0 {
			out[k] = nil
			continue
		}
		out[k] = v[:len(v):len(v)]
	}
	return out
}

// unstored reports whether a response header is never stored (the names are canonical,
// as net/http's Header methods write them); see Response.Header for why each.
func unstored(name string) bool {
	switch name {
	case "Authorization", "Date", "Content-Length", "Idempotent-Replayed",
		"Idempotent-Body-Omitted", "Connection", "Keep-Alive", "Proxy-Connection",
		"Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding",
		"Upgrade":
		return true
	}
	return false
}

// setLength sets h's Content-Length to n, keeping the value h has when it says n
// already (an upstream's answer of known length does), which would otherwise be made
// again.
func setLength(h http.Header, n int) {
	var digits [20]byte
	if v := h["Content-Length"]; len(v) == 1 && v[0] == string(strconv.AppendInt(digits[:0], int64(n), 10)) {
		return
	}
	h.Set("Content-Length", strconv.Itoa(n))
}

// first returns the first value of the header name, which is in canonical form, as
// Header.Get would without canonicalizing it again: it runs several times for every
// answer.
func first(h http.Header, name string) string {
	if v := h[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func copyHeader(dst, src http.Header) {
	for k, v := range src {
		dst[k] = v
	}
}

func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified
}

// Replay writes a stored response: its status, its stored headers (Response.Header
// says which) with Idempotent-Replayed: true added, its body, and its trailers after
// the body. Content-Length is the stored body's length, except when there are
// trailers: then Trailer names them and the body is chunked. When the body was too
// large to keep, the body is empty and Idempotent-Body-Omitted: true says so.
func Replay(w http.ResponseWriter, resp *Response) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = append([]string(nil), v...)
	}
	h.Set("Idempotent-Replayed", "true")
	if resp.BodyOmitted {
		h.Set("Idempotent-Body-Omitted", "true")
	}
	names := make([]string, 0, len(resp.Trailer))
	for k := range resp.Trailer {
		names = append(names, k)
	}
	if len(names) > 0 {
		h.Set("Trailer", strings.Join(names, ", "))
	} else if bodyAllowed(resp.Status) {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	if bodyAllowed(resp.Status) && len(resp.Body) > 0 {
		_, _ = w.Write(resp.Body)
	}
	for k, v := range resp.Trailer {
		h[k] = append([]string(nil), v...)
	}
}
