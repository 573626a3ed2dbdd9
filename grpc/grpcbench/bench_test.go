package grpcbench

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/grpc/grpcidem"
	"github.com/retrysafe/retrysafe/grpc/grpcretry"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
	"github.com/retrysafe/retrysafe/storedsn"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
)

type service struct {
	testgrpc.UnimplementedTestServiceServer
}

func (service) UnaryCall(_ context.Context, in *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Username: "ok", Payload: in.GetPayload()}, nil
}

// cpu returns the process's user+system CPU time so far.
func cpu(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func start(b *testing.B, opts ...grpc.ServerOption) testgrpc.TestServiceClient {
	return startDial(b, nil, opts...)
}

func startDial(b *testing.B, dopts []grpc.DialOption, opts ...grpc.ServerOption) testgrpc.TestServiceClient {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	testgrpc.RegisterTestServiceServer(g, service{})
	go func() { _ = g.Serve(ln) }()
	b.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), append(dopts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return testgrpc.NewTestServiceClient(conn)
}

// run sends b.N calls from 32 goroutines, each with a new key (or the same one when
// replay), and reports the process's CPU per call (client and server, which share it:
// subtract the bare figure to get the interceptor's own).
func run(b *testing.B, c testgrpc.TestServiceClient, keyed, replay bool) {
	req := &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, 256)}}
	var n atomic.Int64
	if replay {
		ctx := metadata.AppendToOutgoingContext(context.Background(), grpcidem.KeyMetadata, "replayed-key")
		if _, err := c.UnaryCall(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	b.SetParallelism(16) // 32 callers on this machine's 2 cores
	b.ReportAllocs()
	b.ResetTimer()
	before := cpu(b)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctx := context.Background()
			switch {
			case replay:
				ctx = metadata.AppendToOutgoingContext(ctx, grpcidem.KeyMetadata, "replayed-key")
			case keyed:
				ctx = metadata.AppendToOutgoingContext(ctx, grpcidem.KeyMetadata, "k-"+strconv.FormatInt(n.Add(1), 10))
			}
			if _, err := c.UnaryCall(ctx, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((cpu(b)-before).Microseconds())/float64(b.N), "cpu-µs/op")
}

// BenchmarkServer: the server interceptor against the bare call.
func BenchmarkServer(b *testing.B) {
	b.Run("bare", func(b *testing.B) { run(b, start(b), false, false) })
	for _, kind := range []string{"memory", "postgres"} {
		for _, replay := range []bool{false, true} {
			name := kind + "/new-keys"
			if replay {
				name = kind + "/replays"
			}
			b.Run(name, func(b *testing.B) {
				var store idempotency.Store = memstore.New()
				if kind == "postgres" {
					ctx := context.Background()
					o, err := storedsn.Open(ctx, testenv.PostgresURL(b)+"&schema="+testenv.Schema(b, "grpcbench"), nil)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { _ = o.Close() })
					if err := o.Migrate(ctx); err != nil {
						b.Fatal(err)
					}
					store = o.Store
				}
				ic, err := grpcidem.New(grpcidem.Config{Idempotency: idempotency.Config{Store: store, Conflict: idempotency.ConflictWait}})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = ic.Shutdown(context.Background()) })
				run(b, start(b, ic.ServerOptions()...), true, replay)
			})
		}
	}
}

// BenchmarkClient: the retrying client interceptor (with AutoKey, against a server that
// ignores the key) against a bare client; no call fails, so this is its cost on the
// path every call takes.
func BenchmarkClient(b *testing.B) {
	b.Run("bare", func(b *testing.B) { run(b, start(b), false, false) })
	b.Run("grpcretry", func(b *testing.B) {
		run(b, startDial(b, grpcretry.DialOptions(grpcretry.Config{AutoKey: true})), false, false)
	})
}
