package redisstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/harness/redisha"
	"github.com/retrysafe/retrysafe/idempotency"
)

// want is a finding expected among others: its level and check, and words its setting
// and its detail hold.
type want struct {
	level   idempotency.FindingLevel
	check   string
	setting string
	detail  string
}

// inspected runs Inspect on s and checks that each of wants is among its findings, and
// that it found no warning or refusal beyond those.
func inspected(t *testing.T, what string, s *Store, wants ...want) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	found, err := s.Inspect(ctx)
	if err != nil {
		t.Fatalf("%s: Inspect: %v", what, err)
	}
	matched := make([]bool, len(found))
	for _, w := range wants {
		ok := false
		for i, f := range found {
			if f.Level == w.level && f.Check == w.check && strings.Contains(f.Setting, w.setting) && strings.Contains(f.Detail, w.detail) {
				ok, matched[i] = true, true
			}
		}
		if !ok {
			t.Errorf("%s: no %s %s finding with %q and %q", what, w.level, w.check, w.setting, w.detail)
		}
	}
	for i, f := range found {
		if !matched[i] && f.Level != idempotency.FindingOK {
			t.Errorf("%s: unexpected %+v", what, f)
		}
	}
	if t.Failed() {
		for _, f := range found {
			t.Logf("%s: found %+v", what, f)
		}
	}
}

// Findings of a lone server with noeviction.
func noEvictionOK() want {
	return want{idempotency.FindingOK, CheckEviction, "maxmemory-policy=noeviction", "nothing is evicted"}
}

func oneServer() want { return want{idempotency.FindingOK, CheckTopology, "one server", "no failover"} }

func noReplica() want {
	return want{idempotency.FindingOK, CheckReplication, "connected_slaves=0", "no replica"}
}

// TestInspectPersistence: each persistence and eviction setting of a lone Redis is
// reported with what a crash or a restart loses; where CONFIG is disabled, INFO stands
// in and what it cannot tell is said.
func TestInspectPersistence(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		args  []string
		wants []want
	}{
		{"AOF always", []string{"--appendonly", "yes", "--appendfsync", "always"}, []want{
			{idempotency.FindingOK, CheckPersistence, "appendonly=yes appendfsync=always", "loses no acknowledged key"}}},
		{"AOF everysec", []string{"--appendonly", "yes", "--appendfsync", "everysec"}, []want{
			{idempotency.FindingWarn, CheckPersistence, "appendonly=yes appendfsync=everysec", "an OS crash or power loss can lose about the last second of keys"}}},
		{"AOF no fsync", []string{"--appendonly", "yes", "--appendfsync", "no"}, []want{
			{idempotency.FindingWarn, CheckPersistence, "appendonly=yes appendfsync=no", "when it chooses"}}},
		{"RDB only", []string{"--appendonly", "no", "--save", "3600 1"}, []want{
			{idempotency.FindingWarn, CheckPersistence, "appendonly=no save='3600 1'", "RDB snapshots only: a restart loses every key since the last snapshot; they would run again"}}},
		{"nothing", nil, []want{ // redisha's default: --save "" --appendonly no
			{idempotency.FindingWarn, CheckPersistence, "appendonly=no save=''", "no persistence: a restart loses every key; they would run again"}}},
		{"allkeys-lru", []string{"--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "allkeys-lru"}, []want{
			{idempotency.FindingOK, CheckPersistence, "appendfsync=always", ""},
			{idempotency.FindingRefuse, CheckEviction, "maxmemory-policy=allkeys-lru", "a retry of an evicted key runs again"}}},
		{"CONFIG disabled", []string{"--rename-command", "CONFIG", "", "--appendonly", "yes", "--maxmemory-policy", "volatile-ttl"}, []want{
			{idempotency.FindingWarn, CheckConfig, "CONFIG GET refused: appendfsync, save, min-replicas-to-write, min-replicas-max-lag unread", "come from INFO"},
			{idempotency.FindingRefuse, CheckEviction, "maxmemory-policy=volatile-ttl", "evicted"},
			{idempotency.FindingWarn, CheckPersistence, "appendonly=yes appendfsync unknown", "could not be read"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := redisha.Start(t, redisha.Options{Replicas: -1, NoSentinel: true, Args: tc.args})
			s, _ := storeAt(t, g.Master().Addr, Config{Eviction: EvictionIgnore})
			wants := append([]want{oneServer(), noReplica()}, tc.wants...)
			if !strings.Contains(strings.Join(tc.args, " "), "maxmemory-policy") {
				wants = append(wants, noEvictionOK())
			}
			inspected(t, tc.name, s, wants...)
		})
	}
}

// TestInspectReplicas: a master's replicas are asynchronous unless the store waits for
// them; waiting for more than are online refuses claims, and for fewer leaves a failover
// to one that did not acknowledge; min-replicas-to-write bounds a cut-off master; a
// store on the replica is refused; a Sentinel failover client is recognised.
func TestInspectReplicas(t *testing.T) {
	t.Parallel()
	g := redisha.Start(t, redisha.Options{Args: []string{"--appendonly", "yes", "--appendfsync", "always"}})
	master, replica := g.Master(), g.Replicas()[0]
	durable := want{idempotency.FindingOK, CheckPersistence, "appendfsync=always", ""}

	plain, _ := storeAt(t, master.Addr, Config{})
	inspected(t, "no wait", plain, durable, noEvictionOK(), oneServer(),
		want{idempotency.FindingWarn, CheckReplication, "replica 127.0.0.1:" + portOf(replica.Addr) + " state=online lag=",
			"asynchronous replica: a failover to it can lose the last completed keys; they would run again"},
		want{idempotency.FindingWarn, CheckMinReplicas, "min-replicas-to-write=0", "keeps acknowledging claims until a failover replaces it"})

	waiting, _ := storeAt(t, master.Addr, Config{Wait: 1})
	inspected(t, "wait=1", waiting, durable, noEvictionOK(), oneServer(),
		want{idempotency.FindingOK, CheckReplication, "state=online", "writes count once 1 replica(s) acknowledged them"})

	tooMany, _ := storeAt(t, master.Addr, Config{Wait: 2})
	inspected(t, "wait=2", tooMany, durable, noEvictionOK(), oneServer(),
		want{idempotency.FindingOK, CheckReplication, "state=online", "2 replica(s)"},
		want{idempotency.FindingWarn, CheckReplication, "wait=2, 1 replica(s) online", "every claim is refused (503 store-not-durable) until enough are back"})

	// The master is disposable: its settings are the test's to change.
	if err := master.Client().ConfigSet(context.Background(), "min-replicas-to-write", "1").Err(); err != nil {
		t.Fatal(err)
	}
	inspected(t, "min-replicas-to-write=1", plain, durable, noEvictionOK(), oneServer(),
		want{idempotency.FindingWarn, CheckReplication, "state=online", "asynchronous replica"},
		want{idempotency.FindingOK, CheckMinReplicas, "min-replicas-to-write=1 min-replicas-max-lag=10", "stops taking claims (503) within 10 s"})

	onReplica, _ := storeAt(t, replica.Addr, Config{})
	inspected(t, "a replica", onReplica, durable, noEvictionOK(), oneServer(),
		want{idempotency.FindingRefuse, CheckRole, "role=slave of 127.0.0.1:", "the store writes to a replica"})

	opts, err := redis.ParseFailoverURL(g.URL())
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewFailoverClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	sentinel, _ := storeWith(t, client, Config{Wait: 1})
	inspected(t, "Sentinel", sentinel, durable, noEvictionOK(),
		want{idempotency.FindingOK, CheckTopology, "Sentinel (failover client)", "follows the master the Sentinels name"},
		want{idempotency.FindingOK, CheckReplication, "state=online", "writes count once 1 replica(s)"},
		want{idempotency.FindingOK, CheckMinReplicas, "min-replicas-to-write=1", ""})

	// Waiting for one of two replicas: a failover may promote the other.
	g.AddReplica()
	inspected(t, "wait=1 of two", waiting, durable, noEvictionOK(), oneServer(),
		want{idempotency.FindingOK, CheckReplication, "state=online", "writes count once 1 replica(s)"},
		want{idempotency.FindingOK, CheckMinReplicas, "min-replicas-to-write=1", ""},
		want{idempotency.FindingWarn, CheckReplication, "wait=1, 2 replicas online", "WAIT is not consensus"})
}

// TestInspectCluster: each master of a Cluster is inspected, its findings labelled with
// its address.
func TestInspectCluster(t *testing.T) {
	t.Parallel()
	addrs := startCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = client.Close() })
	s, _ := storeWith(t, client, Config{})
	wants := []want{{idempotency.FindingOK, CheckTopology, "Cluster, 3 masters", "each shard fails over on its own"}}
	for _, addr := range addrs {
		wants = append(wants,
			want{idempotency.FindingOK, CheckEviction, "node " + addr + ": maxmemory-policy=noeviction", ""},
			want{idempotency.FindingWarn, CheckPersistence, "node " + addr + ": appendonly=no save=''", "no persistence"},
			want{idempotency.FindingOK, CheckReplication, "node " + addr + ": role=master connected_slaves=0", "no replica"})
	}
	inspected(t, "Cluster", s, wants...)
}

// portOf is the port of host:port.
func portOf(addr string) string {
	_, port, _ := strings.Cut(addr, ":")
	return port
}
