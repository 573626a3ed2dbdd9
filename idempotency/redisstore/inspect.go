package redisstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/idempotency"
)

// Checks of Inspect: the Check of each Finding it reports.
const (
	// CheckEviction is the maxmemory-policy: anything but noeviction is refused.
	CheckEviction = "redis.eviction"
	// CheckPersistence is appendonly, appendfsync and save: what a restart keeps.
	CheckPersistence = "redis.persistence"
	// CheckRole is the role of the server the store writes to: a replica is refused.
	CheckRole = "redis.role"
	// CheckReplication is one finding per replica of the master (or one for none), and
	// one when fewer replicas are online than Config.Wait asks for.
	CheckReplication = "redis.replication"
	// CheckMinReplicas is min-replicas-to-write and min-replicas-max-lag.
	CheckMinReplicas = "redis.min-replicas"
	// CheckTopology is how the client reaches Redis: one server, Sentinel, Cluster or
	// Ring.
	CheckTopology = "redis.topology"
	// CheckConfig is what could not be read because CONFIG is disabled (as on managed
	// Redis services), where INFO stood in.
	CheckConfig = "redis.config"
)

var _ idempotency.Inspector = (*Store)(nil)

// Inspect implements idempotency.Inspector. It reads, on every server the store writes
// to (every master of a Cluster, every shard of a Ring), the maxmemory-policy (as Ping
// and EvictionPolicy read it), appendonly, appendfsync, save, min-replicas-to-write
// and min-replicas-max-lag (CONFIG GET), INFO replication and INFO persistence, and
// says what each means for the promise that a keyed request runs once, with
// Config.Wait taken into account. Where CONFIG is disabled it falls back to INFO and
// reports what it could not read. It writes nothing.
func (s *Store) Inspect(ctx context.Context) ([]idempotency.Finding, error) {
	nodes, err := s.nodes(ctx)
	if err != nil {
		return nil, wrap("inspect", err)
	}
	out := []idempotency.Finding{s.topology(len(nodes))}
	_, cluster := s.client.(*redis.ClusterClient)
	_, ring := s.client.(*redis.Ring)
	for _, n := range nodes {
		label := ""
		if cluster || ring {
			label = "node " + n.addr + ": "
		}
		found, err := s.inspectNode(ctx, n, label)
		if err != nil {
			return nil, wrap("inspect", err)
		}
		out = append(out, found...)
	}
	return out, nil
}

// topology says how the client reaches Redis.
func (s *Store) topology(nodes int) idempotency.Finding {
	f := idempotency.Finding{Level: idempotency.FindingOK, Check: CheckTopology}
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		f.Setting = fmt.Sprintf("Cluster, %d masters", nodes)
		f.Detail = "each key lives on one master's shard, and each shard fails over on its own: each master's lines say what its failover can lose"
	case *redis.Ring:
		f.Level = idempotency.FindingWarn
		f.Setting = fmt.Sprintf("Ring, %d shards", nodes)
		f.Detail = "a Ring moves keys to another shard whenever its set of live shards changes: a record on the wrong shard is not found, and its key would run again; prefer a Cluster"
	case *redis.Client:
		// go-redis gives a Sentinel failover client this address in place of a server's.
		if c.Options().Addr == "FailoverClient" {
			f.Setting = "Sentinel (failover client)"
			f.Detail = "the store follows the master the Sentinels name, without a restart; a failover keeps what the promoted replica has (see " + CheckReplication + ")"
			break
		}
		f.Setting = "one server, " + c.Options().Addr
		f.Detail = "no failover: if the server is lost, claims fail until it is back or the store is pointed at another"
	default:
		f.Setting = fmt.Sprintf("%T", c)
		f.Detail = "a client of its own kind: its failover is not checked"
	}
	return f
}

// inspectNode reads one server's settings and says what they mean; label prefixes each
// Setting (the node's address, on a Cluster or a Ring).
func (s *Store) inspectNode(ctx context.Context, n node, label string) ([]idempotency.Finding, error) {
	// One CONFIG GET each: Redis before 7 takes one pattern per command.
	inspectedConfig := [...]string{"appendonly", "appendfsync", "save", "min-replicas-to-write", "min-replicas-max-lag"}
	pipe := n.cmd.Pipeline()
	readPolicy := s.readPolicy(ctx, pipe)
	var configs [len(inspectedConfig)]*redis.MapStringStringCmd
	for i, name := range inspectedConfig {
		configs[i] = pipe.ConfigGet(ctx, name)
	}
	replication := pipe.Info(ctx, "replication")
	persistence := pipe.Info(ctx, "persistence")
	_, _ = pipe.Exec(ctx)

	policy, err := readPolicy(ctx, n.cmd)
	if err != nil {
		return nil, err
	}
	conf := map[string]string{}
	var unread []string // refused by the server, or not among its settings
	for i, name := range inspectedConfig {
		m, err := configs[i].Result()
		v, has := m[name]
		var rerr redis.Error
		switch {
		case err == nil && has:
			conf[name] = v
		case err == nil, errors.As(err, &rerr):
			unread = append(unread, name)
		default:
			return nil, err
		}
	}
	repl, err := infoFields(replication)
	if err != nil {
		return nil, err
	}
	pers, err := infoFields(persistence)
	if err != nil {
		return nil, err
	}

	var out []idempotency.Finding
	add := func(level idempotency.FindingLevel, check, setting, detail string) {
		out = append(out, idempotency.Finding{Level: level, Check: check, Setting: label + setting, Detail: detail})
	}
	if _, aof := pers["aof_enabled"]; aof { // INFO persistence says whether the AOF is on
		unread = slices.DeleteFunc(unread, func(name string) bool { return name == "appendonly" })
	}
	if len(unread) > 0 {
		add(idempotency.FindingWarn, CheckConfig, "CONFIG GET refused: "+strings.Join(unread, ", ")+" unread",
			"CONFIG is disabled (as on managed Redis): the maxmemory-policy and the AOF's state come from INFO, but "+
				strings.Join(unread, ", ")+" could not be read: ask the provider what they are")
	}

	// Eviction.
	if policy == noEviction {
		add(idempotency.FindingOK, CheckEviction, "maxmemory-policy=noeviction",
			"nothing is evicted: when memory is full, claims fail (503) rather than lose keys")
	} else {
		add(idempotency.FindingRefuse, CheckEviction, "maxmemory-policy="+policy,
			"when memory is full Redis deletes keys, records in progress and done alike: a retry of an evicted key runs again; set noeviction")
	}

	// Persistence.
	out = append(out, persistenceFinding(label, conf, pers)...)

	// Role and replicas.
	switch role := repl["role"]; role {
	case "master":
		out = append(out, s.replicaFindings(label, conf, repl)...)
	case "":
		add(idempotency.FindingWarn, CheckRole, "role unknown", "INFO replication did not say the server's role")
	default:
		master := hostPort(repl["master_host"], repl["master_port"])
		add(idempotency.FindingRefuse, CheckRole, "role="+role+" of "+master,
			"the store writes to a replica: its writes are refused (READONLY), or, with replica-read-only no, lost at its next resynchronisation; point the store at the master, or at the Sentinels")
	}
	return out, nil
}

// persistenceFinding says what appendonly, appendfsync and save (conf, from CONFIG)
// mean, or the AOF's state in INFO persistence (info) where CONFIG was refused.
func persistenceFinding(label string, conf, info map[string]string) []idempotency.Finding {
	f := idempotency.Finding{Level: idempotency.FindingWarn, Check: CheckPersistence}
	appendonly, known := conf["appendonly"]
	if !known {
		appendonly = map[string]string{"1": "yes", "0": "no"}[info["aof_enabled"]]
	}
	fsync, fsyncKnown := conf["appendfsync"]
	save, saveKnown := conf["save"]
	switch {
	case appendonly == "yes" && !fsyncKnown:
		f.Setting = "appendonly=yes appendfsync unknown"
		f.Detail = "the AOF is on, but how often it is fsynced could not be read: with everysec an OS crash or power loss can lose about the last second of keys; they would run again"
	case appendonly == "yes" && fsync == "always":
		f.Level = idempotency.FindingOK
		f.Setting = "appendonly=yes appendfsync=always"
		f.Detail = "every write is fsynced before Redis answers: a crash or a restart loses no acknowledged key"
	case appendonly == "yes" && fsync == "everysec":
		f.Setting = "appendonly=yes appendfsync=everysec"
		f.Detail = "an OS crash or power loss can lose about the last second of keys (two when the disk is slow; a crash of Redis alone usually none); they would run again"
	case appendonly == "yes":
		f.Setting = "appendonly=yes appendfsync=" + fsync
		f.Detail = "the OS writes the AOF to disk when it chooses (often every 30 s): an OS crash or power loss can lose that many seconds of keys; they would run again"
	case appendonly == "no" && saveKnown && strings.TrimSpace(save) == "":
		f.Setting = "appendonly=no save=''"
		f.Detail = "no persistence: a restart loses every key; they would run again"
	case appendonly == "no" && saveKnown:
		f.Setting = "appendonly=no save='" + save + "'"
		f.Detail = "RDB snapshots only: a restart loses every key since the last snapshot; they would run again"
	case appendonly == "no":
		f.Setting = "appendonly=no, snapshots unknown"
		f.Detail = "no AOF: a restart loses at least every key since the last RDB snapshot, if snapshots are taken at all; they would run again"
	default:
		f.Setting = "appendonly unknown"
		f.Detail = "neither CONFIG nor INFO persistence said whether the AOF is on: a restart may lose keys, which would run again"
	}
	f.Setting = label + f.Setting
	return []idempotency.Finding{f}
}

// replicaFindings says what a master's replicas (INFO replication: repl) and its
// min-replicas settings (conf) mean with the store's Config.Wait.
func (s *Store) replicaFindings(label string, conf, repl map[string]string) []idempotency.Finding {
	var out []idempotency.Finding
	add := func(level idempotency.FindingLevel, check, setting, detail string) {
		out = append(out, idempotency.Finding{Level: level, Check: check, Setting: label + setting, Detail: detail})
	}
	replicas := replicasOf(repl)
	online := 0
	for _, r := range replicas {
		if r["state"] == "online" {
			online++
		}
	}
	if len(replicas) == 0 {
		add(idempotency.FindingOK, CheckReplication, "role=master connected_slaves=0",
			"no replica: what a crash keeps is what persistence keeps ("+CheckPersistence+"), and there is nothing to fail over to")
	}
	for _, r := range replicas {
		setting := fmt.Sprintf("replica %s state=%s lag=%s", hostPort(r["ip"], r["port"]), r["state"], r["lag"])
		if s.wait == 0 {
			add(idempotency.FindingWarn, CheckReplication, setting,
				"asynchronous replica: a failover to it can lose the last completed keys; they would run again (wait=N makes each write wait for N replicas)")
		} else {
			add(idempotency.FindingOK, CheckReplication, setting,
				fmt.Sprintf("writes count once %d replica(s) acknowledged them (wait=%d): a failover to one that did keeps every completed key", s.wait, s.wait))
		}
	}
	switch {
	case s.wait > online:
		add(idempotency.FindingWarn, CheckReplication, fmt.Sprintf("wait=%d, %d replica(s) online", s.wait, online),
			"fewer replicas than the store waits for can acknowledge writes: every claim is refused (503 store-not-durable) until enough are back")
	case s.wait > 0 && s.wait < online:
		add(idempotency.FindingWarn, CheckReplication, fmt.Sprintf("wait=%d, %d replicas online", s.wait, online),
			fmt.Sprintf("WAIT is not consensus: a failover may promote a replica that was not among those that acknowledged a write, and lose it; wait=%d (every replica) closes that", online))
	}

	minReplicas, known := conf["min-replicas-to-write"]
	switch m, _ := strconv.Atoi(minReplicas); {
	case !known:
	case m > 0:
		lag := conf["min-replicas-max-lag"]
		add(idempotency.FindingOK, CheckMinReplicas, "min-replicas-to-write="+minReplicas+" min-replicas-max-lag="+lag,
			"the master refuses writes while fewer than "+minReplicas+" replica(s) are within "+lag+" s: cut off from them, it stops taking claims (503) within "+lag+" s, which bounds what a failover can lose")
	case online > 0 && s.wait == 0:
		add(idempotency.FindingWarn, CheckMinReplicas, "min-replicas-to-write=0",
			"a master cut off from its replicas keeps acknowledging claims until a failover replaces it; those are lost with it and would run again (wait=N or min-replicas-to-write bounds this)")
	}
	return out
}

// replicasOf returns the replicas INFO replication lists (slave0:ip=…,port=…,state=…),
// in their order.
func replicasOf(repl map[string]string) []map[string]string {
	var names []string
	for k := range repl {
		if n, ok := strings.CutPrefix(k, "slave"); ok {
			if _, err := strconv.Atoi(n); err == nil {
				names = append(names, k)
			}
		}
	}
	sort.Slice(names, func(i, j int) bool {
		a, _ := strconv.Atoi(names[i][len("slave"):])
		b, _ := strconv.Atoi(names[j][len("slave"):])
		return a < b
	})
	out := make([]map[string]string, 0, len(names))
	for _, k := range names {
		r := map[string]string{}
		for kv := range strings.SplitSeq(repl[k], ",") {
			if key, v, ok := strings.Cut(kv, "="); ok {
				r[key] = v
			}
		}
		out = append(out, r)
	}
	return out
}

// infoFields parses the reply of INFO into its fields.
func infoFields(cmd *redis.StringCmd) (map[string]string, error) {
	text, err := cmd.Result()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, "#") {
			m[k] = v
		}
	}
	return m, nil
}

// hostPort is host:port, or "?" when INFO gave neither.
func hostPort(host, port string) string {
	if host == "" && port == "" {
		return "?"
	}
	return host + ":" + port
}
