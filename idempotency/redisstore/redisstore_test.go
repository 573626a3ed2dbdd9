package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
	"github.com/retrysafe/retrysafe/internal/testenv"
)

// newStore returns a store on the test Redis under its own prefix, whose keys are
// deleted when t ends.
func newStore(t *testing.T) *Store {
	t.Helper()
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	return storeOn(t, client, client)
}

// storeOn returns a store using client under its own prefix; when t ends it deletes the
// prefix's keys through admin.
func storeOn(t *testing.T, client redis.UniversalClient, admin *redis.Client) *Store {
	t.Helper()
	prefix := testenv.Name("rs") + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := admin.Scan(ctx, 0, globEscape(prefix)+"*", 100).Iterator()
		for iter.Next(ctx) {
			admin.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("cleanup of %s*: %v", prefix, err)
		}
	})
	s, err := New(Config{Client: client, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T) idempotency.Store { return newStore(t) },
		Down: func(t *testing.T) idempotency.Store {
			client := redis.NewClient(&redis.Options{
				Addr:          testenv.DeadAddr(t),
				DialTimeout:   200 * time.Millisecond,
				DialerRetries: 1,
				MaxRetries:    -1,
			})
			t.Cleanup(func() { _ = client.Close() })
			s, err := New(Config{Client: client})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}

// TestRing runs the suite through a one-shard redis.Ring, whose List scans each shard.
func TestRing(t *testing.T) {
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T) idempotency.Store {
			ring := redis.NewRing(&redis.RingOptions{
				Addrs:    map[string]string{"only": opts.Addr},
				Username: opts.Username, Password: opts.Password, DB: opts.DB,
			})
			admin := redis.NewClient(opts)
			t.Cleanup(func() {
				_ = ring.Close()
				_ = admin.Close()
			})
			return storeOn(t, ring, admin)
		},
	})
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("New without a client: no error")
	}
	client := redis.NewClient(&redis.Options{})
	defer client.Close()
	if _, err := New(Config{Client: client, Prefix: "app:{x}:"}); err == nil {
		t.Error("New with a hash tag in the prefix: no error")
	}
}

func TestClosedClient(t *testing.T) {
	client := redis.NewClient(&redis.Options{})
	_ = client.Close()
	s, err := New(Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), "s", "k"); !errors.Is(err, idempotency.ErrClosed) || !errors.Is(err, redis.ErrClosed) {
		t.Errorf("Get on a closed client = %v, want idempotency.ErrClosed and redis.ErrClosed", err)
	}
}

// TestTTLSet checks that Redis expires records by itself, with a TTL computed from the
// caller's clock (a fake one here, years in the past).
func TestTTLSet(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	now := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	pttl := func(want time.Duration) {
		t.Helper()
		got, err := s.client.PTTL(ctx, s.recordKey("sc", "k")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got <= 0 || got > want || got < want-5*time.Second {
			t.Errorf("PTTL = %v, want ≈ %v", got, want)
		}
	}
	res, err := s.Claim(ctx, idempotency.ClaimRequest{
		Scope: "sc", Key: "k", Fingerprint: "fp",
		Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
	})
	if err != nil || !res.Claimed {
		t.Fatalf("Claim = %+v, %v", res, err)
	}
	pttl(time.Hour)
	now = now.Add(10 * time.Minute)
	err = s.Complete(ctx, idempotency.Completion{
		Scope: "sc", Key: "k", Token: res.Token, Response: idempotency.Response{Status: 201},
		Now: now, ExpiresAt: now.Add(48 * time.Hour),
	})
	if err != nil {
		t.Fatal(err)
	}
	pttl(48 * time.Hour)
}

// TestOneSlot checks that a record's key carries a hash tag that is its own (scope and
// key), so a Cluster spreads records over slots while each script touches one slot.
func TestOneSlot(t *testing.T) {
	s, err := New(Config{Client: redis.NewClient(&redis.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if got := keySlot("123456789"); got != 0x31C3%16384 {
		t.Fatalf("keySlot(123456789) = %d: CRC16 is not XMODEM", got)
	}
	slots := map[uint16]bool{}
	for _, scope := range []string{"", "a", "tenant-1", "t:{x}", "\x00\xff"} {
		for _, key := range []string{"k", "order-42", "a:b", "x{y"} {
			k := s.recordKey(scope, key)
			tag := hashTag(k)
			if tag == k || !strings.HasSuffix(k, tag+"}") || !strings.HasPrefix(k, DefaultPrefix+"{") {
				t.Errorf("recordKey(%q, %q) = %q: hash tag %q is not the record's", scope, key, k, tag)
			}
			slots[keySlot(k)] = true
		}
	}
	if len(slots) < 10 {
		t.Errorf("20 records hash to only %d slots", len(slots))
	}
}

// TestScopeEncoding checks that scopes holding the separators or arbitrary bytes never
// share a record or a List page.
func TestScopeEncoding(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	now := time.Now()
	pairs := [][2]string{
		{"a", "b:c"}, {"a:b", "c"}, {"a:b:c", ""}, {"", "a:b:c"},
		{"{a}", "b"}, {"{a", "}b"}, {"a}", "{b"},
		{"\x00", "k"}, {"\xff\xfe", "k"}, {"\x00:", "k"}, {"é", "k"}, {"\xc3", "\xa9k"},
	}
	keys := map[string]bool{}
	for _, p := range pairs {
		k := s.recordKey(p[0], p[1])
		if keys[k] {
			t.Errorf("scope %q key %q: key %q collides", p[0], p[1], k)
		}
		keys[k] = true
		res, err := s.Claim(ctx, idempotency.ClaimRequest{
			Scope: p[0], Key: p[1], Fingerprint: p[0] + "|" + p[1],
			Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
		})
		if err != nil || !res.Claimed {
			t.Fatalf("Claim(%q, %q) = %+v, %v", p[0], p[1], res, err)
		}
	}
	for _, p := range pairs {
		rec, err := s.Get(ctx, p[0], p[1])
		if err != nil || rec.Scope != p[0] || rec.Key != p[1] || rec.Fingerprint != p[0]+"|"+p[1] {
			t.Errorf("Get(%q, %q) = %+v, %v", p[0], p[1], rec, err)
		}
		if p[0] == "" {
			continue // an empty ListFilter.Scope matches every scope
		}
		page, err := s.List(ctx, idempotency.ListFilter{Scope: p[0]})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			if r.Scope != p[0] {
				t.Errorf("List(scope %q) returned scope %q", p[0], r.Scope)
			}
		}
	}
}

// hashTag returns the part of k Redis Cluster hashes: the text between the first '{' and
// the first '}' after it, when non-empty; otherwise k.
func hashTag(k string) string {
	if i := strings.IndexByte(k, '{'); i >= 0 {
		if j := strings.IndexByte(k[i+1:], '}'); j > 0 {
			return k[i+1 : i+1+j]
		}
	}
	return k
}

// keySlot is Redis Cluster's HASH_SLOT: CRC16 (XMODEM) of the hash tag, mod 16384.
func keySlot(k string) uint16 {
	var crc uint16
	for _, b := range []byte(hashTag(k)) {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
