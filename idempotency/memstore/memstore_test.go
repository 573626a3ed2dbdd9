package memstore_test

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

func TestConformance(t *testing.T) {
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T, clock func() time.Time) idempotency.Store { return memstore.NewWithClock(clock) },
		Down: func(t *testing.T) idempotency.Store {
			s := memstore.New()
			_ = s.Close()
			return s
		},
	})
}

// TestConformanceColliding runs the contract on a store whose keys all share one hash:
// a record filed in spill, behind another key's, must behave as any other.
func TestConformanceColliding(t *testing.T) {
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T, clock func() time.Time) idempotency.Store { return memstore.NewColliding(clock) },
		Down: func(t *testing.T) idempotency.Store {
			s := memstore.NewColliding(nil)
			_ = s.Close()
			return s
		},
	})
}

// A completion finds a recent claim by its token without the index. A claim whose key
// was deleted meanwhile, its handle now another key's, or its key claimed again, must
// still be refused as it would be without that shortcut.
func TestCompleteAfterTheHandleMoved(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		new  func(func() time.Time) *memstore.Store
	}{{"index", memstore.NewWithClock}, {"spill", memstore.NewColliding}} {
		s := c.new(nil)
		claim := func(key string) int64 {
			t.Helper()
			res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
			if err != nil || !res.Claimed {
				t.Fatalf("%s: claim %s: %v %+v", c.name, key, err, res)
			}
			return res.Token
		}
		complete := func(key string, token int64) error {
			return s.Complete(ctx, idempotency.Completion{Key: key, Token: token, TTL: time.Hour,
				Response: idempotency.Response{Status: 201, Body: []byte(key)}})
		}
		if c.name == "spill" {
			claim("first") // so that the keys below are filed in spill
		}
		a := claim("a")
		if err := s.Delete(ctx, "", "a"); err != nil {
			t.Fatal(err)
		}
		b := claim("b") // takes a's handle
		if err := complete("a", a); !errors.Is(err, idempotency.ErrRecordGone) {
			t.Errorf("%s: completion of a deleted claim whose handle is b's: %v, want ErrRecordGone", c.name, err)
		}
		if rec, err := s.Get(ctx, "", "b"); err != nil || rec.State != idempotency.StateInProgress || rec.Token != b {
			t.Errorf("%s: b after a's refused completion: %+v %v", c.name, rec, err)
		}
		if err := s.Delete(ctx, "", "b"); err != nil {
			t.Fatal(err)
		}
		b2 := claim("b") // the same key again, a later token
		if err := complete("b", b); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("%s: completion under b's earlier token: %v, want ErrLeaseLost", c.name, err)
		}
		if err := complete("b", b2); err != nil {
			t.Errorf("%s: completion under b's token: %v", c.name, err)
		}
		if rec, err := s.Get(ctx, "", "b"); err != nil || rec.State != idempotency.StateDone || string(rec.Response.Body) != "b" {
			t.Errorf("%s: b after its completion: %+v %v", c.name, rec, err)
		}
	}
}

// BenchmarkCollectHeld measures what a store of many done records costs each garbage
// collection: one op is a full collection with 100,000 records held. A process pays it
// on every cycle its allocations start, so it falls on every request it serves.
//
//	go test -run '^$' -bench CollectHeld ./idempotency/memstore
func BenchmarkCollectHeld(b *testing.B) {
	const n = 100_000
	ctx := context.Background()
	s := memstore.New()
	resp := idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":1,"amount":1250,"currency":"EUR"}`)}
	for i := range n {
		key := "key-" + strconv.Itoa(i)
		res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "user-1", Key: key, Fingerprint: "fp-" + key,
			Route: "POST /payments", ID: "claim-" + key, Lease: time.Minute, TTL: time.Hour})
		if err != nil || !res.Claimed {
			b.Fatalf("claim %d: %v %+v", i, err, res)
		}
		if err := s.Complete(ctx, idempotency.Completion{Scope: "user-1", Key: key, Token: res.Token, Response: resp, TTL: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	for b.Loop() {
		runtime.GC()
	}
	runtime.KeepAlive(s)
}

// TestSweepAfterShorterRetention: records are swept once their expiry passes, whichever
// write set it: a completion whose retention is shorter than its claim's, and a sweep
// cut short by its limit, which leaves the rest for the next.
func TestSweepAfterShorterRetention(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		new  func(func() time.Time) *memstore.Store
	}{{"index", memstore.NewWithClock}, {"spill", memstore.NewColliding}} {
		now := time.Unix(1_700_000_000, 0)
		s := c.new(func() time.Time { return now })
		for i := range 3 {
			key := "k" + strconv.Itoa(i)
			res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour})
			if err != nil || !res.Claimed {
				t.Fatalf("%s: claim %s: %v %+v", c.name, key, err, res)
			}
			if err := s.Complete(ctx, idempotency.Completion{Key: key, Token: res.Token, TTL: time.Second,
				Response: idempotency.Response{Status: http.StatusCreated}}); err != nil {
				t.Fatalf("%s: complete %s: %v", c.name, key, err)
			}
		}
		if n, err := s.DeleteExpired(ctx, 10); err != nil || n != 0 {
			t.Fatalf("%s: a sweep before any expiry: %d, %v; want 0", c.name, n, err)
		}
		now = now.Add(2 * time.Second)
		for i, want := range []int{1, 1, 1, 0} {
			if n, err := s.DeleteExpired(ctx, 1); err != nil || n != want {
				t.Fatalf("%s: sweep %d of one record each, 2 s on: %d, %v; want %d", c.name, i, n, err, want)
			}
		}
		for i := range 3 {
			if _, err := s.Get(ctx, "", "k"+strconv.Itoa(i)); !errors.Is(err, idempotency.ErrNotFound) {
				t.Errorf("%s: k%d after the sweeps: %v, want ErrNotFound", c.name, i, err)
			}
		}
	}
}

// BenchmarkSweepNothingDue: the janitor's sweep of a store of 200,000 completed records
// none of which has expired, as every sweep is for a retention's length after a process
// starts. It holds the store's lock throughout.
func BenchmarkSweepNothingDue(b *testing.B) {
	ctx := context.Background()
	s := memstore.New()
	for i := range 200_000 {
		key := "k" + strconv.Itoa(i)
		res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		if err != nil || !res.Claimed {
			b.Fatalf("claim %s: %v %+v", key, err, res)
		}
		if err := s.Complete(ctx, idempotency.Completion{Key: key, Token: res.Token, TTL: time.Hour,
			Response: idempotency.Response{Status: http.StatusCreated}}); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if n, err := s.DeleteExpired(ctx, 1000); err != nil || n != 0 {
			b.Fatalf("swept %d, %v", n, err)
		}
	}
}
