package grpcretry_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/grpc/grpcretry"
	"github.com/retrysafe/retrysafe/harness/tcpproxy"
	"github.com/retrysafe/retrysafe/retry"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const method = "/retrysafe.test.Svc/Do"

// step is what the server does on one execution; the last step repeats.
type step func(ctx context.Context) error

// server counts its executions and answers by a script.
type server struct {
	mu        sync.Mutex
	script    []step
	keys      []string // the idempotency-key of each execution
	deadlines []bool   // whether each execution had a deadline
}

func (s *server) do(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	_, hasDeadline := ctx.Deadline()
	s.mu.Lock()
	n := len(s.keys)
	s.keys = append(s.keys, firstOf(md.Get(grpcretry.KeyMetadata)))
	s.deadlines = append(s.deadlines, hasDeadline)
	f := s.script[min(n, len(s.script)-1)]
	s.mu.Unlock()
	if err := f(ctx); err != nil {
		return nil, err
	}
	return wrapperspb.String("ok " + in.GetValue()), nil
}

func (s *server) executions() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

func firstOf(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

var desc = grpc.ServiceDesc{
	ServiceName: "retrysafe.test.Svc",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Do",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return srv.(*server).do(ctx, in)
		},
	}},
}

// start serves s on a loopback port and returns its address.
func start(t *testing.T, s *server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	g.RegisterService(&desc, s)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return ln.Addr().String()
}

// clock is a retry.Clock whose waits end at once and are recorded.
type clock struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (c *clock) Now() time.Time { return time.Now() }

func (c *clock) After(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.mu.Unlock()
	ch := make(chan time.Time, 1)
	ch <- time.Now()
	return ch, func() bool { return false }
}

func (c *clock) recorded() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

// dial connects to addr through the interceptor of cfg, whose Policy gets the clock c.
func dial(t *testing.T, addr string, cfg grpcretry.Config, c *clock) *grpc.ClientConn {
	t.Helper()
	cfg.Policy.Clock = c
	opts := append(grpcretry.DialOptions(cfg),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: time.Millisecond, Multiplier: 1, MaxDelay: time.Millisecond}, MinConnectTimeout: time.Second}))
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func call(ctx context.Context, conn *grpc.ClientConn, value string) error {
	out := new(wrapperspb.StringValue)
	return conn.Invoke(ctx, method, wrapperspb.String(value), out)
}

func fail(c codes.Code) step {
	return func(context.Context) error { return status.Error(c, c.String()) }
}

func ok(context.Context) error { return nil }

func withRetryInfo(c codes.Code, d time.Duration) step {
	return func(context.Context) error {
		st, err := status.New(c, "later").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
		if err != nil {
			return err
		}
		return st.Err()
	}
}

func withPushback(c codes.Code, v string) step {
	return func(ctx context.Context) error {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(grpcretry.PushbackTrailer, v))
		return status.Error(c, "pushed back")
	}
}

func keyed(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, grpcretry.KeyMetadata, "key-1")
}

func TestUnavailableRetried(t *testing.T) {
	t.Parallel()
	s := &server{script: []step{fail(codes.Unavailable), fail(codes.Unavailable), ok}}
	conn := dial(t, start(t, s), grpcretry.Config{}, &clock{})
	if err := call(t.Context(), conn, "a"); err != nil {
		t.Fatalf("call: %v", err)
	}
	if n := len(s.executions()); n != 3 {
		t.Fatalf("executions = %d, want 3", n)
	}
}

func TestRetryInfoDelay(t *testing.T) {
	t.Parallel()
	for _, code := range []codes.Code{codes.ResourceExhausted, codes.Aborted} {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			const delay = 2 * time.Second // longer than any backoff of the policy below
			s := &server{script: []step{withRetryInfo(code, delay), ok}}
			c := &clock{}
			conn := dial(t, start(t, s), grpcretry.Config{Policy: retry.Policy{Base: time.Millisecond, Cap: time.Millisecond}}, c)
			if err := call(t.Context(), conn, "a"); err != nil {
				t.Fatalf("call: %v", err)
			}
			if n := len(s.executions()); n != 2 {
				t.Fatalf("executions = %d, want 2", n)
			}
			if w := c.recorded(); len(w) != 1 || w[0] < delay {
				t.Fatalf("waits = %v, want one of at least %v", w, delay)
			}
		})
	}
}

func TestAbortedWithoutRetryInfoNotRetried(t *testing.T) {
	t.Parallel()
	s := &server{script: []step{fail(codes.Aborted), ok}}
	conn := dial(t, start(t, s), grpcretry.Config{AutoKey: true}, &clock{})
	if err := call(t.Context(), conn, "a"); status.Code(err) != codes.Aborted {
		t.Fatalf("call: %v, want ABORTED", err)
	}
	if n := len(s.executions()); n != 1 {
		t.Fatalf("executions = %d, want 1", n)
	}
}

func TestPushback(t *testing.T) {
	t.Parallel()
	t.Run("honoured", func(t *testing.T) {
		t.Parallel()
		s := &server{script: []step{withPushback(codes.ResourceExhausted, "1500"), ok}}
		c := &clock{}
		conn := dial(t, start(t, s), grpcretry.Config{Policy: retry.Policy{Base: time.Millisecond, Cap: time.Millisecond}}, c)
		if err := call(t.Context(), conn, "a"); err != nil {
			t.Fatalf("call: %v", err)
		}
		if w := c.recorded(); len(w) != 1 || w[0] < 1500*time.Millisecond {
			t.Fatalf("waits = %v, want one of at least 1.5s", w)
		}
	})
	for _, v := range []string{"-1", "soon"} {
		t.Run("stop "+v, func(t *testing.T) {
			t.Parallel()
			s := &server{script: []step{withPushback(codes.Unavailable, v), ok}}
			conn := dial(t, start(t, s), grpcretry.Config{}, &clock{})
			err := call(t.Context(), conn, "a")
			if status.Code(err) != codes.Unavailable || !errors.Is(grpcretry.StopReason(err), grpcretry.ErrPushback) {
				t.Fatalf("call: %v (reason %v), want UNAVAILABLE stopped by ErrPushback", err, grpcretry.StopReason(err))
			}
			if n := len(s.executions()); n != 1 {
				t.Fatalf("executions = %d, want 1", n)
			}
		})
	}
}

func TestNeverRetried(t *testing.T) {
	t.Parallel()
	for _, code := range []codes.Code{codes.InvalidArgument, codes.NotFound, codes.PermissionDenied,
		codes.Unauthenticated, codes.FailedPrecondition, codes.AlreadyExists} {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			s := &server{script: []step{fail(code), ok}}
			conn := dial(t, start(t, s), grpcretry.Config{AutoKey: true}, &clock{})
			err := call(t.Context(), conn, "a")
			if status.Code(err) != code || grpcretry.StopReason(err) != nil {
				t.Fatalf("call: %v, want %v as it is", err, code)
			}
			if n := len(s.executions()); n != 1 {
				t.Fatalf("executions = %d, want 1", n)
			}
		})
	}
}

// requestID is an AIP-155 request_id: here the request's value, when it starts with "rid-".
func requestID(req any) string {
	if s, ok := req.(*wrapperspb.StringValue); ok && len(s.GetValue()) > 4 && s.GetValue()[:4] == "rid-" {
		return s.GetValue()
	}
	return ""
}

func TestUnknownOutcomeRetriedOnlyWithKey(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		cfg   grpcretry.Config
		ctx   func(context.Context) context.Context
		value string
		want  int
	}{
		{name: "no key", want: 1},
		{name: "metadata key", ctx: keyed, want: 2},
		{name: "auto key", cfg: grpcretry.Config{AutoKey: true}, want: 2},
		{name: "request id", cfg: grpcretry.Config{RequestKey: requestID}, value: "rid-1", want: 2},
		{name: "request id func, none in request", cfg: grpcretry.Config{RequestKey: requestID}, value: "x", want: 1},
	}
	for _, code := range []codes.Code{codes.Unknown, codes.Internal} {
		for _, tc := range cases {
			t.Run(code.String()+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				s := &server{script: []step{fail(code), ok}}
				conn := dial(t, start(t, s), tc.cfg, &clock{})
				ctx := t.Context()
				if tc.ctx != nil {
					ctx = tc.ctx(ctx)
				}
				err := call(ctx, conn, tc.value)
				if n := len(s.executions()); n != tc.want {
					t.Fatalf("executions = %d, want %d (err %v)", n, tc.want, err)
				}
				if tc.want == 1 && status.Code(err) != code {
					t.Fatalf("call: %v, want %v", err, code)
				}
				if tc.want == 2 && err != nil {
					t.Fatalf("call: %v", err)
				}
			})
		}
	}
}

func TestAutoKeySameOnEveryAttempt(t *testing.T) {
	t.Parallel()
	s := &server{script: []step{fail(codes.Unavailable), fail(codes.Internal), ok}}
	conn := dial(t, start(t, s), grpcretry.Config{AutoKey: true}, &clock{})
	if err := call(t.Context(), conn, "a"); err != nil {
		t.Fatalf("call: %v", err)
	}
	if err := call(t.Context(), conn, "b"); err != nil {
		t.Fatalf("call: %v", err)
	}
	k := s.executions()
	if len(k) != 4 || k[0] == "" || k[0] != k[1] || k[1] != k[2] || k[3] == k[0] || k[3] == "" {
		t.Fatalf("keys = %q, want one key on the three attempts of the first call, another on the second", k)
	}
}

// TestLostAnswer: the server runs the call, and the connection is cut before the answer
// reaches the client. The outcome is unknown: retried with a key (the same one), not
// without.
func TestLostAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ctx  func(context.Context) context.Context
		want int
	}{{"keyed", keyed, 2}, {"unkeyed", nil, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ran, cut := make(chan struct{}), make(chan struct{})
			s := &server{script: []step{func(ctx context.Context) error {
				close(ran)
				<-cut // the answer is written only after the link is gone
				return nil
			}, ok}}
			p, err := tcpproxy.New(start(t, s))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			go func() {
				<-ran
				p.Cut()
				p.Restore()
				close(cut)
			}()
			conn := dial(t, p.Addr(), grpcretry.Config{Policy: retry.Policy{MaxAttempts: 50, Base: time.Millisecond, OnRetry: func(a retry.Attempt) { t.Logf("retry %d: %v", a.N, a.Err) }}}, &clock{})
			ctx := t.Context()
			if tc.ctx != nil {
				ctx = tc.ctx(ctx)
			}
			err = call(ctx, conn, "a")
			k := s.executions()
			if len(k) != tc.want {
				t.Fatalf("executions = %d, want %d (err %v)", len(k), tc.want, err)
			}
			if tc.want == 1 && status.Code(err) != codes.Unavailable {
				t.Fatalf("call: %v, want UNAVAILABLE", err)
			}
			if tc.want == 2 && (err != nil || k[0] != "key-1" || k[1] != "key-1") {
				t.Fatalf("call: %v, keys %q: want success with key-1 on both executions", err, k)
			}
		})
	}
}

func TestAttemptDeadline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ctx  func(context.Context) context.Context
		want int
	}{{"keyed", keyed, 2}, {"unkeyed", nil, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := &server{script: []step{func(ctx context.Context) error {
				<-ctx.Done() // the attempt's deadline ends it
				return status.FromContextError(ctx.Err()).Err()
			}, ok}}
			conn := dial(t, start(t, s), grpcretry.Config{AttemptTimeout: 100 * time.Millisecond}, &clock{})
			ctx := t.Context()
			if tc.ctx != nil {
				ctx = tc.ctx(ctx)
			}
			err := call(ctx, conn, "a")
			if n := len(s.executions()); n != tc.want {
				t.Fatalf("executions = %d, want %d (err %v)", n, tc.want, err)
			}
			if tc.want == 1 && status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("call: %v, want DEADLINE_EXCEEDED", err)
			}
			if tc.want == 2 && err != nil {
				t.Fatalf("call: %v", err)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			for i, d := range s.deadlines {
				if !d {
					t.Fatalf("execution %d had no deadline", i+1)
				}
			}
		})
	}
}

func TestCallerDeadlineNotRetried(t *testing.T) {
	t.Parallel()
	s := &server{script: []step{func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, ok}}
	conn := dial(t, start(t, s), grpcretry.Config{AutoKey: true}, &clock{})
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	err := call(ctx, conn, "a")
	if status.Code(err) != codes.DeadlineExceeded || grpcretry.StopReason(err) != nil {
		t.Fatalf("call: %v, want DEADLINE_EXCEEDED as it is", err)
	}
	// At most one: on a busy machine the deadline may end before the server runs it.
	if n := len(s.executions()); n > 1 {
		t.Fatalf("executions = %d, want at most 1", n)
	}
}

func TestBudgetExhausted(t *testing.T) {
	t.Parallel()
	s := &server{script: []step{fail(codes.Unavailable)}}
	b := retry.NewBudget(4, 1) // retries while more than 2 tokens remain
	conn := dial(t, start(t, s), grpcretry.Config{Policy: retry.Policy{MaxAttempts: 10, Budget: b}}, &clock{})
	err := call(t.Context(), conn, "a")
	var ex *grpcretry.ExhaustedError
	if !errors.As(err, &ex) || !errors.Is(grpcretry.StopReason(err), retry.ErrBudget) || status.Code(err) != codes.Unavailable {
		t.Fatalf("call: %v, want UNAVAILABLE stopped by retry.ErrBudget", err)
	}
	if n := len(s.executions()); n != 2 || ex.Attempts != 2 {
		t.Fatalf("executions = %d, attempts %d, want 2", n, ex.Attempts)
	}
	// The budget is shared: the next call gets no retry at all.
	if err := call(t.Context(), conn, "b"); !errors.Is(grpcretry.StopReason(err), retry.ErrBudget) {
		t.Fatalf("second call: %v, want retry.ErrBudget", err)
	}
	if n := len(s.executions()); n != 3 {
		t.Fatalf("executions = %d, want 3", n)
	}
}

func TestMaxAttempts(t *testing.T) {
	t.Parallel()
	s := &server{script: []step{fail(codes.Unavailable)}}
	conn := dial(t, start(t, s), grpcretry.Config{Policy: retry.Policy{MaxAttempts: 3}}, &clock{})
	err := call(t.Context(), conn, "a")
	if !errors.Is(grpcretry.StopReason(err), retry.ErrMaxAttempts) || status.Code(err) != codes.Unavailable {
		t.Fatalf("call: %v, want UNAVAILABLE stopped by retry.ErrMaxAttempts", err)
	}
	if n := len(s.executions()); n != 3 {
		t.Fatalf("executions = %d, want 3", n)
	}
}

// TestNeverSentRetried: a call that never got a connection (the link refuses) was not
// sent, so it is retried without a key.
func TestNeverSentRetried(t *testing.T) {
	t.Parallel()
	s := &server{script: []step{ok}}
	p, err := tcpproxy.New(start(t, s))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	p.Cut()
	var (
		failures []error
		conn     *grpc.ClientConn
	)
	cfg := grpcretry.Config{Policy: retry.Policy{OnRetry: func(a retry.Attempt) {
		failures = append(failures, a.Err)
		p.Restore()
		// Wait, on the channel's own signals, until it has a connection again.
		for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
			conn.Connect()
			if !conn.WaitForStateChange(t.Context(), st) {
				return
			}
		}
	}}}
	conn = dial(t, p.Addr(), cfg, &clock{})
	if err := call(t.Context(), conn, "a"); err != nil {
		t.Fatalf("call: %v", err)
	}
	if len(failures) == 0 || status.Code(failures[0]) != codes.Unavailable {
		t.Fatalf("failures = %v, want UNAVAILABLE first", failures)
	}
	if n := len(s.executions()); n != 1 {
		t.Fatalf("executions = %d, want 1", n)
	}
}

// TestWithoutStatsHandler: the interceptor alone cannot tell a server's UNAVAILABLE
// from a lost connection, so it retries an UNAVAILABLE of a call that reached a server
// only when the call is keyed.
func TestWithoutStatsHandler(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  grpcretry.Config
		want int
	}{{"keyed", grpcretry.Config{AutoKey: true}, 2}, {"unkeyed", grpcretry.Config{}, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := &server{script: []step{fail(codes.Unavailable), ok}}
			tc.cfg.Policy.Clock = &clock{}
			conn, err := grpc.NewClient(start(t, s), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDisableRetry(), grpc.WithUnaryInterceptor(grpcretry.UnaryClientInterceptor(tc.cfg)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			err = call(t.Context(), conn, "a")
			if n := len(s.executions()); n != tc.want {
				t.Fatalf("executions = %d, want %d (err %v)", n, tc.want, err)
			}
		})
	}
}
