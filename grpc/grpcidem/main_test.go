package grpcidem_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/grpc/grpcidem"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
	"github.com/retrysafe/retrysafe/storedsn"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestMain runs the test binary as a gRPC server process when the crash test starts it
// (serverEnv set), so that the test can kill it mid-call.
func TestMain(m *testing.M) {
	if dsn := os.Getenv(serverEnv); dsn != "" {
		os.Exit(serveProcess(dsn))
	}
	os.Exit(m.Run())
}

// svc is the test service: it counts its executions by request payload and answers by
// the payload's prefix.
type svc struct {
	testgrpc.UnimplementedTestServiceServer
	mu     sync.Mutex
	execs  map[string]int
	tokens map[string][]int64
	holds  map[string]chan struct{} // a payload whose execution waits for its channel
	// started receives the payload of a held execution once it runs.
	started chan string
	// after, when set, runs after an execution's work, before its answer is returned.
	after func(body string, n int)
}

func newSvc() *svc {
	return &svc{execs: map[string]int{}, tokens: map[string][]int64{}, holds: map[string]chan struct{}{}, started: make(chan string, 16)}
}

// hold makes the next executions of body wait until the returned function is called.
func (s *svc) hold(t *testing.T, body string) (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.holds[body] = ch
	s.mu.Unlock()
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	return release
}

func (s *svc) count(body string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.execs[body]
}

func (s *svc) UnaryCall(ctx context.Context, in *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	body := string(in.GetPayload().GetBody())
	s.mu.Lock()
	s.execs[body]++
	n := s.execs[body]
	if c, ok := idempotency.ClaimFromContext(ctx); ok {
		s.tokens[body] = append(s.tokens[body], c.Token)
	}
	hold := s.holds[body]
	s.mu.Unlock()
	if err := grpc.SetHeader(ctx, metadata.Pairs("x-exec", strconv.Itoa(n))); err != nil {
		return nil, err
	}
	if err := grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "t-"+body, "x-bin-bin", "\x00\xff")); err != nil {
		return nil, err
	}
	if hold != nil {
		s.started <- body
		<-hold
	}
	if strings.HasPrefix(body, "gives-up") && n == 1 { // gives up when its caller leaves
		s.started <- body
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	switch {
	case strings.HasPrefix(body, "unavailable-once") && n == 1:
		return nil, status.Error(codes.Unavailable, "not now: nothing was done")
	case strings.HasPrefix(body, "exhausted-once") && n == 1:
		return nil, status.Error(codes.ResourceExhausted, "over quota: nothing was done")
	case strings.HasPrefix(body, "internal"):
		return nil, status.Errorf(codes.Internal, "failed after the work, execution %d", n)
	case strings.HasPrefix(body, "notfound"):
		return nil, status.Errorf(codes.NotFound, "no such thing, execution %d", n)
	case strings.HasPrefix(body, "panic") && n == 1:
		panic("the handler broke before its work")
	}
	if s.after != nil {
		s.after(body, n)
	}
	return &testgrpc.SimpleResponse{Username: fmt.Sprintf("%s execution %d", body, n), Payload: in.GetPayload()}, nil
}

func (s *svc) CacheableUnaryCall(ctx context.Context, in *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return s.UnaryCall(ctx, in)
}

func (s *svc) FullDuplexCall(stream testgrpc.TestService_FullDuplexCallServer) error {
	s.mu.Lock()
	s.execs["stream"]++
	s.mu.Unlock()
	return nil
}

// stores are the backends every battery runs on.
var storeKinds = []string{"memory", "sqlite", "postgres", "redis"}

// openStore opens a fresh store of kind for t, closed at its end.
func openStore(t *testing.T, kind string) idempotency.Store {
	t.Helper()
	return openOpened(t, storeDSN(t, kind)).Store
}

// storeDSN returns a DSN of kind naming a store of t's own (a new file, schema or key
// prefix).
func storeDSN(t *testing.T, kind string) string {
	t.Helper()
	switch kind {
	case "memory":
		return "memory:"
	case "sqlite":
		return "sqlite:" + filepath.Join(t.TempDir(), "keys.db")
	case "postgres":
		u := testenv.PostgresURL(t)
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		return u + sep + "schema=" + testenv.Schema(t, "grpcidem")
	case "redis":
		u := testenv.RedisURL(t)
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		return u + sep + "prefix=" + testenv.Name("grpcidem") + ":"
	}
	t.Fatalf("unknown store kind %q", kind)
	return ""
}

func openOpened(t *testing.T, dsn string) *storedsn.Opened {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o, err := storedsn.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	if err := o.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return o
}

// serve starts a gRPC server with the interceptor of cfg in front of s, and returns
// its address and the interceptor.
func serve(t *testing.T, s *svc, cfg grpcidem.Config, opts ...grpc.ServerOption) (string, *grpcidem.Interceptor) {
	t.Helper()
	if cfg.Idempotency.Store == nil && cfg.Shared == nil {
		cfg.Idempotency.Store = memstore.New()
	}
	ic, err := grpcidem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(recoverPanic)}, opts...)
	g := grpc.NewServer(append(opts, ic.ServerOptions()...)...)
	testgrpc.RegisterTestServiceServer(g, s)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	t.Cleanup(func() {
		g.Stop()
		<-done
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ic.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return ln.Addr().String(), ic
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) testgrpc.TestServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return testgrpcClient(conn)
}

func testgrpcClient(conn *grpc.ClientConn) testgrpc.TestServiceClient {
	return testgrpc.NewTestServiceClient(conn)
}

// result is what a call got: its response or error, and its header and trailer.
type result struct {
	resp    *testgrpc.SimpleResponse
	err     error
	header  metadata.MD
	trailer metadata.MD
}

func (r result) replayed() bool { return len(r.header.Get(grpcidem.ReplayedMetadata)) > 0 }

func (r result) String() string {
	if r.err != nil {
		return r.err.Error()
	}
	return r.resp.GetUsername()
}

// invoke calls UnaryCall with body, under key (none when "") and authorization auth.
func invoke(ctx context.Context, c testgrpc.TestServiceClient, key, body, auth string) result {
	var kv []string
	if key != "" {
		kv = append(kv, grpcidem.KeyMetadata, key)
	}
	if auth != "" {
		kv = append(kv, "authorization", auth)
	}
	if len(kv) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	var r result
	r.resp, r.err = c.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte(body)}},
		grpc.Header(&r.header), grpc.Trailer(&r.trailer))
	return r
}

// sameAnswer reports whether two results carry the same answer, metadata included.
func sameAnswer(a, b result) bool {
	if a.String() != b.String() || status.Code(a.err) != status.Code(b.err) {
		return false
	}
	eq := func(x, y metadata.MD, name string) bool {
		xs, ys := x.Get(name), y.Get(name)
		return strings.Join(xs, "\x00") == strings.Join(ys, "\x00")
	}
	return eq(a.header, b.header, "x-exec") && eq(a.trailer, b.trailer, "x-trailer") &&
		bytes.Equal([]byte(strings.Join(a.trailer.Get("x-bin-bin"), "")), []byte(strings.Join(b.trailer.Get("x-bin-bin"), "")))
}

// recoverPanic answers a handler's panic with INTERNAL, as a server's recovery
// interceptor does; it sits outside the idempotency interceptor, which has released the
// key by the time the panic reaches it.
func recoverPanic(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = status.Errorf(codes.Internal, "panic: %v", p)
		}
	}()
	return h(ctx, req)
}
