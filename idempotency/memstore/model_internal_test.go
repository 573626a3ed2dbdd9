package memstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// TestArenaAgainstModel runs random claims, completions, releases, deletes and expiry
// on a store and on a model of what each key holds (a map), with responses from empty
// to larger than a slab's share, so that slabs fill, die and are compacted in every
// order the operations allow. After each operation its outcome must be the model's,
// and every so often each key must read back as the model has it, and each slab's live
// count must be the sum of the records filed in it.
func TestArenaAgainstModel(t *testing.T) {
	for _, tc := range layouts {
		t.Run(tc.name, func(t *testing.T) {
			runModel(t, tc.new, 100_000)
		})
	}
}

// modelRecord is what the model holds for a key: present until deleted, released,
// replaced or swept by DeleteExpired; expired (claimable again) from expires on.
type modelRecord struct {
	token   int64
	done    bool
	body    []byte
	expires time.Time
}

func runModel(t *testing.T, newStore func(clock func() time.Time) *Store, steps int) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11))
	now := time.Unix(1_700_000_000, 0)
	s := newStore(func() time.Time { return now })
	model := make(map[string]*modelRecord)
	const keys = 300
	body := func() []byte {
		switch n := rng.IntN(100); {
		case n == 0:
			return bytes.Repeat([]byte{byte(rng.IntN(256))}, bigRecord+rng.IntN(bigRecord))
		case n < 10:
			return nil
		default:
			return bytes.Repeat([]byte{byte(rng.IntN(256))}, rng.IntN(3000))
		}
	}
	var lastToken int64
	for step := range steps {
		key := fmt.Sprint("k", rng.IntN(keys))
		m := model[key]
		// A claim's lease and TTL are equal, so that a record in progress is either
		// held or expired, never open to a takeover: the model stays a map.
		ttl := time.Duration(30+rng.IntN(90)) * time.Minute
		switch op := rng.IntN(10); {
		case op < 4:
			res, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Lease: ttl, TTL: ttl})
			if err != nil {
				t.Fatalf("step %d: claim %s: %v", step, key, err)
			}
			if m == nil || !now.Before(m.expires) {
				if !res.Claimed || res.Token <= lastToken {
					t.Fatalf("step %d: claim of free %s: %+v, want a claim with a token above %d", step, key, res, lastToken)
				}
				lastToken = res.Token
				model[key] = &modelRecord{token: res.Token, expires: now.Add(ttl)}
				break
			}
			if res.Claimed || res.Existing == nil || res.Existing.Token != m.token ||
				(res.Existing.State == idempotency.StateDone) != m.done {
				t.Fatalf("step %d: claim of held %s (%+v): %+v", step, key, *m, res)
			}
			if m.done && !bytes.Equal(res.Existing.Response.Body, m.body) {
				t.Fatalf("step %d: replay of %s: body of %d bytes, want %d", step, key, len(res.Existing.Response.Body), len(m.body))
			}
		case op < 7:
			token := lastToken + 1 // no record's: the store must refuse it
			if m != nil && rng.IntN(8) > 0 {
				token = m.token
			}
			b := body()
			err := s.Complete(ctx, idempotency.Completion{Key: key, Token: token, TTL: ttl,
				Response: idempotency.Response{Status: 201, Header: http.Header{"X-Key": {key}}, Body: b}})
			switch {
			case m == nil:
				if !errors.Is(err, idempotency.ErrRecordGone) {
					t.Fatalf("step %d: complete of absent %s: %v", step, key, err)
				}
			case token != m.token:
				if !errors.Is(err, idempotency.ErrLeaseLost) {
					t.Fatalf("step %d: complete of %s with another token: %v", step, key, err)
				}
			case m.done:
				if err != nil {
					t.Fatalf("step %d: complete of done %s again: %v", step, key, err)
				}
			default:
				if err != nil {
					t.Fatalf("step %d: complete %s: %v", step, key, err)
				}
				m.done, m.body, m.expires = true, b, now.Add(ttl)
			}
		case op < 8:
			if m == nil {
				break
			}
			err := s.Release(ctx, "", key, m.token)
			if m.done {
				if !errors.Is(err, idempotency.ErrLeaseLost) {
					t.Fatalf("step %d: release of done %s: %v", step, key, err)
				}
				break
			}
			if err != nil {
				t.Fatalf("step %d: release %s: %v", step, key, err)
			}
			delete(model, key)
		case op < 9:
			if err := s.Delete(ctx, "", key); err != nil {
				t.Fatalf("step %d: delete %s: %v", step, key, err)
			}
			delete(model, key)
		case rng.IntN(3) > 0:
			// Time passes: records expire and stay until swept, claimable again.
			now = now.Add(time.Duration(rng.IntN(20)) * time.Minute)
		default:
			n, err := s.DeleteExpired(ctx, keys)
			if err != nil {
				t.Fatal(err)
			}
			swept := 0
			for k, r := range model {
				if !now.Before(r.expires) {
					delete(model, k)
					swept++
				}
			}
			if n != swept {
				t.Fatalf("step %d: DeleteExpired swept %d, the model %d", step, n, swept)
			}
		}
		if step%500 == 0 || step == steps-1 {
			checkModel(t, s, model, keys)
		}
	}
}

// checkModel checks that each key reads back as model has it, and that each slab's
// live count is what the records filed in it take.
func checkModel(t *testing.T, s *Store, model map[string]*modelRecord, keys int) {
	t.Helper()
	ctx := context.Background()
	for i := range keys {
		key := fmt.Sprint("k", i)
		rec, err := s.Get(ctx, "", key)
		m := model[key]
		if m == nil {
			if !errors.Is(err, idempotency.ErrNotFound) {
				t.Fatalf("%s: found %v %+v, want none", key, err, rec)
			}
			continue
		}
		if err != nil || rec.Key != key || rec.Token != m.token || (rec.State == idempotency.StateDone) != m.done ||
			!rec.ExpiresAt.Equal(m.expires) {
			t.Fatalf("%s: %v %+v, want %+v", key, err, rec, *m)
		}
		if m.done && (!bytes.Equal(rec.Response.Body, m.body) || rec.Response.Header.Get("X-Key") != key) {
			t.Fatalf("%s: response body of %d bytes, header %v; want %d bytes", key, len(rec.Response.Body), rec.Response.Header, len(m.body))
		}
	}
	live := make(map[uint32]int)
	count := func(at ref) { live[at.slab()] += lenSize + len(s.arena.get(at)) }
	// Every handle is either filed, once, with a record, or free, once, with none.
	filed := make(map[handle]bool)
	file := func(hd handle) {
		if filed[hd] || s.refs[hd] == noRef {
			t.Fatalf("handle %d filed twice, or filed without a record", hd)
		}
		filed[hd] = true
		count(s.refs[hd])
	}
	for _, hd := range s.index {
		file(hd)
	}
	for _, hd := range s.spill {
		file(hd)
	}
	for _, hd := range s.free {
		if filed[hd] || s.refs[hd] != noRef {
			t.Fatalf("free handle %d is filed, or has a record", hd)
		}
		filed[hd] = true
	}
	if len(filed) != len(s.refs) {
		t.Fatalf("%d handles filed or free, of %d", len(filed), len(s.refs))
	}
	for i, sl := range s.arena.slabs {
		if sl.live != live[uint32(i)] {
			t.Fatalf("slab %d counts %d live bytes, its filed records take %d", i, sl.live, live[uint32(i)])
		}
	}
}
