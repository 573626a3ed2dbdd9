package console_test

// Tests of the console in a real headless Chromium, against the real gateway in front of
// an upstream that counts its executions, a PostgreSQL store and a RabbitMQ dead-letter
// queue.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/console"
	"github.com/retrysafe/retrysafe/console/history"
	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/gateway/configfile"
	"github.com/retrysafe/retrysafe/harness/rabbitqueue"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/rabbitmq"
	"github.com/retrysafe/retrysafe/retry"
)

const chromiumPath = "/usr/bin/chromium"

// browser is a headless Chromium tab that records every console message, uncaught
// exception and log entry (CSP violations, failed loads) of the pages it shows.
type browser struct {
	ctx  context.Context
	mu   sync.Mutex
	errs []string
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if testenv.Required() {
			t.Fatalf("no Chromium at %s (apt-get install -y chromium): %v", chromiumPath, err)
		}
		t.Skipf("no Chromium at %s (apt-get install -y chromium); set RETRYSAFE_REQUIRE_SERVICES=1 to fail instead", chromiumPath)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true),
		chromedp.WindowSize(1360, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	b := &browser{}
	ctx, cancelTab := chromedp.NewContext(actx, chromedp.WithListener(func(ev any) {
		var msg string
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			var args []string
			for _, a := range ev.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			msg = "console." + string(ev.Type) + ": " + strings.Join(args, " ")
		case *runtime.EventExceptionThrown:
			msg = "exception: " + ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				msg += " " + ev.ExceptionDetails.Exception.Description
			}
		case *cdplog.EventEntryAdded:
			msg = "log " + string(ev.Entry.Level) + " " + string(ev.Entry.Source) + ": " + ev.Entry.Text + " " + ev.Entry.URL
		default:
			return
		}
		b.mu.Lock()
		b.errs = append(b.errs, msg)
		b.mu.Unlock()
	}))
	b.ctx = ctx
	// The first run starts the browser, on a context without a deadline: the browser
	// lives as long as it.
	if err := chromedp.Do(ctx); err != nil {
		cancelTab()
		cancelAlloc()
		t.Fatalf("starting Chromium: %v", err)
	}
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	return b
}

// do runs the steps with a bound, failing t on an error.
func (b *browser) do(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		loc, _ := chromedp.Run(b.ctx, chromedp.Location())
		txt, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		t.Fatalf("%s (at %s): %v; the page says:\n%s", what, loc, err, txt)
	}
}

// get runs one action that returns a value, with a bound, failing t on an error.
func value[T any](t *testing.T, b *browser, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// clean fails t when any page shown so far wrote to its console, threw, or logged
// (a CSP violation, a failed load), but for the entries that contain one of allowed.
func (b *browser) clean(t *testing.T, allowed ...string) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
next:
	for _, e := range b.errs {
		for _, a := range allowed {
			if strings.Contains(e, a) {
				continue next
			}
		}
		t.Errorf("the browser reported: %s", e)
	}
	b.errs = nil
}

// text returns the visible text of the page's main element.
func (b *browser) text(t *testing.T) string {
	t.Helper()
	return value(t, b, "reading the page", chromedp.Text(chromedp.CSS("main")))
}

// screenshot saves the page as a PNG in the test's directory, or in
// $RETRYSAFE_SCREENSHOTS when set (how docs/console-*.png are made).
func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	png := value(t, b, "screenshot", chromedp.FullScreenshot(100))
	dir := os.Getenv("RETRYSAFE_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	if len(png) < 1000 || string(png[1:4]) != "PNG" {
		t.Errorf("screenshot %s is not a PNG (%d bytes)", name, len(png))
	}
	t.Logf("screenshot %s (%d bytes)", path, len(png))
}

// countingUpstream is an API that counts its executions, by Idempotency-Key.
type countingUpstream struct {
	srv *httptest.Server
	n   atomic.Int64
	mu  sync.Mutex
	per map[string]int
}

func newUpstream(t *testing.T) *countingUpstream {
	u := &countingUpstream{per: map[string]int{}}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.n.Add(1)
		u.mu.Lock()
		u.per[r.Header.Get("Idempotency-Key")]++
		n := u.per[r.Header.Get("Idempotency-Key")]
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Execution", strconv.Itoa(n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":"p-%d","amount":%s,"note":"<b>not markup</b>"}`, u.n.Load(), strings.TrimSpace(string(body)))
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *countingUpstream) executions(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.per[key]
}

// send posts body to the gateway at addr with the key, and returns the status and
// whether it was a replay.
func send(t *testing.T, addr, path, key, body string) (int, bool) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, res.Header.Get("Idempotent-Replayed") == "true"
}

// stack is the gateway with its console on the admin listener, over real services.
type stack struct {
	store    idempotency.Store
	upstream *countingUpstream
	hist     *history.History
	proxy    string // the gateway's address
	admin    string // the admin listener's URL
	queue    string
	dlq      *rabbitmq.DeadLetters
	rabbit   string
	consumed chan *redeliver.Message // messages a healthy consumer of the queue handled
}

func newStack(t *testing.T, opt console.Options) *stack {
	t.Helper()
	s := &stack{upstream: newUpstream(t)}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	schema := testenv.Schema(t, "console")
	pool := testenv.PostgresPool(t, 0)
	pg, err := pgstore.New(pgstore.Config{Pool: pool, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.store = pg
	up, _ := url.Parse(s.upstream.srv.URL)
	cfg := gateway.Config{Upstream: up, Logger: logger, Registerer: prometheus.NewRegistry(),
		Routes:      []gateway.Route{{Pattern: "POST /payments"}, {Pattern: "POST /refunds"}},
		Idempotency: idempotency.Config{Store: pg}}
	gw, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.hist = history.New(gw.Gatherer(), history.Options{})
	if err := s.hist.Sample(); err != nil {
		t.Fatal(err)
	}
	s.rabbitDLQ(t)
	opt.Store, opt.History, opt.Logger, opt.StoreName = pg, s.hist, logger, "postgres "+schema
	opt.RouteTable = (&configfile.File{Gateway: cfg}).WriteTable
	opt.DeadLetters = map[string]redeliver.DeadLetters{s.queue: s.dlq}
	c, err := console.New(opt)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.proxy, s.admin = ln.Addr().String(), "http://"+adminLn.Addr().String()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.RunWith(ctx, ln, adminLn, gateway.AdminConfig{Console: c, Token: opt.AdminToken}) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("gateway: %v", err)
		}
	})
	return s
}

// rabbitDLQ puts one dead letter in the DLQ of a fresh RabbitMQ work queue (a consumer
// whose handler refuses it), and opens the DLQ as the console does.
func (s *stack) rabbitDLQ(t *testing.T) {
	t.Helper()
	s.rabbit = testenv.AMQPURL(t)
	s.queue = testenv.Name("console") + ".payments"
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, admin := rabbitqueue.Open(ctx, t, s.rabbit, s.queue, logger)
	topo := src.Topology()
	pub, err := rabbitmq.NewPublisher(ctx, rabbitmq.PublisherConfig{URL: s.rabbit})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(ctx, s.queue, &redeliver.Message{ID: "refund-7", Body: []byte(`{"refund":7}`),
		ContentType: "application/json"}); err != nil {
		t.Fatal(err)
	}
	c, err := redeliver.New(redeliver.Config{Source: src, Logger: logger, ShutdownGrace: 5 * time.Second,
		Handler: func(context.Context, *redeliver.Message) error {
			return retry.Permanent(errors.New("ledger refused the refund"))
		}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	testenv.Eventually(t, 20*time.Second, func() bool {
		ch, err := admin.Channel()
		if err != nil {
			return false
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(topo.DLQ, true, false, false, false, nil)
		return err == nil && q.Messages == 1
	}, "the message in the DLQ")
	stop()
	if err := <-done; err != nil {
		t.Fatalf("consumer: %v", err)
	}
	s.dlq, err = rabbitmq.OpenDeadLetters(ctx, rabbitmq.DeadLettersConfig{URL: s.rabbit, Queue: s.queue})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.dlq.Close() })
}

// consume runs a healthy consumer of the work queue until t ends; what it handles
// goes to s.consumed.
func (s *stack) consume(t *testing.T) {
	t.Helper()
	s.consumed = make(chan *redeliver.Message, 10)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, stop := context.WithCancel(context.Background())
	src, err := rabbitmq.NewSource(ctx, rabbitmq.Config{URL: s.rabbit, Queue: s.queue, Logger: logger})
	if err != nil {
		stop()
		t.Fatal(err)
	}
	c, err := redeliver.New(redeliver.Config{Source: src, Logger: logger, ShutdownGrace: 5 * time.Second,
		Handler: func(_ context.Context, m *redeliver.Message) error {
			s.consumed <- m
			return nil
		}})
	if err != nil {
		stop()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
}

// TestBrowser: an operator's night in a real browser. A key made through the gateway
// is found, shown and evicted from the page, and the next request with it executes
// again; the outcomes chart shows the requests made; a dead letter is replayed from the
// page and consumed; no page writes to the browser's console.
func TestBrowser(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	s := newStack(t, console.Options{})
	key := "pay-" + testenv.Name("k")

	if st, replay := send(t, s.proxy, "/payments", key, `100`); st != http.StatusCreated || replay {
		t.Fatalf("first request: %d replay=%v", st, replay)
	}
	if st, replay := send(t, s.proxy, "/payments", key, `100`); st != http.StatusCreated || !replay {
		t.Fatalf("retry: %d replay=%v, want the replay", st, replay)
	}
	if st, _ := send(t, s.proxy, "/payments", key, `999`); st != http.StatusUnprocessableEntity {
		t.Fatalf("reuse with another body: %d, want 422", st)
	}
	for i := range 3 {
		send(t, s.proxy, "/payments", fmt.Sprintf("%s-other-%d", key, i), `5`)
	}
	if n := s.upstream.executions(key); n != 1 {
		t.Fatalf("the upstream ran the key %d times before the eviction, want 1", n)
	}

	// The search finds the key; its page shows the stored response, escaped.
	b.do(t, "searching", chromedp.Navigate(s.admin+"/"), chromedp.WaitVisible(chromedp.CSS("form.search")),
		chromedp.SendKeys(chromedp.CSS(`input[name="key"]`), key),
		chromedp.Click(chromedp.CSS(`form.search button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("table.records td.key a")))
	if txt := b.text(t); !strings.Contains(txt, key) || !strings.Contains(txt, "done") || !strings.Contains(txt, "201") {
		t.Fatalf("the search result lacks the key, its state or status:\n%s", txt)
	}
	// Records of other states, written through the store's own API: one stuck (in
	// progress past its lease), one in progress, one abandoned by its owner.
	ctx := context.Background()
	scope := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	claim := func(key string, lease time.Duration) int64 {
		res, err := s.store.Claim(ctx, idempotency.ClaimRequest{Scope: scope, Key: key, Fingerprint: "fp", Lease: lease, TTL: time.Hour})
		if err != nil || !res.Claimed {
			t.Fatalf("claim %s: %v %+v", key, err, res)
		}
		return res.Token
	}
	stuckKey := "refund-" + testenv.Name("stuck")
	claim(stuckKey, 20*time.Millisecond)
	claim("charge-"+testenv.Name("running"), 10*time.Minute)
	abandoned := "payout-" + testenv.Name("abandoned")
	if err := s.store.Abandon(ctx, scope, abandoned, claim(abandoned, 10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the stuck record's lease runs out, on PostgreSQL's clock
	b.do(t, "the stuck filter", chromedp.Navigate(s.admin+"/keys?stuck=1"), chromedp.WaitVisible(chromedp.CSS("table.records")))
	if txt := b.text(t); !strings.Contains(txt, stuckKey) || strings.Contains(txt, abandoned) || strings.Contains(txt, key) {
		t.Errorf("the stuck filter shows:\n%s", txt)
	}
	b.do(t, "showing all keys", chromedp.Navigate(s.admin+"/keys"), chromedp.WaitVisible(chromedp.CSS("table.records")))
	if n := value(t, b, "counting the badges", chromedp.Evaluate[int](`document.querySelectorAll(".badge.stuck").length`)); n != 1 {
		t.Errorf("%d stuck badges on the keys page, want 1", n)
	}
	b.screenshot(t, "console-keys.png")
	// The stuck record taken over: its page counts the takeover (PostgreSQL counts them).
	claim(stuckKey, time.Minute)
	b.do(t, "opening the taken-over record", chromedp.Navigate(s.admin+"/keys/record?"+url.Values{"scope": {scope}, "key": {stuckKey}}.Encode()),
		chromedp.WaitVisible(chromedp.CSS("dl")))
	if txt := b.text(t); !strings.Contains(txt, "2 (1 takeover of a claim") {
		t.Errorf("the taken-over record's page does not count its takeover:\n%s", txt)
	}
	b.do(t, "opening the record", chromedp.Navigate(s.admin+"/keys?key="+url.QueryEscape(key)+"&state=done"),
		chromedp.WaitVisible(chromedp.CSS("table.records td.key a")),
		chromedp.Click(chromedp.CSS("table.records td.key a")), chromedp.WaitVisible(chromedp.CSS("pre.body")))
	body := value(t, b, "reading the body", chromedp.Text(chromedp.CSS("pre.body")))
	html := value(t, b, "reading the body", chromedp.OuterHTML(chromedp.CSS("pre.body")))
	if !strings.Contains(body, "<b>not markup</b>") || strings.Contains(html, "<b>") {
		t.Errorf("the body is not shown as escaped text: %s", html)
	}
	if txt := b.text(t); !strings.Contains(txt, "X-Execution") || !strings.Contains(txt, "Fencing token") {
		t.Errorf("the record page lacks the headers or the token:\n%s", txt)
	}
	b.screenshot(t, "console-record.png")

	// Evict, confirmed on its own page: the store no longer has the key, and the next
	// request with it executes again.
	b.do(t, "evicting", chromedp.Click(chromedp.CSS(`a.button.danger`)), chromedp.WaitVisible(chromedp.CSS("#confirm-evict")))
	if _, err := s.store.Get(context.Background(), "", key); err != nil {
		t.Fatalf("the confirmation page changed the store: %v", err)
	}
	b.do(t, "confirming", chromedp.Click(chromedp.CSS("#confirm-evict")), chromedp.WaitVisible(chromedp.CSS("p.flash")))
	if txt := b.text(t); !strings.Contains(txt, "Evicted key") {
		t.Errorf("no confirmation of the eviction:\n%s", txt)
	}
	if _, err := s.store.Get(context.Background(), "", key); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("after the eviction the store says %v, want ErrNotFound", err)
	}
	if st, replay := send(t, s.proxy, "/payments", key, `100`); st != http.StatusCreated || replay {
		t.Fatalf("request after the eviction: %d replay=%v, want a new execution", st, replay)
	}
	if n := s.upstream.executions(key); n != 2 {
		t.Fatalf("the upstream ran the key %d times after the eviction, want 2", n)
	}

	// The chart shows the requests: 5 executed (1 + 3 others + 1 after the eviction),
	// 1 replayed, 1 mismatch.
	if err := s.hist.Sample(); err != nil {
		t.Fatal(err)
	}
	b.do(t, "outcomes", chromedp.Navigate(s.admin+"/outcomes"), chromedp.WaitVisible(chromedp.CSS("section.chart svg")))
	label := value(t, b, "reading the chart", chromedp.AttributeValue(chromedp.CSS("section.chart svg"), "aria-label")).Value
	segments := value(t, b, "reading the bars", chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll("section.chart svg g.bars rect title")).map(t => t.textContent)`))
	if want := "POST /payments: 5 executed, 1 replayed, 1 422 mismatch"; label != want {
		t.Errorf("the chart says %q, want %q", label, want)
	}
	sum := map[string]int{}
	for _, seg := range segments {
		// "15:04 executed: 4"
		name, n, found := strings.Cut(seg[strings.Index(seg, " ")+1:], ": ")
		v, err := strconv.Atoi(n)
		if !found || err != nil {
			t.Fatalf("a bar's title %q", seg)
		}
		sum[name] += v
	}
	if sum["executed"] != 5 || sum["replayed"] != 1 || sum["422 mismatch"] != 1 || len(sum) != 3 {
		t.Errorf("the bars add up to %v, want 5 executed, 1 replayed, 1 422 mismatch", sum)
	}
	if n := int(s.upstream.n.Load()); n != sum["executed"] {
		t.Errorf("the upstream executed %d requests, the chart shows %d", n, sum["executed"])
	}
	if txt := b.text(t); !strings.Contains(txt, "claim") {
		t.Errorf("no store latency of the claims:\n%s", txt)
	}
	b.screenshot(t, "console-outcomes.png")

	// The routes page shows the table.
	b.do(t, "routes", chromedp.Navigate(s.admin+"/routes"), chromedp.WaitVisible(chromedp.CSS("table.routes")))
	if txt := b.text(t); !strings.Contains(txt, "POST /payments") || !strings.Contains(txt, "required") {
		t.Errorf("the routes page:\n%s", txt)
	}
	b.screenshot(t, "console-routes.png")

	// The dead letter: listed with its reason and attempts, shown, replayed with a
	// fresh attempt count and consumed by a real consumer.
	s.consume(t)
	b.do(t, "dead letters", chromedp.Navigate(s.admin+"/dlq"), chromedp.WaitVisible(chromedp.CSS("input.pick")))
	if txt := b.text(t); !strings.Contains(txt, "refund-7") || !strings.Contains(txt, "ledger refused the refund") {
		t.Errorf("the DLQ page:\n%s", txt)
	}
	b.screenshot(t, "console-dlq.png")
	b.do(t, "showing the dead letter", chromedp.Click(chromedp.CSS("td.key a")), chromedp.WaitVisible(chromedp.CSS("#replay-one")))
	if txt := b.text(t); !strings.Contains(txt, `{"refund":7}`) {
		t.Errorf("the dead letter's page:\n%s", txt)
	}
	b.do(t, "selecting", chromedp.Navigate(s.admin+"/dlq"), chromedp.WaitVisible(chromedp.CSS("input.pick")),
		chromedp.Click(chromedp.CSS("#select-all")))
	if picked := value(t, b, "reading the boxes", chromedp.Evaluate[int](`document.querySelectorAll("input.pick:checked").length`)); picked != 1 {
		t.Fatalf("select all checked %d boxes, want 1", picked)
	}
	b.do(t, "replaying", chromedp.Click(chromedp.CSS("#replay-selected")), chromedp.WaitVisible(chromedp.CSS("p.flash")))
	if txt := b.text(t); !strings.Contains(txt, "Replayed 1 dead letter") {
		t.Errorf("no confirmation of the replay:\n%s", txt)
	}
	select {
	case m := <-s.consumed:
		if m.ID != "refund-7" || m.Attempt != 1 || string(m.Body) != `{"refund":7}` {
			t.Errorf("consumed %q attempt %d body %q, want refund-7 at attempt 1", m.ID, m.Attempt, m.Body)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the replayed dead letter was not consumed")
	}
	if left, err := s.dlq.List(context.Background(), 0); err != nil || len(left) != 0 {
		t.Errorf("the DLQ after the replay: %d left, %v", len(left), err)
	}
	b.clean(t)

	// CSRF: a POST without the token is refused and changes nothing.
	send(t, s.proxy, "/payments", key+"-csrf", `1`)
	res, err := http.PostForm(s.admin+"/keys/evict", url.Values{"scope": {`""`}, "key": {key + "-csrf"}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("POST without the CSRF token: %d, want 403", res.StatusCode)
	}
	if _, err := s.store.Get(context.Background(), "", key+"-csrf"); err != nil {
		t.Errorf("the refused POST deleted the key: %v", err)
	}
	// The probes and /metrics stay where they were.
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		res, err := http.Get(s.admin + p)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", p, res.StatusCode)
		}
	}
}

// TestBrowserRouteFilter: keys made through two routes of the gateway (and its
// catch-all) are filed under their routes' patterns; choosing one route in the keys
// page's filter shows that route's keys only, and a record's page names its route.
func TestBrowserRouteFilter(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	s := newStack(t, console.Options{})
	base := testenv.Name("rt")
	pays := []string{base + "-pay-1", base + "-pay-2"}
	refunds := []string{base + "-refund-1", base + "-refund-2"}
	other := base + "-other"
	for _, k := range pays {
		if st, _ := send(t, s.proxy, "/payments", k, `10`); st != http.StatusCreated {
			t.Fatalf("payment %s: %d", k, st)
		}
	}
	for _, k := range refunds {
		if st, _ := send(t, s.proxy, "/refunds", k, `3`); st != http.StatusCreated {
			t.Fatalf("refund %s: %d", k, st)
		}
	}
	if st, _ := send(t, s.proxy, "/other", other, `1`); st != http.StatusCreated {
		t.Fatalf("the catch-all: %d", st)
	}
	if err := s.hist.Sample(); err != nil {
		t.Fatal(err)
	}
	b.do(t, "the keys page", chromedp.Navigate(s.admin+"/keys"), chromedp.WaitVisible(chromedp.CSS(`select[name="route"]`)))
	routes := value(t, b, "reading the route choices", chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('select[name="route"] option')).map(o => o.value)`))
	if want := []string{"", "/", "POST /payments", "POST /refunds"}; strings.Join(routes, "|") != strings.Join(want, "|") {
		t.Errorf("the route filter offers %q, want %q", routes, want)
	}
	b.do(t, "filtering by route", chromedp.SetValue(chromedp.CSS(`select[name="route"]`), "POST /refunds"),
		chromedp.Click(chromedp.CSS(`form.search button[type="submit"]`)),
		chromedp.WaitReady(chromedp.CSS(`select[name="route"] option[value="POST /refunds"][selected]`)),
		chromedp.WaitVisible(chromedp.CSS("table.records td.key a")))
	loc := value(t, b, "reading the address", chromedp.Location())
	if u, err := url.Parse(loc); err != nil || u.Query().Get("route") != "POST /refunds" {
		t.Errorf("the filtered page is %s, want route=POST /refunds in its query", loc)
	}
	shown := value(t, b, "reading the keys", chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll("table.records td.key a")).map(a => a.textContent)`))
	if strings.Join(shown, " ") != strings.Join(refunds, " ") {
		t.Errorf("filtered by POST /refunds the page shows %q, want %q", shown, refunds)
	}
	cells := value(t, b, "reading the routes", chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll("table.records td.route")).map(td => td.textContent)`))
	if strings.Join(cells, "|") != "POST /refunds|POST /refunds" {
		t.Errorf("the Route column says %q", cells)
	}
	b.screenshot(t, "console-keys-route.png")
	b.do(t, "the catch-all's keys", chromedp.Navigate(s.admin+"/keys?route=%2F"), chromedp.WaitVisible(chromedp.CSS("table.records td.key a")))
	if txt := b.text(t); !strings.Contains(txt, other) || strings.Contains(txt, pays[0]) || strings.Contains(txt, refunds[0]) {
		t.Errorf("filtered by / the page shows:\n%s", txt)
	}
	b.do(t, "a payment's record", chromedp.Navigate(s.admin+"/keys/record?"+url.Values{"scope": {`""`}, "key": {pays[1]}}.Encode()),
		chromedp.WaitVisible(chromedp.CSS("dd.route")))
	if got := value(t, b, "reading the route", chromedp.Text(chromedp.CSS("dd.route"))); got != "POST /payments" {
		t.Errorf("the record page's route is %q, want POST /payments", got)
	}
	b.clean(t)
}

// TestBrowserReadOnlyAndToken: a read-only console shows no action and refuses the
// POST; a console with an admin token shows only its login form until given the token.
func TestBrowserReadOnlyAndToken(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	const token = "night-shift-token"
	s := newStack(t, console.Options{ReadOnly: true, AdminToken: token})
	key := "ro-" + testenv.Name("k")
	send(t, s.proxy, "/payments", key, `1`)

	// No token: the login form, nothing else; the API refuses too.
	b.do(t, "opening", chromedp.Navigate(s.admin+"/keys?key="+url.QueryEscape(key)), chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)))
	if txt := b.text(t); strings.Contains(txt, key) {
		t.Errorf("the login page shows the key:\n%s", txt)
	}
	for _, p := range []string{"/keys", "/metrics"} {
		res, err := http.Get(s.admin + p)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d, want 401", p, res.StatusCode)
		}
	}
	b.do(t, "logging in with a wrong token", chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), "wrong"),
		chromedp.Submit(chromedp.CSS(`input[name="token"]`)), chromedp.WaitVisible(chromedp.CSS("p.error")))
	b.do(t, "logging in", chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.Submit(chromedp.CSS(`input[name="token"]`)), chromedp.WaitVisible(chromedp.CSS("table.records td.key a")))
	if txt := b.text(t); !strings.Contains(txt, key) {
		t.Errorf("after the login the search does not show the key:\n%s", txt)
	}

	// Read-only: no eviction offered, on the list or the record; no replay or purge.
	count := func(what, sel string) int {
		return value(t, b, what, chromedp.Evaluate[int](`document.querySelectorAll("`+sel+`").length`))
	}
	n := count("counting the buttons", "a.danger, button.danger, #confirm-evict")
	if n != 0 {
		t.Errorf("the read-only keys page has %d eviction buttons", n)
	}
	b.do(t, "the record", chromedp.Click(chromedp.CSS("td.key a")), chromedp.WaitVisible(chromedp.CSS("dl.card")))
	n = count("counting the buttons", "a.danger, button.danger")
	if n != 0 {
		t.Errorf("the read-only record page has %d eviction buttons", n)
	}
	b.do(t, "the DLQ", chromedp.Navigate(s.admin+"/dlq"), chromedp.WaitVisible(chromedp.CSS("table.records")))
	n = count("counting the boxes", "input.pick, #replay-selected, #purge-selected")
	if n != 0 {
		t.Errorf("the read-only DLQ page has %d selection boxes or buttons", n)
	}
	b.clean(t, "401 (Unauthorized)")

	// The POST, even with the token and a CSRF field, is refused.
	req, _ := http.NewRequest(http.MethodPost, s.admin+"/keys/evict", strings.NewReader(url.Values{"scope": {`""`}, "key": {key}, "csrf": {"x"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("read-only POST: %d, want 403", res.StatusCode)
	}
	if _, err := s.store.Get(context.Background(), "", key); err != nil {
		t.Errorf("the read-only console deleted the key: %v", err)
	}
}
