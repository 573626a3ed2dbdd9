package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/idempotency"
)

var _ idempotency.Inspector = (*Store)(nil)

// Inspect implements idempotency.Inspector: what the settings of the store's Redis (every
// master of a Cluster, every shard of a Ring) mean for the promise that a keyed request
// runs once. It reads INFO, and CONFIG GET appendfsync where CONFIG is allowed. Its
// checks:
//
//	redis.eviction     refuse: a maxmemory-policy other than noeviction (records may be
//	                   evicted, and their keys run again)
//	redis.persistence  warn: no AOF (a restart loses the records since the last
//	                   snapshot), or AOF with appendfsync everysec or no, or unknown
//	redis.replication  warn: replicas with no wait (a failover may lose the last
//	                   acknowledged writes), fewer replicas than wait (claims are
//	                   refused), or wait for fewer than all the replicas (WAIT is no
//	                   consensus: a replica that was not among those may be promoted)
//
// A server's settings are named with its address on a Cluster or a Ring.
func (s *Store) Inspect(ctx context.Context) ([]idempotency.Finding, error) {
	nodes, err := s.nodes(ctx)
	if err != nil {
		return nil, wrap("inspect", err)
	}
	var out []idempotency.Finding
	for _, n := range nodes {
		pipe := n.cmd.Pipeline()
		infoCmd := pipe.Info(ctx)
		var fsync *redis.MapStringStringCmd
		if !s.noConfig.Load() {
			fsync = pipe.ConfigGet(ctx, "appendfsync")
		}
		_, _ = pipe.Exec(ctx)
		text, err := infoCmd.Result()
		if err != nil {
			return nil, wrap("inspect", err)
		}
		info := map[string]string{}
		for line := range strings.Lines(text) {
			if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
				info[k] = v
			}
		}
		at := ""
		if n.addr != "" {
			at = " on " + n.addr
		}
		appendfsync := ""
		if fsync != nil {
			appendfsync = fsync.Val()["appendfsync"]
		}
		out = append(out, evictionFinding(info["maxmemory_policy"], at),
			persistenceFinding(info["aof_enabled"], appendfsync, at),
			s.replicationFinding(info, at))
	}
	return out, nil
}

func evictionFinding(policy, at string) idempotency.Finding {
	f := idempotency.Finding{Check: "redis.eviction", Setting: "maxmemory-policy=" + policy + at}
	switch policy {
	case noEviction:
		f.Level, f.Detail = idempotency.FindingOK, "a full Redis refuses writes (claims fail) instead of evicting records"
	case "":
		f.Level, f.Setting, f.Detail = idempotency.FindingWarn, "maxmemory-policy unknown"+at,
			"INFO does not tell the maxmemory-policy: any policy but noeviction evicts records, whose keys then run again"
	default:
		f.Level, f.Detail = idempotency.FindingRefuse,
			"Redis evicts records when its memory is full (every record has a TTL, so volatile-* policies evict them too): a retry of an evicted key runs again, even while its first execution runs"
	}
	return f
}

func persistenceFinding(aof, appendfsync, at string) idempotency.Finding {
	f := idempotency.Finding{Check: "redis.persistence", Level: idempotency.FindingWarn}
	switch {
	case aof == "0":
		f.Setting, f.Detail = "appendonly=no"+at,
			"a Redis restart loses every record written since the last snapshot (all of them without one): their keys run again"
	case appendfsync == "always":
		f.Level, f.Setting, f.Detail = idempotency.FindingOK, "appendonly=yes appendfsync=always"+at,
			"every acknowledged write is on disk before Redis answers"
	case appendfsync == "everysec":
		f.Setting, f.Detail = "appendonly=yes appendfsync=everysec"+at,
			"a crash of the Redis host can lose about the last second of claims and completions: their keys run again"
	case appendfsync != "":
		f.Setting, f.Detail = "appendonly=yes appendfsync="+appendfsync+at,
			"the operating system decides when writes reach the disk: a crash of the Redis host can lose the last claims and completions"
	default:
		f.Setting, f.Detail = "appendonly=yes appendfsync unknown"+at,
			"CONFIG is refused, so appendfsync is unknown: unless it is always, a crash of the Redis host can lose the last claims and completions"
	}
	return f
}

func (s *Store) replicationFinding(info map[string]string, at string) idempotency.Finding {
	replicas, _ := strconv.Atoi(info["connected_slaves"])
	f := idempotency.Finding{Check: "redis.replication", Level: idempotency.FindingWarn,
		Setting: fmt.Sprintf("replicas=%d wait=%d%s", replicas, s.wait, at)}
	switch {
	case info["role"] != "" && info["role"] != "master":
		f.Setting = "role=" + info["role"] + at
		f.Detail = "the store's server is a replica: it refuses writes"
	case replicas == 0 && s.wait == 0:
		f.Level, f.Detail = idempotency.FindingOK, "no replica, so no failover can promote one that lacks acknowledged writes (losing the master is an outage)"
	case s.wait == 0:
		f.Detail = "replication is asynchronous: a failover may promote a replica without the last claims and completions the master acknowledged, and their keys may run again; wait=N makes each count only once N replicas have it"
	case replicas < s.wait:
		f.Detail = "fewer replicas than wait: claims and completions are refused as not durable until enough replicas acknowledge them"
	case s.wait < replicas:
		f.Detail = "WAIT is not consensus: a failover may promote a replica that was not among those that acknowledged a write, and lose it"
	default:
		f.Level, f.Detail = idempotency.FindingOK, "every replica acknowledges each claim and completion before it counts"
	}
	return f
}
