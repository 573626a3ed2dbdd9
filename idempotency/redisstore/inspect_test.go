package redisstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/harness/redisha"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
)

// want is a finding expected among others: its level and check, and words its setting
// and its detail hold.
type want = idempotencytest.WantFinding

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
	idempotencytest.CheckFindings(t, what, found, wants...)
}

// Findings of a lone server with noeviction.
func noEvictionOK() want {
	return want{Level: idempotency.FindingOK, Check: CheckEviction, Setting: "maxmemory-policy=noeviction", Detail: "nothing is evicted"}
}

func oneServer() want {
	return want{Level: idempotency.FindingOK, Check: CheckTopology, Setting: "one server", Detail: "no failover"}
}

func noReplica() want {
	return want{Level: idempotency.FindingOK, Check: CheckReplication, Setting: "connected_slaves=0", Detail: "no replica"}
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
			{Level: idempotency.FindingOK, Check: CheckPersistence, Setting: "appendonly=yes appendfsync=always", Detail: "loses no acknowledged key"}}},
		{"AOF everysec", []string{"--appendonly", "yes", "--appendfsync", "everysec"}, []want{
			{Level: idempotency.FindingWarn, Check: CheckPersistence, Setting: "appendonly=yes appendfsync=everysec", Detail: "an OS crash or power loss can lose about the last second of keys"}}},
		{"AOF no fsync", []string{"--appendonly", "yes", "--appendfsync", "no"}, []want{
			{Level: idempotency.FindingWarn, Check: CheckPersistence, Setting: "appendonly=yes appendfsync=no", Detail: "when it chooses"}}},
		{"RDB only", []string{"--appendonly", "no", "--save", "3600 1"}, []want{
			{Level: idempotency.FindingWarn, Check: CheckPersistence, Setting: "appendonly=no save='3600 1'", Detail: "RDB snapshots only: a restart loses every key since the last snapshot; they would run again"}}},
		{"nothing", nil, []want{ // redisha's default: --save "" --appendonly no
			{Level: idempotency.FindingWarn, Check: CheckPersistence, Setting: "appendonly=no save=''", Detail: "no persistence: a restart loses every key; they would run again"}}},
		{"allkeys-lru", []string{"--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "allkeys-lru"}, []want{
			{Level: idempotency.FindingOK, Check: CheckPersistence, Setting: "appendfsync=always", Detail: ""},
			{Level: idempotency.FindingRefuse, Check: CheckEviction, Setting: "maxmemory-policy=allkeys-lru", Detail: "a retry of an evicted key runs again"}}},
		{"CONFIG disabled", []string{"--rename-command", "CONFIG", "", "--appendonly", "yes", "--maxmemory-policy", "volatile-ttl"}, []want{
			{Level: idempotency.FindingWarn, Check: CheckConfig, Setting: "CONFIG GET refused: appendfsync, save, min-replicas-to-write, min-replicas-max-lag unread", Detail: "come from INFO"},
			{Level: idempotency.FindingRefuse, Check: CheckEviction, Setting: "maxmemory-policy=volatile-ttl", Detail: "evicted"},
			{Level: idempotency.FindingWarn, Check: CheckPersistence, Setting: "appendonly=yes appendfsync unknown", Detail: "could not be read"}}},
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
	durable := want{Level: idempotency.FindingOK, Check: CheckPersistence, Setting: "appendfsync=always", Detail: ""}

	plain, _ := storeAt(t, master.Addr, Config{})
	inspected(t, "no wait", plain, durable, noEvictionOK(), oneServer(),
		want{Level: idempotency.FindingWarn, Check: CheckReplication, Setting: "replica 127.0.0.1:" + portOf(replica.Addr) + " state=online lag=", Detail: "asynchronous replica: a failover to it can lose the last completed keys; they would run again"},
		want{Level: idempotency.FindingWarn, Check: CheckMinReplicas, Setting: "min-replicas-to-write=0", Detail: "keeps acknowledging claims until a failover replaces it"})

	waiting, _ := storeAt(t, master.Addr, Config{Wait: 1})
	inspected(t, "wait=1", waiting, durable, noEvictionOK(), oneServer(),
		want{Level: idempotency.FindingOK, Check: CheckReplication, Setting: "state=online", Detail: "writes count once 1 replica(s) acknowledged them"})

	tooMany, _ := storeAt(t, master.Addr, Config{Wait: 2})
	inspected(t, "wait=2", tooMany, durable, noEvictionOK(), oneServer(),
		want{Level: idempotency.FindingOK, Check: CheckReplication, Setting: "state=online", Detail: "2 replica(s)"},
		want{Level: idempotency.FindingWarn, Check: CheckReplication, Setting: "wait=2, 1 replica(s) online", Detail: "every claim is refused (503 store-not-durable) until enough are back"})

	// The master is disposable: its settings are the test's to change.
	if err := master.Client().ConfigSet(context.Background(), "min-replicas-to-write", "1").Err(); err != nil {
		t.Fatal(err)
	}
	inspected(t, "min-replicas-to-write=1", plain, durable, noEvictionOK(), oneServer(),
		want{Level: idempotency.FindingWarn, Check: CheckReplication, Setting: "state=online", Detail: "asynchronous replica"},
		want{Level: idempotency.FindingOK, Check: CheckMinReplicas, Setting: "min-replicas-to-write=1 min-replicas-max-lag=10", Detail: "stops taking claims (503) within 10 s"})

	onReplica, _ := storeAt(t, replica.Addr, Config{})
	inspected(t, "a replica", onReplica, durable, noEvictionOK(), oneServer(),
		want{Level: idempotency.FindingRefuse, Check: CheckRole, Setting: "role=slave of 127.0.0.1:", Detail: "the store writes to a replica"})

	opts, err := redis.ParseFailoverURL(g.URL())
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewFailoverClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	sentinel, _ := storeWith(t, client, Config{Wait: 1})
	inspected(t, "Sentinel", sentinel, durable, noEvictionOK(),
		want{Level: idempotency.FindingOK, Check: CheckTopology, Setting: "Sentinel (failover client)", Detail: "follows the master the Sentinels name"},
		want{Level: idempotency.FindingOK, Check: CheckReplication, Setting: "state=online", Detail: "writes count once 1 replica(s)"},
		want{Level: idempotency.FindingOK, Check: CheckMinReplicas, Setting: "min-replicas-to-write=1", Detail: ""})

	// Waiting for one of two replicas: a failover may promote the other.
	g.AddReplica()
	inspected(t, "wait=1 of two", waiting, durable, noEvictionOK(), oneServer(),
		want{Level: idempotency.FindingOK, Check: CheckReplication, Setting: "state=online", Detail: "writes count once 1 replica(s)"},
		want{Level: idempotency.FindingOK, Check: CheckMinReplicas, Setting: "min-replicas-to-write=1", Detail: ""},
		want{Level: idempotency.FindingWarn, Check: CheckReplication, Setting: "wait=1, 2 replicas online", Detail: "WAIT is not consensus"})
}

// TestInspectCluster: each master of a Cluster is inspected, its findings labelled with
// its address.
func TestInspectCluster(t *testing.T) {
	t.Parallel()
	addrs := startCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = client.Close() })
	s, _ := storeWith(t, client, Config{})
	wants := []want{{Level: idempotency.FindingOK, Check: CheckTopology, Setting: "Cluster, 3 masters", Detail: "each shard fails over on its own"}}
	for _, addr := range addrs {
		wants = append(wants,
			want{Level: idempotency.FindingOK, Check: CheckEviction, Setting: "node " + addr + ": maxmemory-policy=noeviction", Detail: ""},
			want{Level: idempotency.FindingWarn, Check: CheckPersistence, Setting: "node " + addr + ": appendonly=no save=''", Detail: "no persistence"},
			want{Level: idempotency.FindingOK, Check: CheckReplication, Setting: "node " + addr + ": role=master connected_slaves=0", Detail: "no replica"})
	}
	inspected(t, "Cluster", s, wants...)
}

// portOf is the port of host:port.
func portOf(addr string) string {
	_, port, _ := strings.Cut(addr, ":")
	return port
}
