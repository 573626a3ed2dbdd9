package jetstream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrEmbedded is returned (wrapped) when the embedded NATS server cannot start.
var ErrEmbedded = errors.New("jetstream: embedded server")

// StartEmbedded starts a NATS server with JetStream inside this process, listening on a
// random port of 127.0.0.1, and returns its client URL and a function that shuts it
// down and waits until it has stopped. It is the default broker of the demo and of the
// tests when no URL is given.
//
// dir is where JetStream keeps its streams; "" means a new temporary directory, removed
// by shutdown. A non-empty dir is kept, so a restarted embedded server finds its streams
// again. StartEmbedded waits for the server to accept connections until ctx ends (at
// most 10 s without a deadline).
func StartEmbedded(ctx context.Context, dir string) (url string, shutdown func(), err error) {
	temp := ""
	if dir == "" {
		temp, err = os.MkdirTemp("", "retrysafe-nats-*")
		if err != nil {
			return "", nil, fmt.Errorf("%w: %w", ErrEmbedded, err)
		}
		dir = temp
	}
	cleanup := func() {
		if temp != "" {
			_ = os.RemoveAll(temp)
		}
	}
	s, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      -1, // random
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
		// No HTTP monitoring, no cluster, no leaf nodes: a client port and nothing else.
		HTTPPort: 0,
	})
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("%w: %w", ErrEmbedded, err)
	}
	s.Start()
	wait := 10 * time.Second
	if d, ok := ctx.Deadline(); ok {
		wait = time.Until(d)
	}
	stop := func() {
		s.Shutdown()
		s.WaitForShutdown()
		cleanup()
	}
	if !s.ReadyForConnections(wait) {
		stop()
		return "", nil, fmt.Errorf("%w: not ready for connections after %v", ErrEmbedded, wait)
	}
	if !s.JetStreamEnabled() {
		stop()
		return "", nil, fmt.Errorf("%w: JetStream did not start (store %s)", ErrEmbedded, dir)
	}
	return s.ClientURL(), stop, nil
}
