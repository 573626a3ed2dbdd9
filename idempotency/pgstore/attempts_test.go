package pgstore_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// Get and List report the attempts of a claim: 1, then 2 after a takeover of a record
// whose lease ran out, then 1 again for a fresh claim of the key once it expired.
func TestAttempts(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()).UTC() }
	st, _ := newStoreConfig(t, pgstore.Config{Pool: newPool(t, testenv.PostgresURL(t), nil), Clock: clock})
	req := idempotency.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Minute}
	attempts := func(want int) {
		t.Helper()
		rec, err := st.Get(ctx, "s", "k")
		if err != nil {
			t.Fatal(err)
		}
		page, err := st.List(ctx, idempotency.ListFilter{Scope: "s"})
		if err != nil || len(page.Records) != 1 {
			t.Fatalf("List: %v, %d records", err, len(page.Records))
		}
		if rec.Attempts != want || page.Records[0].Attempts != want {
			t.Errorf("attempts: Get %d, List %d, want %d", rec.Attempts, page.Records[0].Attempts, want)
		}
	}
	claim := func(wantTookOver bool) {
		t.Helper()
		res, err := st.Claim(ctx, req)
		if err != nil || !res.Claimed || res.TookOver != wantTookOver {
			t.Fatalf("Claim: %+v, %v; want claimed, took over %v", res, err, wantTookOver)
		}
	}
	claim(false)
	attempts(1)
	now.Add(int64(2 * time.Second)) // the lease ran out: the owner is presumed dead
	claim(true)
	attempts(2)
	now.Add(int64(2 * time.Minute)) // the record expired: a fresh claim starts over
	claim(false)
	attempts(1)
}
