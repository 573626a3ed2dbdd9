package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	js "github.com/nats-io/nats.go/jetstream"

	"github.com/retrysafe/retrysafe/idempotency"
)

// Checks Inspect reports (idempotency.Finding.Check).
const (
	// CheckStream: the work stream exists. A missing one is a refusal: nothing consumes
	// the queue (no Source ran with this Config, or the name is wrong).
	CheckStream = "jetstream.stream"
	// CheckReplicas: the replica count of the work stream, the DLQ stream and the
	// failure bucket against the cluster's size.
	CheckReplicas = "jetstream.replicas"
	// CheckStorage: file or memory storage of the same three.
	CheckStorage = "jetstream.storage"
	// CheckConsumer: the durable consumer exists.
	CheckConsumer = "jetstream.consumer"
	// CheckMaxDeliver: the consumer's MaxDeliver against the policy's attempts and
	// max deliveries.
	CheckMaxDeliver = "jetstream.max-deliver"
	// CheckAckWait: the consumer's AckWait.
	CheckAckWait = "jetstream.ack-wait"
)

// AckWait bounds below which and above which Inspect warns.
const (
	shortAckWait = 5 * time.Second
	longAckWait  = 5 * time.Minute
)

// Inspect reads what the JetStream topology of cfg — its work stream, DLQ stream,
// failure bucket and durable consumer — means for the queue's messages when a server
// crashes or loses its disk, without writing anything, and returns one finding per
// setting. It connects as NewSource does (cfg.Conn or cfg.URL). The cluster's size is
// what the connection knows of it, as for the default Replicas. Its error is for a
// server that cannot be reached or read; a missing stream is a finding (a refusal).
func Inspect(ctx context.Context, cfg Config) ([]idempotency.Finding, error) {
	s, err := cfg.open(ctx)
	if err != nil {
		return nil, err
	}
	defer s.close()
	c := s.cfg
	cluster, servers := clusterSize(s.nc)
	var found []idempotency.Finding
	add := func(level idempotency.FindingLevel, check, setting, detail string) {
		found = append(found, idempotency.Finding{Level: level, Check: check, Setting: setting, Detail: detail})
	}
	streams := []struct{ what, name string }{
		{"work stream", c.Stream}, {"DLQ stream", c.DLQStream}, {"failure bucket", "KV_" + c.FailureBucket},
	}
	for i, st := range streams {
		info, err := streamInfo(ctx, s.js, st.name)
		if errors.Is(err, js.ErrStreamNotFound) {
			if i == 0 {
				add(idempotency.FindingRefuse, CheckStream, "stream "+st.name+": missing",
					"the work stream does not exist: no Source declared this queue (or the name is wrong); messages published to "+c.Queue+" are not stored")
				return found, nil
			}
			add(idempotency.FindingWarn, CheckStream, st.what+" "+st.name+": missing",
				"declared by NewSource and Declare: no Source with this Config has started since the work stream was created")
			continue
		}
		if err != nil {
			return nil, err
		}
		found = append(found, replicasFinding(st.what, st.name, info.Config.Replicas, cluster, servers))
		setting := st.what + " " + st.name + ": storage=" + info.Config.Storage.String()
		if info.Config.Storage == js.MemoryStorage {
			add(idempotency.FindingWarn, CheckStorage, setting, "kept in memory: a restart of a server holding it loses what that replica held, and a restart of all of them loses every message")
		} else {
			add(idempotency.FindingOK, CheckStorage, setting, "kept on disk")
		}
	}
	cons, err := s.js.Consumer(ctx, c.Stream, c.Consumer)
	if errors.Is(err, js.ErrConsumerNotFound) {
		add(idempotency.FindingWarn, CheckConsumer, "consumer "+c.Consumer+" on "+c.Stream+": missing",
			"no Source has consumed the queue yet (or Config.Consumer names another): messages wait in the stream")
		return found, nil
	}
	if err != nil {
		return nil, fmt.Errorf("jetstream: reading consumer %s on %s: %w", c.Consumer, c.Stream, err)
	}
	cc := cons.CachedInfo().Config
	p := c.Policy.WithDefaults()
	md := "max_deliver=" + strconv.Itoa(cc.MaxDeliver) + " (policy max attempts " + strconv.Itoa(p.MaxAttempts) +
		", max deliveries " + strconv.Itoa(p.MaxDeliveries) + ")"
	switch {
	case cc.MaxDeliver > 0 && cc.MaxDeliver <= p.MaxAttempts:
		add(idempotency.FindingWarn, CheckMaxDeliver, md,
			"the server stops delivering a message before the policy's attempts are spent: it becomes an orphan, published again by the sweep, then dead-lettered as max-deliver; the default is max deliveries + 2")
	case cc.MaxDeliver > 0 && cc.MaxDeliver <= p.MaxDeliveries:
		add(idempotency.FindingWarn, CheckMaxDeliver, md,
			"the server stops delivering a message before the policy's max deliveries: a delivery is not an attempt (failovers and restarts hand back messages pulled ahead, each counted), so a message can become an orphan with attempts left; the default is max deliveries + 2")
	case cc.MaxDeliver <= 0:
		add(idempotency.FindingOK, CheckMaxDeliver, md,
			"no server backstop: the Consumer dead-letters a message delivered more often than the policy's max deliveries")
	default:
		add(idempotency.FindingOK, CheckMaxDeliver, md, "the server's backstop is past the policy's max deliveries")
	}
	aw := "ack_wait=" + cc.AckWait.String()
	switch {
	case cc.AckWait < shortAckWait:
		add(idempotency.FindingWarn, CheckAckWait, aw,
			"short: a process paused longer than a third of it (GC, a busy machine) misses its InProgress heartbeat and the server delivers the running message again")
	case cc.AckWait > longAckWait:
		add(idempotency.FindingWarn, CheckAckWait, aw,
			"long: the messages of a consumer that crashed come back only after it")
	default:
		add(idempotency.FindingOK, CheckAckWait, aw, "a crashed consumer's messages come back after it; running ones are kept by InProgress heartbeats")
	}
	return found, nil
}

// streamInfo reads a stream's configuration.
func streamInfo(ctx context.Context, j js.JetStream, name string) (*js.StreamInfo, error) {
	st, err := j.Stream(ctx, name)
	if err != nil {
		if errors.Is(err, js.ErrStreamNotFound) {
			return nil, err
		}
		return nil, fmt.Errorf("jetstream: reading stream %s: %w", name, err)
	}
	return st.CachedInfo(), nil
}

// replicasFinding judges a stream's replica count against the cluster's size.
func replicasFinding(what, name string, replicas int, cluster string, servers int) idempotency.Finding {
	where := "a single server"
	if cluster != "" {
		where = "cluster " + cluster + " of " + strconv.Itoa(servers) + " servers known"
	}
	f := idempotency.Finding{Check: CheckReplicas, Setting: what + " " + name + ": replicas=" + strconv.Itoa(replicas) + ", " + where}
	switch {
	case replicas >= clusterReplicas:
		f.Level, f.Detail = idempotency.FindingOK, "a server's crash or disk loss loses nothing acknowledged; the stream serves on while a majority of its replicas is up"
	case replicas == 2:
		f.Level, f.Detail = idempotency.FindingWarn, "two replicas need both for a majority: either server down stops the stream; use 3"
	case servers >= clusterReplicas:
		f.Level, f.Detail = idempotency.FindingWarn, "one replica on a cluster that has the servers for three: "+oneReplicaLoss+"; a Source with the default Replicas (or Replicas 3) scales it to 3"
	default:
		f.Level, f.Detail = idempotency.FindingWarn, "one replica: "+oneReplicaLoss+"; a cluster of three JetStream servers and Replicas 3 avoid it"
	}
	return f
}
