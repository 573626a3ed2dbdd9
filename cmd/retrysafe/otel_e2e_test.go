package main

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/retrysafe/retrysafe/harness/otlprecv"
	"github.com/retrysafe/retrysafe/retry"
	"github.com/retrysafe/retrysafe/retry/retryotel"
)

// losingProxy forwards TCP connections to target; the first connection's response is
// read from target and dropped, and the client's connection closed: the request was
// served and its answer lost on the way back.
type losingProxy struct {
	ln     net.Listener
	target string
	conns  atomic.Int32
	lost   chan struct{} // closed once the first response was dropped
}

func newLosingProxy(t *testing.T, target string) *losingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &losingProxy{ln: ln, target: target, lost: make(chan struct{})}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.serve(c)
			}()
		}
	}()
	return p
}

func (p *losingProxy) serve(client net.Conn) {
	defer client.Close()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer up.Close()
	go func() { _, _ = io.Copy(up, client) }()
	if p.conns.Add(1) == 1 {
		// The gateway's answer arrives (it was stored before it was sent) and goes
		// nowhere: the client sees its connection close without a response.
		buf := make([]byte, 1)
		_, _ = up.Read(buf)
		close(p.lost)
		return
	}
	_, _ = io.Copy(client, up)
}

// TestE2EOtel: the binary with --otel exports, to an OTLP/HTTP receiver, the spans of
// one keyed request whose first response is lost and whose retry is a replay: two
// gateway request spans in the client's trace, each the child of the client's attempt
// that sent it, the first with its claim, upstream call and completion, the second with
// its claim and replay; the upstream received the upstream span's traceparent; the
// spans queued at SIGTERM are flushed before the process exits; no raw key, body or
// credential in anything exported.
func TestE2EOtel(t *testing.T) {
	t.Parallel()
	recv := otlprecv.Start(t)
	var upstreamParent atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamParent.Store(r.Header.Get("Traceparent"))
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"pay_1"}`)
	}))
	t.Cleanup(up.Close)
	// A schedule delay longer than the test: only the flush at exit exports the spans.
	gw := startGateway(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.URL, "OTEL_BSP_SCHEDULE_DELAY=600000", "OTEL_SERVICE_NAME="},
		"--otel", "--upstream", up.URL, "--store", "memory:")
	proxy := newLosingProxy(t, strings.TrimPrefix(gw.addr, "http://"))

	// The client traces its attempts: each carries its own traceparent.
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	rt := &retry.Transport{Policy: retry.Policy{MaxAttempts: 3, Base: 20 * time.Millisecond, Jitter: retry.JitterNone}, NoBudget: true,
		Base: &http.Transport{DisableKeepAlives: true}}
	client := &http.Client{Transport: retryotel.Instrument(rt, retryotel.Config{TracerProvider: tp}), Timeout: 20 * time.Second}
	const key, auth, body = "e2e-RAW-KEY-7f3a", "Bearer e2e-SECRET-TOKEN", `{"amount":"e2e-SECRET-BODY"}`
	ctx, root := tp.Tracer("client").Start(context.Background(), "checkout")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+proxy.ln.Addr().String()+"/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", auth)
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	root.End()
	if res.StatusCode != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("client got %d, replayed %q; want the replayed 201", res.StatusCode, res.Header.Get("Idempotent-Replayed"))
	}
	select {
	case <-proxy.lost:
	default:
		t.Fatal("the first response was not dropped")
	}
	var attempts []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "POST" {
			attempts = append(attempts, s)
		}
	}
	slices.SortFunc(attempts, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	if len(attempts) != 2 {
		t.Fatalf("the client made %d attempts, want 2", len(attempts))
	}

	if n := len(recv.Spans()); n != 0 {
		t.Fatalf("%d spans exported before the exit; the schedule delay should hold them", n)
	}
	if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := gw.wait(20 * time.Second); code != 0 {
		t.Fatalf("gateway exited %d", code)
	}

	spans := recv.Spans()
	traceID := root.SpanContext().TraceID().String()
	var servers []otlprecv.Span
	for _, s := range spans {
		if s.Kind == tracepb.Span_SPAN_KIND_SERVER && s.TraceID() == traceID {
			servers = append(servers, s)
		}
		if s.Resource["service.name"] != "retrysafe-gateway" {
			t.Errorf("span %q from service %q, want retrysafe-gateway", s.Name, s.Resource["service.name"])
		}
	}
	if len(servers) != 2 {
		t.Fatalf("%d gateway request spans in the client's trace %s, want 2; received %d spans", len(servers), traceID, len(spans))
	}
	byStart := func(a, b otlprecv.Span) int { return cmp.Compare(a.StartTimeUnixNano, b.StartTimeUnixNano) }
	slices.SortFunc(servers, byStart)
	children := func(parent otlprecv.Span) (out []otlprecv.Span) {
		for _, s := range spans {
			if s.ParentID() == parent.SpanID() {
				out = append(out, s)
			}
		}
		slices.SortFunc(out, byStart)
		return out
	}
	spanNames := func(ss []otlprecv.Span) (out []string) {
		for _, s := range ss {
			out = append(out, s.Name)
		}
		return out
	}
	for i, c := range []struct {
		outcome  string
		children []string
	}{
		{"executed", []string{"store.claim", "upstream POST", "store.complete"}},
		{"replayed", []string{"store.claim", "replay"}},
	} {
		s := servers[i]
		if got := s.Attr("retrysafe.outcome"); got != c.outcome {
			t.Errorf("gateway request %d: outcome %q, want %q", i+1, got, c.outcome)
		}
		if want := attempts[i].SpanContext.SpanID().String(); s.ParentID() != want {
			t.Errorf("gateway request %d: parent %s, want the client's attempt %d, %s", i+1, s.ParentID(), i+1, want)
		}
		if s.Name != "POST /" || s.Attr("http.response.status_code") != "201" || s.Attr("retrysafe.key.hash") == "" {
			t.Errorf("gateway request %d: %q status %q key hash %q", i+1, s.Name, s.Attr("http.response.status_code"), s.Attr("retrysafe.key.hash"))
		}
		kids := children(s)
		if got := spanNames(kids); !slices.Equal(got, c.children) {
			t.Errorf("gateway request %d: children %v, want %v", i+1, got, c.children)
			continue
		}
		if i == 0 {
			want := "00-" + traceID + "-" + kids[1].SpanID() + "-01"
			if got, _ := upstreamParent.Load().(string); got != want {
				t.Errorf("the upstream received traceparent %q, want the upstream span's %q", got, want)
			}
		}
	}
	if servers[0].Attr("retrysafe.key.hash") != servers[1].Attr("retrysafe.key.hash") {
		t.Error("the two requests of one key have different key hashes")
	}
	for _, raw := range recv.Raw() {
		for _, secret := range []string{key, "SECRET"} {
			if bytes.Contains(raw, []byte(secret)) {
				t.Errorf("an export holds %q", secret)
			}
		}
	}
	if recv.Failed() > 0 {
		t.Errorf("%d exports the receiver could not decode", recv.Failed())
	}
}
