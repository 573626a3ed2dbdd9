package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/retrysafe/retrysafe/idempotency"
)

// Checks Inspect reports (idempotency.Finding.Check).
const (
	// CheckQueue: the work queue exists. A missing one is a refusal: nothing consumes
	// it (no Source declared it, or the name is wrong).
	CheckQueue = "rabbitmq.queue"
	// CheckQueueType: quorum or classic.
	CheckQueueType = "rabbitmq.queue-type"
	// CheckDLQ: the dead-letter queue exists.
	CheckDLQ = "rabbitmq.dlq"
	// CheckRetryQueues: the delay queues that retries wait in exist.
	CheckRetryQueues = "rabbitmq.retry-queues"
	// CheckCluster: the cluster the broker is part of; its node count is not readable
	// over AMQP and is said to be unchecked.
	CheckCluster = "rabbitmq.cluster"
)

// Inspect reads what the RabbitMQ topology of cfg (URL, Queue, Delays and AMQP are
// read) means for the queue's messages when a node crashes, and returns one finding per
// setting: the work queue's type, its DLQ and delay queues present, the cluster. It
// declares no queue: it looks each one up passively, and learns the type of the work
// queue, once it knows the queue exists, by declaring it again as a quorum queue with
// the arguments a Source uses — a no-op on a quorum queue, refused without change on a
// classic one. Its error is for a broker that cannot be reached or read; a missing
// queue is a finding (a refusal for the work queue).
func Inspect(ctx context.Context, cfg Config) ([]idempotency.Finding, error) {
	if cfg.URL == "" {
		return nil, fmt.Errorf("%w: Config.URL is required", ErrConfig)
	}
	topo, err := newTopology(cfg.Queue, cfg.Delays, true)
	if err != nil {
		return nil, err
	}
	conn, err := dial(ctx, cfg.URL, withConnectionName(cfg.AMQP, "retrysafe inspect "+cfg.Queue))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var found []idempotency.Finding
	add := func(level idempotency.FindingLevel, check, setting, detail string) {
		found = append(found, idempotency.Finding{Level: level, Check: check, Setting: setting, Detail: detail})
	}
	ok, err := queueExists(ctx, conn, topo.Work)
	if err != nil {
		return nil, err
	}
	if !ok {
		add(idempotency.FindingRefuse, CheckQueue, "queue "+topo.Work+": missing",
			"the work queue does not exist: no Source declared it (or the name or the vhost is wrong); messages published to it are dropped")
		return found, nil
	}
	quorum, setting, err := queueType(ctx, conn, topo)
	switch {
	case err != nil:
		add(idempotency.FindingWarn, CheckQueueType, "queue "+topo.Work+": type not read",
			"redeclaring it as a Source does failed: "+err.Error())
	case quorum:
		add(idempotency.FindingOK, CheckQueueType, setting,
			"acknowledgements, retry copies (at-least-once dead-lettering from the delay queues) and the delivery count survive a crash of a node; replicated over the cluster's nodes")
	case !strings.HasSuffix(setting, "=classic"):
		add(idempotency.FindingRefuse, CheckQueueType, setting, "a Source consumes quorum and classic queues only")
	default:
		add(idempotency.FindingWarn, CheckQueueType, setting, "classic queues: "+classicLoss+
			"; drain and delete the queues, then let a Source declare them anew as quorum queues (the default)")
	}
	if ok, err := queueExists(ctx, conn, topo.DLQ); err != nil {
		return nil, err
	} else if ok {
		add(idempotency.FindingOK, CheckDLQ, "queue "+topo.DLQ+": present", "dead letters are kept until replayed or purged")
	} else {
		add(idempotency.FindingWarn, CheckDLQ, "queue "+topo.DLQ+": missing",
			"a dead-lettering fails until a Source declares it (or Config.NoDeclare's topology lacks it)")
	}
	var missing []string
	for _, d := range topo.Delays {
		ok, err := queueExists(ctx, conn, d.Name)
		if err != nil {
			return nil, err
		}
		if !ok {
			missing = append(missing, d.Name)
		}
	}
	if len(missing) == 0 {
		add(idempotency.FindingOK, CheckRetryQueues, fmt.Sprintf("%d delay queues of %s: present", len(topo.Delays), topo.Work),
			"a retry waits in the delay queue nearest its backoff, then returns to the work queue")
	} else {
		add(idempotency.FindingWarn, CheckRetryQueues, fmt.Sprintf("%d of %d delay queues missing: %s", len(missing), len(topo.Delays), strings.Join(missing, ", ")),
			"a retry to a missing delay queue fails until a Source declares it (other Delays than the Sources'?)")
	}
	name, _ := conn.Properties["cluster_name"].(string)
	add(idempotency.FindingOK, CheckCluster, "cluster_name="+name+", nodes: not checked",
		"AMQP does not tell the node count (rabbitmq-diagnostics cluster_status does): quorum queues are replicated only where there are nodes; on one node a crash keeps what a quorum queue holds, the loss of its disk does not")
	return found, nil
}

// queueExists looks queue up passively, on a channel of its own (a missing queue
// closes the channel).
func queueExists(ctx context.Context, conn *amqp.Connection, queue string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("rabbitmq: opening channel: %w", err)
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var aerr *amqp.Error
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &aerr) && aerr.Code == amqp.NotFound:
		return false, nil
	}
	return false, fmt.Errorf("rabbitmq: looking up queue %q: %w", queue, err)
}

// queueType says whether the existing work queue of t (a quorum topology) is a quorum
// queue, by redeclaring it with the arguments a Source gives it: RabbitMQ accepts an
// equivalent redeclaration without change and refuses one with another x-queue-type.
func queueType(ctx context.Context, conn *amqp.Connection, t Topology) (quorum bool, setting string, err error) {
	if err := ctx.Err(); err != nil {
		return false, "", err
	}
	ch, err := conn.Channel()
	if err != nil {
		return false, "", fmt.Errorf("rabbitmq: opening channel: %w", err)
	}
	defer ch.Close()
	_, err = ch.QueueDeclare(t.Work, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	switch {
	case err == nil:
		return true, "queue " + t.Work + ": x-queue-type=quorum", nil
	case typeMismatch(err):
		return false, "queue " + t.Work + ": x-queue-type=" + currentType(err), nil
	}
	return false, "", err
}

// currentType is the queue type RabbitMQ's refusal names ("… but current is the value
// 'stream' of type 'longstr'"): classic when it names none ("… but current is none").
func currentType(err error) string {
	var aerr *amqp.Error
	if errors.As(err, &aerr) {
		if _, cur, ok := strings.Cut(aerr.Reason, "but current is the value '"); ok {
			if typ, _, ok := strings.Cut(cur, "'"); ok && typ != "" {
				return typ
			}
		}
	}
	return "classic"
}
