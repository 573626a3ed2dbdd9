package jetstream

import (
	"context"
	"testing"
	"time"
)

// A read of a failure record lost with its connection (sent into a partition that then
// resets the connection, as a node that dies during a leader change leaves it) is sent
// again until answered: the record is found, and the message's next delivery is not
// taken for a first attempt.
func TestFailureReadSentAgainAfterALostRead(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, target string) {
		const seq = 987654321
		// sent is closed once the read of the record has reached the stalled proxy.
		proxy, sent := proxyTo(t, target, []byte(failureKey(seq)))

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

		first := time.Date(2026, 12, 6, 2, 0, 0, 0, time.UTC)
		if err := s.recordFailure(ctx, seq, failure{attempts: 2, first: first}); err != nil {
			t.Fatal(err)
		}

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
