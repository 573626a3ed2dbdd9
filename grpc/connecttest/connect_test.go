package connecttest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/retrysafe/retrysafe/harness/tcpproxy"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/retry"
	"github.com/retrysafe/retrysafe/storedsn"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const procedure = "/retrysafe.test.Orders/Create"

// orders is the connect-go service: it counts executions by request value and answers by
// the value's prefix.
type orders struct {
	mu      sync.Mutex
	execs   map[string]int
	holds   map[string]chan struct{}
	started chan string
	after   func(value string, n int) // runs after the work, before the answer
}

func (o *orders) count(v string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.execs[v]
}

func (o *orders) hold(t *testing.T, v string) (release func()) {
	ch := make(chan struct{})
	o.mu.Lock()
	o.holds[v] = ch
	o.mu.Unlock()
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	return release
}

func (o *orders) create(ctx context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
	v := req.Msg.GetValue()
	o.mu.Lock()
	o.execs[v]++
	n := o.execs[v]
	hold := o.holds[v]
	o.mu.Unlock()
	if hold != nil {
		o.started <- v
		<-hold
	}
	switch {
	case strings.HasPrefix(v, "gives-up") && n == 1:
		o.started <- v
		<-ctx.Done()
		return nil, ctx.Err()
	case strings.HasPrefix(v, "unavailable-once") && n == 1:
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("not now: nothing was done"))
	case strings.HasPrefix(v, "internal"):
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("failed after the work, execution %d", n))
	}
	if o.after != nil {
		o.after(v, n)
	}
	resp := connect.NewResponse(wrapperspb.String(fmt.Sprintf("%s execution %d", v, n)))
	resp.Header().Set("X-Exec", fmt.Sprint(n))
	resp.Trailer().Set("X-Done", v)
	return resp, nil
}

// server serves orders behind the middleware of cfg (a memory store unless set), over
// TLS with HTTP/2, so that the gRPC protocol works too.
func server(t *testing.T, cfg idempotency.Config) (*orders, *httptest.Server, *idempotency.Middleware) {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = openStore(t, "memory")
	}
	m, err := idempotency.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o := &orders{execs: map[string]int{}, holds: map[string]chan struct{}{}, started: make(chan string, 8)}
	mux := http.NewServeMux()
	mux.Handle(procedure, connect.NewUnaryHandler(procedure, o.create))
	srv := httptest.NewUnstartedServer(m.Handler(mux))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Close()
		_ = m.Shutdown(context.Background())
	})
	return o, srv, m
}

func openStore(t *testing.T, kind string) idempotency.Store {
	t.Helper()
	dsn := "memory:"
	switch kind {
	case "sqlite":
		dsn = "sqlite:" + filepath.Join(t.TempDir(), "keys.db")
	case "postgres":
		dsn = testenv.PostgresURL(t) + "&schema=" + testenv.Schema(t, "connecttest")
	}
	ctx := context.Background()
	o, err := storedsn.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	if err := o.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return o.Store
}

// protocols are the wire protocols a connect-go client speaks.
var protocols = []struct {
	name string
	opts []connect.ClientOption
}{
	{"connect+proto", nil},
	{"connect+json", []connect.ClientOption{connect.WithProtoJSON()}},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	{"grpc-web", []connect.ClientOption{connect.WithGRPCWeb()}},
}

// client is a connect-go client of srv whose HTTP client retries through
// retry.Transport with tr's settings (no retries when tr is nil).
func client(t *testing.T, srv *httptest.Server, tr *retry.Transport, addr string, opts ...connect.ClientOption) *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue] {
	t.Helper()
	base := srv.Client().Transport.(*http.Transport).Clone()
	if addr != "" { // through a proxy: dial it, and verify the server's certificate as usual
		base.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	}
	var rt http.RoundTripper = base
	if tr != nil {
		tr.Base = base
		rt = tr
	}
	return connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](&http.Client{Transport: rt}, srv.URL+procedure, opts...)
}

// call sends v under key ("" for none).
func call(ctx context.Context, c *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue], key, v string) (*connect.Response[wrapperspb.StringValue], error) {
	req := connect.NewRequest(wrapperspb.String(v))
	if key != "" {
		req.Header().Set("Idempotency-Key", key)
	}
	return c.CallUnary(ctx, req)
}

func replayed(r *connect.Response[wrapperspb.StringValue]) bool {
	return r != nil && r.Header().Get("Idempotent-Replayed") == "true"
}

// retryDelay returns the RetryInfo delay among err's Connect details, or -1.
func retryDelay(err error) time.Duration {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return -1
	}
	for _, d := range ce.Details() {
		if m, derr := d.Value(); derr == nil {
			if ri, ok := m.(*errdetails.RetryInfo); ok {
				return ri.GetRetryDelay().AsDuration()
			}
		}
	}
	return -1
}

// instant is a retry.Clock whose waits end at once.
type instant struct{}

func (instant) Now() time.Time { return time.Now() }

func (instant) After(time.Duration) (<-chan time.Time, func() bool) {
	ch := make(chan time.Time, 1)
	ch <- time.Now()
	return ch, func() bool { return false }
}

// TestContract: for every protocol a connect-go client speaks, on SQLite: a retry is
// replayed with the same message, headers and trailers; a key reused with another
// request, a missing key and a key in flight are errors with the codes that say so.
func TestContract(t *testing.T) {
	t.Parallel()
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			o, srv, _ := server(t, idempotency.Config{Store: openStore(t, "sqlite"), Conflict: idempotency.ConflictReject})
			c := client(t, srv, nil, "", p.opts...)
			ctx := t.Context()

			first, err := call(ctx, c, "k1", "order-1")
			if err != nil {
				t.Fatal(err)
			}
			second, err := call(ctx, c, "k1", "order-1")
			if err != nil || !replayed(second) || second.Msg.GetValue() != first.Msg.GetValue() ||
				second.Header().Get("X-Exec") != "1" || second.Trailer().Get("X-Done") != "order-1" || o.count("order-1") != 1 {
				t.Fatalf("retry: %v %v (replayed %v, header %v, trailer %v), executions %d; want the first answer replayed",
					second, err, replayed(second), second.Header(), second.Trailer(), o.count("order-1"))
			}

			if _, err := call(ctx, c, "k1", "order-2"); connect.CodeOf(err) != connect.CodeFailedPrecondition {
				t.Errorf("the key reused with another request: %v, want failed_precondition", err)
			}
			if _, err := call(ctx, c, "", "order-3"); connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Errorf("no key: %v, want invalid_argument", err)
			}
			if o.count("order-2")+o.count("order-3") != 0 {
				t.Errorf("refused calls ran")
			}

			release := o.hold(t, "slow")
			done := make(chan error, 1)
			go func() { _, err := call(ctx, c, "k-slow", "slow"); done <- err }()
			<-o.started
			_, err = call(ctx, c, "k-slow", "slow")
			if connect.CodeOf(err) != connect.CodeAborted || retryDelay(err) < time.Second {
				t.Errorf("a duplicate in flight: %v (retry delay %v), want aborted with a RetryInfo", err, retryDelay(err))
			}
			release()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRetryTransport: retry.Transport under a connect-go client (Connect protocol) retries what the
// middleware and the service say may be retried, with the same key: a duplicate in
// flight until the answer is stored, a method that answered unavailable (the key was
// released), and never a reused key.
func TestRetryTransport(t *testing.T) {
	t.Parallel()
	for _, p := range protocols[:2] {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			o, srv, _ := server(t, idempotency.Config{Conflict: idempotency.ConflictReject})
			var retries atomic.Int64
			var onRetry func()
			tr := &retry.Transport{AutoKey: true, NoBudget: true, Policy: retry.Policy{MaxAttempts: 50, Clock: instant{}},
				OnRetry: func(*http.Request, retry.Attempt) {
					retries.Add(1)
					if onRetry != nil {
						onRetry()
					}
				}}
			c := client(t, srv, tr, "", p.opts...)
			ctx := t.Context()

			r, err := call(ctx, c, "", "unavailable-once")
			if err != nil || replayed(r) || o.count("unavailable-once") != 2 {
				t.Fatalf("unavailable once: %v (replayed %v), executions %d; want success on a second execution", err, replayed(r), o.count("unavailable-once"))
			}

			release := o.hold(t, "slow")
			done := make(chan error, 1)
			go func() { _, err := call(ctx, c, "k-slow", "slow"); done <- err }()
			<-o.started
			onRetry = release // the duplicate's first 409 lets the first call finish
			r, err = call(ctx, c, "k-slow", "slow")
			if err != nil || !replayed(r) || o.count("slow") != 1 {
				t.Fatalf("a duplicate retried until the answer is stored: %v (replayed %v), executions %d", err, replayed(r), o.count("slow"))
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			onRetry = nil

			before := retries.Load()
			if _, err := call(ctx, c, "k-slow", "other"); connect.CodeOf(err) != connect.CodeFailedPrecondition || retries.Load() != before {
				t.Errorf("a reused key: %v after %d retries, want failed_precondition and none", err, retries.Load()-before)
			}
		})
	}
}

// TestStoredFailures: a failure after the work is stored and replayed as the same
// error; a method that gives up when its client cancels (connect answers 499) releases
// the key, so the retry runs.
func TestStoredFailures(t *testing.T) {
	t.Parallel()
	o, srv, _ := server(t, idempotency.Config{Conflict: idempotency.ConflictWait})
	c := client(t, srv, nil, "")
	ctx := t.Context()
	_, err1 := call(ctx, c, "k-int", "internal")
	r2, err2 := call(ctx, c, "k-int", "internal")
	var ce *connect.Error
	if connect.CodeOf(err1) != connect.CodeInternal || connect.CodeOf(err2) != connect.CodeInternal ||
		!errors.As(err2, &ce) || ce.Message() != "failed after the work, execution 1" || o.count("internal") != 1 {
		t.Errorf("internal: %v, then %v (%v); executions %d; want the first error replayed", err1, err2, r2, o.count("internal"))
	}
	if ce != nil && ce.Meta().Get("Idempotent-Replayed") != "true" {
		t.Errorf("the replayed error is not marked replayed: %v", ce.Meta())
	}

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := call(cctx, c, "k-gu", "gives-up"); done <- err }()
	<-o.started
	cancel()
	if err := <-done; connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("the cancelled call: %v", err)
	}
	r, err := call(ctx, c, "k-gu", "gives-up")
	if err != nil || replayed(r) || o.count("gives-up") != 2 {
		t.Errorf("the retry after a cancelled call: %v (replayed %v), executions %d; want a second execution", err, replayed(r), o.count("gives-up"))
	}
}

// TestGRPCRelease: over the gRPC and gRPC-Web protocols every answer is HTTP 200, and
// the code is in grpc-status: a method that answered UNAVAILABLE, or gave up when its
// client cancelled, has its key released all the same, so the retry runs.
func TestGRPCRelease(t *testing.T) {
	t.Parallel()
	for _, p := range protocols[2:] {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			o, srv, _ := server(t, idempotency.Config{Conflict: idempotency.ConflictWait})
			c := client(t, srv, nil, "", p.opts...)
			ctx := t.Context()
			if _, err := call(ctx, c, "k-un", "unavailable-once"); connect.CodeOf(err) != connect.CodeUnavailable {
				t.Fatalf("first call: %v, want unavailable", err)
			}
			r, err := call(ctx, c, "k-un", "unavailable-once")
			if err != nil || replayed(r) || o.count("unavailable-once") != 2 {
				t.Errorf("retry after UNAVAILABLE: %v (replayed %v), executions %d; want a second execution", err, replayed(r), o.count("unavailable-once"))
			}
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { _, err := call(cctx, c, "k-gu", "gives-up"); done <- err }()
			<-o.started
			cancel()
			<-done
			r, err = call(ctx, c, "k-gu", "gives-up")
			if err != nil || replayed(r) || o.count("gives-up") != 2 {
				t.Errorf("retry after a cancelled call: %v (replayed %v), executions %d; want a second execution", err, replayed(r), o.count("gives-up"))
			}
		})
	}
}

// TestLostAnswers: a TCP proxy cuts the connection after the service ran one call in
// every 10, losing its answer (and every other on the link); retry.Transport, reading
// answers ahead (MaxBufferedResponse), retries with the call's key. Every call runs once and gets its answer, over each protocol.
func TestLostAnswers(t *testing.T) {
	t.Parallel()
	const calls, clients = 300, 4
	for _, p := range protocols[:2] {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			o, srv, _ := server(t, idempotency.Config{Store: openStore(t, "sqlite"), Conflict: idempotency.ConflictWait})
			link, err := tcpproxy.New(srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = link.Close() })
			var executions, cuts atomic.Int64
			o.after = func(string, int) {
				if executions.Add(1)%10 == 0 {
					cuts.Add(1)
					link.Cut()
					link.Restore()
				}
			}
			tr := &retry.Transport{AutoKey: true, NoBudget: true, MaxBufferedResponse: 1 << 20, Policy: retry.Policy{MaxAttempts: 30, Base: time.Millisecond, Cap: 20 * time.Millisecond}}
			c := client(t, srv, tr, link.Addr(), p.opts...)
			work := make(chan int)
			var wg sync.WaitGroup
			var failed atomic.Int64
			for range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range work {
						v := fmt.Sprintf("lossy-%d", i)
						r, err := call(t.Context(), c, "", v)
						if err != nil || r.Msg.GetValue() != v+" execution 1" {
							if failed.Add(1) <= 3 {
								t.Errorf("%s: %v", v, err)
							}
						}
					}
				}()
			}
			for i := range calls {
				work <- i
			}
			close(work)
			wg.Wait()
			dups, lost := 0, 0
			for i := range calls {
				switch n := o.count(fmt.Sprintf("lossy-%d", i)); {
				case n == 0:
					lost++
				case n > 1:
					dups++
				}
			}
			t.Logf("%d calls, %d executions, %d cuts, %d failed, %d duplicates, %d never ran", calls, executions.Load(), cuts.Load(), failed.Load(), dups, lost)
			if dups != 0 || lost != 0 || failed.Load() != 0 || cuts.Load() == 0 {
				t.Fatalf("%d duplicates, %d never ran, %d failed, %d cuts: want 0, 0, 0 and some cuts", dups, lost, failed.Load(), cuts.Load())
			}
		})
	}
}
