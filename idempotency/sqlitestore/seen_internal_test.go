package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// brokenRead makes s's lock-free read fail, so that a claim shows whether it ran it.
func brokenRead(t *testing.T, s *Store) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "closed.db"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := db.Prepare(`SELECT 1`)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s.st.lean = st
}

// A key the Store has not met is claimed without the lock-free read (one statement
// under the write lock); a key it has met is read first, so that its retries stay off
// the write lock.
func TestUnmetKeySkipsLockFreeRead(t *testing.T) {
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%t", batched), func(t *testing.T) {
			ctx := context.Background()
			s, err := Open(ctx, Config{Path: filepath.Join(t.TempDir(), "seen.db"), Batch: batched})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			brokenRead(t, s)
			req := idempotency.ClaimRequest{Scope: "s", Key: "new", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
			if res, err := s.Claim(ctx, req); err != nil || !res.Claimed || res.Token == 0 {
				t.Fatalf("claim of a new key = %+v, %v: it ran the lock-free read", res, err)
			}
			if res, err := s.Claim(ctx, req); err == nil {
				t.Fatalf("claim of a key met before = %+v: it did not run the lock-free read", res)
			}
		})
	}
}

// A Store that has not met a key decides every claim of it under the write lock as the
// lock-free read would have: a replay, a request in flight, a mismatch, the claimer's
// own record granted again, a takeover and a replaced expired record, with tokens that
// keep growing.
func TestUnmetKeysDecidedUnderTheLock(t *testing.T) {
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%t", batched), func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "two.db")
			var clock atomic.Int64
			clock.Store(1_700_000_000_000)
			now := func() time.Time { return time.UnixMilli(clock.Load()) }
			a, err := Open(ctx, Config{Path: path, Batch: batched, Clock: now})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Close() })
			// A Store that meets every key for the first time: a new one for each claim,
			// its lock-free read broken to show that it is not what decides.
			fresh := func() *Store {
				b, err := Open(ctx, Config{Path: path, Batch: batched, Clock: now})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = b.Close() })
				brokenRead(t, b)
				return b
			}
			req := func(key, fp string) idempotency.ClaimRequest {
				return idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour, ID: key + "-" + fp}
			}
			mustClaim := func(s *Store, r idempotency.ClaimRequest) idempotency.ClaimResult {
				t.Helper()
				res, err := s.Claim(ctx, r)
				if err != nil {
					t.Fatalf("claim %+v: %v", r, err)
				}
				return res
			}

			done := mustClaim(a, req("done", "fp"))
			if err := a.Complete(ctx, idempotency.Completion{Scope: "s", Key: "done", Token: done.Token, TTL: time.Hour,
				Response: idempotency.Response{Status: 201, Body: []byte("paid")}}); err != nil {
				t.Fatal(err)
			}
			if res := mustClaim(fresh(), req("done", "fp")); res.Claimed || res.Existing == nil || res.Existing.Response == nil || string(res.Existing.Response.Body) != "paid" {
				t.Errorf("replay = %+v", res)
			}
			if res := mustClaim(fresh(), req("done", "other")); res.Claimed || res.Existing == nil || res.Existing.Response != nil || res.Existing.Fingerprint != "fp" {
				t.Errorf("mismatch = %+v", res)
			}
			running := mustClaim(a, req("running", "fp"))
			if res := mustClaim(fresh(), req("running", "other")); res.Claimed || res.Existing == nil || res.Existing.State != idempotency.StateInProgress {
				t.Errorf("claim of a key in flight = %+v", res)
			}
			if res := mustClaim(fresh(), req("running", "fp")); !res.Claimed || res.Token != running.Token || res.TookOver {
				t.Errorf("the claim sent again = %+v, want its own token %d granted again", res, running.Token)
			}

			clock.Add(2 * time.Minute.Milliseconds()) // the lease of "running" has run out
			retry := req("running", "fp")
			retry.ID = "a retry's"
			took := mustClaim(fresh(), retry)
			if !took.Claimed || !took.TookOver || took.Token <= done.Token || took.Token <= running.Token {
				t.Errorf("takeover = %+v, want a token above %d", took, running.Token)
			}
			clock.Add(2 * time.Hour.Milliseconds()) // "done" has expired
			replaced := mustClaim(fresh(), req("done", "other"))
			if !replaced.Claimed || replaced.TookOver || replaced.Token <= took.Token {
				t.Errorf("claim over an expired record = %+v, want a token above %d", replaced, took.Token)
			}
			rec, err := a.Get(ctx, "s", "done")
			if err != nil || rec.Token != replaced.Token || rec.Fingerprint != "other" || rec.State != idempotency.StateInProgress {
				t.Errorf("replaced record = %+v, %v", rec, err)
			}
		})
	}
}
