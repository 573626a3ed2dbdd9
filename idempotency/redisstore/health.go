package redisstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/durfmt"
)

// noEviction is the one maxmemory-policy under which Redis never deletes a key to make
// room.
const noEviction = "noeviction"

// EvictionError is a Redis whose maxmemory-policy may evict records: when its memory is
// full it deletes keys, records in progress and done alike, and the retry of a key whose
// record was evicted runs again. Every record has a TTL, so the volatile-* policies
// evict them as readily as the allkeys-* ones. It wraps idempotency.ErrNotDurable.
type EvictionError struct {
	Policy string // the maxmemory-policy found
	Node   string // the server that has it (host:port); empty for the client's only server
}

func (e *EvictionError) Error() string {
	at := ""
	if e.Node != "" {
		at = " on " + e.Node
	}
	return fmt.Sprintf("redisstore: maxmemory-policy is %s%s, not noeviction: Redis may evict idempotency records, and a retry of an evicted key runs again", e.Policy, at)
}

func (e *EvictionError) Unwrap() error { return idempotency.ErrNotDurable }

// health is what the store's checks found about its durability, and how it checks.
type health struct {
	wait        int
	waitTimeout time.Duration
	eviction    Eviction
	logger      *slog.Logger

	noConfig atomic.Bool // CONFIG GET was refused: read the policy from INFO memory
	short    atomic.Bool // the last WAIT counted fewer replicas than wait

	mu     sync.Mutex
	policy *EvictionError // the evicting policy the last check found; nil: none
	seen   bool           // a check has read the policy
}

// Unsafe reports the conditions the store's last checks found under which it cannot
// keep its promise: evicting, while the maxmemory-policy last read (by Ping or
// EvictionPolicy) may evict records, whether or not Config.Eviction allows it; and
// replicas, while the last write or Ping that waited for replicas (Config.Wait) was
// acknowledged by fewer. It does no I/O.
func (s *Store) Unsafe() (evicting, replicas bool) {
	s.mu.Lock()
	evicting = s.policy != nil
	s.mu.Unlock()
	return evicting, s.short.Load()
}

// EvictionPolicy reads the maxmemory-policy of the store's Redis (of every master of a
// Cluster, every shard of a Ring) and returns an *EvictionError for the first server
// whose policy may evict records, or nil. It records what it found as the state Ping
// compares with, without logging it: call it before serving, to refuse or warn.
func (s *Store) EvictionPolicy(ctx context.Context) error {
	nodes, err := s.nodes(ctx)
	if err != nil {
		return wrap("eviction policy", err)
	}
	var found *EvictionError
	for _, n := range nodes {
		pipe := n.cmd.Pipeline()
		read := s.readPolicy(ctx, pipe)
		_, _ = pipe.Exec(ctx)
		policy, err := read(ctx, n.cmd)
		if err != nil {
			return wrap("eviction policy", err)
		}
		if policy != noEviction && found == nil {
			found = &EvictionError{Policy: policy, Node: n.addr}
		}
	}
	s.mu.Lock()
	s.policy, s.seen = found, true
	s.mu.Unlock()
	if found != nil {
		return found
	}
	return nil
}

// Ping implements idempotency.Pinger. It pings every server the store writes to (every
// master of a Cluster, every shard of a Ring), and, in the same round trip, reads its
// maxmemory-policy unless Config.Eviction is EvictionIgnore: a policy that may evict
// records makes it return an *EvictionError (wrapping idempotency.ErrNotDurable) under
// EvictionRefuse. With Config.Wait it then writes a probe key (Prefix + "ping", kept a
// minute; on a Cluster, on the master of its slot) and waits for the replicas to
// acknowledge it: fewer is an error wrapping idempotency.ErrNotDurable. A change in what
// it finds is logged once.
func (s *Store) Ping(ctx context.Context) error {
	nodes, err := s.nodes(ctx)
	if err != nil {
		return wrap("ping", err)
	}
	var found *EvictionError
	for _, n := range nodes {
		pipe := n.cmd.Pipeline()
		ping := pipe.Ping(ctx)
		var read func(context.Context, redis.Cmdable) (string, error)
		if s.eviction != EvictionIgnore {
			read = s.readPolicy(ctx, pipe)
		}
		_, _ = pipe.Exec(ctx)
		if err := ping.Err(); err != nil {
			return wrap("ping", err)
		}
		if read == nil {
			continue
		}
		policy, err := read(ctx, n.cmd)
		if err != nil {
			return wrap("ping", err)
		}
		if policy != noEviction && found == nil {
			found = &EvictionError{Policy: policy, Node: n.addr}
		}
	}
	if s.eviction != EvictionIgnore {
		s.sawPolicy(found)
		if found != nil && s.eviction == EvictionRefuse {
			return found
		}
	}
	if s.wait == 0 {
		return nil
	}
	c, err := s.conn(ctx, s.prefix+"ping")
	if err != nil {
		return wrap("ping", err)
	}
	pipe := c.Pipeline()
	set := pipe.Set(ctx, s.prefix+"ping", "1", time.Minute)
	acked := s.queueWait(ctx, pipe)
	_, _ = pipe.Exec(ctx)
	if err := set.Err(); err != nil {
		return wrap("ping", err)
	}
	if err := s.acknowledged(acked); err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	return nil
}

// readPolicy queues the read of the maxmemory-policy on pipe and returns the function
// that reads the answer once pipe has run: CONFIG GET, or INFO memory where CONFIG is
// refused (managed Redis services disable it). A refused CONFIG GET is asked again as
// INFO memory on c, and from then on INFO memory is queued instead.
func (s *Store) readPolicy(ctx context.Context, pipe redis.Pipeliner) func(context.Context, redis.Cmdable) (string, error) {
	if s.noConfig.Load() {
		info := pipe.Info(ctx, "memory")
		return func(context.Context, redis.Cmdable) (string, error) { return policyFromInfo(info) }
	}
	cfg := pipe.ConfigGet(ctx, "maxmemory-policy")
	return func(ctx context.Context, c redis.Cmdable) (string, error) {
		m, err := cfg.Result()
		var rerr redis.Error
		switch {
		case err == nil && m["maxmemory-policy"] != "":
			return m["maxmemory-policy"], nil
		case err != nil && !errors.As(err, &rerr):
			return "", err
		}
		// Refused (unknown command, no permission) or answered without the setting.
		s.noConfig.Store(true)
		return policyFromInfo(c.Info(ctx, "memory"))
	}
}

// policyFromInfo reads maxmemory_policy from the reply of INFO memory.
func policyFromInfo(info *redis.StringCmd) (string, error) {
	text, err := info.Result()
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "maxmemory_policy:"); ok {
			return v, nil
		}
	}
	return "", errors.New("neither CONFIG GET maxmemory-policy nor INFO memory tells the maxmemory-policy")
}

// sawPolicy records what a Ping found (nil: noeviction everywhere) and logs it when it
// differs from what the last check found, or when the first check finds an evicting
// policy.
func (s *Store) sawPolicy(found *EvictionError) {
	s.mu.Lock()
	before, seen := s.policy, s.seen
	s.policy, s.seen = found, true
	s.mu.Unlock()
	switch {
	case found == nil && before == nil, found != nil && before != nil && *found == *before:
		return
	case found == nil:
		if seen {
			s.logger.Info("redisstore: maxmemory-policy is noeviction again: records are no longer evicted")
		}
	case s.eviction == EvictionRefuse:
		s.logger.Error("redisstore: the store is not durable: "+strings.TrimPrefix(found.Error(), "redisstore: ")+
			"; the store reports it until the policy is noeviction again",
			"policy", found.Policy, "node", found.Node)
	default:
		s.logger.Warn("redisstore: "+strings.TrimPrefix(found.Error(), "redisstore: ")+" (allowed by configuration)",
			"policy", found.Policy, "node", found.Node)
	}
}

// conn returns the client that reaches the master of key: on a Cluster that master's own
// client, so that a pipeline of a script and WAIT runs on one connection to it.
func (s *Store) conn(ctx context.Context, key string) (redis.Cmdable, error) {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.MasterForKey(ctx, key)
	}
	return s.client, nil
}

// write runs script on the record at key. Without Config.Wait that is all, and durable
// is nil. With it, the script and WAIT go in one pipeline, on one connection (WAIT
// counts the replicas that have the connection's own last write), and durable is nil
// when the replicas acknowledged the write, or else an error wrapping
// idempotency.ErrNotDurable: the caller decides whether the script's answer needed it
// (a claim lost to another record wrote nothing). err is the script's own failure.
func (s *Store) write(ctx context.Context, script *redis.Script, key string, args ...any) (reply any, durable, err error) {
	keys := []string{key}
	if s.wait == 0 {
		reply, err = script.Run(ctx, s.client, keys, args...).Result()
		return reply, nil, err
	}
	c, err := s.conn(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	reply, acked, err := s.pipelined(ctx, c, script.EvalSha, keys, args)
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		// Redis does not have the script (restarted, failed over, flushed): send it
		// whole, again followed by WAIT.
		reply, acked, err = s.pipelined(ctx, c, script.Eval, keys, args)
	}
	if err != nil {
		return nil, nil, err
	}
	return reply, s.acknowledged(acked), nil
}

// pipelined sends run (the script's EVALSHA or EVAL) and WAIT in one pipeline on c, and
// returns the script's reply and WAIT's command.
func (s *Store) pipelined(ctx context.Context, c redis.Cmdable,
	run func(context.Context, redis.Scripter, []string, ...any) *redis.Cmd, keys []string, args []any,
) (any, *redis.Cmd, error) {
	pipe := c.Pipeline()
	cmd := run(ctx, pipe, keys, args...)
	acked := s.queueWait(ctx, pipe)
	_, _ = pipe.Exec(ctx)
	reply, err := cmd.Result()
	return reply, acked, err
}

// queueWait queues WAIT Config.Wait Config.WaitTimeout on pipe; the timeout is at least
// a millisecond, as WAIT with 0 waits for ever.
func (s *Store) queueWait(ctx context.Context, pipe redis.Pipeliner) *redis.Cmd {
	return pipe.Do(ctx, "wait", s.wait, max(s.waitTimeout.Milliseconds(), 1))
}

// acknowledged returns nil when WAIT counted Config.Wait replicas or more, and
// otherwise an error wrapping idempotency.ErrNotDurable; it records the outcome for
// Unsafe and logs a change.
func (s *Store) acknowledged(acked *redis.Cmd) error {
	n, err := acked.Int64()
	var short error
	switch {
	case err != nil:
		short = fmt.Errorf("%w: WAIT for %d replicas failed: %w", idempotency.ErrNotDurable, s.wait, err)
	case n < int64(s.wait):
		short = fmt.Errorf("%w: %d of the %d replicas asked for (wait=%d) acknowledged the write within %v",
			idempotency.ErrNotDurable, n, s.wait, s.wait, s.waitTimeout)
	}
	if was := s.short.Swap(short != nil); was != (short != nil) {
		if short != nil {
			s.logger.Error("redisstore: the store is not durable: replicas do not acknowledge writes; claims and completions fail until they do",
				"err", short, "wait", s.wait, durfmt.Millis("wait_timeout_ms", s.waitTimeout))
		} else {
			s.logger.Info("redisstore: replicas acknowledge writes again", "wait", s.wait)
		}
	}
	return short
}
