package grpcdeadline_test

import (
	"testing"
	"time"
)

// TestChain: a budget sent to A over HTTP bounds the gRPC call to B (its deadline) and
// B's HTTP call to C (its Request-Budget-Ms), each hop's less the reserve of the hop
// before it, and none later than the client's.
func TestChain(t *testing.T) {
	t.Parallel()
	const budget, reserve = 5 * time.Second, 200 * time.Millisecond
	ch, err := startChain(reserve, reserve)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ch.close)
	code, exhausted, body, err := ch.call(t.Context(), budget)
	if err != nil || code != 200 || exhausted || body != "done by C" {
		t.Fatalf("the chain answered %d (exhausted %v) %q, %v; want 200 from C", code, exhausted, body, err)
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	t.Logf("budgets: A %v, B %v, C %v", ch.a, ch.b, ch.c)
	if ch.a <= 0 || ch.a > budget {
		t.Errorf("A had %v, want (0, %v]", ch.a, budget)
	}
	if ch.b <= 0 || ch.b > ch.a-reserve {
		t.Errorf("B had %v, want (0, A's %v − %v]", ch.b, ch.a, reserve)
	}
	if ch.c <= 0 || ch.c > ch.b-reserve {
		t.Errorf("C was sent %v, want (0, B's %v − %v]", ch.c, ch.b, reserve)
	}
}

// TestChainSpent: when B has less time left than it must keep back for C, it does not
// call C, and the verdict travels back through both protocols: B answers
// DEADLINE_EXCEEDED with the exhausted trailer, and A's failure carries
// Request-Budget-Exhausted, so the client does not resend.
func TestChainSpent(t *testing.T) {
	t.Parallel()
	ch, err := startChain(100*time.Millisecond, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ch.close)
	code, exhausted, body, err := ch.call(t.Context(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code != 504 || !exhausted {
		t.Errorf("the client got %d (exhausted %v) %q; want 504 with Request-Budget-Exhausted", code, exhausted, body)
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.cRuns != 0 {
		t.Errorf("C ran %d times, want 0", ch.cRuns)
	}
	if ch.b <= 0 {
		t.Errorf("B did not run")
	}
}

// TestChainNotSent: a budget no larger than A's reserve for B is not sent to B at all.
func TestChainNotSent(t *testing.T) {
	t.Parallel()
	ch, err := startChain(time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ch.close)
	code, exhausted, _, err := ch.call(t.Context(), 5*time.Second)
	if err != nil || code != 504 || !exhausted {
		t.Fatalf("the client got %d (exhausted %v), %v; want 504 with Request-Budget-Exhausted", code, exhausted, err)
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.b != 0 || ch.cRuns != 0 {
		t.Errorf("B ran (had %v), C ran %d times; want neither", ch.b, ch.cRuns)
	}
}
