package jetstream

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/retrysafe/retrysafe/redeliver"
)

// startServer runs a JetStream server on a fixed port and store, as a restartable broker.
func startServer(t *testing.T, dir string, port int) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatal("server not ready")
	}
	return s
}

// The broker restarts under a running consumer: the Source reconnects by itself, and
// every message published before and after is handled.
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	srv := startServer(t, dir, port)
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)

	cfg := Config{Queue: "restart.q", URL: url, Policy: testPolicy(), Logger: quietLogger()}
	var mu sync.Mutex
	handled := map[string]int{}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(handled)
	}
	r := run(t, cfg, func(_ context.Context, m *redeliver.Message) error {
		mu.Lock()
		handled[m.ID]++
		mu.Unlock()
		return nil
	}, nil)
	pubAll := func(from, to int) {
		t.Helper()
		nc := connect(t, url)
		ids := make([]string, 0, to-from)
		for i := from; i < to; i++ {
			ids = append(ids, "x-"+strconv.Itoa(i))
		}
		publish(t, nc, cfg, ids...)
		nc.Close()
	}
	pubAll(0, 20)
	eventually(t, 10*time.Second, "the first 20", func() bool { return count() == 20 })

	srv.Shutdown()
	srv.WaitForShutdown()
	// The server comes back only once the Source's connection has seen it go: the Source
	// must reconnect by itself.
	eventually(t, 10*time.Second, "the Source to lose its connection", func() bool { return !r.src.nc.IsConnected() })
	srv = startServer(t, dir, port)

	pubAll(20, 40)
	eventually(t, 20*time.Second, "the next 20 after the restart", func() bool { return count() == 40 })
	if err := r.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	nc := connect(t, url)
	if st := queueState(t, nc, cfg); st.work != 0 || st.dlq != 0 {
		t.Errorf("state after the restart: %+v", st)
	}
}
