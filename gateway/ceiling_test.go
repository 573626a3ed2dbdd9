package gateway_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// halfAnswer is an upstream whose answers to the keys it is told to hold stop halfway:
// it reads the request's body, announces an answer of the held size, sends its first
// half and waits for the test before the second. It counts its executions by key.
type halfAnswer struct {
	mu    sync.Mutex
	runs  map[string]int
	sizes map[string]int // the held keys' answer sizes; 0: echo the body
	gate  chan struct{}
}

func (u *halfAnswer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.runs[key]++
	size, held := u.sizes[key]
	u.mu.Unlock()
	if !held {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
		return
	}
	answer := body
	if size > 0 {
		answer = []byte(strings.Repeat("z", size))
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(answer[:len(answer)/2])
	http.NewResponseController(w).Flush()
	<-u.gate
	_, _ = w.Write(answer[len(answer)/2:])
}

func (u *halfAnswer) of(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[key]
}

// recordedHalf is a Transport whose upstream answers say, on their body's second read,
// that the gateway has taken their first bytes: the proxy writes what it read before it
// reads again.
type recordedHalf struct {
	base  http.RoundTripper
	taken chan string // the key whose answer's first read was written on
}

func (t recordedHalf) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := t.base.RoundTrip(req)
	if err == nil {
		// The gateway hides the key from http.Transport under its lower-case name.
		res.Body = &readCounter{ReadCloser: res.Body, key: strings.Join(req.Header["idempotency-key"], ""), taken: t.taken}
	}
	return res, err
}

type readCounter struct {
	io.ReadCloser
	key   string
	reads int
	taken chan string
}

func (b *readCounter) Read(p []byte) (int, error) {
	if b.reads++; b.reads == 2 {
		b.taken <- b.key
	}
	return b.ReadCloser.Read(p)
}

// ceilingGateway serves a gateway with a 1,000-byte ceiling on bodies in memory in front
// of up, and returns its address, its store and its body_memory_bytes gauge.
func ceilingGateway(t *testing.T, up http.Handler, taken chan string) (*httptest.Server, *memstore.Store, func() float64) {
	t.Helper()
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	u, _ := url.Parse(upSrv.URL)
	reg := prometheus.NewRegistry()
	store := memstore.New()
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	gw, err := gateway.New(gateway.Config{Upstream: u, Registerer: reg, Logger: slog.New(slog.DiscardHandler),
		Transport:   recordedHalf{base: base, taken: taken},
		Idempotency: idempotency.Config{Store: store, MaxBody: 1000, MaxBodyMemory: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
	front := httptest.NewServer(gw)
	t.Cleanup(front.Close)
	gauge := func() float64 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "retrysafe_gateway_body_memory_bytes" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	return front, store, gauge
}

type answer struct {
	status int
	header http.Header
	body   string
	err    error
}

func keyedPost(client *http.Client, base, key, body string) answer {
	req, _ := http.NewRequest(http.MethodPost, base+"/pay", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	res, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, header: res.Header, body: string(b), err: err}
}

// TestGatewayAnswersCountAgainstTheCeiling: an upstream answer being received counts
// against the ceiling on bodies in memory: past it, a new keyed request gets 503 with
// Retry-After before anything is claimed (the upstream never sees it), and the answer,
// larger than the ceiling, arrives whole. Afterwards the gauge is back to zero.
func TestGatewayAnswersCountAgainstTheCeiling(t *testing.T) {
	t.Parallel()
	up := &halfAnswer{runs: map[string]int{}, sizes: map[string]int{"big": 3000}, gate: make(chan struct{})}
	gateOnce := sync.OnceFunc(func() { close(up.gate) })
	taken := make(chan string, 4)
	front, store, gauge := ceilingGateway(t, up, taken)
	t.Cleanup(gateOnce) // before the servers close, which wait for their handlers
	client := front.Client()

	big := make(chan answer, 1)
	go func() { big <- keyedPost(client, front.URL, "big", strings.Repeat("q", 500)) }()
	if k := <-taken; k != "big" {
		t.Fatalf("first answer taken: %q", k)
	}
	if g := gauge(); g < 1000 {
		t.Errorf("body_memory_bytes = %v with a 3000-byte answer coming in, want past the 1000 ceiling", g)
	}
	for _, body := range []string{"tiny", ""} {
		a := keyedPost(client, front.URL, "small"+body, body)
		if a.err != nil || a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" ||
			!strings.Contains(a.body, idempotency.ProblemOverloaded) {
			t.Errorf("a new request past the ceiling: %d %q %v, want 503 overloaded with Retry-After", a.status, a.body, a.err)
		}
		if _, err := store.Get(context.Background(), "", "small"+body); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("a refused request was claimed: %v", err)
		}
		if n := up.of("small" + body); n != 0 {
			t.Errorf("a refused request reached the upstream %d times", n)
		}
	}
	gateOnce()
	a := <-big
	if a.err != nil || a.status != http.StatusCreated || a.body != strings.Repeat("z", 3000) {
		t.Fatalf("the answer past the ceiling: %d, %d bytes, %v; want 201 and its 3000 bytes", a.status, len(a.body), a.err)
	}
	if a := keyedPost(client, front.URL, "smalltiny", "tiny"); a.status != http.StatusCreated || up.of("smalltiny") != 1 {
		t.Errorf("the refused request, retried: %d, %d executions", a.status, up.of("smalltiny"))
	}
	if up.of("big") != 1 {
		t.Errorf("big executed %d times", up.of("big"))
	}
	front.Close() // waits for the handlers
	if g := gauge(); g != 0 {
		t.Errorf("body_memory_bytes = %v after the requests, want 0", g)
	}
}

// TestGatewayBodyAndAnswerCountOnce: once the upstream has a keyed request's body and
// has answered, the gateway drops the body, so that a request and its echo hold the
// ceiling once, not twice: with 400 bytes echoed and the answer halfway in, a request of
// 500 more fits under the 1,000-byte ceiling.
func TestGatewayBodyAndAnswerCountOnce(t *testing.T) {
	t.Parallel()
	up := &halfAnswer{runs: map[string]int{}, sizes: map[string]int{"echo": 0}, gate: make(chan struct{})}
	gateOnce := sync.OnceFunc(func() { close(up.gate) })
	taken := make(chan string, 4)
	front, _, gauge := ceilingGateway(t, up, taken)
	t.Cleanup(gateOnce) // before the servers close, which wait for their handlers
	client := front.Client()

	echo := strings.Repeat("e", 400)
	done := make(chan answer, 1)
	go func() { done <- keyedPost(client, front.URL, "echo", echo) }()
	<-taken
	if g := gauge(); g != 400 {
		t.Errorf("body_memory_bytes = %v with a 400-byte request sent and its answer coming in, want 400", g)
	}
	if a := keyedPost(client, front.URL, "next", strings.Repeat("n", 500)); a.status != http.StatusCreated {
		t.Errorf("500 bytes with 400 held under a 1000-byte ceiling: %d %q, want 201", a.status, a.body)
	}
	gateOnce()
	if a := <-done; a.status != http.StatusCreated || a.body != echo {
		t.Fatalf("echo: %d %d bytes %v", a.status, len(a.body), a.err)
	}
	front.Close()
	if g := gauge(); g != 0 {
		t.Errorf("body_memory_bytes = %v after the requests, want 0", g)
	}
}

// getBodyCheck is a Transport that checks when a keyed request's body can still be
// read again: http.Transport rewinds a body with GetBody to resend a request of which
// nothing reached the wire, which it may find out only after it wrote the whole body
// into its buffer (WroteRequest), so the body must stay until the answer came; once
// the answer came, nothing resends it, and it is dropped.
type getBodyCheck struct {
	mu                     sync.Mutex
	afterWritten, afterAns error
	rewound                string
}

func (c *getBodyCheck) RoundTrip(req *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(req.Body)
	if trace := httptrace.ContextClientTrace(req.Context()); trace != nil && trace.WroteRequest != nil {
		trace.WroteRequest(httptrace.WroteRequestInfo{})
	}
	again, err := req.GetBody()
	c.mu.Lock()
	c.afterWritten = err
	if err == nil {
		b, _ := io.ReadAll(again)
		c.rewound = string(b)
	}
	c.mu.Unlock()
	return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Request: req, ContentLength: int64(len(body)),
		Body: &afterAnswer{c: c, req: req, r: strings.NewReader(string(body))}}, nil
}

// afterAnswer is the answer's body: its first read, by the proxy once the answer is
// in the gateway's hands, tries GetBody again.
type afterAnswer struct {
	c    *getBodyCheck
	req  *http.Request
	r    io.Reader
	once sync.Once
}

func (b *afterAnswer) Read(p []byte) (int, error) {
	b.once.Do(func() {
		_, err := b.req.GetBody()
		b.c.mu.Lock()
		b.c.afterAns = err
		b.c.mu.Unlock()
	})
	return b.r.Read(p)
}

func (b *afterAnswer) Close() error { return nil }

// TestGatewayKeepsBodyUntilAnswered: see getBodyCheck.
func TestGatewayKeepsBodyUntilAnswered(t *testing.T) {
	t.Parallel()
	check := &getBodyCheck{}
	u, _ := url.Parse("http://upstream.invalid")
	gw, err := gateway.New(gateway.Config{Upstream: u, Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler),
		Transport: check, Idempotency: idempotency.Config{Store: memstore.New()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
	req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
	req.Header.Set("Idempotency-Key", "rewind")
	w := httptest.NewRecorder()
	gw.ServeHTTP(w, req)
	if w.Code != http.StatusCreated || w.Body.String() != `{"amount":1}` {
		t.Fatalf("answer: %d %q", w.Code, w.Body)
	}
	check.mu.Lock()
	defer check.mu.Unlock()
	if check.afterWritten != nil || check.rewound != `{"amount":1}` {
		t.Errorf("GetBody once the body was written, before the answer: %q, %v; want the body again", check.rewound, check.afterWritten)
	}
	if check.afterAns == nil {
		t.Error("GetBody still gives the body once the answer came: the gateway keeps it in memory")
	}
}
