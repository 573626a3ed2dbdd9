package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// requestLine returns the attributes of the JSON "request" line logged for key.
func (f *fixture) requestLine(key string) map[string]any {
	f.t.Helper()
	for line := range strings.Lines(f.logs.String()) {
		var attrs map[string]any
		if json.Unmarshal([]byte(line), &attrs) == nil && attrs["msg"] == "request" && attrs["key"] == key {
			return attrs
		}
	}
	f.t.Fatalf("no request line for key %s in:\n%s", key, f.logs.String())
	return nil
}

// serveGone runs a keyed POST to path through the gateway whose client goes away when
// gone is closed (its context is cancelled, as net/http's server cancels it when the
// client's connection closes); nil: the client has gone before the request is served.
func (f *fixture) serveGone(path, key string, gone <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	if gone == nil {
		cancel()
	} else {
		go func() {
			<-gone
			cancel()
		}()
		defer cancel()
	}
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, path, strings.NewReader(`{"a":1}`))
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Content-Type", "application/json")
	f.gw.ServeHTTP(httptest.NewRecorder(), r)
}

// Durations are logged as milliseconds, a number with the unit in the key's name, in
// every format: a JSON reader cannot take slog's bare nanoseconds for milliseconds.
func TestLogDurationsInMilliseconds(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memstore.New(), nil, nil)
	key := testenv.Name("ms")
	if r := f.do("POST", "/pay", key, `{}`); r.status != http.StatusCreated {
		t.Fatalf("%d %s", r.status, r.body)
	}
	line := f.requestLine(key)
	for _, name := range []string{"latency_ms", "upstream_latency_ms"} {
		ms, ok := line[name].(float64)
		if !ok || ms <= 0 {
			t.Errorf("%s = %#v, want a positive number of milliseconds", name, line[name])
		}
		// The whole request took less than a minute: nanoseconds would say more.
		if ms >= 60_000 {
			t.Errorf("%s = %v: not milliseconds", name, ms)
		}
	}
	for _, name := range []string{"latency", "upstream_latency"} {
		if v, ok := line[name]; ok {
			t.Errorf("%s = %v logged without its unit", name, v)
		}
	}
	up, _ := line["upstream_latency_ms"].(float64)
	if all, _ := line["latency_ms"].(float64); up > all {
		t.Errorf("upstream_latency_ms %v > latency_ms %v", up, all)
	}
}

// A request whose client went away names no status it was not sent: the line says
// client_gone, and what the upstream answered (stored for the client's retry) as
// upstream_status.
func TestLogClientGoneSendsNoStatus(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memstore.New(), nil, nil)

	// Gone before the request was served: nothing claimed, nothing forwarded.
	early := testenv.Name("early")
	f.serveGone("/pay", early, nil)
	line := f.requestLine(early)
	if line["outcome"] != "client-gone" || line["client_gone"] != true {
		t.Errorf("gone before: %v, want outcome client-gone, client_gone", line)
	}
	for _, name := range []string{"status", "upstream_status"} {
		if v, ok := line[name]; ok {
			t.Errorf("gone before: %s = %v, though nothing was sent or forwarded", name, v)
		}
	}

	// Gone while the upstream worked: its answer is stored, and sent to no one.
	late := testenv.Name("late")
	gone := make(chan struct{})
	go func() {
		<-f.up.arrived(late)
		close(gone)
		f.up.release()
	}()
	f.serveGone("/block", late, gone)
	line = f.requestLine(late)
	if line["outcome"] != "executed" || line["client_gone"] != true || line["upstream_status"] != float64(http.StatusCreated) {
		t.Errorf("gone while upstream: %v, want outcome executed, client_gone, upstream_status 201", line)
	}
	if v, ok := line["status"]; ok {
		t.Errorf("gone while upstream: status = %v, though the client had gone", v)
	}
	if r := f.do("POST", "/block", late, `{"a":1}`); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %d %v, want the stored answer", r.status, r.header)
	}

	// A client that stays is sent the status, and the line says so.
	stays := testenv.Name("stays")
	f.do("POST", "/pay", stays, `{}`)
	line = f.requestLine(stays)
	if line["status"] != float64(http.StatusCreated) || line["upstream_status"] != float64(http.StatusCreated) || line["client_gone"] != nil {
		t.Errorf("client stayed: %v, want status and upstream_status 201, no client_gone", line)
	}
}

// A client whose body is late is still there to be answered 408, though net/http
// cancelled its request's context when the read failed: the line names the status.
func TestLogBodyTimeoutNamesItsStatus(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memstore.New(), nil, func(c *gateway.Config) { c.Idempotency.BodyTimeout = 100 * time.Millisecond })
	key := testenv.Name("slow")
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Two bytes of the ten announced, and then nothing: the answer comes at the timeout.
	fmt.Fprintf(conn, "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{}", key)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("%d, want 408", res.StatusCode)
	}
	line := f.requestLine(key)
	if line["outcome"] != "body-timeout" || line["status"] != float64(http.StatusRequestTimeout) || line["client_gone"] != nil {
		t.Errorf("%v, want outcome body-timeout, status 408, no client_gone", line)
	}
}

// heldEnd is a span processor that holds the end of the gateway's server span (the one
// without a parent): it says when it holds it, and lets it go when released.
type heldEnd struct {
	held, release chan struct{}
}

func (h heldEnd) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (h heldEnd) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.Parent().IsValid() {
		close(h.held)
		<-h.release
	}
}
func (h heldEnd) Shutdown(context.Context) error   { return nil }
func (h heldEnd) ForceFlush(context.Context) error { return nil }

// onRequestLine closes logged once it has handled a request line.
type onRequestLine struct {
	slog.Handler
	logged chan struct{}
}

func (o onRequestLine) Handle(ctx context.Context, r slog.Record) error {
	err := o.Handler.Handle(ctx, r)
	if r.Message == "request" {
		close(o.logged)
	}
	return err
}

// A request's line carries the instant its latency ends, not when the line is written:
// its time less latency_ms is when the request began, however long the work after
// the request's end takes (here its span's end, held until the test has read the
// clock). What matches lines against what the upstream saw relies on it.
func TestLogTimeIsTheRequestsEnd(t *testing.T) {
	t.Parallel()
	h := heldEnd{held: make(chan struct{}), release: make(chan struct{})}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(h))
	logged := make(chan struct{})
	f := newFixture(t, memstore.New(), nil, func(c *gateway.Config) {
		c.TracerProvider = tp
		c.Logger = slog.New(onRequestLine{Handler: c.Logger.Handler(), logged: logged})
	})
	key := testenv.Name("end")
	var whileHeld time.Time
	go func() {
		<-h.held
		whileHeld = time.Now()
		close(h.release)
	}()
	sent := time.Now()
	if r := f.do("POST", "/pay", key, `{}`); r.status != http.StatusCreated {
		t.Fatalf("%d %s", r.status, r.body)
	}
	<-logged // after the release: whileHeld is set
	line := f.requestLine(key)
	at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(line["time"]))
	if err != nil {
		t.Fatalf("time %v: %v", line["time"], err)
	}
	if at.After(whileHeld) {
		t.Errorf("the line's time %s is after the request's end was held (%s): it was taken when the line was written",
			at.Format(time.RFC3339Nano), whileHeld.Format(time.RFC3339Nano))
	}
	ms, _ := line["latency_ms"].(float64)
	if began := at.Add(-time.Duration(ms * float64(time.Millisecond))); began.Before(sent.Add(-time.Millisecond)) {
		t.Errorf("time less latency_ms is %s, before the request was sent at %s", began.Format(time.RFC3339Nano), sent.Format(time.RFC3339Nano))
	}
}
