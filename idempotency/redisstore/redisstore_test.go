package redisstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/harness/tcpproxy"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
	"github.com/retrysafe/retrysafe/internal/headercodec"
)

// newStore returns a store on the test Redis under its own prefix, on clock (nil: the
// server's), whose keys are deleted when t ends.
func newStore(t *testing.T, clock func() time.Time) *Store {
	t.Helper()
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	return storeOn(t, client, client, clock)
}

// storeOn returns a store using client under its own prefix, on clock; when t ends it
// deletes the prefix's keys through admin.
func storeOn(t *testing.T, client redis.UniversalClient, admin *redis.Client, clock func() time.Time) *Store {
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
	s, err := New(Config{Client: client, Prefix: prefix, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	idempotencytest.Run(t, idempotencytest.Harness{
		New: func(t *testing.T, clock func() time.Time) idempotency.Store { return newStore(t, clock) },
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
		New: func(t *testing.T, clock func() time.Time) idempotency.Store {
			ring := redis.NewRing(&redis.RingOptions{
				Addrs:    map[string]string{"only": opts.Addr},
				Username: opts.Username, Password: opts.Password, DB: opts.DB,
			})
			admin := redis.NewClient(opts)
			t.Cleanup(func() {
				_ = ring.Close()
				_ = admin.Close()
			})
			return storeOn(t, ring, admin, clock)
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

// TestRedisTTL checks the TTL Redis expires a record with: TTL from the claim, never
// shorter than the lease while in progress (a renewed record must not vanish under its
// owner), and the completion's TTL once done. TTLs are durations, so they do not depend on
// which clock the store reads: the server's, or one years in the past.
func TestRedisTTL(t *testing.T) {
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	for name, clock := range map[string]func() time.Time{
		"server clock": nil,
		"past clock":   func() time.Time { return old },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, clock)
			ctx := context.Background()
			pttl := func(key string, want time.Duration) {
				t.Helper()
				got, err := s.client.PTTL(ctx, s.recordKey("sc", key)).Result()
				if err != nil {
					t.Fatal(err)
				}
				if got <= 0 || got > want || got < want-5*time.Second {
					t.Errorf("PTTL of %s = %v, want ≈ %v", key, got, want)
				}
			}
			claim := func(key string, lease, ttl time.Duration) int64 {
				t.Helper()
				res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "sc", Key: key, Fingerprint: "fp", Lease: lease, TTL: ttl})
				if err != nil || !res.Claimed {
					t.Fatalf("Claim(%s) = %+v, %v", key, res, err)
				}
				return res.Token
			}
			tok := claim("k", time.Minute, time.Hour)
			pttl("k", time.Hour)
			// A lease shorter than what is left of the TTL leaves the TTL alone.
			if err := s.Extend(ctx, "sc", "k", tok, time.Minute); err != nil {
				t.Fatal(err)
			}
			pttl("k", time.Hour)
			// A lease beyond it carries the TTL with it.
			if err := s.Extend(ctx, "sc", "k", tok, 3*time.Hour); err != nil {
				t.Fatal(err)
			}
			pttl("k", 3*time.Hour)
			if err := s.Abandon(ctx, "sc", "k", tok); err != nil {
				t.Fatal(err)
			}
			pttl("k", 3*time.Hour)
			err := s.Complete(ctx, idempotency.Completion{Scope: "sc", Key: "k", Token: tok,
				Response: idempotency.Response{Status: 201}, TTL: 48 * time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			pttl("k", 48*time.Hour)
			// A TTL shorter than the lease (outside the contract) still keeps the record
			// for the whole lease.
			claim("short", time.Minute, time.Second)
			pttl("short", time.Minute)
		})
	}
}

// TestServerClock checks that a store without Config.Clock decides on the Redis server's
// clock: ClaimResult.Now and the record's instants lie between two readings of TIME.
func TestServerClock(t *testing.T) {
	t.Parallel()
	s := newStore(t, nil)
	ctx := context.Background()
	before, err := s.client.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "sc", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || !res.Claimed {
		t.Fatalf("Claim = %+v, %v", res, err)
	}
	after, err := s.client.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	before, after = before.Truncate(time.Microsecond), after.Truncate(time.Microsecond)
	if res.Now.Before(before) || res.Now.After(after) {
		t.Errorf("ClaimResult.Now = %v, not within the server's TIME [%v, %v]", res.Now, before, after)
	}
	rec, err := s.Get(ctx, "sc", "k")
	if err != nil {
		t.Fatal(err)
	}
	if !rec.CreatedAt.Equal(res.Now) || !rec.LeaseUntil.Equal(res.Now.Add(time.Minute)) || !rec.ExpiresAt.Equal(res.Now.Add(time.Hour)) {
		t.Errorf("record %+v, want its instants from ClaimResult.Now %v", rec, res.Now)
	}
}

// meter counts the commands a client sends (each one round trip: no pipelines here).
type meter struct{ cmds atomic.Int64 }

func (m *meter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (m *meter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		m.cmds.Add(1)
		return next(ctx, cmd)
	}
}
func (m *meter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		m.cmds.Add(1)
		return next(ctx, cmds)
	}
}

// TestLostClaimReply measures, on the wire through a TCP proxy, what a claim reads from
// Redis: a 422 (another fingerprint) or a 409 (in flight) gets the record's metadata and
// none of a multi-megabyte stored body, while a replay gets the response in the same
// single round trip. A first execution is one round trip to claim and one to complete.
func TestLostClaimReply(t *testing.T) {
	t.Parallel()
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := tcpproxy.New(opts.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	admin := redis.NewClient(opts)
	t.Cleanup(func() { _ = admin.Close() })
	viaProxy := *opts
	viaProxy.Addr = proxy.Addr()
	client := redis.NewClient(&viaProxy)
	t.Cleanup(func() { _ = client.Close() })
	var m meter
	client.AddHook(&m)
	s := storeOn(t, client, admin, nil)
	ctx := context.Background()

	// Load the scripts (a first EVALSHA of a script Redis has not seen costs an EVAL).
	warm := func(key string) {
		res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "sc", Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		if err != nil || !res.Claimed {
			t.Fatalf("Claim = %+v, %v", res, err)
		}
		if err := s.Complete(ctx, idempotency.Completion{Scope: "sc", Key: key, Token: res.Token, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	warm("warm")

	const size = 4 << 20
	body := make([]byte, size)
	for i := range body {
		body[i] = byte(i)
	}
	measure := func(f func()) (cmds, n int64) {
		t.Helper()
		c0, b0 := m.cmds.Load(), proxy.Stats().BytesFromTarget
		f()
		return m.cmds.Load() - c0, proxy.Stats().BytesFromTarget - b0
	}
	claim := func(key, fp string) idempotency.ClaimResult {
		t.Helper()
		res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "sc", Key: key, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	var tok int64
	if cmds, _ := measure(func() { tok = claim("big", "fp-a").Token }); cmds != 1 {
		t.Errorf("first claim: %d round trips, want 1", cmds)
	}
	// In flight: no body exists yet, but the reply is the record's metadata only.
	if _, n := measure(func() { claim("big", "fp-a") }); n > 1024 {
		t.Errorf("in-flight claim: %d reply bytes, want < 1 KiB", n)
	}
	resp := idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: body}
	if cmds, _ := measure(func() {
		if err := s.Complete(ctx, idempotency.Completion{Scope: "sc", Key: "big", Token: tok, Response: resp, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}); cmds != 1 {
		t.Errorf("complete: %d round trips, want 1", cmds)
	}
	var lost idempotency.ClaimResult
	cmds, n := measure(func() { lost = claim("big", "fp-b") })
	if lost.Claimed || lost.Existing == nil || lost.Existing.Response != nil || lost.Existing.State != idempotency.StateDone {
		t.Errorf("mismatching claim = %+v, want a lean done Existing", lost)
	}
	if cmds != 1 || n > 1024 {
		t.Errorf("mismatching claim: %d round trips, %d reply bytes; want 1 and < 1 KiB (the %d-byte body is not sent)", cmds, n, size)
	}
	var replay idempotency.ClaimResult
	cmds, n = measure(func() { replay = claim("big", "fp-a") })
	if replay.Existing == nil || replay.Existing.Response == nil || !bytes.Equal(replay.Existing.Response.Body, body) {
		t.Fatalf("replay = %+v, want the stored body", replay)
	}
	if cmds != 1 || n < size || n > size+4096 {
		t.Errorf("replay: %d round trips, %d reply bytes; want 1 and the %d-byte body once", cmds, n, size)
	}
}

// TestStoredFields checks the hash of a done record: headers and trailers in 'hdr' byte
// for byte, and a JSON 'header' that a binary reading only that field still decodes.
func TestStoredFields(t *testing.T) {
	t.Parallel()
	s := newStore(t, nil)
	ctx := context.Background()
	res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "sc", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || !res.Claimed {
		t.Fatalf("Claim = %+v, %v", res, err)
	}
	header := http.Header{"Content-Type": {"text/plain"}, "X-Latin1": {"caf\xe9"}}
	trailer := http.Header{"Grpc-Status": {"0"}}
	err = s.Complete(ctx, idempotency.Completion{Scope: "sc", Key: "k", Token: res.Token, TTL: time.Hour,
		Response: idempotency.Response{Status: 200, Header: header, Trailer: trailer, Body: []byte("x")}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.client.HGetAll(ctx, s.recordKey("sc", "k")).Result()
	if err != nil {
		t.Fatal(err)
	}
	h, tr, err := headercodec.Decode([]byte(m["hdr"]))
	if err != nil || !reflect.DeepEqual(h, header) || !reflect.DeepEqual(tr, trailer) {
		t.Errorf("hdr decodes to %q, %q, %v; want %q, %q", h, tr, err, header, trailer)
	}
	var old http.Header
	if err := json.Unmarshal([]byte(m["header"]), &old); err != nil || old.Get("Content-Type") != "text/plain" {
		t.Errorf("header = %q (%v), want the headers as JSON", m["header"], err)
	}
	if m["status"] != "200" || m["body"] != "x" || m["omitted"] != "0" {
		t.Errorf("fields = %q", m)
	}
}

// TestOldRecords reads records written in the layout without 'hdr' and 'abandoned' (the
// headers as JSON in 'header'), as binaries that predate those fields write them: they
// replay with their headers, a live one is renewed, abandoned and completed by its owner,
// and such a binary's takeover of an abandoned record clears the mark.
func TestOldRecords(t *testing.T) {
	t.Parallel()
	s := newStore(t, nil)
	ctx := context.Background()
	now, err := s.client.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	us := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).UnixMicro(), 10) }
	hset := func(key string, fields ...string) {
		t.Helper()
		k := s.recordKey("sc", key)
		if err := s.client.HSet(ctx, k, fields).Err(); err != nil {
			t.Fatal(err)
		}
		if err := s.client.PExpire(ctx, k, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	hset("done", "scope", "sc", "key", "done", "fp", "fp", "state", "done", "token", "17",
		"created", us(-time.Minute), "lease", us(time.Minute), "expires", us(time.Hour),
		"status", "201", "header", `{"Content-Type":["application/json"],"Link":["</a>","</b>"]}`,
		"body", `{"id":1}`, "omitted", "0")
	hset("live", "scope", "sc", "key", "live", "fp", "fp", "state", "in_progress", "token", "18",
		"created", us(0), "lease", us(time.Minute), "expires", us(time.Hour))

	want := idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Link": {"</a>", "</b>"}},
		Body: []byte(`{"id":1}`)}
	rec, err := s.Get(ctx, "sc", "done")
	if err != nil || rec.Token != 17 || rec.Abandoned || !reflect.DeepEqual(rec.Response, &want) {
		t.Errorf("Get(old done) = %+v (%+v), %v; want response %+v", rec, rec.Response, err, want)
	}
	res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "sc", Key: "done", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || res.Claimed || res.Existing == nil || !reflect.DeepEqual(res.Existing.Response, &want) {
		t.Errorf("replay of an old record = %+v, %v; want response %+v", res, err, want)
	}
	res, err = s.Claim(ctx, idempotency.ClaimRequest{Scope: "sc", Key: "done", Fingerprint: "other", Lease: time.Minute, TTL: time.Hour})
	if err != nil || res.Claimed || res.Existing == nil || res.Existing.Response != nil {
		t.Errorf("mismatch on an old record = %+v, %v; want a lean Existing", res, err)
	}

	rec, err = s.Get(ctx, "sc", "live")
	if err != nil || rec.State != idempotency.StateInProgress || rec.Abandoned || rec.Token != 18 {
		t.Fatalf("Get(old live) = %+v, %v", rec, err)
	}
	if err := s.Extend(ctx, "sc", "live", 18, 2*time.Minute); err != nil {
		t.Errorf("Extend of an old record: %v", err)
	}
	if err := s.Abandon(ctx, "sc", "live", 18); err != nil {
		t.Errorf("Abandon of an old record: %v", err)
	}
	if rec, err := s.Get(ctx, "sc", "live"); err != nil || !rec.Abandoned {
		t.Errorf("old record after Abandon = %+v, %v", rec, err)
	}
	// A takeover by a writer that knows nothing of 'abandoned' (it sets a new token and
	// lease only) leaves a record its new owner has not abandoned.
	hset("taken", "scope", "sc", "key", "taken", "fp", "fp", "state", "in_progress", "token", "20",
		"created", us(0), "lease", us(time.Minute), "expires", us(time.Hour))
	if err := s.Abandon(ctx, "sc", "taken", 20); err != nil {
		t.Fatal(err)
	}
	hset("taken", "token", "21", "lease", us(2*time.Minute))
	if rec, err := s.Get(ctx, "sc", "taken"); err != nil || rec.Abandoned || rec.Token != 21 {
		t.Errorf("record taken over by a writer without 'abandoned' = %+v, %v; want token 21, not abandoned", rec, err)
	}
	resp := idempotency.Response{Status: 200, Header: http.Header{"X": {"\xff"}}, Body: []byte("ok")}
	if err := s.Complete(ctx, idempotency.Completion{Scope: "sc", Key: "live", Token: 18, Response: resp, TTL: time.Hour}); err != nil {
		t.Fatalf("Complete of an old record: %v", err)
	}
	if rec, err := s.Get(ctx, "sc", "live"); err != nil || rec.Abandoned || !reflect.DeepEqual(rec.Response, &resp) {
		t.Errorf("old record after Complete = %+v, %v; want response %+v", rec, err, resp)
	}
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
	s := newStore(t, nil)
	ctx := context.Background()
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
			Scope: p[0], Key: p[1], Fingerprint: p[0] + "|" + p[1], Lease: time.Minute, TTL: time.Hour,
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
