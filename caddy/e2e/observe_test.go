package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/retrysafe/retrysafe/harness/testenv"
)

// scrape returns the samples of Caddy's admin /metrics whose name is name and whose
// labels include every one of labels (name="value"), summed.
func scrape(t *testing.T, p *caddyProc, name string, labels ...string) float64 {
	t.Helper()
	res, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", res.StatusCode, err)
	}
	var sum float64
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// TestMetrics: Caddy's admin /metrics counts the handler's requests by outcome, as the
// gateway names them (retrysafe_gateway_*, route the Caddy server's name), and the
// executions it counts are the upstream's; after a reload through the admin API (which
// must succeed: the collectors go into the new configuration's registry) the new
// configuration's requests are counted, from zero. Caddy's access log names each
// request's outcome.
func TestMetrics(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	held, unhold := holdFirst(t, up, "/held")
	db := filepath.Join(t.TempDir(), "keys.db")
	site := fmt.Sprintf("%%s {\n\tlog\n\tidempotency {\n\t\tstore sqlite:%s\n\t\tconflict reject\n\t}\n\treverse_proxy %s\n}\n", db, up.URL)
	p := startCaddy(t, site)

	send(t, "POST", p.base+"/m", "k-1", `{"a":1}`)
	send(t, "POST", p.base+"/m", "k-2", `{"a":2}`)
	send(t, "POST", p.base+"/m", "k-1", `{"a":1}`) // replayed
	send(t, "POST", p.base+"/m", "k-1", `{"a":9}`) // mismatch
	send(t, "POST", p.base+"/m", "", `{"a":1}`)    // missing-key
	done := sendAsync("POST", p.base+"/held", "k-h", `{}`)
	select {
	case <-held:
	case a := <-done:
		t.Fatalf("the held request was answered before it reached the upstream: %d %q", a.status, a.body)
	}
	if a := send(t, "POST", p.base+"/held", "k-h", `{}`); a.status != http.StatusConflict {
		t.Errorf("a duplicate of a key in flight: %d, want 409", a.status)
	}
	if g := scrape(t, p, "retrysafe_gateway_keys_in_flight"); g != 1 {
		t.Errorf("keys_in_flight while one is forwarded = %v, want 1", g)
	}
	unhold()
	<-done

	execs := up.count("/m") + up.count("/held")
	want := map[string]float64{"executed": float64(execs), "replayed": 1, "mismatch": 1, "missing-key": 1, "conflict": 1}
	for outcome, n := range want {
		if got := scrape(t, p, "retrysafe_gateway_requests_total", `outcome="`+outcome+`"`, `route="srv0"`); got != n {
			t.Errorf("requests_total{outcome=%q} = %v, want %v", outcome, got, n)
		}
	}
	// Caddy's access log (the log directive) names each request's outcome, as the
	// gateway's request lines do.
	for outcome := range want {
		if !strings.Contains(p.log.String(), `"idempotency_outcome":"`+outcome+`"`) {
			t.Errorf("no access log line has idempotency_outcome %q", outcome)
		}
	}
	if execs != 3 {
		t.Errorf("the upstream executed %d requests, want 3", execs)
	}
	if n := scrape(t, p, "retrysafe_gateway_store_duration_seconds_count", `operation="claim"`); n < 6 {
		t.Errorf("store_duration_seconds_count{operation=claim} = %v, want one per keyed request (6)", n)
	}
	if n := scrape(t, p, "retrysafe_gateway_store_not_durable"); n != 0 {
		t.Errorf("store_not_durable = %v, want 0", n)
	}

	cmd := exec.Command(caddyBin, "reload", "--force", "--config", p.path, "--adapter", "caddyfile", "--address", p.admin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("caddy reload: %v\n%s", err, out)
	}
	send(t, "POST", p.base+"/m", "k-3", `{"a":3}`)
	send(t, "POST", p.base+"/m", "k-3", `{"a":3}`)
	// The new configuration has a registry of its own: its counters start from zero.
	for outcome, n := range map[string]float64{"executed": 1, "replayed": 1, "mismatch": 0} {
		if got := scrape(t, p, "retrysafe_gateway_requests_total", `outcome="`+outcome+`"`); got != n {
			t.Errorf("after the reload, requests_total{outcome=%q} = %v, want %v (the new configuration's requests)", outcome, got, n)
		}
	}
	if n := up.count("/m"); n != 3 {
		t.Errorf("the upstream executed /m %d times, want 3", n)
	}
}

// collector is an OTLP/HTTP trace receiver: it keeps the spans exported to it, and the
// raw bytes of every export.
type collector struct {
	*httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
	raw   bytes.Buffer
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			z, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = z
		}
		b, err := io.ReadAll(body)
		if err != nil {
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.raw.Write(b)
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *collector) named(name string) []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range c.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s *tracepb.Span, key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.Value.GetStringValue()
		}
	}
	return ""
}

// TestTracing: under Caddy's tracing directive, exporting OTLP/HTTP to a collector of
// the test's, a keyed request's store calls are spans under Caddy's server span, in its
// trace, and its retry has a replay span; the server span gets the outcome and the key's
// hash, and no span holds the key.
func TestTracing(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	col := newCollector(t)
	db := filepath.Join(t.TempDir(), "keys.db")
	site := fmt.Sprintf("%%s {\n\ttracing {\n\t\tspan caddy\n\t}\n\tidempotency {\n\t\tstore sqlite:%s\n\t}\n\treverse_proxy %s\n}\n", db, up.URL)
	p := startCaddyEnv(t, site, []string{
		"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.URL, "OTEL_BSP_SCHEDULE_DELAY=50",
	})
	const key = "secret-key-7f3a9c"
	send(t, "POST", p.base+"/payments", key, `{"amount":1}`)
	send(t, "POST", p.base+"/payments", key, `{"amount":1}`)

	testenv.Eventually(t, 30*time.Second, func() bool {
		return len(col.named("caddy")) >= 2 && len(col.named("store.complete")) >= 1 && len(col.named("replay")) >= 1
	}, "the spans to be exported")

	servers := map[string]*tracepb.Span{} // by span ID
	for _, s := range col.named("caddy") {
		servers[hex.EncodeToString(s.SpanId)] = s
	}
	for _, name := range []string{"store.claim", "store.complete", "replay"} {
		spans := col.named(name)
		if len(spans) == 0 {
			t.Errorf("no %s span", name)
		}
		for _, s := range spans {
			parent := servers[hex.EncodeToString(s.ParentSpanId)]
			if parent == nil {
				t.Errorf("the %s span's parent is not Caddy's server span", name)
				continue
			}
			if !bytes.Equal(parent.TraceId, s.TraceId) {
				t.Errorf("the %s span is not in Caddy's trace", name)
			}
			if attr(s, "retrysafe.key.hash") == "" {
				t.Errorf("the %s span has no retrysafe.key.hash", name)
			}
		}
	}
	outcomes := map[string]bool{}
	for _, s := range servers {
		outcomes[attr(s, "retrysafe.outcome")] = true
	}
	if !outcomes["executed"] || !outcomes["replayed"] {
		t.Errorf("Caddy's server spans have the outcomes %v, want executed and replayed", outcomes)
	}
	col.mu.Lock()
	leaked := bytes.Contains(col.raw.Bytes(), []byte(key))
	col.mu.Unlock()
	if leaked {
		t.Error("the key appears in the exported spans")
	}
}

// TestMetricsTwoStores: the gauges of a configuration whose handlers use two stores
// cover both: a duplicate waiting on a key of the second store's handler is counted in
// requests_waiting.
func TestMetricsTwoStores(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	held, unhold := holdFirst(t, up, "/b")
	dir := t.TempDir()
	site := fmt.Sprintf("%%s {\n\thandle /a {\n\t\tidempotency {\n\t\t\tstore sqlite:%s\n\t\t}\n\t\treverse_proxy %s\n\t}\n"+
		"\thandle /b {\n\t\tidempotency {\n\t\t\tstore sqlite:%s\n\t\t\tconflict wait\n\t\t}\n\t\treverse_proxy %s\n\t}\n}\n",
		filepath.Join(dir, "a.db"), up.URL, filepath.Join(dir, "b.db"), up.URL)
	p := startCaddy(t, site)
	send(t, "POST", p.base+"/a", "k-a", `{}`)
	first := sendAsync("POST", p.base+"/b", "k-b", `{}`)
	select {
	case <-held:
	case a := <-first:
		t.Fatalf("the held request was answered before it reached the upstream: %d %q", a.status, a.body)
	}
	second := sendAsync("POST", p.base+"/b", "k-b", `{}`)
	testenv.Eventually(t, 30*time.Second, func() bool {
		return scrape(t, p, "retrysafe_gateway_requests_waiting") == 1
	}, "requests_waiting to count the duplicate waiting on the second store's key")
	unhold()
	for _, ch := range []<-chan answer{first, second} {
		if a := <-ch; a.status != http.StatusOK {
			t.Errorf("a /b request: %d %q, want 200", a.status, a.body)
		}
	}
	if n := up.count("/b"); n != 1 {
		t.Errorf("the upstream executed /b %d times, want 1", n)
	}
}
