package main

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/natscluster"
	"github.com/retrysafe/retrysafe/harness/rabbitqueue"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver/jetstream"
	"github.com/retrysafe/retrysafe/redeliver/rabbitmq"
)

// quietLog discards the backends' logs.
func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// declareJetStream declares the JetStream topology of queue at url, deleted when t ends.
func declareJetStream(ctx context.Context, t *testing.T, url, queue string) {
	t.Helper()
	cfg := jetstream.Config{URL: url, Queue: queue, Logger: quietLog()}
	if err := jetstream.Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := jetstream.DeleteTopology(ctx, cfg); err != nil {
			t.Errorf("deleting the JetStream topology: %v", err)
		}
	})
}

// TestE2EDoctorBrokers: retrysafe doctor --amqp/--nats --queue reads the queues'
// topologies: a quorum queue is OK (exit 0), a classic one a warning saying what a node
// crash loses, a JetStream queue of one replica on a single server a warning, an
// unknown queue a refusal (exit 2); the store is checked too when --store is given.
func TestE2EDoctorBrokers(t *testing.T) {
	amqpURL, natsURL := testenv.AMQPURL(t), testenv.NATSURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	quorum, classic, js := testenv.Name("doctorq"), testenv.Name("doctorc"), testenv.Name("doctorj")+".work"
	for _, c := range []struct {
		queue   string
		classic bool
	}{{quorum, false}, {classic, true}} {
		src, _ := rabbitqueue.OpenConfig(ctx, t, rabbitmq.Config{URL: amqpURL, Queue: c.queue, Classic: c.classic, Logger: quietLog()})
		if err := src.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	declareJetStream(ctx, t, natsURL, js)
	disk := diskDir(t)

	for _, c := range []struct {
		name  string
		env   []string
		args  []string
		code  int
		lines []string // LEVEL CHECK
		want  []string
		not   []string
	}{
		{"quorum", nil, []string{"--amqp", amqpURL, "--queue", quorum}, 0,
			[]string{"OK rabbitmq.queue-type", "OK rabbitmq.dlq", "OK rabbitmq.retry-queues", "OK rabbitmq.cluster"},
			[]string{"rabbitmq queue " + quorum + " at ", "x-queue-type=quorum", "nodes: not checked", "0 refusals, 0 warnings, 4 ok: the setup keeps the promise that the queues keep"},
			[]string{"store "}},
		{"classic", nil, []string{"--amqp", amqpURL, "--queue", classic}, 1,
			[]string{"WARN rabbitmq.queue-type", "OK rabbitmq.dlq"},
			[]string{"x-queue-type=classic", "redelivers messages already acknowledged", "no delivery count", "0 refusals, 1 warning, 3 ok", "exit 1"}, nil},
		{"JetStream R1 on a single server", []string{"RETRYSAFE_NATS=" + natsURL, "RETRYSAFE_QUEUE=" + js}, nil, 1,
			[]string{"WARN jetstream.replicas", "OK jetstream.storage", "OK jetstream.max-deliver", "OK jetstream.ack-wait"},
			[]string{"replicas=1, a single server", "losing its disk loses every message", "0 refusals, 3 warnings, 5 ok"}, nil},
		{"unknown queues", nil, []string{"--amqp", amqpURL, "--nats", natsURL, "--queue", "doctor-no-such-queue"}, 2,
			[]string{"REFUSE rabbitmq.queue", "REFUSE jetstream.stream"},
			[]string{"queue doctor-no-such-queue: missing", "2 refusals, 0 warnings, 0 ok: a queue cannot be consumed as it stands"}, nil},
		{"store and brokers", nil, []string{"--store", "sqlite:" + filepath.Join(disk, "keys.db"), "--amqp", amqpURL, "--queue", quorum + "," + classic}, 1,
			[]string{"OK sqlite.synchronous", "OK rabbitmq.queue-type", "WARN rabbitmq.queue-type"},
			[]string{"store sqlite:", "rabbitmq queue " + quorum, "rabbitmq queue " + classic,
				"a keyed request runs once, and the queues keep their messages"}, nil},
		{"queue without a broker", nil, []string{"--queue", quorum}, 2, nil, []string{"--queue needs --amqp URL or --nats URL"}, nil},
		{"broker without a queue", nil, []string{"--amqp", amqpURL}, 2, nil, []string{"--amqp and --nats need --queue NAME"}, nil},
		{"unreachable broker", nil, []string{"--amqp", "amqp://guest:secret@" + testenv.DeadAddr(t) + "/", "--queue", quorum}, 2,
			nil, []string{"retrysafe doctor: rabbitmq queue " + quorum, "guest:xxxxx@"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			expectDoctor(t, c.env, c.args, c.code, c.lines, c.want, c.not)
		})
	}
	if out, code := runBinary(t, "doctor", "--help"); code != 0 || !strings.Contains(out, "--amqp URL") || !strings.Contains(out, "--queue NAME") ||
		!strings.Contains(out, "is said to be unchecked") {
		t.Errorf("doctor --help: %d\n%s", code, out)
	}
}

// TestE2EDoctorJetStreamCluster: on a 3-node cluster of its own, a queue declared with
// the defaults is R3, and every finding is OK: exit 0.
func TestE2EDoctorJetStreamCluster(t *testing.T) {
	c := natscluster.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	queue := testenv.Name("doctorr3") + ".work"
	if err := jetstream.Declare(ctx, jetstream.Config{URL: c.URLs(), Queue: queue, Logger: quietLog()}); err != nil {
		t.Fatal(err)
	}
	out, code := runBinary(t, "doctor", "--nats", c.URLs(), "--queue", queue)
	if code != 0 || doctorLine(out, "OK", "jetstream.replicas") == "" || doctorLine(out, "WARN", "jetstream.replicas") != "" ||
		!strings.Contains(out, "replicas=3, cluster ") || !strings.Contains(out, "0 refusals, 0 warnings, 8 ok") {
		t.Errorf("exit status %d, want 0 with every replicas finding OK at 3:\n%s", code, out)
	}
}
