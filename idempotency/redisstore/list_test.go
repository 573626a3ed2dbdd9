package redisstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// TestListReturnsEveryRecord: a listing in pages returns every record that exists for
// the whole listing while other records are written and deleted between the pages, so
// that Redis grows, shrinks and rehashes its keyspace meanwhile.
func TestListReturnsEveryRecord(t *testing.T) {
	t.Parallel()
	s := newStore(t, nil)
	ctx := context.Background()
	const n = 6000
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if _, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "u", Key: fmt.Sprintf("k%05d", i), Fingerprint: "fp",
				Lease: time.Minute, TTL: time.Hour}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	// Other records, deleted between the pages below: the keyspace shrinks.
	for i := range n {
		if _, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "gone", Key: fmt.Sprint(i), Fingerprint: "fp",
			Lease: time.Minute, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	deleted := 0
	extra := 0 // other records written between the pages: the keyspace grows and rehashes
	for _, limit := range []int{1000, 37} {
		seen := map[string]bool{}
		f := idempotency.ListFilter{Scope: "u", Limit: limit}
		for pages := 0; ; pages++ {
			for range 200 {
				if deleted < n {
					if err := s.Delete(ctx, "gone", fmt.Sprint(deleted)); err != nil {
						t.Fatal(err)
					}
					deleted++
				}
			}
			for range 20 {
				extra++
				if _, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "other", Key: fmt.Sprint(extra), Fingerprint: "fp",
					Lease: time.Minute, TTL: time.Hour}); err != nil {
					t.Fatal(err)
				}
			}
			if pages > 2*n {
				t.Fatal("List does not end")
			}
			page, err := s.List(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range page.Records {
				seen[r.Key] = true
			}
			if page.Next == "" {
				break
			}
			f.After = page.Next
		}
		if len(seen) != n {
			t.Errorf("pages of %d: List returned %d of the %d records", limit, len(seen), n)
		}
	}
}
