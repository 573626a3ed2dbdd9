// Package natsserver runs a NATS server with JetStream inside the process, for tests and
// demos that need a broker and have none: it listens on a random port of 127.0.0.1. It
// is apart from package jetstream so that programs using that package link no server.
package natsserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrStart is returned (wrapped) when the server cannot start.
var ErrStart = errors.New("natsserver: start")

// Start starts a NATS server with JetStream inside this process, listening on a random
// port of 127.0.0.1, and returns its client URL and a function that shuts it down and
// waits until it has stopped.
//
// dir is where JetStream keeps its streams; "" means a new temporary directory, removed
// by shutdown. A non-empty dir is kept, so a restarted embedded server finds its streams
// again. Start waits for the server to accept connections until ctx ends (at
// most 10 s without a deadline).
func Start(ctx context.Context, dir string) (url string, shutdown func(), err error) {
	temp := ""
	if dir == "" {
		temp, err = os.MkdirTemp("", "retrysafe-nats-*")
		if err != nil {
			return "", nil, fmt.Errorf("%w: %w", ErrStart, err)
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
		return "", nil, fmt.Errorf("%w: %w", ErrStart, err)
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
		return "", nil, fmt.Errorf("%w: not ready for connections after %v", ErrStart, wait)
	}
	if !s.JetStreamEnabled() {
		stop()
		return "", nil, fmt.Errorf("%w: JetStream did not start (store %s)", ErrStart, dir)
	}
	return s.ClientURL(), stop, nil
}
