package grpcidem_test

import (
	"context"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/grpc/grpcidem"
	"github.com/retrysafe/retrysafe/harness/tcpproxy"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestStoreOutage: PostgreSQL behind a TCP proxy the test cuts. A call made while the
// store is unreachable is refused with UNAVAILABLE and a RetryInfo, and does not run.
// A call whose store link is cut after its work gets its answer, which the process holds:
// a retry during the outage gets it again without running the call, and once the link is
// back it is stored, and another process's interceptor replays it.
func TestStoreOutage(t *testing.T) {
	t.Parallel()
	directDSN := storeDSN(t, "postgres")
	u, err := url.Parse(directDSN)
	if err != nil {
		t.Fatal(err)
	}
	link, err := tcpproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	u.Host = link.Addr()
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	dsn := u.String()

	var mu sync.Mutex
	outcomes := map[string][]idempotency.Outcome{}
	s := newSvc()
	addr, _ := serve(t, s, grpcidem.Config{
		Idempotency: idempotency.Config{Store: openOpened(t, dsn).Store, StoreTimeout: 2 * time.Second, Conflict: idempotency.ConflictWait},
		OnOutcome: func(ctx context.Context, _ string, o idempotency.Outcome, _ codes.Code) {
			mu.Lock()
			defer mu.Unlock()
			outcomes["all"] = append(outcomes["all"], o)
		},
	})
	c := dial(t, addr)
	ctx := t.Context()

	link.Cut()
	r := invoke(ctx, c, "k-down", "down", "")
	if status.Code(r.err) != codes.Unavailable || reason(r.err) != grpcidem.ReasonStoreUnavailable || retryDelay(r.err) <= 0 {
		t.Fatalf("a call with the store unreachable: %v (reason %q, retry delay %v), want UNAVAILABLE %s with a RetryInfo",
			r.err, reason(r.err), retryDelay(r.err), grpcidem.ReasonStoreUnavailable)
	}
	if n := s.count("down"); n != 0 {
		t.Fatalf("the call ran %d times with its store unreachable, want 0", n)
	}
	link.Restore()

	s.after = func(body string, _ int) {
		if body == "held" {
			link.Cut() // the work is done; its answer cannot be stored now
		}
	}
	first := invoke(ctx, c, "k-held", "held", "")
	if first.err != nil {
		t.Fatalf("the call whose store link was cut after its work: %v, want its answer", first.err)
	}
	retry := invoke(ctx, c, "k-held", "held", "")
	if retry.err != nil || !retry.replayed() || !sameAnswer(first, retry) || s.count("held") != 1 {
		t.Fatalf("a retry during the outage: %v (replayed %v), executions %d; want the held answer, 1 execution",
			retry, retry.replayed(), s.count("held"))
	}
	link.Restore()
	direct := openOpened(t, directDSN) // the same schema, not through the link

	testenv.Eventually(t, time.Minute, func() bool {
		rec, err := direct.Store.Get(ctx, "", "k-held")
		return err == nil && rec.State == idempotency.StateDone
	}, "the held answer to be stored once the link is back")

	s2 := newSvc()
	addr2, _ := serve(t, s2, grpcidem.Config{Idempotency: idempotency.Config{Store: direct.Store}})
	again := invoke(ctx, dial(t, addr2), "k-held", "held", "")
	if again.err != nil || !again.replayed() || !sameAnswer(first, again) || s2.count("held") != 0 {
		t.Fatalf("another process's retry: %v (replayed %v), its executions %d; want the stored answer", again, again.replayed(), s2.count("held"))
	}
	mu.Lock()
	defer mu.Unlock()
	want := []idempotency.Outcome{idempotency.OutcomeStoreError, idempotency.OutcomeStoredLater, idempotency.OutcomeReplayed}
	if got := outcomes["all"]; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("outcomes %v, want %v", got, want)
	}
}
