package grpcidem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/grpc/grpcidem"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// reason returns the ErrorInfo reason of err's status, or "".
func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei.GetReason()
		}
	}
	return ""
}

// retryDelay returns the RetryInfo delay of err's status, or -1.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return -1
}

// TestBattery is the conformance battery of the HTTP middleware, for calls, on every
// store: a grpc-go client and server over loopback, the executions counted by the
// service itself.
func TestBattery(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := newSvc()
			// The default conflict policy: a duplicate in flight waits.
			addr, ic := serve(t, s, grpcidem.Config{Idempotency: idempotency.Config{Store: openStore(t, kind)}})
			c := dial(t, addr)
			ctx := t.Context()

			t.Run("sequential duplicate is replayed", func(t *testing.T) {
				first := invoke(ctx, c, "k-seq", "seq", "")
				second := invoke(ctx, c, "k-seq", "seq", "")
				if first.err != nil || second.err != nil {
					t.Fatalf("calls: %v, %v", first.err, second.err)
				}
				if n := s.count("seq"); n != 1 {
					t.Fatalf("executions = %d, want 1", n)
				}
				if first.replayed() || !second.replayed() {
					t.Errorf("%s replayed: first %v, second %v; want false, true", grpcidem.ReplayedMetadata, first.replayed(), second.replayed())
				}
				if !sameAnswer(first, second) {
					t.Errorf("replay differs: %v %v %v / %v %v %v", first, first.header, first.trailer, second, second.header, second.trailer)
				}
				if got := second.resp.GetPayload().GetBody(); string(got) != "seq" {
					t.Errorf("replayed payload %q, want the typed response's", got)
				}
			})

			t.Run("concurrent duplicates wait for the answer", func(t *testing.T) {
				release := s.hold(t, "conc")
				const dups = 8
				results := make([]result, dups+1)
				var wg sync.WaitGroup
				wg.Add(1)
				go func() { defer wg.Done(); results[0] = invoke(ctx, c, "k-conc", "conc", "") }()
				<-s.started
				for i := 1; i <= dups; i++ {
					wg.Add(1)
					go func() { defer wg.Done(); results[i] = invoke(ctx, c, "k-conc", "conc", "") }()
				}
				testenv.Eventually(t, time.Minute, func() bool { return ic.Middleware().Waiting() == dups }, "duplicates waiting")
				release()
				wg.Wait()
				if n := s.count("conc"); n != 1 {
					t.Fatalf("executions = %d, want 1", n)
				}
				for i, r := range results {
					if r.err != nil || !sameAnswer(r, results[0]) {
						t.Errorf("call %d: %v (header %v), want the first's answer %v", i, r, r.header, results[0])
					}
					if i > 0 && !r.replayed() {
						t.Errorf("call %d not marked replayed", i)
					}
				}
			})

			t.Run("another request under the key is refused", func(t *testing.T) {
				if r := invoke(ctx, c, "k-mis", "mis-a", ""); r.err != nil {
					t.Fatal(r.err)
				}
				r := invoke(ctx, c, "k-mis", "mis-b", "")
				if status.Code(r.err) != codes.FailedPrecondition || reason(r.err) != grpcidem.ReasonKeyReused {
					t.Fatalf("other request: %v (reason %q), want FAILED_PRECONDITION %s", r.err, reason(r.err), grpcidem.ReasonKeyReused)
				}
				if n := s.count("mis-b"); n != 0 {
					t.Errorf("the other request ran %d times, want 0", n)
				}
			})

			t.Run("another scope has its own key", func(t *testing.T) {
				a := invoke(ctx, c, "k-scope", "scope", "Bearer alice")
				b := invoke(ctx, c, "k-scope", "scope", "Bearer bob")
				a2 := invoke(ctx, c, "k-scope", "scope", "Bearer alice")
				if a.err != nil || b.err != nil || a2.err != nil {
					t.Fatal(a.err, b.err, a2.err)
				}
				if n := s.count("scope"); n != 2 || b.replayed() || !a2.replayed() || a2.String() != a.String() {
					t.Errorf("executions %d (want 2), bob replayed %v (want false), alice again %v replayed %v (want %v, true)", n, b.replayed(), a2, a2.replayed(), a)
				}
			})

			t.Run("a failure before the work releases the key", func(t *testing.T) {
				for _, body := range []string{"unavailable-once", "exhausted-once"} {
					r1 := invoke(ctx, c, "k-"+body, body, "")
					r2 := invoke(ctx, c, "k-"+body, body, "")
					if c := status.Code(r1.err); c != codes.Unavailable && c != codes.ResourceExhausted {
						t.Errorf("%s first: %v", body, r1.err)
					}
					if r2.err != nil || r2.replayed() || s.count(body) != 2 {
						t.Errorf("%s retry: %v replayed %v, executions %d; want a second execution", body, r2, r2.replayed(), s.count(body))
					}
				}
			})

			t.Run("a failure after the work is stored", func(t *testing.T) {
				for _, body := range []string{"internal", "notfound"} {
					r1 := invoke(ctx, c, "k-"+body, body, "")
					r2 := invoke(ctx, c, "k-"+body, body, "")
					if r1.err == nil || !r2.replayed() || status.Code(r2.err) != status.Code(r1.err) ||
						status.Convert(r2.err).Message() != status.Convert(r1.err).Message() || !sameAnswer(r1, r2) {
						t.Errorf("%s: first %v, retry %v (replayed %v); want the same error replayed", body, r1.err, r2.err, r2.replayed())
					}
					if n := s.count(body); n != 1 {
						t.Errorf("%s executions = %d, want 1", body, n)
					}
				}
			})

			t.Run("a method that gives up with its caller releases the key", func(t *testing.T) {
				cctx, cancel := context.WithCancel(ctx)
				first := make(chan result, 1)
				go func() { first <- invoke(cctx, c, "k-gives-up", "gives-up", "") }()
				<-s.started
				cancel()
				if r := <-first; status.Code(r.err) != codes.Canceled {
					t.Fatalf("the cancelled call: %v", r.err)
				}
				r := invoke(ctx, c, "k-gives-up", "gives-up", "")
				if r.err != nil || r.replayed() || s.count("gives-up") != 2 {
					t.Errorf("retry: %v (replayed %v), executions %d; want a second execution", r, r.replayed(), s.count("gives-up"))
				}
			})

			t.Run("a panic releases the key", func(t *testing.T) {
				r1 := invoke(ctx, c, "k-panic", "panic", "")
				r2 := invoke(ctx, c, "k-panic", "panic", "")
				if status.Code(r1.err) != codes.Internal || r2.err != nil || r2.replayed() || s.count("panic") != 2 {
					t.Errorf("first %v, retry %v (replayed %v), executions %d; want INTERNAL, then a second execution", r1.err, r2, r2.replayed(), s.count("panic"))
				}
			})

			t.Run("a missing or malformed key is refused", func(t *testing.T) {
				r := invoke(ctx, c, "", "nokey", "")
				if status.Code(r.err) != codes.InvalidArgument || reason(r.err) != grpcidem.ReasonMissingKey {
					t.Errorf("no key: %v (reason %q)", r.err, reason(r.err))
				}
				r = invoke(ctx, c, "a key with spaces", "nokey", "")
				if status.Code(r.err) != codes.InvalidArgument || reason(r.err) != grpcidem.ReasonInvalidKey {
					t.Errorf("malformed key: %v (reason %q)", r.err, reason(r.err))
				}
				if n := s.count("nokey"); n != 0 {
					t.Errorf("executions = %d, want 0", n)
				}
			})

		})
	}
}

// noTypes is a Resolver that knows no method: replays travel as raw bytes.
type noTypes struct{}

func (noTypes) FindDescriptorByName(protoreflect.FullName) (protoreflect.Descriptor, error) {
	return nil, protoregistry.NotFound
}

func (noTypes) FindMessageByName(protoreflect.FullName) (protoreflect.MessageType, error) {
	return nil, protoregistry.NotFound
}

// TestConflictReject: with ConflictReject a duplicate of a call in flight is answered
// ABORTED with a RetryInfo, which the client's retry honours; after the first call, the
// retry gets the answer, whole even when the server does not know the method's
// response type (the stored bytes are sent as they are).
func TestConflictReject(t *testing.T) {
	t.Parallel()
	s := newSvc()
	addr, _ := serve(t, s, grpcidem.Config{Idempotency: idempotency.Config{Conflict: idempotency.ConflictReject}, Resolver: noTypes{}})
	c := dial(t, addr)
	release := s.hold(t, "rej")
	first := make(chan result, 1)
	go func() { first <- invoke(t.Context(), c, "k-rej", "rej", "") }()
	<-s.started
	dup := invoke(t.Context(), c, "k-rej", "rej", "")
	if status.Code(dup.err) != codes.Aborted || reason(dup.err) != grpcidem.ReasonInFlight || retryDelay(dup.err) < time.Second {
		t.Fatalf("duplicate in flight: %v (reason %q, retry delay %v), want ABORTED %s with a RetryInfo of 1s or more",
			dup.err, reason(dup.err), retryDelay(dup.err), grpcidem.ReasonInFlight)
	}
	release()
	r1 := <-first
	r2 := invoke(t.Context(), c, "k-rej", "rej", "")
	if r1.err != nil || r2.err != nil || !r2.replayed() || s.count("rej") != 1 || !sameAnswer(r1, r2) || string(r2.resp.GetPayload().GetBody()) != "rej" {
		t.Fatalf("after the first: %v, retry %v replayed %v, executions %d", r1, r2, r2.replayed(), s.count("rej"))
	}
}

// TestStreams: streaming calls are not protected. A keyed one to a protected method is
// refused before it runs, unless the operator lets it through; an unkeyed one passes.
func TestStreams(t *testing.T) {
	t.Parallel()
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow=%v", allow), func(t *testing.T) {
			t.Parallel()
			s := newSvc()
			addr, _ := serve(t, s, grpcidem.Config{AllowKeyedStreams: allow})
			c := dial(t, addr)
			run := func(ctx context.Context) error {
				st, err := c.FullDuplexCall(ctx)
				if err != nil {
					return err
				}
				_ = st.CloseSend()
				_, err = st.Recv()
				if errors.Is(err, io.EOF) || err == nil {
					return nil
				}
				return err
			}
			if err := run(t.Context()); err != nil {
				t.Fatalf("unkeyed stream: %v", err)
			}
			err := run(metadata.AppendToOutgoingContext(t.Context(), grpcidem.KeyMetadata, "k-stream"))
			want, wantExecs := codes.OK, 2
			if !allow {
				want, wantExecs = codes.Unimplemented, 1
			}
			if status.Code(err) != want {
				t.Errorf("keyed stream: %v, want %v", err, want)
			}
			if n := s.count("stream"); n != wantExecs {
				t.Errorf("stream executions = %d, want %d", n, wantExecs)
			}
		})
	}
}

// TestKeyOptional: with KeyOptional, an unkeyed call to a protected method runs
// unprotected; without a key, each call runs.
func TestKeyOptional(t *testing.T) {
	t.Parallel()
	s := newSvc()
	addr, _ := serve(t, s, grpcidem.Config{KeyOptional: true})
	c := dial(t, addr)
	for range 2 {
		if r := invoke(t.Context(), c, "", "optional", ""); r.err != nil || r.replayed() {
			t.Fatal(r.err, r.replayed())
		}
	}
	if n := s.count("optional"); n != 2 {
		t.Errorf("executions = %d, want 2", n)
	}
}

// TestConfigRefusesHTTPSettings: the engine's HTTP settings have no meaning for calls.
func TestConfigRefusesHTTPSettings(t *testing.T) {
	t.Parallel()
	for _, cfg := range []idempotency.Config{
		{KeyHeader: "X-Key"}, {Methods: []string{"PUT"}}, {KeyOptional: true}, {Release: func(int) bool { return false }},
	} {
		if _, err := grpcidem.New(grpcidem.Config{Idempotency: cfg}); err == nil {
			t.Errorf("New with %+v: no error", cfg)
		}
	}
}

// TestShared: an interceptor made from a process's HTTP middleware shares its store
// state: a call waiting on a key in flight counts among the middleware's waiters, and
// one Shutdown (the middleware's) serves both. Another store is refused.
func TestShared(t *testing.T) {
	t.Parallel()
	store := openStore(t, "memory")
	m, err := idempotency.New(idempotency.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown(context.Background()) })
	if _, err := grpcidem.New(grpcidem.Config{Shared: m, Idempotency: idempotency.Config{Store: openStore(t, "memory")}}); err == nil {
		t.Error("New with Shared over another store: no error")
	}
	s := newSvc()
	addr, _ := serve(t, s, grpcidem.Config{Shared: m, Idempotency: idempotency.Config{Conflict: idempotency.ConflictWait}})
	c := dial(t, addr)
	release := s.hold(t, "shared")
	done := make(chan result, 2)
	go func() { done <- invoke(t.Context(), c, "k-shared", "shared", "") }()
	<-s.started
	go func() { done <- invoke(t.Context(), c, "k-shared", "shared", "") }()
	testenv.Eventually(t, time.Minute, func() bool { return m.Waiting() == 1 }, "the duplicate waiting, as the HTTP middleware counts it")
	release()
	for range 2 {
		if r := <-done; r.err != nil {
			t.Fatal(r.err)
		}
	}
	if n := s.count("shared"); n != 1 {
		t.Errorf("executions = %d, want 1", n)
	}
}
