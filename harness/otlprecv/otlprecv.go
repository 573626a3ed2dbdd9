// Package otlprecv is an OTLP/HTTP trace receiver for tests: it decodes the protobuf
// export requests an OpenTelemetry exporter sends to /v1/traces and keeps their spans,
// so that a test can check the spans a process exported, with their resource.
package otlprecv

import (
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, with the attributes of the resource that sent it.
type Span struct {
	*tracepb.Span
	Resource map[string]string
}

// TraceID, SpanID and ParentID are the span's ids in hex ("" for no parent).
func (s Span) TraceID() string  { return hex.EncodeToString(s.Span.TraceId) }
func (s Span) SpanID() string   { return hex.EncodeToString(s.Span.SpanId) }
func (s Span) ParentID() string { return hex.EncodeToString(s.Span.ParentSpanId) }

// Attr returns the span attribute key as a string ("" when absent): strings as they
// are, other values in their protobuf text form.
func (s Span) Attr(key string) string { return attr(s.Span.Attributes, key) }

func attr(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.Key == key {
			return Text(kv.Value)
		}
	}
	return ""
}

// Text is an attribute value as text: a string as it is, an integer in decimal, others
// in their protobuf text form.
func Text(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	}
	return v.String()
}

// Receiver is a running OTLP/HTTP receiver.
type Receiver struct {
	*httptest.Server
	t      testing.TB
	mu     sync.Mutex
	spans  []Span
	raw    [][]byte // the request bodies, decoded from gzip
	failed int      // requests it could not decode
}

// Start starts a receiver, closed when t ends. Its URL is an OTEL_EXPORTER_OTLP_ENDPOINT.
func Start(t testing.TB) *Receiver {
	r := &Receiver{t: t}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.Close)
	return r
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/v1/traces" || req.Method != http.MethodPost {
		http.NotFound(w, req)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			r.fail(w)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	var msg coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &msg)
	}
	if err != nil {
		r.fail(w)
		return
	}
	r.mu.Lock()
	r.raw = append(r.raw, b)
	for _, rs := range msg.ResourceSpans {
		res := map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			res[kv.Key] = Text(kv.Value)
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, Span{Span: s, Resource: res})
			}
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *Receiver) fail(w http.ResponseWriter) {
	r.mu.Lock()
	r.failed++
	r.mu.Unlock()
	http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Raw returns the bytes of every export request received, for a test that checks what
// never appears in them.
func (r *Receiver) Raw() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.raw...)
}

// Failed returns how many requests were not OTLP trace exports.
func (r *Receiver) Failed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}
