package grpcidem_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/retrysafe/retrysafe/grpc/grpcidem"
	"github.com/retrysafe/retrysafe/grpc/grpcretry"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/storedsn"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
)

// orders is a service whose UnaryCall has a side effect: it counts what it did.
type orders struct {
	testgrpc.UnimplementedTestServiceServer
	placed atomic.Int64
}

func (o *orders) UnaryCall(_ context.Context, in *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	n := o.placed.Add(1)
	return &testgrpc.SimpleResponse{Username: fmt.Sprintf("order %d for %s", n, in.GetPayload().GetBody())}, nil
}

// A server with the idempotency interceptor on the embedded SQLite store, and a client
// whose interceptor retries with one key per call: the second call, with the first's
// key (a retry whose first answer was lost), is answered from the store.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "grpcidem-example")
	defer os.RemoveAll(dir)
	store, err := storedsn.Open(ctx, "sqlite:"+filepath.Join(dir, "keys.db"), nil)
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}

	// The server.
	ic, err := grpcidem.New(grpcidem.Config{Idempotency: idempotency.Config{
		Store:    store.Store,
		Conflict: idempotency.ConflictWait,
	}})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(ic.ServerOptions()...)
	svc := &orders{}
	testgrpc.RegisterTestServiceServer(srv, svc)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	defer func() { srv.GracefulStop(); _ = ic.Shutdown(ctx) }()

	// The client: every call gets a key, the same on each of its attempts.
	conn, err := grpc.NewClient(ln.Addr().String(), append(grpcretry.DialOptions(grpcretry.Config{AutoKey: true}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := testgrpc.NewTestServiceClient(conn)

	call := func(key string) {
		var header metadata.MD
		resp, err := client.UnaryCall(metadata.AppendToOutgoingContext(ctx, grpcidem.KeyMetadata, key),
			&testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("alice")}}, grpc.Header(&header))
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s (replayed: %v)\n", resp.GetUsername(), len(header.Get(grpcidem.ReplayedMetadata)) > 0)
	}
	call("order-7f3a")
	call("order-7f3a") // the same operation again: answered from the store
	call("order-9b21") // another operation
	fmt.Println("orders placed:", svc.placed.Load())
	// Output:
	// order 1 for alice (replayed: false)
	// order 1 for alice (replayed: true)
	// order 2 for alice (replayed: false)
	// orders placed: 2
}
