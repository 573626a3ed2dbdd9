package idempotency

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// RPC protocols over HTTP (Connect, gRPC and gRPC-Web, as connect-go and grpc-gateway
// serve them) have error formats of their own: their clients cannot read a
// problem+json answer, and map its HTTP status to a code that loses what it said (a
// key in flight would be "unknown", a missing key "internal"). For a keyed request of
// one of them, the middleware's own answers are written in the request's protocol,
// with the code that says the same thing and, when a retry may succeed, a
// google.rpc.RetryInfo beside the Retry-After header:
//
//	the middleware's answer          code                 Connect HTTP status
//	missing, malformed key; body     invalid_argument     400
//	  unreadable, too large; a
//	  method in another case
//	the key in flight                aborted + RetryInfo  409
//	the key reused                   failed_precondition  400
//	store unavailable, not durable,  unavailable +        503
//	  bodies in memory at the          RetryInfo
//	  ceiling, body too slow
//	deadline passed before running   deadline_exceeded    504
//
// A Connect request is a unary one (Connect-Protocol-Version with a codec's content
// type, application/proto or application/json); its errors are Connect's JSON with
// that status. A gRPC or gRPC-Web request (application/grpc…) gets a trailers-only
// answer: HTTP 200, grpc-status, grpc-message and grpc-status-details-bin in the
// headers. Everything else gets problem+json, as any HTTP client does.
type rpcProtocol uint8

const (
	rpcNone rpcProtocol = iota
	rpcConnect
	rpcGRPC
)

// rpcProtocolOf returns the RPC protocol of a request by its headers.
func rpcProtocolOf(r *http.Request) rpcProtocol {
	ct := r.Header.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "application/grpc"):
		return rpcGRPC
	case r.Header.Get("Connect-Protocol-Version") != "" && strings.HasPrefix(ct, "application/") &&
		!strings.HasPrefix(ct, "application/connect+"): // Connect's streaming is not unary
		return rpcConnect
	}
	return rpcNone
}

// rpcWriter is the ResponseWriter of a keyed request of an RPC protocol: WriteProblem
// writes its problems in that protocol. Everything else passes through.
type rpcWriter struct {
	http.ResponseWriter
	proto       rpcProtocol
	contentType string // the request's, which a gRPC answer echoes
}

func (w *rpcWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *rpcWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// rpcCode is the code (Connect's name and gRPC's number) that says what a problem of
// type typ says.
func rpcCode(typ string) (string, int) {
	switch typ {
	case ProblemInFlight:
		return "aborted", 10
	case ProblemMismatch:
		return "failed_precondition", 9
	case ProblemStoreUnavailable, ProblemStoreNotDurable, ProblemOverloaded, ProblemBodyTimeout:
		return "unavailable", 14
	case ProblemDeadlineExceeded:
		return "deadline_exceeded", 4
	default: // missing or invalid key, body too large or unreadable, method case
		return "invalid_argument", 3
	}
}

// connectStatus is the HTTP status of a Connect error with code name.
func connectStatus(name string) int {
	switch name {
	case "aborted":
		return http.StatusConflict
	case "unavailable":
		return http.StatusServiceUnavailable
	case "deadline_exceeded":
		return http.StatusGatewayTimeout
	default:
		return http.StatusBadRequest
	}
}

func (w *rpcWriter) writeProblem(p Problem, retryAfter int) {
	name, num := rpcCode(p.Type)
	msg := p.Title
	if p.Detail != "" {
		msg += ": " + p.Detail
	}
	var retryInfo []byte
	if retryAfter > 0 {
		retryInfo = retryInfoProto(retryAfter)
	}
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	if w.proto == rpcGRPC {
		h.Set("Content-Type", w.contentType)
		h.Set("Grpc-Status", strconv.Itoa(num))
		h.Set("Grpc-Message", grpcPercentEncode(msg))
		h.Set("Grpc-Status-Details-Bin", base64.RawStdEncoding.EncodeToString(statusProto(num, msg, retryInfo)))
		w.WriteHeader(http.StatusOK)
		return
	}
	type detail struct {
		Type  string `json:"type"`
		Value string `json:"value"`
	}
	e := struct {
		Code    string   `json:"code"`
		Message string   `json:"message"`
		Details []detail `json:"details,omitempty"`
	}{Code: name, Message: msg}
	if retryInfo != nil {
		e.Details = []detail{{Type: "google.rpc.RetryInfo", Value: base64.RawStdEncoding.EncodeToString(retryInfo)}}
	}
	body, _ := json.Marshal(e) // strings only: always marshals
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(connectStatus(name))
	_, _ = w.Write(body)
}

// retryInfoProto is the protobuf encoding of google.rpc.RetryInfo{retry_delay:
// {seconds: s}}.
func retryInfoProto(s int) []byte {
	d := binary.AppendUvarint([]byte{0x08}, uint64(s)) // Duration.seconds, field 1
	return appendLen([]byte(nil), 1, d)                // RetryInfo.retry_delay, field 1
}

// statusProto is the protobuf encoding of google.rpc.Status{code, message, details:
// [RetryInfo]} (no details when retryInfo is nil).
func statusProto(code int, msg string, retryInfo []byte) []byte {
	b := binary.AppendUvarint([]byte{0x08}, uint64(code)) // code, field 1
	b = appendLen(b, 2, []byte(msg))                      // message, field 2
	if retryInfo != nil {
		any := appendLen(nil, 1, []byte("type.googleapis.com/google.rpc.RetryInfo")) // Any.type_url
		any = appendLen(any, 2, retryInfo)                                           // Any.value
		b = appendLen(b, 3, any)                                                     // details, field 3
	}
	return b
}

// appendLen appends a length-delimited field (wire type 2) numbered field.
func appendLen(b []byte, field int, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(field)<<3|2)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// grpcPercentEncode encodes a grpc-message value: every byte outside printable ASCII,
// and '%', as %XX.
func grpcPercentEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '%' {
			b.WriteString("%" + strings.ToUpper(strconv.FormatUint(uint64(c)>>4, 16)+strconv.FormatUint(uint64(c)&0xf, 16)))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// answerStatus is the status the release rule judges the handler's answer by: its
// HTTP status, but for a gRPC or gRPC-Web answer, which is HTTP 200 whatever happened,
// the HTTP status of its grpc-status (in the headers of a trailers-only answer, or in
// its trailers): UNAVAILABLE is 503 and RESOURCE_EXHAUSTED 429, which release the key by
// default, and CANCELLED is 499, the answer to a client that went away.
func (r *recorder) answerStatus() int {
	rw, ok := r.w.(*rpcWriter)
	if !ok || rw.proto != rpcGRPC || r.status != http.StatusOK {
		return r.status
	}
	code := r.header.Get("Grpc-Status")
	if code == "" {
		code = r.trailers().Get("Grpc-Status")
	}
	switch code {
	case "14":
		return http.StatusServiceUnavailable
	case "8":
		return http.StatusTooManyRequests
	case "1":
		return statusClientClosed
	}
	return r.status
}
