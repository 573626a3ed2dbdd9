package memstore

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// layouts are the two ways a record is filed: under its hash in the index, and (a
// store whose keys all share one hash) in spill.
var layouts = []struct {
	name string
	new  func(clock func() time.Time) *Store
}{
	{"index", NewWithClock},
	{"spill", NewColliding},
}

// TestArenaKeepsRecordsThroughCompaction fills slabs, frees most of their records in
// the ways a store frees them (a completion writing a record anew, a release, a
// delete, expiry), and checks that every record kept still reads back whole, under its
// own key, and that the slabs hold at most about twice the live bytes: mostly dead
// slabs were compacted and dropped, not kept. It runs on the hashed index and on a
// store where every key is in spill.
func TestArenaKeepsRecordsThroughCompaction(t *testing.T) {
	for _, tc := range layouts {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1_700_000_000, 0)
			s := tc.new(func() time.Time { return now })
			ctx := context.Background()
			const n = 6000 // several slabs of records
			body := bytes.Repeat([]byte("b"), 200)
			tokens := make(map[string]int64)
			for i := range n {
				key := "key-" + strconv.Itoa(i)
				ttl := time.Hour
				if i%10 == 0 {
					ttl = 48 * time.Hour // outlives the expiry below
				}
				res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "fp-" + key, Lease: time.Minute, TTL: ttl})
				if err != nil || !res.Claimed {
					t.Fatalf("claim %s: %v %+v", key, err, res)
				}
				tokens[key] = res.Token
				switch i % 4 {
				case 0, 1: // done: the claim's bytes die, the completion's live
					err = s.Complete(ctx, idempotency.Completion{Key: key, Token: res.Token, TTL: ttl,
						Response: idempotency.Response{Status: 201, Header: http.Header{"X-Key": {key}}, Body: body}})
				case 2:
					err = s.Release(ctx, "", key, res.Token)
				case 3:
					err = s.Delete(ctx, "", key)
				}
				if err != nil {
					t.Fatalf("key %s: %v", key, err)
				}
			}
			if got := s.arena.bytes(); got < 4*slabSize {
				t.Fatalf("the test fills %d bytes of slabs, want several slabs", got)
			}
			now = now.Add(2 * time.Hour) // every record of a 1-hour TTL expires
			if _, err := s.DeleteExpired(ctx, n); err != nil {
				t.Fatal(err)
			}
			kept := 0
			for i := range n {
				key := "key-" + strconv.Itoa(i)
				rec, err := s.Get(ctx, "", key)
				if i%10 != 0 || i%4 > 1 {
					if err == nil {
						t.Fatalf("%s: found %+v, want it gone", key, rec)
					}
					continue
				}
				kept++
				if err != nil {
					t.Fatalf("%s: %v", key, err)
				}
				if rec.Key != key || rec.Fingerprint != "fp-"+key || rec.Token != tokens[key] || rec.State != idempotency.StateDone ||
					rec.Response == nil || rec.Response.Header.Get("X-Key") != key || !bytes.Equal(rec.Response.Body, body) {
					t.Fatalf("%s after compaction: %+v", key, rec)
				}
			}
			live := 0
			for _, sl := range s.arena.slabs {
				live += sl.live
			}
			// Beyond twice the live bytes: a current slab of each kind, and a spare buffer.
			if got, bound := s.arena.bytes(), 2*live+3*slabSize; got > bound {
				t.Fatalf("%d records kept, %d live bytes: slabs hold %d bytes, want at most %d", kept, live, got, bound)
			}
		})
	}
}

// TestArenaBigRecord stores responses too big to share a slab, each in a slab of its
// own, and checks that its slab is dropped when the record is.
func TestArenaBigRecord(t *testing.T) {
	s := New()
	ctx := context.Background()
	body := bytes.Repeat([]byte("x"), 3*slabSize)
	for i := range 3 {
		key := fmt.Sprint("big-", i)
		res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		if err != nil || !res.Claimed {
			t.Fatalf("claim: %v %+v", err, res)
		}
		if err := s.Complete(ctx, idempotency.Completion{Key: key, Token: res.Token, TTL: time.Hour,
			Response: idempotency.Response{Status: 200, Header: http.Header{}, Body: body}}); err != nil {
			t.Fatal(err)
		}
		rec, err := s.Get(ctx, "", key)
		if err != nil || !bytes.Equal(rec.Response.Body, body) {
			t.Fatalf("Get %s: %v", key, err)
		}
		if err := s.Delete(ctx, "", key); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.arena.bytes(); got > slabSize {
		t.Fatalf("after the big records' deletes the slabs hold %d bytes, want at most one slab (%d)", got, slabSize)
	}
}

// TestArenaSettledKeysHoldNoDeadClaims claims and completes keys, one at a time and
// with requests in flight as a server has them, and checks that the slabs hold little
// more than the settled records: each key's claim, dead once the key is settled, does
// not stay between them until the key expires, and a claims slab that is wholly dead
// when the next takes its place is reused, not kept. Were claims and settled records to
// share slabs, the slabs would hold about half again the live bytes.
func TestArenaSettledKeysHoldNoDeadClaims(t *testing.T) {
	for _, inFlight := range []int{0, 32} {
		t.Run(fmt.Sprint(inFlight, "-in-flight"), func(t *testing.T) {
			s := New()
			ctx := context.Background()
			const n, scope = 20000, "a-scope-of-some-length"
			body := bytes.Repeat([]byte("b"), 100)
			tokens := make([]int64, n)
			complete := func(i int) {
				key := "key-" + strconv.Itoa(i)
				if err := s.Complete(ctx, idempotency.Completion{Scope: scope, Key: key, Token: tokens[i], TTL: time.Hour,
					Response: idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}}); err != nil {
					t.Fatalf("complete %s: %v", key, err)
				}
			}
			for i := range n {
				key := "key-" + strconv.Itoa(i)
				res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: scope, Key: key,
					Fingerprint: "a-fingerprint-of-the-length-of-a-sha-256-in-hex-" + key, Lease: time.Minute, TTL: time.Hour})
				if err != nil || !res.Claimed {
					t.Fatalf("claim %s: %v %+v", key, err, res)
				}
				tokens[i] = res.Token
				if i >= inFlight {
					complete(i - inFlight)
				}
			}
			for i := n - inFlight; i < n; i++ {
				complete(i)
			}
			live := 0
			for _, sl := range s.arena.slabs {
				live += sl.live
			}
			if live < 16*slabSize {
				t.Fatalf("%d live bytes: the test must fill many slabs", live)
			}
			t.Logf("%d keys settled: %d live bytes, slabs hold %d", n, live, s.arena.bytes())
			// A current slab of each kind and a spare buffer, beyond a tenth of slack.
			if got, bound := s.arena.bytes(), live+live/10+3*slabSize; got > bound {
				t.Fatalf("%d keys settled, %d live bytes: slabs hold %d bytes, want at most %d", n, live, got, bound)
			}
		})
	}
}

// TestSettledRecordDropsClaimID checks that a completion writes the key's record
// without its claim ID, and that the claim sent again with that ID then gets the
// stored answer, as any other request does: only a claim in progress is its ID's.
func TestSettledRecordDropsClaimID(t *testing.T) {
	s := New()
	ctx := context.Background()
	req := idempotency.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Route: "/r", ID: "process-a.1", Lease: time.Minute, TTL: time.Hour}
	res, err := s.Claim(ctx, req)
	if err != nil || !res.Claimed {
		t.Fatalf("claim: %v %+v", err, res)
	}
	f, _ := s.find("s", "k")
	if v := f.r.view(); string(v.claimID) != req.ID {
		t.Fatalf("in progress: claim ID %q, want %q", v.claimID, req.ID)
	}
	inProgress := len(f.r)
	body := []byte(`{"id":1}`)
	resp := idempotency.Response{Status: 201, Header: http.Header{"Location": {"/r/1"}}, Body: body}
	if err := s.Complete(ctx, idempotency.Completion{Scope: "s", Key: "k", Token: res.Token, TTL: time.Hour, Response: resp}); err != nil {
		t.Fatal(err)
	}
	f, _ = s.find("s", "k")
	v := f.r.view()
	if len(v.claimID) != 0 || string(v.scope) != "s" || string(v.key) != "k" || string(v.fingerprint) != "fp" || string(v.route) != "/r" {
		t.Fatalf("settled record's strings: %q %q %q %q, claim ID %q", v.scope, v.key, v.fingerprint, v.route, v.claimID)
	}
	if want := inProgress - len(req.ID) + len(appendResponse(nil, &resp)); len(f.r) != want {
		t.Fatalf("settled record: %d bytes, want %d", len(f.r), want)
	}
	again, err := s.Claim(ctx, req)
	if err != nil || again.Claimed || again.Existing == nil || again.Existing.State != idempotency.StateDone ||
		again.Existing.Response == nil || !bytes.Equal(again.Existing.Response.Body, body) || again.Existing.Route != "/r" {
		t.Fatalf("the claim again with its ID after the completion: %v %+v", err, again)
	}
}
