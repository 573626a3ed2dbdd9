package idempotency

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
)

// recorder passes a response through to the client while keeping a copy to store: the
// status, the headers as they were when the status was written, and the body up to
// limit bytes. Past the limit it keeps nothing of the body and sets omitted.
type recorder struct {
	http.ResponseWriter
	limit   int64
	status  int
	header  http.Header
	body    bytes.Buffer
	omitted bool
}

func (r *recorder) WriteHeader(code int) {
	if r.status != 0 {
		return // net/http ignores (and logs) superfluous calls; so do we
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		r.ResponseWriter.WriteHeader(code) // informational: pass on, not the final status
		return
	}
	r.status = code
	r.header = storedHeader(r.ResponseWriter.Header())
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if !r.omitted {
		if int64(r.body.Len()+len(p)) > r.limit {
			r.omitted = true
			r.body = bytes.Buffer{}
		} else {
			r.body.Write(p)
		}
	}
	return r.ResponseWriter.Write(p)
}

// Flush implements http.Flusher when the underlying writer does.
func (r *recorder) Flush() {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// wrote reports whether the handler produced a response at all.
func (r *recorder) wrote() bool { return r.status != 0 }

func (r *recorder) response() Response {
	status, header := r.status, r.header
	if status == 0 { // the handler returned without writing: net/http sends 200
		status, header = http.StatusOK, storedHeader(r.ResponseWriter.Header())
	}
	resp := Response{Status: status, Header: header, BodyOmitted: r.omitted}
	if !r.omitted {
		resp.Body = bytes.Clone(r.body.Bytes())
	}
	return resp
}

// storedHeader returns the headers worth replaying: never credentials, cookies, Date,
// Content-Length (recomputed on replay) or hop-by-hop headers.
func storedHeader(h http.Header) http.Header {
	out := h.Clone()
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			out.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range []string{
		"Set-Cookie", "Authorization", "Date", "Content-Length", "Idempotent-Replayed",
		"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
	} {
		out.Del(name)
	}
	for name := range out {
		if strings.HasPrefix(name, http.TrailerPrefix) {
			delete(out, name)
		}
	}
	return out
}

// Replay writes a stored response, marked with Idempotent-Replayed: true. When the body
// was too large to keep, the body is empty and Idempotent-Body-Omitted: true says so.
func Replay(w http.ResponseWriter, resp *Response) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = append([]string(nil), v...)
	}
	h.Set("Idempotent-Replayed", "true")
	if resp.BodyOmitted {
		h.Set("Idempotent-Body-Omitted", "true")
	}
	noBody := resp.Status == http.StatusNoContent || resp.Status == http.StatusNotModified
	if !noBody {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	if !noBody && len(resp.Body) > 0 {
		_, _ = w.Write(resp.Body)
	}
}
