package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
	"github.com/retrysafe/retrysafe/idempotency/redisstore"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgx and go-redis leave no goroutine behind once closed; these are the runtime's
		// and net/http's idle helpers that outlive a test by a moment.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

// upstream is the service behind the gateway under test. What it does depends on the
// path:
//
//	/pay          201 with a JSON body numbering the call
//	/block        as /pay once the test calls release
//	/held-once    as /pay once the test calls releaseKey, on a key's first call; as /pay
//	              at once on the others
//	/status/N     answers N
//	/echo         200 with the request's method, path and headers as JSON
//
// arrived says when a key's first request has reached it, so a test waits for that
// instead of polling the counts.
type upstream struct {
	*httptest.Server
	calls    atomic.Int64
	mu       sync.Mutex
	perKey   map[string]int
	uris     map[string]bool          // request URIs seen
	arrivals map[string]chan struct{} // closed at a key's first request
	gates    map[string]chan struct{} // closed by releaseKey
	blocked  chan struct{}            // closed by release, and when the test ends
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{perKey: map[string]int{}, uris: map[string]bool{}, arrivals: map[string]chan struct{}{},
		gates: map[string]chan struct{}{}, blocked: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(func() {
		u.release()
		u.Close()
	})
	return u
}

func (u *upstream) release() {
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-u.blocked:
	default:
		close(u.blocked)
	}
}

// arrived returns a channel closed once a request with key has reached the upstream.
func (u *upstream) arrived(key string) <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	return chanFor(u.arrivals, key)
}

// releaseKey lets the /held-once call on key answer.
func (u *upstream) releaseKey(key string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	close(chanFor(u.gates, key))
}

// chanFor returns m's channel for key, made on first use; u.mu is held.
func chanFor(m map[string]chan struct{}, key string) chan struct{} {
	ch, ok := m[key]
	if !ok {
		ch = make(chan struct{})
		m[key] = ch
	}
	return ch
}

func (u *upstream) callsFor(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.perKey[key]
}

func (u *upstream) sawURI(uri string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.uris[uri]
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	n := u.calls.Add(1)
	key := r.Header.Get("Idempotency-Key")
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.perKey[key]++
	nth := u.perKey[key]
	u.uris[r.URL.RequestURI()] = true
	if nth == 1 {
		close(chanFor(u.arrivals, key))
	}
	gate := chanFor(u.gates, key)
	u.mu.Unlock()
	switch {
	case r.URL.Path == "/block":
		<-u.blocked
	case r.URL.Path == "/held-once" && nth == 1:
		select {
		case <-gate:
		case <-u.blocked:
		}
	case strings.HasPrefix(r.URL.Path, "/status/"):
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/status/"))
		w.Header().Set("Retry-After", "7")
		http.Error(w, "upstream says "+strconv.Itoa(code), code)
		return
	case r.URL.Path == "/hangup":
		// Read the request, act on it (counted above), and hang up without a word.
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
		return
	case r.URL.Path == "/echo":
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"method": r.Method, "path": r.URL.Path, "host": r.Host, "header": r.Header})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Add("X-Multi", "a")
	w.Header().Add("X-Multi", "b")
	w.Header().Add("Set-Cookie", "session=s1; Path=/; HttpOnly")
	w.Header().Add("Set-Cookie", "theme=dark; Path=/")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"call":%d,"key":%q,"body":%q}`+"\n", n, key, body)
}

// clock is a settable test clock.
type clock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

// storeKinds makes a fresh, isolated store of each kind; the services' ones skip when
// the service is absent.
// Each store reads the time from clock (nil: its own clock).
var storeKinds = []struct {
	name string
	open func(t *testing.T, clock func() time.Time) idempotency.Store
}{
	{"memory", func(t *testing.T, clock func() time.Time) idempotency.Store { return memstore.NewWithClock(clock) }},
	{"sqlite", openSQLite},
	{"postgres", func(t *testing.T, clock func() time.Time) idempotency.Store {
		return openPostgresShared(t, testenv.Schema(t, "gw"), clock)
	}},
	{"redis", openRedis},
}

func openSQLite(t *testing.T, clock func() time.Time) idempotency.Store {
	s, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: filepath.Join(t.TempDir(), "gw.db"), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// openPostgresShared returns a store in schema, on a pool of its own, migrated. Two
// calls with one schema share the records (two replicas). The schema comes from
// testenv.Schema, which drops it once the pools are closed.
func openPostgresShared(t *testing.T, schema string, clock func() time.Time) idempotency.Store {
	pool := testenv.PostgresPool(t, 0)
	s, err := pgstore.New(pgstore.Config{Pool: pool, Schema: schema, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func openRedis(t *testing.T, clock func() time.Time) idempotency.Store {
	return openRedisPrefix(t, testenv.Name("gw")+":", clock, true)
}

// openRedisPrefix returns a store on its own client under prefix; owner deletes the
// prefix's keys at the end. Two calls with the same prefix share the records.
func openRedisPrefix(t *testing.T, prefix string, clock func() time.Time, owner bool) idempotency.Store {
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opt)
	t.Cleanup(func() {
		if owner {
			ctx := context.Background()
			iter := client.Scan(ctx, 0, prefix+"*", 100).Iterator()
			for iter.Next(ctx) {
				client.Del(ctx, iter.Val())
			}
		}
		_ = client.Close()
	})
	s, err := redisstore.New(redisstore.Config{Client: client, Prefix: prefix, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type fixture struct {
	t     *testing.T
	up    *upstream
	store idempotency.Store
	gw    *gateway.Gateway
	front *httptest.Server
	// open opens another store of the same kind, on a clock of its own (nil: the
	// store's own), for a test that moves time: the store is shared by tests running in
	// parallel, whose leases must not end under them.
	open func(t *testing.T, clock func() time.Time) idempotency.Store
	logs *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newFixture starts a gateway on store in front of up (a new upstream when nil).
func newFixture(t *testing.T, store idempotency.Store, up *upstream, edit func(*gateway.Config)) *fixture {
	t.Helper()
	if up == nil {
		up = newUpstream(t)
	}
	f := &fixture{t: t, up: up, store: store, logs: &syncBuffer{}}
	u, _ := url.Parse(up.URL)
	cfg := gateway.Config{
		Upstream:        u,
		UpstreamTimeout: 5 * time.Second,
		Logger:          slog.New(slog.NewJSONHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Idempotency: idempotency.Config{
			Store:   store,
			MaxBody: 1 << 10,
		},
	}
	if edit != nil {
		edit(&cfg)
	}
	gw, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.gw = gw
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	f.front = httptest.NewServer(gw)
	t.Cleanup(f.front.Close)
	return f
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (r reply) problemType() string {
	var p idempotency.Problem
	_ = json.Unmarshal([]byte(r.body), &p)
	return p.Type
}

// do sends method path with key ("" for none) and body through the gateway.
func (f *fixture) do(method, path, key, body string, hdr ...string) reply {
	f.t.Helper()
	return doAt(f.t, f.front.URL, method, path, key, body, hdr...)
}

func doAt(t *testing.T, base, method, path, key, body string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{res.StatusCode, res.Header, string(b)}
}

func (f *fixture) record(key string) (*idempotency.Record, error) {
	return f.store.Get(context.Background(), "", key)
}

// await waits up to 10s for ch, the signal of what.
func await(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestContract runs every status of the idempotency contract through the gateway on
// every store.
func TestContract(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			store := kind.open(t, nil)
			up := newUpstream(t)
			f := newFixture(t, store, up, nil)
			f.open = kind.open
			for _, c := range contractCases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.run(t, f.withT(t))
				})
			}
		})
	}
}

func (f *fixture) withT(t *testing.T) *fixture {
	g := *f
	g.t = t
	return &g
}

var contractCases = []struct {
	name string
	run  func(t *testing.T, f *fixture)
}{
	{"201 executed then replayed", func(t *testing.T, f *fixture) {
		key := testenv.Name("exec")
		first := f.do("POST", "/pay", key, `{"amount":1}`)
		if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("first: %d %v %s", first.status, first.header, first.body)
		}
		again := f.do("POST", "/pay", key, `{"amount":1}`)
		if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || again.body != first.body {
			t.Fatalf("replay: %d %v %q, first body %q", again.status, again.header, again.body, first.body)
		}
		if got := again.header.Values("X-Multi"); len(got) != 2 || got[0] != "a" || got[1] != "b" {
			t.Errorf("replayed X-Multi = %q", got)
		}
		// The replay goes only to the same key in the same scope and carries the body
		// whole: the cookies the first answer set come back too, all and in order.
		if got, want := again.header.Values("Set-Cookie"), first.header.Values("Set-Cookie"); len(want) != 2 || !slices.Equal(got, want) {
			t.Errorf("replayed Set-Cookie = %q, first answer's %q", got, want)
		}
		if n := f.up.callsFor(key); n != 1 {
			t.Fatalf("upstream called %d times", n)
		}
	}},
	{"409 in flight with Retry-After", func(t *testing.T, f *fixture) {
		// A gateway of its own, so that releasing its upstream blocks no one else.
		g := newFixture(t, f.store, nil, nil)
		key := testenv.Name("inflight")
		done := make(chan reply, 1)
		go func() { done <- doAt(t, g.front.URL, "POST", "/block", key, `{}`) }()
		await(t, "the first request upstream", g.up.arrived(key))
		dup := g.do("POST", "/block", key, `{}`)
		if dup.status != http.StatusConflict || dup.header.Get("Retry-After") == "" || dup.problemType() != idempotency.ProblemInFlight {
			t.Fatalf("duplicate: %d %v %s", dup.status, dup.header, dup.body)
		}
		g.up.release()
		if first := <-done; first.status != http.StatusCreated {
			t.Fatalf("first: %d %s", first.status, first.body)
		}
		if n := g.up.callsFor(key); n != 1 {
			t.Fatalf("upstream called %d times", n)
		}
	}},
	{"422 key reused with another body", func(t *testing.T, f *fixture) {
		key := testenv.Name("mismatch")
		if r := f.do("POST", "/pay", key, `{"amount":1}`); r.status != http.StatusCreated {
			t.Fatalf("first: %d", r.status)
		}
		r := f.do("POST", "/pay", key, `{"amount":2}`)
		if r.status != http.StatusUnprocessableEntity || r.problemType() != idempotency.ProblemMismatch ||
			!strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json") {
			t.Fatalf("reuse: %d %v %s", r.status, r.header, r.body)
		}
		if r := f.do("POST", "/other", key, `{"amount":1}`); r.status != http.StatusUnprocessableEntity {
			t.Fatalf("same key on another path: %d", r.status)
		}
	}},
	{"400 missing and invalid key", func(t *testing.T, f *fixture) {
		path := "/pay?t=" + testenv.Name("nokey")
		if r := f.do("POST", path, "", `{}`); r.status != http.StatusBadRequest || r.problemType() != idempotency.ProblemMissingKey {
			t.Fatalf("missing: %d %s", r.status, r.body)
		}
		if r := f.do("PATCH", path, "bad key", `{}`); r.status != http.StatusBadRequest || r.problemType() != idempotency.ProblemInvalidKey {
			t.Fatalf("invalid: %d %s", r.status, r.body)
		}
		if r := f.do("POST", path, strings.Repeat("k", 256), `{}`); r.status != http.StatusBadRequest {
			t.Fatalf("too long: %d %s", r.status, r.body)
		}
		if f.up.sawURI(path) {
			t.Fatal("a request without a valid key was forwarded")
		}
	}},
	{"GET is not keyed", func(t *testing.T, f *fixture) {
		if r := f.do("GET", "/echo", "", ""); r.status != http.StatusOK {
			t.Fatalf("GET: %d %s", r.status, r.body)
		}
	}},
	{"413 body too large, nothing stored", func(t *testing.T, f *fixture) {
		key := testenv.Name("large")
		r := f.do("POST", "/pay", key, strings.Repeat("x", 2<<10))
		if r.status != http.StatusRequestEntityTooLarge || r.problemType() != idempotency.ProblemBodyTooLarge {
			t.Fatalf("large: %d %s", r.status, r.body)
		}
		if _, err := f.record(key); !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("record after 413: %v", err)
		}
		if f.up.callsFor(key) != 0 {
			t.Fatal("forwarded")
		}
	}},
	{"429 and 503 passed through, key released", func(t *testing.T, f *fixture) {
		for _, code := range []int{429, 503} {
			key := testenv.Name("busy")
			path := "/status/" + strconv.Itoa(code)
			r := f.do("POST", path, key, `{}`)
			if r.status != code || !strings.Contains(r.body, "upstream says") || r.header.Get("Retry-After") != "7" {
				t.Fatalf("%d: got %d %v %s", code, r.status, r.header, r.body)
			}
			if _, err := f.record(key); !errors.Is(err, idempotency.ErrNotFound) {
				t.Fatalf("%d: record: %v", code, err)
			}
			f.do("POST", path, key, `{}`)
			if n := f.up.callsFor(key); n != 2 {
				t.Fatalf("%d: the retry was not forwarded (%d calls)", code, n)
			}
		}
	}},
	{"500 from the upstream is stored", func(t *testing.T, f *fixture) {
		key := testenv.Name("fivehundred")
		f.do("POST", "/status/500", key, `{}`)
		r := f.do("POST", "/status/500", key, `{}`)
		if r.status != 500 || r.header.Get("Idempotent-Replayed") != "true" || f.up.callsFor(key) != 1 {
			t.Fatalf("replay of 500: %d %v, %d calls", r.status, r.header, f.up.callsFor(key))
		}
	}},
	{"502 upstream down, key released", func(t *testing.T, f *fixture) {
		dead, _ := url.Parse("http://" + testenv.DeadAddr(t))
		g := newFixture(t, f.store, f.up, func(c *gateway.Config) { c.Upstream = dead })
		key := testenv.Name("down")
		for i := 0; i < 2; i++ { // released: the retry is forwarded (and fails) again, no 409
			r := g.do("POST", "/pay", key, `{}`)
			if r.status != http.StatusBadGateway || r.problemType() != gateway.ProblemUpstreamUnreachable {
				t.Fatalf("attempt %d: %d %s", i, r.status, r.body)
			}
			if _, err := g.record(key); !errors.Is(err, idempotency.ErrNotFound) {
				t.Fatalf("record after 502: %v", err)
			}
		}
		if !strings.Contains(g.logs.String(), `"upstream_error":"unreachable"`) {
			t.Errorf("log: %s", g.logs)
		}
	}},
	{"502 upstream hung up after the request, key kept", func(t *testing.T, f *fixture) {
		// The upstream read the request and may have acted on it: the outcome is unknown,
		// so the key stays in progress and a retry is not forwarded again.
		key := testenv.Name("hangup")
		r := f.do("POST", "/hangup", key, `{"amount":1}`)
		if r.status != http.StatusBadGateway || r.problemType() != gateway.ProblemUpstreamFailed {
			t.Fatalf("first: %d %s", r.status, r.body)
		}
		rec, err := f.record(key)
		if err != nil || rec.State != idempotency.StateInProgress {
			t.Fatalf("record after the hang-up: %+v %v", rec, err)
		}
		if r := f.do("POST", "/hangup", key, `{"amount":1}`); r.status != http.StatusConflict {
			t.Fatalf("retry: %d %s", r.status, r.body)
		}
		if n := f.up.callsFor(key); n != 1 {
			t.Fatalf("the upstream was called %d times, want once", n)
		}
	}},
	{"504 upstream timeout, key kept until its lease ends", func(t *testing.T, f *fixture) {
		// A gateway, an upstream and a store of their own, the store on a clock that this
		// test moves: the first call is held upstream until the timeout, the one after
		// the lease answers at once. The timeout is seconds, so that a loaded machine
		// still answers that one in time.
		clk := &clock{}
		g := newFixture(t, f.open(t, clk.now), nil, func(c *gateway.Config) {
			c.UpstreamTimeout = 2 * time.Second
			c.Idempotency.Lease = 30 * time.Second
		})
		key := testenv.Name("timeout")
		r := g.do("POST", "/block", key, `{}`)
		g.up.release()
		if r.status != http.StatusGatewayTimeout || r.problemType() != gateway.ProblemUpstreamTimeout || r.header.Get("Retry-After") != "30" {
			t.Fatalf("first: %d %v %s", r.status, r.header, r.body)
		}
		rec, err := g.record(key)
		if err != nil || rec.State != idempotency.StateInProgress {
			t.Fatalf("record after 504: %+v %v", rec, err)
		}
		if r := g.do("POST", "/block", key, `{}`); r.status != http.StatusConflict {
			t.Fatalf("retry within the lease: %d %s", r.status, r.body)
		}
		clk.advance(31 * time.Second)
		r = g.do("POST", "/block", key, `{}`)
		if r.status != http.StatusCreated {
			t.Fatalf("retry after the lease: %d %s", r.status, r.body)
		}
		if n := g.up.callsFor(key); n != 2 {
			t.Fatalf("upstream saw the key %d times, want 2 (same key forwarded again)", n)
		}
	}},
	{"client disconnect: upstream completes, retry replays", func(t *testing.T, f *fixture) {
		// A gateway of its own, so that releasing its upstream blocks no one else. The
		// client gives up once its request is upstream (held there): the key is claimed
		// and the gateway's upstream call is under way. The middleware reports the
		// request's outcome once it has stored the answer.
		key := testenv.Name("gone")
		stored := make(chan struct{})
		var once sync.Once
		g := newFixture(t, f.store, nil, func(c *gateway.Config) {
			c.Idempotency.OnOutcome = func(r *http.Request, _ idempotency.Outcome) {
				if r.Header.Get("Idempotency-Key") == key {
					once.Do(func() { close(stored) })
				}
			}
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", g.front.URL+"/block", strings.NewReader(`{"a":1}`))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		gone := make(chan error, 1)
		go func() {
			res, err := http.DefaultClient.Do(req)
			if err == nil {
				res.Body.Close()
			}
			gone <- err
		}()
		await(t, "the request upstream", g.up.arrived(key))
		cancel()
		err := <-gone
		g.up.release()
		if err == nil {
			t.Fatal("the client did not give up")
		}
		await(t, "the first request's outcome", stored)
		r := g.do("POST", "/block", key, `{"a":1}`)
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %v %s", r.status, r.header, r.body)
		}
		if n := g.up.callsFor(key); n != 1 {
			t.Fatalf("upstream called %d times", n)
		}
	}},
	{"headers forwarded: Idempotency-Key unchanged, X-Forwarded-*, no hop-by-hop", func(t *testing.T, f *fixture) {
		key := `"` + testenv.Name("fwd") + `"` // the quoted sf-string form
		r := f.do("POST", "/echo", key, `{}`, "Connection", "X-Hop", "X-Hop", "1", "X-Forwarded-For", "6.6.6.6", "X-Custom", "kept")
		if r.status != http.StatusOK {
			t.Fatalf("%d %s", r.status, r.body)
		}
		var got struct {
			Header http.Header
			Host   string
		}
		if err := json.Unmarshal([]byte(r.body), &got); err != nil {
			t.Fatal(err)
		}
		front, _ := url.Parse(f.front.URL)
		want := map[string]string{
			"Idempotency-Key":   key,
			"X-Forwarded-For":   "127.0.0.1",
			"X-Forwarded-Host":  front.Host,
			"X-Forwarded-Proto": "http",
			"X-Custom":          "kept",
			"X-Hop":             "",
			"Connection":        "",
		}
		for h, v := range want {
			if g := strings.Join(got.Header.Values(h), ","); g != v {
				t.Errorf("upstream got %s %q, want %q", h, g, v)
			}
		}
		if got.Header.Get("Request-Budget-Ms") == "" {
			t.Error("no Request-Budget-Ms forwarded")
		}
	}},
	{"scopes never share a record", func(t *testing.T, f *fixture) {
		key := testenv.Name("scope")
		a := f.do("POST", "/pay", key, `{}`, "Authorization", "Bearer alice")
		b := f.do("POST", "/pay", key, `{}`, "Authorization", "Bearer bob")
		if a.status != 201 || b.status != 201 || b.header.Get("Idempotent-Replayed") != "" || a.body == b.body {
			t.Fatalf("alice %d %q, bob %d %v %q", a.status, a.body, b.status, b.header, b.body)
		}
		if n := f.up.callsFor(key); n != 2 {
			t.Fatalf("upstream called %d times", n)
		}
	}},
	{"response too large to store: completed without its body", func(t *testing.T, f *fixture) {
		g := newFixture(t, f.store, f.up, func(c *gateway.Config) { c.Idempotency.MaxResponse = 10 })
		key := testenv.Name("bigresp")
		first := g.do("POST", "/pay", key, `{}`)
		again := g.do("POST", "/pay", key, `{}`)
		if first.status != 201 || len(first.body) <= 10 || again.status != 201 ||
			again.header.Get("Idempotent-Body-Omitted") != "true" || again.body != "" || g.up.callsFor(key) != 1 {
			t.Fatalf("first %d %q; again %d %v %q", first.status, first.body, again.status, again.header, again.body)
		}
	}},
}

// TestScopeHeader: with ScopeHeader, keys live in the principal's scope.
func TestScopeHeader(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memstore.New(), nil, func(c *gateway.Config) { c.ScopeHeader = "X-User" })
	f.do("POST", "/pay", "k1", `{}`, "X-User", "alice")
	if r := f.do("POST", "/pay", "k1", `{}`, "X-User", "alice", "Authorization", "other"); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("same principal: %d %v", r.status, r.header)
	}
	if r := f.do("POST", "/pay", "k1", `{}`, "X-User", "bob"); r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("other principal replayed")
	}
	if _, err := f.store.Get(context.Background(), "alice", "k1"); err != nil {
		t.Fatalf("record in scope alice: %v", err)
	}
}

// TestReplicasSharePostgres: two gateways on one PostgreSQL schema behave as one.
func TestReplicasSharePostgres(t *testing.T) {
	t.Parallel()
	schema := testenv.Schema(t, "gwrep")
	up := newUpstream(t)
	a := newFixture(t, openPostgresShared(t, schema, nil), up, nil)
	b := newFixture(t, openPostgresShared(t, schema, nil), up, nil)
	for k := 0; k < 5; k++ {
		key := testenv.Name("dup")
		var wg sync.WaitGroup
		replies := make(chan reply, 16)
		for i := 0; i < 16; i++ {
			base := a.front.URL
			if i%2 == 1 {
				base = b.front.URL
			}
			wg.Go(func() { replies <- doAt(t, base, "POST", "/held-once", key, `{"n":1}`) })
		}
		// The request forwarded is held upstream until the 15 others have been answered,
		// so that they all come while it is in flight; a duplicate of a key in flight is
		// answered at once. Should they not come, it is let go after 30s, and the
		// statuses below say what they got.
		var got []reply
		timeout := time.After(30 * time.Second)
	answers:
		for len(got) < 15 {
			select {
			case r := <-replies:
				got = append(got, r)
			case <-timeout:
				break answers
			}
		}
		up.releaseKey(key)
		wg.Wait()
		close(replies)
		for r := range replies {
			got = append(got, r)
		}
		if n := up.callsFor(key); n != 1 {
			t.Fatalf("key %s forwarded %d times", key, n)
		}
		for _, r := range got {
			if r.status != http.StatusCreated && r.status != http.StatusConflict {
				t.Errorf("duplicate answered %d %s", r.status, r.body)
			}
		}
		// After completion, both replicas replay.
		for _, base := range []string{a.front.URL, b.front.URL} {
			if r := doAt(t, base, "POST", "/held-once", key, `{"n":1}`); r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replica %s: %d %v", base, r.status, r.header)
			}
		}
	}
}

// TestStoreDownFailsClosed: with the store failing, 503 and nothing forwarded; with
// FailOpen, forwarded.
func TestStoreDownFailsClosed(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	_ = s.Close()
	f := newFixture(t, s, nil, nil)
	if r := f.do("POST", "/pay", "k", `{}`); r.status != http.StatusServiceUnavailable || r.problemType() != idempotency.ProblemStoreUnavailable {
		t.Fatalf("closed: %d %s", r.status, r.body)
	}
	if f.up.calls.Load() != 0 {
		t.Fatal("forwarded with the store down")
	}
	open := newFixture(t, s, nil, func(c *gateway.Config) { c.Idempotency.FailOpen = true })
	if r := open.do("POST", "/pay", "k", `{}`); r.status != http.StatusCreated {
		t.Fatalf("fail open: %d %s", r.status, r.body)
	}
	rr := httptest.NewRecorder()
	open.gw.Admin().ServeHTTP(rr, httptest.NewRequest("GET", "/readyz", nil))
	if rr.Code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the store down: %d", rr.Code)
	}
}

// TestBodyBreaksOff: an upstream whose body breaks off after the status: the client's
// connection is aborted and the key kept in progress (the upstream acted).
func TestBodyBreaksOff(t *testing.T) {
	t.Parallel()
	// A small part (held in the gateway's buffers) and a large one (the gateway has sent
	// much of it to the client's socket by the time it breaks), of answers within the
	// stored-response limit and past it.
	for _, c := range []struct {
		name          string
		sent, claimed int
	}{
		{"small", 7, 100},
		{"large", 1 << 20, 2 << 20},
		{"past the limit", 5 << 20, 6 << 20},
		{"chunked", 7, 0}, // no Content-Length: only a cut connection tells the client
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if c.claimed > 0 {
					w.Header().Set("Content-Length", strconv.Itoa(c.claimed))
				}
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write(bytes.Repeat([]byte("p"), c.sent))
				w.(http.Flusher).Flush() // the status and some of the body reach the gateway
				panic(http.ErrAbortHandler)
			}))
			t.Cleanup(up.Close)
			u, _ := url.Parse(up.URL)
			store := memstore.New()
			gw, err := gateway.New(gateway.Config{Upstream: u, Logger: slog.New(slog.DiscardHandler), Idempotency: idempotency.Config{Store: store}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
			front := httptest.NewServer(gw)
			t.Cleanup(front.Close)
			req, _ := http.NewRequest("POST", front.URL+"/x", strings.NewReader("{}"))
			req.Header.Set("Idempotency-Key", "broken")
			res, err := http.DefaultClient.Do(req)
			var got []byte
			if err == nil {
				got, err = io.ReadAll(res.Body)
				res.Body.Close()
			}
			if err == nil {
				t.Fatalf("the client got a whole answer: %d, %d of the upstream's %d bytes", res.StatusCode, len(got), c.sent)
			}
			rec, err := store.Get(context.Background(), "", "broken")
			wantState := idempotency.StateInProgress // outcome unknown: kept to its lease
			if c.sent > idempotency.DefaultMaxResponse {
				wantState = idempotency.StateDone // stored, without its body, once past the limit
			}
			if err != nil || rec.State != wantState {
				t.Fatalf("record: %+v %v; want %s", rec, err, wantState)
			}
		})
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("http://127.0.0.1:1")
	s := memstore.New()
	cases := []struct {
		name string
		cfg  gateway.Config
	}{
		{"no upstream", gateway.Config{Idempotency: idempotency.Config{Store: s}}},
		{"no store", gateway.Config{Upstream: u}},
		{"ftp upstream", gateway.Config{Upstream: &url.URL{Scheme: "ftp", Host: "x"}, Idempotency: idempotency.Config{Store: s}}},
		{"no host", gateway.Config{Upstream: &url.URL{Scheme: "http"}, Idempotency: idempotency.Config{Store: s}}},
		{"negative lease", gateway.Config{Upstream: u, Idempotency: idempotency.Config{Store: s, Lease: -1}}},
		{"ttl under lease", gateway.Config{Upstream: u, Idempotency: idempotency.Config{Store: s, TTL: time.Second, Lease: time.Minute}}},
		{"bad scope header", gateway.Config{Upstream: u, ScopeHeader: "X User", Idempotency: idempotency.Config{Store: s}}},
		{"bad method", gateway.Config{Upstream: u, Idempotency: idempotency.Config{Store: s, Methods: []string{"PO ST"}}}},
	}
	for _, c := range cases {
		if _, err := gateway.New(c.cfg); err == nil {
			t.Errorf("%s: New accepted it", c.name)
		}
	}
	for _, in := range []string{"", "localhost:8080", "ftp://x", "http://", "http://h/p?q=1", "http://[::1"} {
		if _, err := gateway.ParseUpstream(in); err == nil {
			t.Errorf("ParseUpstream(%q) accepted it", in)
		}
	}
	if u, err := gateway.ParseUpstream(" https://api.example.com/v1 "); err != nil || u.Host != "api.example.com" {
		t.Errorf("ParseUpstream: %v %v", u, err)
	}
}

// TestAdminAndMetrics: /healthz, /readyz and the metrics after some traffic.
func TestAdminAndMetrics(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memstore.New(), nil, nil)
	f.do("POST", "/pay", "m1", `{}`)
	f.do("POST", "/pay", "m1", `{}`)
	f.do("POST", "/pay", "", `{}`)
	admin := httptest.NewServer(f.gw.Admin())
	t.Cleanup(admin.Close)
	upstreamHost := strings.TrimPrefix(f.up.URL, "http://")
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/nope": 404} {
		res, err := http.Get(admin.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("%s: %d", path, res.StatusCode)
		}
		if path != "/metrics" {
			continue
		}
		for _, line := range []string{
			`retrysafe_gateway_requests_total{outcome="executed",route="/"} 1`,
			`retrysafe_gateway_requests_total{outcome="replayed",route="/"} 1`,
			`retrysafe_gateway_requests_total{outcome="missing-key",route="/"} 1`,
			`retrysafe_gateway_store_duration_seconds_count{operation="claim"} 2`,
			`retrysafe_gateway_store_duration_seconds_count{operation="complete"} 1`,
			`retrysafe_gateway_upstream_duration_seconds_count{result="2xx",upstream="` + upstreamHost + `"} 1`,
			`retrysafe_gateway_keys_in_flight 0`,
			`retrysafe_gateway_body_memory_bytes 0`,
			`retrysafe_gateway_request_duration_seconds_bucket{outcome="executed",route="/",le="+Inf"} 1`,
			`go_goroutines`,
		} {
			if !strings.Contains(string(b), line) {
				t.Errorf("/metrics lacks %q", line)
			}
		}
	}
	logs := f.logs.String()
	for _, want := range []string{`"outcome":"executed"`, `"outcome":"replayed"`, `"outcome":"missing-key"`, `"latency_ms":`, `"key":"m1"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
}

// TestRunGracefulShutdown: Run serves until its context ends, lets the request in
// flight finish and record, and returns nil.
func TestRunGracefulShutdown(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	u, _ := url.Parse(up.URL)
	store := memstore.New()
	gw, err := gateway.New(gateway.Config{Upstream: u, Logger: slog.New(slog.DiscardHandler), Idempotency: idempotency.Config{Store: store}})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := net.Listen("tcp", "127.0.0.1:0")
	ln := &closeSignal{Listener: raw, closed: make(chan struct{})}
	adminLn, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- gw.Run(ctx, ln, adminLn) }()
	// The listeners are open already: the request waits in the backlog until Run
	// serves it.
	res, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + adminLn.Addr().String() + "/readyz")
	if err != nil {
		t.Fatalf("/readyz: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("/readyz: %d", res.StatusCode)
	}
	if err := gw.Run(ctx, ln, adminLn); !errors.Is(err, gateway.ErrRunning) {
		t.Fatalf("second Run: %v", err)
	}
	base := "http://" + ln.Addr().String()
	inflight := make(chan reply, 1)
	go func() { inflight <- doAt(t, base, "POST", "/held-once", "graceful", `{}`) }()
	await(t, "the request upstream", up.arrived("graceful"))
	cancel()
	// The upstream answers only once the shutdown has begun, so the request is in
	// flight through it.
	await(t, "the shutdown to close the listener", ln.closed)
	up.releaseKey("graceful")
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if r := <-inflight; r.status != http.StatusCreated {
		t.Fatalf("in-flight request: %d %s", r.status, r.body)
	}
	rec, err := store.Get(context.Background(), "", "graceful")
	if err != nil || rec.State != idempotency.StateDone {
		t.Fatalf("record: %+v %v", rec, err)
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Fatal("still accepting after Run returned")
	}
}

// closeSignal is a listener that says when it is closed: http.Server.Shutdown closes its
// listeners first, then waits for the requests in flight.
type closeSignal struct {
	net.Listener
	once   sync.Once
	closed chan struct{}
}

func (l *closeSignal) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// TestCallerBudgetSpent: a caller whose Request-Budget-Ms is spent gets 504 before
// anything is claimed or forwarded.
func TestCallerBudgetSpent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memstore.New(), nil, nil)
	r := f.do("POST", "/pay", "spent", `{}`, "Request-Budget-Ms", "0")
	if r.status != http.StatusGatewayTimeout || f.up.calls.Load() != 0 {
		t.Fatalf("%d %s, %d upstream calls", r.status, r.body, f.up.calls.Load())
	}
	if _, err := f.record("spent"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("record: %v", err)
	}
	if !strings.Contains(f.logs.String(), `"outcome":"budget-exhausted"`) {
		t.Errorf("log: %s", f.logs)
	}
}

// TestRegisterer: metrics go to the Registerer given; a second gateway on it is refused,
// and a failed New leaves it clean.
func TestRegisterer(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	u, _ := url.Parse("http://127.0.0.1:1")
	if _, err := gateway.New(gateway.Config{Upstream: u, Registerer: reg, Idempotency: idempotency.Config{Store: memstore.New(), TTL: time.Second, Lease: time.Minute}}); err == nil {
		t.Fatal("TTL under Lease accepted")
	}
	gw, err := gateway.New(gateway.Config{Upstream: u, Registerer: reg, Idempotency: idempotency.Config{Store: memstore.New()}})
	if err != nil {
		t.Fatalf("after a failed New: %v", err)
	}
	if _, err := gateway.New(gateway.Config{Upstream: u, Registerer: reg, Idempotency: idempotency.Config{Store: memstore.New()}}); err == nil {
		t.Fatal("a second gateway on one registry")
	}
	rr := httptest.NewRecorder()
	gw.Admin().ServeHTTP(rr, httptest.NewRequest("GET", "/metrics", nil))
	if rr.Code != 200 || !strings.Contains(rr.Body.String(), "retrysafe_gateway_keys_in_flight") {
		t.Fatalf("/metrics: %d", rr.Code)
	}
}
