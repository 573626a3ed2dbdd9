// Package redisstore is an idempotency.Store on Redis (single node, Sentinel, Cluster or
// Ring), through github.com/redis/go-redis/v9. It requires Redis 5 or later (scripts must
// be effect-replicated so that they may call TIME before writing).
//
// # Key layout
//
// One record is one Redis hash whose key is
//
//	Prefix + "{" + base64url(scope) + ":" + key + "}"
//
// for example "retrysafe:idem:{dXNlci0x:order-42}". The scope is encoded (unpadded
// base64url, which has no ':', '{' or '}'), so any scope bytes are allowed and the first
// ':' after '{' always separates scope from key. The fields are:
//
//	scope, key, fp    the scope, key and request fingerprint, verbatim
//	state             "in_progress" or "done"
//	token             the fencing token, decimal
//	abandoned         the token of an owner that gave up on the request (Store.Abandon):
//	                  the record is abandoned while it is in progress and this equals
//	                  token, so a claim by any writer, even one that does not know the
//	                  field, clears the mark by changing the token
//	created, lease,   CreatedAt, LeaseUntil and ExpiresAt, in microseconds since the
//	expires           Unix epoch, decimal (of the store's clock, below)
//	status, hdr,      the stored response of a done record: status code, headers and
//	body, omitted     trailers in the binary encoding of internal/headercodec (byte for
//	                  byte: values need not be UTF-8), the raw body bytes, and "1" when
//	                  the body was not kept
//	header            the same headers as JSON (no trailers; bytes that are not UTF-8
//	                  become U+FFFD), written beside hdr for binaries that know only this
//	                  field, and read only when hdr is absent
//	route             what the claim was filed under (ClaimRequest.Route), for
//	                  operators; written by every claim and takeover, read by Get and List
//	claim             the token and the ID of the claim that holds the record
//	                  (ClaimRequest.ID), "token:ID": a claim sent again with its ID finds
//	                  its own record by it; a takeover by a binary that does not know the
//	                  field leaves a stale token in it, which matches nobody
//
// # Time
//
// Every lease and expiry decision is taken inside the script, on the Redis server's clock
// (TIME), so that processes whose clocks disagree still agree on when a lease ends.
// Config.Clock replaces the server's clock by a passed-in time (the scripts take an empty
// argument to mean TIME, so both run the same script); it exists for tests, which drive
// time with it.
//
// The hash also carries a Redis TTL, so Redis deletes expired records itself and the
// store needs no janitor. A claim sets it to the claim's TTL (never less than its lease),
// Extend to what remains until ExpiresAt, which Extend moves to at least the end of the
// new lease (a record never vanishes under an owner that renews it), and Complete to the
// completion's TTL. Until the TTL fires, Claim compares the expires field with the
// script's now and treats an expired record as described in idempotency.Store.
//
// # Atomicity and Cluster
//
// Claim, Extend, Abandon, Complete and Release are Lua scripts (EVALSHA, falling back to
// EVAL), which Redis runs atomically: no other command interleaves with a script. Each
// script touches only the record's own key, and the "{...}" hash tag puts everything of
// one record in one hash slot, so the store works unchanged on Redis Cluster, while
// records spread over all slots. There is no key shared by all records. Prefix may not
// contain '{' or '}': a hash tag in the prefix would put every record in one slot.
//
// Claim is one round trip whatever its outcome. A lost claim returns the record's
// metadata, and the stored response only for a replay (done, same fingerprint): a 409 or
// a 422 never moves a stored body over the network.
//
// Fencing tokens come from the Redis server clock, whatever Config.Clock says: a fresh
// claim gets TIME in microseconds since the epoch, and a claim that replaces a record (a
// takeover or an expired record) gets max(TIME, old token + 1). Takeovers are therefore
// strictly increasing, and a fresh claim after Delete or expiry gets a token no earlier
// owner holds, as long as the Redis server clock (of the master, and of a replica
// promoted in its place) never steps back across a claim. Tokens fit in a Lua double
// (< 2^53), so the scripts compute them exactly.
//
// List scans keys with SCAN, so records come in SCAN order with SCAN's guarantees: a
// record that exists for the whole listing is returned at least once, and may be
// returned twice if the keyspace is rehashed meanwhile. On a Cluster (or a Ring) List
// scans each master (shard) in turn, ordered by address.
//
// A Ring works, but it moves keys to another shard whenever its set of live shards
// changes, and a record on the wrong shard is a record lost: prefer a Cluster.
//
// # Migration
//
// There is no migration step: Redis has no schema. Records written without the hdr and
// abandoned fields (headers as JSON in header only) are read as they are: their headers
// come from header, and they count as not abandoned; records without route have none
// (a binary that predates the field writes none on a fresh claim, and leaves it as it
// was on a takeover). A record claimed in that layout and
// completed by this store gets hdr. Because every record written here still carries
// header, binaries that read only that field decode and replay it too (without
// trailers, and with non-UTF-8 header bytes replaced), during a rolling upgrade or after
// a rollback.
//
// # Durability
//
// The store is only as durable as Redis. A record Redis loses is a claim or a completion
// that never happened: a retry of that request executes again. A lost Extend shortens a
// lease: once the shorter lease ends a retry may take over a request that is still
// running, whose owner then gets idempotency.ErrLeaseLost. An owner whose record is gone
// (evicted, expired, deleted) gets idempotency.ErrRecordGone from Extend, Abandon,
// Complete and Release, apart from one whose key another request took over
// (idempotency.ErrLeaseLost).
//
// Persistence, on a Redis crash or restart:
//
//   - AOF with appendfsync everysec (the usual AOF setting) can lose up to about one
//     second of claims and completions when the Redis host crashes.
//   - AOF with appendfsync always loses none, at the cost of an fsync per write.
//   - RDB snapshots alone lose every write since the last snapshot: minutes.
//   - No persistence loses everything on a restart.
//
// Eviction. Every record has a TTL, so any maxmemory-policy other than noeviction
// (volatile-* and allkeys-* alike) deletes live records when memory runs out — records in
// progress and done alike — and with them the promise: a retry of an evicted key runs
// again, even while its first execution still runs. EvictionPolicy reads the policy
// (CONFIG GET, or INFO memory where CONFIG is disabled, as on managed Redis services)
// so that a server can refuse to start on such a Redis; Ping reads it again each time,
// and fails (an *EvictionError, wrapping idempotency.ErrNotDurable) while it is not
// noeviction, unless Config.Eviction allows it. Under noeviction a full Redis refuses
// writes instead: claims fail, and nothing is lost.
//
// Replication and failover. Redis replicates asynchronously: the master acknowledges a
// write before any replica has it, and a failover (Sentinel, or Cluster) promotes a
// replica that may lack the last writes the old master acknowledged — claims (a retry
// then runs beside the first execution) and completions (a retry runs again). The store
// follows a failover as its client does: a Sentinel failover client
// (redis.NewFailoverClient) asks the Sentinels for the master and drops its connections
// to the old one when they switch.
//
// Config.Wait narrows that window. Each claim, renewal and completion is sent in one
// pipeline with WAIT, on one connection, and counts only when WAIT reports Config.Wait
// replicas have it; short of that (or when WAIT fails), the call returns an error
// wrapping idempotency.ErrNotDurable: the write may exist on the master alone. The
// middleware then answers such a claim 503 without running the request (and releases it
// once it can), and keeps such a completion's answer held and sends it again until one
// is acknowledged. A completion sent again under its token, and a claim sent again with
// its ID, write again (their record unchanged), so that their WAIT also covers the first
// attempt's write, made on whichever connection. Ping writes a probe key (Prefix +
// "ping") and waits for it too, so that a store whose replicas stopped acknowledging is
// not ready. Abandon and Release do not wait: losing one only leaves a key in progress
// until its lease ends.
//
// What WAIT cannot close:
//
//   - WAIT is not consensus. A write acknowledged by N replicas survives a failover only if
//     the replica promoted is one of those N. Sentinel and Cluster prefer the replica with
//     the most data (the greatest replication offset), but a replica that lagged, or the
//     only one left, may be promoted: run Wait as the number of replicas, or accept that
//     window.
//   - Replicas acknowledge what they received, not what they persisted: a replica that
//     restarts without AOF (appendfsync always) loses it too.
//   - The master keeps writes WAIT did not confirm. A claim that failed with ErrNotDurable
//     may still hold its key on the master (409 to a retry until it is released, or its
//     lease ends); a completion that failed so is stored there, and replays, but may be
//     lost by a failover, which is why its owner sends it again.
//   - Writes keep going to a master that lost its replicas: configure min-replicas-to-write
//     (with min-replicas-max-lag) on the master so that it refuses them, and a master cut
//     off from its Sentinels and replicas stops accepting writes that a failover would
//     lose.
//   - The promoted replica's clock then decides leases, expiry and tokens: a clock behind
//     the old master's lengthens leases and may reissue a token (see above), one ahead
//     ends leases early.
//
// For payments and anything else that must not execute twice, run Redis with
// appendonly yes, appendfsync always, maxmemory-policy noeviction and, with replicas,
// Wait equal to the number of replicas and min-replicas-to-write — or use the PostgreSQL
// store with synchronous replication, which in transaction mode commits the business
// write and the completion together.
//
// Store.Inspect (idempotency.Inspector, behind `retrysafe doctor` and the gateway's
// checks at start) reads these settings on every master and says what each means:
// maxmemory-policy, appendonly, appendfsync and save, the role and replicas (with
// Config.Wait), min-replicas-to-write, and Sentinel, Cluster or Ring. Where CONFIG is
// disabled it reads INFO instead and says what it could not read.
package redisstore

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/headercodec"
)

// Config configures a Store.
type Config struct {
	// Client is the Redis client. Required. Any redis.UniversalClient works: a single
	// node (*redis.Client), Sentinel (redis.NewFailoverClient), Cluster
	// (*redis.ClusterClient) or Ring. The caller owns it and closes it.
	Client redis.UniversalClient
	// Prefix starts every key the store writes; it must not contain '{' or '}'. Stores
	// with different prefixes never see one another's records. Default "retrysafe:idem:".
	Prefix string
	// Clock, when set, is read for every lease and expiry decision instead of the Redis
	// server's clock (TIME inside the scripts). Default nil: the server's clock. Leave it
	// nil wherever several processes share the Redis, so that processes with skewed
	// clocks agree on when a lease ends; tests set it to drive time. Fencing tokens come
	// from the server's clock either way.
	Clock func() time.Time
	// Wait is the number of replicas that must acknowledge a claim, a renewal (Extend)
	// and a completion before the store reports it done: each of those scripts is sent
	// in one pipeline with WAIT Wait WaitTimeout, on one connection, and a write fewer
	// replicas acknowledged is an error wrapping idempotency.ErrNotDurable (see
	// Durability). Ping then writes a probe key and waits for it too. On a Cluster the
	// pipeline goes to the master of the record's slot. Default 0: no WAIT. Not on a
	// Ring.
	Wait int
	// WaitTimeout bounds each WAIT. It must be shorter than the client's ReadTimeout
	// (go-redis's default 3s), which bounds the whole pipeline. Default
	// DefaultWaitTimeout.
	WaitTimeout time.Duration
	// Eviction is what the store does about a Redis whose maxmemory-policy may evict
	// records (anything but noeviction). Default EvictionRefuse.
	Eviction Eviction
	// Logger receives one line each time a check finds the store's condition changed:
	// an evicting maxmemory-policy, or replicas that stop or resume acknowledging
	// writes (Config.Wait). Default slog.Default().
	Logger *slog.Logger
}

// Defaults of Config.
const (
	// DefaultPrefix is the key prefix used when Config.Prefix is empty.
	DefaultPrefix = "retrysafe:idem:"
	// DefaultWaitTimeout is Config.WaitTimeout's default.
	DefaultWaitTimeout = time.Second
)

// Eviction is what a Store does about a Redis whose maxmemory-policy may evict records.
type Eviction int

const (
	// EvictionRefuse: Ping fails with an *EvictionError, which wraps
	// idempotency.ErrNotDurable, while the policy is not noeviction, and logs an error
	// when it changes to one. Check the policy before serving with EvictionPolicy.
	EvictionRefuse Eviction = iota
	// EvictionAllow: the operator accepts that records may be evicted. Ping does not
	// fail for it, and a change of policy is logged as a warning.
	EvictionAllow
	// EvictionIgnore: the policy is never read, for tools that claim nothing (listing or
	// deleting records).
	EvictionIgnore
)

// Store is an idempotency.Store on Redis. It is safe for concurrent use.
type Store struct {
	client                                    redis.UniversalClient
	prefix                                    string
	clock                                     func() time.Time
	claim, extend, abandon, complete, release *redis.Script
	health
}

var (
	_ idempotency.Store  = (*Store)(nil)
	_ idempotency.Lister = (*Store)(nil)
	_ idempotency.Pinger = (*Store)(nil)
)

// New returns a Store using cfg.
func New(cfg Config) (*Store, error) {
	if cfg.Client == nil {
		return nil, errors.New("redisstore: Config.Client is required")
	}
	prefix := cmp.Or(cfg.Prefix, DefaultPrefix)
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("redisstore: Config.Prefix %q contains '{' or '}'", prefix)
	}
	switch {
	case cfg.Wait < 0 || cfg.WaitTimeout < 0:
		return nil, errors.New("redisstore: Config.Wait and Config.WaitTimeout must not be negative")
	case cfg.Eviction < EvictionRefuse || cfg.Eviction > EvictionIgnore:
		return nil, fmt.Errorf("redisstore: Config.Eviction %d is none of EvictionRefuse, EvictionAllow and EvictionIgnore", cfg.Eviction)
	}
	if _, ring := cfg.Client.(*redis.Ring); ring && cfg.Wait > 0 {
		// A Ring has no way to send a script and WAIT to the shard of a key on one
		// connection.
		return nil, errors.New("redisstore: Config.Wait is not supported on a Ring")
	}
	return &Store{
		client:   cfg.Client,
		prefix:   prefix,
		clock:    cfg.Clock,
		claim:    redis.NewScript(prelude + claimScript),
		extend:   redis.NewScript(prelude + ownerCheck + extendScript),
		abandon:  redis.NewScript(ownerCheck + abandonScript),
		complete: redis.NewScript(prelude + completeCheck + completeScript),
		release:  redis.NewScript(ownerCheck + releaseScript),
		health: health{
			wait:        cfg.Wait,
			waitTimeout: cmp.Or(cfg.WaitTimeout, DefaultWaitTimeout),
			eviction:    cfg.Eviction,
			logger:      cmp.Or(cfg.Logger, slog.Default()),
		},
	}, nil
}

// Record states as stored in the hash.
const (
	inProgress = string(idempotency.StateInProgress)
	done       = string(idempotency.StateDone)
)

// prelude defines the scripts' helpers. clock(arg) is the script's now in microseconds:
// arg when it is not empty (Config.Clock), else the server's TIME. int formats a number
// as a decimal integer (Redis would write a Lua number as %.14g, losing digits). ms
// turns a duration in microseconds into a PEXPIRE argument: milliseconds rounded up, at
// least 1 (PEXPIRE with 0 deletes the key). The claim script reads TIME itself, since
// its token comes from TIME whatever the clock argument says.
const prelude = `
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function int(n) return string.format('%d', n) end
local function ms(us) return int(math.max(1, math.ceil(us / 1000))) end
`

// claimScript: KEYS[1] record; ARGV scope, key, fingerprint, now (µs, or empty for
// TIME), lease (µs), ttl (µs), the takeover limit (µs: a record is taken over only at a
// now not after it), route, claim ID. Returns {1, now, token, tookOver} or,
// when the claim is lost, {0, now, {state, fp, token, lease, expires}, {scope, key,
// created, abandoned}, response}, where response is {status, hdr, body, omitted,
// header-when-hdr-is-absent} for a replay (done, same fingerprint) and nil otherwise:
// a 409 or a 422 reads no part of the stored response.
//
// An in-progress record whose claim field is its token and the claim's ID (not empty)
// was written by this claim's earlier attempt: it is granted again, unchanged but for
// that field, written again so that a WAIT after the script covers the record (WAIT
// counts the replication offset of the connection's own last write, and the earlier
// attempt may have written on another connection). The token in the field makes a
// record taken over by a binary that does not know the field nobody's own.
const claimScript = `
local k = KEYS[1]
local t = redis.call('TIME')
local tok = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = tok
if ARGV[4] ~= '' then now = tonumber(ARGV[4]) end
local cur = redis.call('HMGET', k, 'state', 'fp', 'token', 'lease', 'expires')
local took = 0
if cur[1] then
  if cur[1] == 'in_progress' and ARGV[9] ~= '' and redis.call('HGET', k, 'claim') == cur[3] .. ':' .. ARGV[9] then
    redis.call('HSET', k, 'claim', cur[3] .. ':' .. ARGV[9])
    return {1, now, tonumber(cur[3]), 0}
  end
  local expired = tonumber(cur[5]) <= now
  local free = false
  if cur[1] == 'done' then
    free = expired
  elseif cur[1] == 'in_progress' and now <= tonumber(ARGV[7]) and tonumber(cur[4]) <= now then
    free = expired or cur[2] == ARGV[3]
  end
  if not free then
    local rec = redis.call('HMGET', k, 'scope', 'key', 'created', 'abandoned')
    local resp = false
    if cur[1] == 'done' and cur[2] == ARGV[3] then
      resp = redis.call('HMGET', k, 'status', 'hdr', 'body', 'omitted')
      resp[5] = false
      if not resp[2] then resp[5] = redis.call('HGET', k, 'header') end
    end
    return {0, now, cur, rec, resp}
  end
  tok = math.max(tok, tonumber(cur[3]) + 1)
  if cur[1] == 'in_progress' and not expired then took = 1 end
end
local lease = now + tonumber(ARGV[5])
local expires = now + tonumber(ARGV[6])
if took == 0 then
  redis.call('DEL', k)
  redis.call('HSET', k, 'scope', ARGV[1], 'key', ARGV[2], 'fp', ARGV[3], 'created', int(now))
end
redis.call('HSET', k, 'state', 'in_progress', 'token', int(tok), 'lease', int(lease),
  'expires', int(expires), 'route', ARGV[8], 'claim', int(tok) .. ':' .. ARGV[9])
redis.call('PEXPIRE', k, ms(math.max(lease, expires) - now))
return {1, now, tok, took}
`

// The scripts' answers about the record they were to change: changed (replyOK); the
// record is another token's, or no longer in progress (replyLeaseLost); there is no
// record (replyGone); the completion had been stored already under its token
// (replyAgain).
const (
	replyGone      = -1
	replyLeaseLost = 0
	replyOK        = 1
	replyAgain     = 2
)

// ownerCheck starts the scripts below: it returns -1 when KEYS[1] does not exist, and 0
// unless it is in progress with token ARGV[1]. cur[3] is the record's expires field.
const ownerCheck = `
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'expires')
if not cur[1] then return -1 end
if cur[1] ~= 'in_progress' or cur[2] ~= ARGV[1] then return 0 end
`

// completeCheck starts completeScript: ownerCheck, but a record already done under token
// ARGV[1] is written again (its state, unchanged) and the script returns 2. That write
// changes nothing, but it is a write: Redis replicates it, and a WAIT after the script,
// on the same connection, waits for the replicas to have it and so everything before it,
// the first completion included.
const completeCheck = `
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'expires')
if not cur[1] then return -1 end
if cur[2] ~= ARGV[1] then return 0 end
if cur[1] == 'done' then
  redis.call('HSET', KEYS[1], 'state', 'done')
  return 2
end
if cur[1] ~= 'in_progress' then return 0 end
`

// extendScript: ARGV token, now (µs, or empty for TIME), lease (µs). Returns 1, or 0
// when the lease is lost.
const extendScript = `
local now = clock(ARGV[2])
local lease = now + tonumber(ARGV[3])
local expires = math.max(tonumber(cur[3]), lease)
redis.call('HSET', KEYS[1], 'lease', int(lease), 'expires', int(expires))
redis.call('PEXPIRE', KEYS[1], ms(expires - now))
return 1
`

// abandonScript: ARGV token. The lease and the TTL stay as they are.
const abandonScript = `
redis.call('HSET', KEYS[1], 'abandoned', ARGV[1])
return 1
`

// completeScript: ARGV token, now (µs, or empty for TIME), ttl (µs), status, hdr,
// header (JSON), body, omitted.
const completeScript = `
local now = clock(ARGV[2])
local expires = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'state', 'done', 'expires', int(expires),
  'status', ARGV[4], 'hdr', ARGV[5], 'header', ARGV[6], 'body', ARGV[7], 'omitted', ARGV[8])
redis.call('PEXPIRE', KEYS[1], ms(expires - now))
return 1
`

// releaseScript: ARGV token.
const releaseScript = `
redis.call('DEL', KEYS[1])
return 1
`

// recordKey returns the Redis key of (scope, key).
func (s *Store) recordKey(scope, key string) string {
	return s.scopePrefix(scope) + key + "}"
}

// scopePrefix is the start of the keys of every record in scope.
func (s *Store) scopePrefix(scope string) string {
	return s.prefix + "{" + base64.RawURLEncoding.EncodeToString([]byte(scope)) + ":"
}

// now is the scripts' now argument: the Config.Clock time in microseconds, or empty for
// the server's TIME.
func (s *Store) now() string {
	if s.clock == nil {
		return ""
	}
	return micros(s.clock())
}

// Claim implements idempotency.Store in one round trip: a lost claim returns the
// existing record, with its response only for a replay.
//
// With Config.Wait, a claim granted is reported only once the replicas acknowledged it;
// otherwise Claim returns an error wrapping idempotency.ErrNotDurable (the record may
// exist on the master alone: send the claim again with the same ID to learn its token).
// A claim lost to an existing record is reported whatever WAIT said: it wrote nothing.
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	reply, durable, err := s.write(ctx, s.claim, s.recordKey(req.Scope, req.Key),
		req.Scope, req.Key, req.Fingerprint, s.now(), req.Lease.Microseconds(),
		req.TTL.Microseconds(), micros(req.TakeoverLimit()), req.Route, req.ID)
	if err != nil {
		return idempotency.ClaimResult{}, wrap("claim", err)
	}
	res, ok := reply.([]any)
	if !ok || len(res) < 2 {
		return idempotency.ClaimResult{}, fmt.Errorf("redisstore: claim: unexpected reply %v", reply)
	}
	now, _ := res[1].(int64)
	out := idempotency.ClaimResult{Now: time.UnixMicro(now).UTC()}
	if len(res) == 4 && res[0] == int64(1) {
		if durable != nil {
			return idempotency.ClaimResult{}, fmt.Errorf("redisstore: claim: %w", durable)
		}
		out.Claimed = true
		out.Token, _ = res[2].(int64)
		out.TookOver = res[3] == int64(1)
		return out, nil
	}
	if len(res) < 4 || res[0] != int64(0) {
		return idempotency.ClaimResult{}, fmt.Errorf("redisstore: claim: unexpected reply %v", res)
	}
	fields := map[string]string{}
	collect(fields, res[2], "state", "fp", "token", "lease", "expires")
	collect(fields, res[3], "scope", "key", "created", "abandoned")
	replay := len(res) > 4 && res[4] != nil
	if replay {
		collect(fields, res[4], "status", "hdr", "body", "omitted", "header")
	}
	rec, err := decode(fields, replay)
	if err != nil {
		return idempotency.ClaimResult{}, err
	}
	out.Existing = rec
	return out, nil
}

// collect stores the values of an HMGET reply in m under names; missing fields (nil)
// are left out.
func collect(m map[string]string, reply any, names ...string) {
	values, _ := reply.([]any)
	for i, name := range names {
		if i < len(values) {
			if v, ok := values[i].(string); ok {
				m[name] = v
			}
		}
	}
}

// Extend implements idempotency.Store. ExpiresAt moves to the end of the new lease when
// that is later, and the Redis TTL with it. With Config.Wait it waits for the replicas:
// a renewal a failover loses shortens the lease on the promoted replica, where a retry
// could then take over a request that still runs.
func (s *Store) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) error {
	return s.owned(ctx, "extend", s.extend, true, scope, key, token, s.now(), lease.Microseconds())
}

// Abandon implements idempotency.Store. It does not wait for replicas (Config.Wait):
// losing the mark in a failover only leaves the key to its lease.
func (s *Store) Abandon(ctx context.Context, scope, key string, token int64) error {
	return s.owned(ctx, "abandon", s.abandon, false, scope, key, token)
}

// Complete implements idempotency.Store. It sets the record's Redis TTL to c.TTL. A
// record already done under c.Token is written again, unchanged (see completeCheck),
// and Complete returns nil once that write is acknowledged as Config.Wait asks, which
// confirms the first.
func (s *Store) Complete(ctx context.Context, c idempotency.Completion) error {
	header, err := json.Marshal(c.Response.Header)
	if err != nil {
		return fmt.Errorf("redisstore: complete: encode header: %w", err)
	}
	omitted := "0"
	if c.Response.BodyOmitted {
		omitted = "1"
	}
	return s.owned(ctx, "complete", s.complete, true, c.Scope, c.Key, c.Token,
		s.now(), c.TTL.Microseconds(), c.Response.Status,
		headercodec.Encode(c.Response.Header, c.Response.Trailer), header, c.Response.Body, omitted)
}

// Release implements idempotency.Store. It does not wait for replicas (Config.Wait): a
// release a failover loses leaves the key in progress until its lease ends, when a
// retry takes it over.
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	return s.owned(ctx, "release", s.release, false, scope, key, token)
}

// owned runs a script that starts with ownerCheck (or completeCheck) and maps its
// answer to ErrRecordGone, ErrLeaseLost or success; with waits, a success counts only
// when the replicas acknowledged it (Config.Wait).
func (s *Store) owned(ctx context.Context, op string, script *redis.Script, waits bool, scope, key string, token int64, args ...any) error {
	args = append([]any{strconv.FormatInt(token, 10)}, args...)
	var (
		reply   any
		durable error
		err     error
	)
	if waits {
		reply, durable, err = s.write(ctx, script, s.recordKey(scope, key), args...)
	} else {
		reply, err = script.Run(ctx, s.client, []string{s.recordKey(scope, key)}, args...).Result()
	}
	if err != nil {
		return wrap(op, err)
	}
	switch reply {
	case int64(replyOK), int64(replyAgain):
		if durable != nil {
			return fmt.Errorf("redisstore: %s: %w", op, durable)
		}
		return nil
	case int64(replyLeaseLost):
		return fmt.Errorf("redisstore: %s: %w", op, idempotency.ErrLeaseLost)
	case int64(replyGone):
		return fmt.Errorf("redisstore: %s: %w", op, idempotency.ErrRecordGone)
	}
	return fmt.Errorf("redisstore: %s: unexpected reply %v", op, reply)
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	fields, err := s.client.HGetAll(ctx, s.recordKey(scope, key)).Result()
	if err != nil {
		return nil, wrap("get", err)
	}
	if len(fields) == 0 {
		return nil, idempotency.ErrNotFound
	}
	return decode(fields, true)
}

// Delete implements idempotency.Store.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := s.client.Del(ctx, s.recordKey(scope, key)).Err(); err != nil {
		return wrap("delete", err)
	}
	return nil
}

// scanCount is the COUNT of every SCAN.
const scanCount = 100

// cursor is List's opaque position: a node (its address; empty for a single node), the
// SCAN cursor that continues after the batch being read, whether that batch was the
// node's last, and the keys of the batch not returned yet. A page never re-issues a
// SCAN cursor: SCAN returns every key present for a whole iteration only to a caller
// that follows the cursors it returns, and the same cursor asked again after Redis has
// rehashed its keyspace may return other keys.
type cursor struct {
	Node    string   `json:"n,omitempty"`
	Scan    uint64   `json:"c,omitempty"`
	End     bool     `json:"e,omitempty"`
	Pending []string `json:"p,omitempty"`
}

// node is one server to SCAN.
type node struct {
	addr string
	cmd  redis.Cmdable
}

// List implements idempotency.Lister. Records come in SCAN order, node by node, and in
// key order within one SCAN batch. Next is set only when another record follows; it
// holds the rest of the SCAN batch the page ended in (up to about a hundred keys).
func (s *Store) List(ctx context.Context, f idempotency.ListFilter) (idempotency.ListPage, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	var at cursor
	if f.After != "" {
		b, err := base64.RawURLEncoding.DecodeString(f.After)
		if err == nil {
			err = json.Unmarshal(b, &at)
		}
		if err != nil {
			return idempotency.ListPage{}, fmt.Errorf("redisstore: list: invalid cursor %q", f.After)
		}
	}
	match := globEscape(s.prefix+"{") + "*"
	if f.Scope != "" {
		match = globEscape(s.scopePrefix(f.Scope)) + "*"
	}
	nodes, err := s.nodes(ctx)
	if err != nil {
		return idempotency.ListPage{}, wrap("list", err)
	}
	var page idempotency.ListPage
	for _, n := range nodes {
		if n.addr < at.Node {
			continue
		}
		if n.addr > at.Node {
			at = cursor{Node: n.addr}
		}
		for {
			keys := at.Pending
			at.Pending = nil
			if keys == nil {
				if at.End {
					break
				}
				var next uint64
				keys, next, err = n.cmd.Scan(ctx, at.Scan, match, scanCount).Result()
				if err != nil {
					return idempotency.ListPage{}, wrap("list", err)
				}
				slices.Sort(keys)
				at.Scan, at.End = next, next == 0
			}
			recs, err := s.fetch(ctx, keys)
			if err != nil {
				return idempotency.ListPage{}, err
			}
			for i, rec := range recs {
				if rec == nil || (f.State != "" && rec.State != f.State) || (f.Route != "" && rec.Route != f.Route) {
					continue
				}
				if len(page.Records) == limit {
					at.Pending = keys[i:]
					page.Next = encodeCursor(at)
					return page, nil
				}
				page.Records = append(page.Records, *rec)
			}
			if at.End {
				break
			}
		}
	}
	return page, nil
}

// fetch reads the records at keys in one pipeline; a key deleted meanwhile gives nil.
func (s *Store) fetch(ctx context.Context, keys []string) ([]*idempotency.Record, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := s.client.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HGetAll(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, wrap("list", err)
	}
	recs := make([]*idempotency.Record, len(keys))
	for i, c := range cmds {
		if len(c.Val()) == 0 {
			continue
		}
		rec, err := decode(c.Val(), true)
		if err != nil {
			return nil, err
		}
		recs[i] = rec
	}
	return recs, nil
}

// nodes returns the servers List scans, ordered by address: the masters of a Cluster,
// the live shards of a Ring, or the client itself.
func (s *Store) nodes(ctx context.Context) ([]node, error) {
	var each func(context.Context, func(context.Context, *redis.Client) error) error
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		each = c.ForEachMaster
	case *redis.Ring:
		each = c.ForEachShard
	default:
		return []node{{cmd: s.client}}, nil
	}
	var mu sync.Mutex
	var nodes []node
	err := each(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		nodes = append(nodes, node{addr: c.Options().Addr, cmd: c})
		mu.Unlock()
		return nil
	})
	slices.SortFunc(nodes, func(a, b node) int { return strings.Compare(a.addr, b.addr) })
	return nodes, err
}

func encodeCursor(c cursor) string {
	b, _ := json.Marshal(c) // a struct of strings and an integer always encodes
	return base64.RawURLEncoding.EncodeToString(b)
}

// globEscape escapes the SCAN MATCH metacharacters of s.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\*?[]`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// decode builds a Record from a record hash's fields, with the stored response of a done
// record when withResponse is set.
func decode(m map[string]string, withResponse bool) (*idempotency.Record, error) {
	var errs []error
	num := func(field string) int64 {
		n, err := strconv.ParseInt(m[field], 10, 64)
		errs = append(errs, err)
		return n
	}
	rec := &idempotency.Record{
		Scope:       m["scope"],
		Key:         m["key"],
		Fingerprint: m["fp"],
		Route:       m["route"],
		State:       idempotency.State(m["state"]),
		Token:       num("token"),
		Abandoned:   m["state"] == inProgress && m["abandoned"] != "" && m["abandoned"] == m["token"],
		CreatedAt:   time.UnixMicro(num("created")).UTC(),
		LeaseUntil:  time.UnixMicro(num("lease")).UTC(),
		ExpiresAt:   time.UnixMicro(num("expires")).UTC(),
	}
	switch {
	case m["state"] == done && withResponse:
		resp := &idempotency.Response{
			Status:      int(num("status")),
			Body:        []byte(m["body"]),
			BodyOmitted: m["omitted"] == "1",
		}
		var err error
		if hdr, ok := m["hdr"]; ok {
			resp.Header, resp.Trailer, err = headercodec.Decode([]byte(hdr))
		} else {
			err = json.Unmarshal([]byte(m["header"]), &resp.Header)
		}
		errs = append(errs, err)
		if resp.Header == nil {
			resp.Header = http.Header{}
		}
		rec.Response = resp
	case m["state"] != done && m["state"] != inProgress:
		errs = append(errs, fmt.Errorf("unknown state %q", m["state"]))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("redisstore: malformed record %q/%q: %w", rec.Scope, rec.Key, err)
	}
	return rec, nil
}

// micros encodes t for the hash and the scripts.
func micros(t time.Time) string { return strconv.FormatInt(t.UnixMicro(), 10) }

// wrap prefixes err with the operation, and makes a closed client match
// idempotency.ErrClosed.
func wrap(op string, err error) error {
	if errors.Is(err, redis.ErrClosed) {
		return fmt.Errorf("redisstore: %s: %w (%w)", op, idempotency.ErrClosed, err)
	}
	return fmt.Errorf("redisstore: %s: %w", op, err)
}
