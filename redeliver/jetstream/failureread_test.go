package jetstream

import (
	"bytes"
	"context"
	neturl "net/url"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/tcpproxy"
)

// A read of a failure record lost with its connection (sent into a partition that then
// resets the connection, as a node that dies during a leader change leaves it) is sent
// again until answered: the record is found, and the message's next delivery is not
// taken for a first attempt.
func TestFailureReadSentAgainAfterALostRead(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, target string) {
		u, err := neturl.Parse(target)
		if err != nil {
			t.Fatal(err)
		}
		proxy, err := tcpproxy.New(u.Host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = proxy.Close() })

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cfg := newConfig(t, target)
		nc, err := Dial(ctx, "nats://"+proxy.Addr(), t.Name())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		cfg.Conn = nc
		s, err := NewSource(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })

		const seq = 987654321
		first := time.Date(2026, 12, 6, 2, 0, 0, 0, time.UTC)
		if err := s.recordFailure(ctx, seq, failure{attempts: 2, first: first}); err != nil {
			t.Fatal(err)
		}

		// sent is closed once the read of the record has reached the stalled proxy.
		var mu sync.Mutex
		var held []byte
		var once sync.Once
		sent := make(chan struct{})
		proxy.OnHold(func(b []byte) {
			mu.Lock()
			held = append(held, b...)
			found := bytes.Contains(held, []byte(failureKey(seq)))
			mu.Unlock()
			if found {
				once.Do(func() { close(sent) })
			}
		})
		proxy.Stall()
		type result struct {
			f     failure
			found bool
		}
		done := make(chan result, 1)
		go func() {
			// Bounded well under the test's context: a read that is never sent again
			// waits for this one's end.
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			f, found := s.failure(rctx, seq)
			done <- result{f, found}
		}()
		select {
		case <-sent:
		case r := <-done:
			t.Fatalf("the read returned during the stall, before it was sent: %+v", r)
		}
		proxy.Restore() // resets the stalled connection: the read is lost with it
		r := <-done
		if !r.found || r.f.attempts != 2 || !r.f.first.Equal(first) {
			t.Fatalf("after its first read was lost: %+v found %v, want 2 attempts since %v", r.f, r.found, first)
		}
		if nc.Stats().Reconnects == 0 {
			t.Error("no reconnection: the read was not lost with its connection")
		}
	})
}
