package jetstream

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	neturl "net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/retrysafe/retrysafe/harness/natsserver"
	"github.com/retrysafe/retrysafe/harness/tcpproxy"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/retry"
)

// embeddedURL is the in-process server every test shares, started by TestMain.
var embeddedURL string

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	url, shutdown, err := natsserver.Start(ctx, "")
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the embedded NATS server:", err)
		os.Exit(1)
	}
	embeddedURL = url
	code := m.Run()
	shutdown()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// A harness is a NATS server the scenarios run against.
type harness struct {
	name string
	url  func(t testing.TB) string
}

var harnesses = []harness{
	{"nats", func(t testing.TB) string { return testenv.NATSURL(t) }},
	{"embedded", func(testing.TB) string { return embeddedURL }},
}

// forEach runs fn as a parallel subtest on every harness.
func forEach(t *testing.T, fn func(t *testing.T, url string)) {
	t.Helper()
	for _, h := range harnesses {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			fn(t, h.url(t))
		})
	}
}

// quietLogger discards logs, unless RETRYSAFE_TEST_LOG=1 sends them to stderr.
func quietLogger() *slog.Logger {
	if os.Getenv("RETRYSAFE_TEST_LOG") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testPolicy: 3 attempts, waits of exactly 100ms then 200ms.
func testPolicy() redeliver.Policy {
	return redeliver.Policy{
		MaxAttempts: 3,
		Backoff:     retry.Policy{Base: 100 * time.Millisecond, Cap: time.Second, Jitter: retry.JitterNone},
		Timeout:     30 * time.Second,
	}
}

// newConfig returns a Config for a fresh queue on url, whose streams and bucket are
// deleted when t ends.
func newConfig(t testing.TB, url string) Config {
	t.Helper()
	cfg := Config{
		Queue:         testenv.Name("rsjs") + ".work",
		URL:           url,
		Policy:        testPolicy(),
		MemoryStorage: true,
		Logger:        quietLogger(),
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := DeleteTopology(ctx, cfg); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	return cfg
}

// connect returns a connection closed when t ends.
func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// publish publishes messages with the ids to cfg's queue.
func publish(t testing.TB, nc *nats.Conn, cfg Config, ids ...string) {
	t.Helper()
	p, err := NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, id := range ids {
		m := &redeliver.Message{ID: id, Body: []byte("body of " + id), ContentType: "text/plain",
			Header: map[string]string{"tenant": "acme"}}
		if err := p.Publish(ctx, cfg.Queue, m); err != nil {
			t.Fatal(err)
		}
	}
}

// running is a Consumer running over a Source.
type running struct {
	src  *Source
	stop func() error
}

// markers are the marker messages quiesce publishes, by id. The Consumers that run
// starts acknowledge them without calling the test's handler.
var markers sync.Map // id → *marker

type marker struct {
	once sync.Once
	seen chan struct{} // closed when a handler got the marker
}

// run starts a Consumer with the handler over a new Source of cfg; it is stopped when t
// ends (or by calling stop).
func run(t testing.TB, cfg Config, h redeliver.Handler, tweak func(*redeliver.Config)) *running {
	t.Helper()
	ctx := context.Background()
	src, err := NewSource(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	handler := func(ctx context.Context, m *redeliver.Message) error {
		if v, ok := markers.Load(m.ID); ok {
			mk := v.(*marker)
			mk.once.Do(func() { close(mk.seen) })
			return nil
		}
		return h(ctx, m)
	}
	rc := redeliver.Config{Source: src, Handler: handler, Policy: cfg.Policy, Logger: cfg.Logger, ShutdownGrace: 5 * time.Second}
	if tweak != nil {
		tweak(&rc)
	}
	c, err := redeliver.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return &running{src: src, stop: stop}
}

// eventually polls cond until it holds, or fails t when the timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, timeout, cond, "%s", what)
}

// quiesce returns once no delivery of cfg's queue can still reach r's handler, so that
// the test may count what it got: the server holds nothing but want (an acknowledged
// message leaves the work stream, a retried one stays in it until it is redelivered);
// a marker published then has reached the handler, so everything the server had sent
// before it was received (the server delivers a consumer's messages in order); and r is
// stopped, which waits for the handlers still running.
func quiesce(t testing.TB, nc *nats.Conn, cfg Config, r *running, want state) {
	t.Helper()
	eventually(t, 10*time.Second, fmt.Sprintf("the queue's state %+v", want), func() bool { return queueState(t, nc, cfg) == want })
	id := testenv.Name("marker")
	mk := &marker{seen: make(chan struct{})}
	markers.Store(id, mk)
	defer markers.Delete(id)
	publish(t, nc, cfg, id)
	select {
	case <-mk.seen:
	case <-time.After(10 * time.Second):
		t.Fatal("the marker message did not reach the handler")
	}
	if err := r.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// state is a queue's broker-side state.
type state struct {
	work, dlq            uint64 // messages stored
	ackPending, unpulled int
}

func queueState(t testing.TB, nc *nats.Conn, cfg Config) state {
	t.Helper()
	c, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	j, _ := js.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var st state
	for _, s := range []struct {
		name string
		n    *uint64
	}{{c.Stream, &st.work}, {c.DLQStream, &st.dlq}} {
		str, err := j.Stream(ctx, s.name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := str.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		*s.n = info.State.Msgs
	}
	cons, err := j.Consumer(ctx, c.Stream, c.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st.ackPending, st.unpulled = ci.NumAckPending, int(ci.NumPending)
	return st
}

// deadLetters opens cfg's DLQ for the test.
func deadLetters(t testing.TB, cfg Config) *DeadLetters {
	t.Helper()
	d, err := NewDeadLetters(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// recorder records deliveries by message id.
type recorder struct {
	mu        sync.Mutex
	times     map[string][]time.Time
	attempts  map[string][]int
	successes map[string]int
}

func newRecorder() *recorder {
	return &recorder{times: map[string][]time.Time{}, attempts: map[string][]int{}, successes: map[string]int{}}
}

func (r *recorder) delivered(m *redeliver.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.times[m.ID] = append(r.times[m.ID], time.Now())
	r.attempts[m.ID] = append(r.attempts[m.ID], m.Attempt)
}

func (r *recorder) succeeded(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.successes[id]++
}

func (r *recorder) deliveries(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.times[id])
}

func (r *recorder) success(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.successes[id]
}

func (r *recorder) totalSuccesses() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.successes {
		n += c
	}
	return n
}

// proxyTo returns a TCP proxy to the NATS server at url, closed when t ends, and a
// channel closed once bytes holding marker have reached it during a Stall: the client
// has written the request they belong to, and it is lost when Restore resets the
// connection.
func proxyTo(t testing.TB, url string, marker []byte) (*tcpproxy.Proxy, <-chan struct{}) {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := tcpproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	var mu sync.Mutex
	var held []byte
	var once sync.Once
	sent := make(chan struct{})
	proxy.OnHold(func(b []byte) {
		mu.Lock()
		held = append(held, b...)
		found := bytes.Contains(held, marker)
		mu.Unlock()
		if found {
			once.Do(func() { close(sent) })
		}
	})
	return proxy, sent
}
