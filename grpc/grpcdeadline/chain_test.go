package grpcdeadline_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/retrysafe/retrysafe/deadline"
	"github.com/retrysafe/retrysafe/grpc/grpcdeadline"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
)

// chain is HTTP service A → gRPC service B → HTTP service C, each behind its budget
// middleware or interceptor, each recording the budget it was given.
type chain struct {
	url                string // A's
	mu                 sync.Mutex
	a, b               time.Duration // the time A and B had left when the request arrived
	c                  time.Duration // the budget C was sent (its Request-Budget-Ms)
	cRuns              int
	reserveB, reserveC time.Duration
	close              func()
}

func (ch *chain) record(f func()) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	f()
}

// b is service B: it calls C with its call's context.
type serviceB struct {
	testgrpc.UnimplementedTestServiceServer
	ch     *chain
	client *http.Client
	cURL   string
}

func (s *serviceB) UnaryCall(ctx context.Context, _ *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	left, _ := deadline.Remaining(ctx)
	s.ch.record(func() { s.ch.b = left })
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err // deadline.ErrExhausted when C could not finish in time
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, status.Errorf(codes.Unavailable, "C answered %d", resp.StatusCode)
	}
	return &testgrpc.SimpleResponse{Username: string(body)}, nil
}

// startChain starts the three services on loopback; reserveB is what A keeps back from
// the call to B, reserveC what B keeps back from the call to C.
func startChain(reserveB, reserveC time.Duration) (*chain, error) {
	ch := &chain{reserveB: reserveB, reserveC: reserveC}
	var closers []func()
	ch.close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	serveHTTP := func(h http.Handler) (string, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		srv := &http.Server{Handler: h}
		go func() { _ = srv.Serve(ln) }()
		closers = append(closers, func() { _ = srv.Close() })
		return "http://" + ln.Addr().String(), nil
	}

	cURL, err := serveHTTP(deadline.Middleware(deadline.Config{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.Header.Get(deadline.DefaultHeader))
		ch.record(func() { ch.c = time.Duration(ms) * time.Millisecond; ch.cRuns++ })
		fmt.Fprint(w, "done by C")
	})))
	if err != nil {
		ch.close()
		return nil, err
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		ch.close()
		return nil, err
	}
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(grpcdeadline.UnaryServerInterceptor()))
	testgrpc.RegisterTestServiceServer(g, &serviceB{ch: ch, cURL: cURL,
		client: &http.Client{Transport: deadline.Transport{Reserve: reserveC}}})
	go func() { _ = g.Serve(ln) }()
	closers = append(closers, g.Stop)

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(grpcdeadline.UnaryClientInterceptor(reserveB)))
	if err != nil {
		ch.close()
		return nil, err
	}
	closers = append(closers, func() { _ = conn.Close() })
	b := testgrpc.NewTestServiceClient(conn)

	ch.url, err = serveHTTP(deadline.Middleware(deadline.Config{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		left, _ := deadline.Remaining(r.Context())
		ch.record(func() { ch.a = left })
		resp, err := b.UnaryCall(r.Context(), &testgrpc.SimpleRequest{})
		switch {
		case status.Code(err) == codes.DeadlineExceeded:
			http.Error(w, err.Error(), http.StatusGatewayTimeout)
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadGateway)
		default:
			fmt.Fprint(w, resp.GetUsername())
		}
	})))
	if err != nil {
		ch.close()
		return nil, err
	}
	return ch, nil
}

// call sends a request to A with budget, through deadline.Transport, and returns its
// status, whether it carries the exhausted verdict, and its body.
func (ch *chain) call(ctx context.Context, budget time.Duration) (int, bool, string, error) {
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ch.url, nil)
	if err != nil {
		return 0, false, "", err
	}
	resp, err := (&http.Client{Transport: deadline.Transport{}}).Do(req)
	if err != nil {
		return 0, false, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, false, "", err
	}
	return resp.StatusCode, resp.Header.Get(deadline.ExhaustedHeader) == "?1", string(body), nil
}
