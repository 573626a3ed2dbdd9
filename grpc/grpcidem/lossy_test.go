package grpcidem_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/grpc/grpcidem"
	"github.com/retrysafe/retrysafe/grpc/grpcretry"
	"github.com/retrysafe/retrysafe/harness/tcpproxy"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// TestLostAnswers: a TCP proxy between client and server cuts the connection after the
// server has run one call in every cutEvery, before its answer is sent, which kills
// every call on that connection. The client interceptor retries with one key per call
// (AutoKey); every call must run exactly once and get its answer.
func TestLostAnswers(t *testing.T) {
	t.Parallel()
	const calls, clients, cutEvery = 1500, 8, 20
	for _, kind := range []string{"sqlite", "postgres", "redis"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := newSvc()
			addr, _ := serve(t, s, grpcidem.Config{Idempotency: idempotency.Config{Store: openStore(t, kind), Conflict: idempotency.ConflictWait}})
			p, err := tcpproxy.New(addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			var executions, cuts atomic.Int64
			s.after = func(string, int) {
				if executions.Add(1)%cutEvery == 0 {
					cuts.Add(1)
					p.Cut() // the work is done; its answer, and every other on the link, is lost
					p.Restore()
				}
			}
			var retries atomic.Int64
			c := dial(t, p.Addr(), append(grpcretry.DialOptions(grpcretry.Config{
				AutoKey: true,
				Policy: retry.Policy{MaxAttempts: 30, Base: time.Millisecond, Cap: 50 * time.Millisecond,
					OnRetry: func(retry.Attempt) { retries.Add(1) }},
			}), grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: time.Millisecond, Multiplier: 1, MaxDelay: 10 * time.Millisecond}, MinConnectTimeout: 5 * time.Second}))...)

			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			var failed atomic.Int64
			work := make(chan int)
			for range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range work {
						body := fmt.Sprintf("lossy-%d", i)
						resp, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte(body)}})
						if err != nil || resp.GetUsername() != body+" execution 1" {
							if failed.Add(1) <= 5 {
								t.Errorf("call %s: %v %q", body, err, resp.GetUsername())
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
				switch n := s.count(fmt.Sprintf("lossy-%d", i)); {
				case n == 0:
					lost++
				case n > 1:
					dups++
				}
			}
			t.Logf("%d calls, %d executions, %d cuts, %d retries, %d failed, %d duplicates, %d never ran",
				calls, executions.Load(), cuts.Load(), retries.Load(), failed.Load(), dups, lost)
			if dups != 0 || lost != 0 || failed.Load() != 0 {
				t.Fatalf("%d duplicates, %d never ran, %d failed calls: want 0, 0, 0", dups, lost, failed.Load())
			}
			if cuts.Load() == 0 || retries.Load() == 0 {
				t.Fatalf("%d cuts and %d retries: the fault never happened", cuts.Load(), retries.Load())
			}
		})
	}
}
