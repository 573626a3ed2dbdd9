package main

// End-to-end tests of retrysafe dlq: a redeliver consumer in the test dead-letters a few
// messages on the real RabbitMQ and NATS, then the binary lists, shows, replays and
// purges them.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/retrysafe/retrysafe/harness/rabbitqueue"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/jetstream"
	"github.com/retrysafe/retrysafe/redeliver/rabbitmq"
	"github.com/retrysafe/retrysafe/retry"
)

// dlqBroker is one broker's work queue with dead letters, as the test sees it.
type dlqBroker struct {
	url, queue string
	// counts returns the messages stored in the work queue and in its DLQ.
	counts func(t *testing.T) (work, dlq int)
}

// dlqTestIDs returns the ids of the messages the tests dead-letter.
func dlqTestIDs() []string { return []string{"dlq-m1", "dlq-m2", "dlq-m3"} }

// deadLetterAll runs a Consumer whose handler always fails permanently over src until
// the broker's DLQ holds every published message, then stops it.
func deadLetterAll(t *testing.T, src redeliver.Source, b *dlqBroker, publish func(ctx context.Context, m *redeliver.Message) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ids := dlqTestIDs()
	for _, id := range ids {
		m := &redeliver.Message{ID: id, Body: []byte(`{"payload":"` + id + `"}`), ContentType: "application/json",
			Header: map[string]string{"tenant": "acme"}}
		if err := publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	c, err := redeliver.New(redeliver.Config{
		Source: src,
		Handler: func(context.Context, *redeliver.Message) error {
			return retry.Permanent(errors.New("boom: the handler refuses"))
		},
		ShutdownGrace: 5 * time.Second,
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	waitFor(t, "three dead letters", 15*time.Second, func() bool {
		work, dlq := b.counts(t)
		return work == 0 && dlq == len(ids)
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("consumer: %v", err)
	}
}

func rabbitDLQ(t *testing.T) *dlqBroker {
	url := testenv.AMQPURL(t)
	b := &dlqBroker{url: url, queue: testenv.Name("dlqe2e")}
	ctx := context.Background()
	src, admin := rabbitqueue.Open(ctx, t, url, b.queue, slog.New(slog.NewTextHandler(io.Discard, nil)))
	topo := src.Topology()
	b.counts = func(t *testing.T) (int, int) {
		t.Helper()
		ch, err := admin.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		var n [2]int
		for i, q := range []string{topo.Work, topo.DLQ} {
			info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			if err != nil {
				t.Fatalf("inspecting %s: %v", q, err)
			}
			n[i] = info.Messages
		}
		return n[0], n[1]
	}
	pub, err := rabbitmq.NewPublisher(ctx, rabbitmq.PublisherConfig{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	deadLetterAll(t, src, b, func(ctx context.Context, m *redeliver.Message) error {
		return pub.Publish(ctx, b.queue, m)
	})
	return b
}

func natsDLQ(t *testing.T) *dlqBroker {
	url := testenv.NATSURL(t)
	b := &dlqBroker{url: url, queue: testenv.Name("dlqe2e") + ".work"}
	// The default stream names: the queue with '.' as '_', and the DLQ stream + "_dlq".
	stream := strings.ReplaceAll(b.queue, ".", "_")
	dlqStream := stream + "_dlq"
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := jetstream.DeleteTopology(ctx, jetstream.Config{Conn: nc, Queue: b.queue}); err != nil {
			t.Errorf("deleting the streams: %v", err)
		}
	})
	j, err := js.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := jetstream.NewSource(ctx, jetstream.Config{URL: url, Queue: b.queue, MemoryStorage: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	b.counts = func(t *testing.T) (int, int) {
		t.Helper()
		var n [2]int
		for i, s := range []string{stream, dlqStream} {
			st, err := j.Stream(ctx, s)
			if err != nil {
				t.Fatalf("stream %s: %v", s, err)
			}
			info, err := st.Info(ctx)
			if err != nil {
				t.Fatalf("stream %s: %v", s, err)
			}
			n[i] = int(info.State.Msgs)
		}
		return n[0], n[1]
	}
	pub, err := jetstream.NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	deadLetterAll(t, src, b, func(ctx context.Context, m *redeliver.Message) error {
		return pub.Publish(ctx, b.queue, m)
	})
	return b
}

// TestE2EDLQ: list, show, replay and purge dead letters through the binary, on
// RabbitMQ and on NATS JetStream.
func TestE2EDLQ(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		setup func(t *testing.T) *dlqBroker
	}{
		{"rabbitmq", rabbitDLQ},
		{"jetstream", natsDLQ},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := c.setup(t)
			flags := []string{"--broker", b.url, "--queue", b.queue}
			dlq := func(action string, args ...string) (string, int) {
				t.Helper()
				return runBinary(t, append(append([]string{"dlq", action}, flags...), args...)...)
			}

			out, code := dlq("list")
			t.Logf("retrysafe dlq list:\n%s", out)
			if code != exitOK || !strings.Contains(out, "(3 dead letters)") || !strings.Contains(out, "permanent") ||
				!strings.Contains(out, "boom: the handler refuses") || !strings.Contains(out, "LAST ERROR") {
				t.Fatalf("list: %d\n%s", code, out)
			}
			for _, id := range dlqTestIDs() {
				if !strings.Contains(out, id) {
					t.Errorf("list does not show %s:\n%s", id, out)
				}
			}
			// --limit, and the broker from RETRYSAFE_BROKER.
			out, code = runBinaryEnv(t, []string{"RETRYSAFE_BROKER=" + b.url}, "dlq", "list", "--queue", b.queue, "--limit", "2")
			if code != exitOK || !strings.Contains(out, "stopped at --limit 2") || strings.Count(out, "dlq-m") != 2 {
				t.Fatalf("list --limit 2 from the environment: %d\n%s", code, out)
			}

			out, code = dlq("show", "--id", "dlq-m2", "--body")
			t.Logf("retrysafe dlq show --id dlq-m2 --body:\n%s", out)
			for _, want := range []string{"id:", "dlq-m2", "reason:", "permanent", "attempts:", "header:",
				"redeliver-reason: permanent", "tenant: acme", `{"payload":"dlq-m2"}`} {
				if !strings.Contains(out, want) {
					t.Errorf("show lacks %q", want)
				}
			}
			// Both times, by name, on both brokers: the first publish, then the move to
			// the DLQ.
			published, dead := showTime(t, out, "first published:"), showTime(t, out, "dead-lettered:")
			if !published.IsZero() && !dead.IsZero() && dead.Before(published) {
				t.Errorf("dead-lettered %v before first published %v", dead, published)
			}
			if code != exitOK || t.Failed() {
				t.Fatalf("show: %d\n%s", code, out)
			}
			if out, code := dlq("show", "--id", "nope"); code != exitFail || !strings.Contains(out, "no dead letter") || strings.Count(out, "\n") != 1 {
				t.Errorf("show of a missing id: %d %q", code, out)
			}

			out, code = dlq("replay", "--id", "dlq-m1")
			if code != exitOK || !strings.Contains(out, "replayed 1 dead letter") {
				t.Fatalf("replay: %d %s", code, out)
			}
			if work, dead := b.counts(t); work != 1 || dead != 2 {
				t.Fatalf("after the replay: work queue %d, DLQ %d; want 1 and 2", work, dead)
			}
			if out, code := dlq("replay"); code != exitUsage || !strings.Contains(out, "--yes") {
				t.Errorf("replay without ids or --yes: %d %q", code, out)
			}

			out, code = dlq("purge", "--yes")
			if code != exitOK || !strings.Contains(out, "purged 2 dead letters") {
				t.Fatalf("purge: %d %s", code, out)
			}
			if work, dead := b.counts(t); work != 1 || dead != 0 {
				t.Fatalf("after the purge: work queue %d, DLQ %d; want 1 and 0", work, dead)
			}
			if out, code := dlq("list"); code != exitOK || !strings.Contains(out, "(0 dead letters)") {
				t.Errorf("list after purge: %d\n%s", code, out)
			}

			// A queue that never had a consumer has no DLQ: one line, status 1.
			out, code = runBinary(t, "dlq", "list", "--broker", b.url, "--queue", testenv.Name("nodlq"))
			if code != exitFail || !strings.Contains(out, "no dead-letter queue") || strings.Count(out, "\n") != 1 {
				t.Errorf("list of a missing DLQ: %d %q", code, out)
			}
		})
	}
}

// showTime returns the time on the line of retrysafe dlq show's output that starts
// with label, failing the test when there is none.
func showTime(t *testing.T, out, label string) time.Time {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, label); ok {
			at, err := time.Parse(time.RFC3339, strings.TrimSpace(v))
			if err != nil {
				t.Errorf("show's %s %q is not a time: %v", label, v, err)
			}
			return at
		}
	}
	t.Errorf("show has no %q line:\n%s", label, out)
	return time.Time{}
}

// TestE2EDLQHelp: the help says what RabbitMQ declares for one work queue (the count
// and the delay buckets, read from the rabbitmq package) and how a delay is rounded.
func TestE2EDLQHelp(t *testing.T) {
	t.Parallel()
	out, code := runBinary(t, "dlq", "--help")
	if code != exitOK {
		t.Fatalf("dlq --help: %d\n%s", code, out)
	}
	topo, err := rabbitmq.Config{Queue: "NAME"}.Topology()
	if err != nil {
		t.Fatal(err)
	}
	var buckets []string
	for _, d := range topo.Delays {
		buckets = append(buckets, shortDuration(d.Delay))
	}
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{
		strconv.Itoa(len(topo.Queues())) + " queues",
		strings.Join(buckets, " "), "1s 2s 5s 10s 30s 1m 2m 5m 10m 30m 1h",
		"nearest", "3s waits 2s", "4s waits 5s", "rabbitmq.Config.Delays",
		"first published", "dead-lettered",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("dlq --help lacks %q:\n%s", want, out)
		}
	}
}

// TestE2EDLQBadFlags: bad flags, an unknown scheme, an unreachable broker: one line on
// stderr, exit status 2, and no password.
func TestE2EDLQBadFlags(t *testing.T) {
	t.Parallel()
	dead := testenv.DeadAddr(t)
	q := []string{"--queue", "orders"}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no action", nil, "want list, show, replay or purge"},
		{"unknown action", []string{"peek"}, "unknown action"},
		{"unknown flag", []string{"list", "--brokr", "amqp://x"}, "flag provided but not defined"},
		{"no broker", append([]string{"list"}, q...), "--broker is required"},
		{"no queue", []string{"list", "--broker", "amqp://x"}, "--queue is required"},
		{"unknown scheme", append([]string{"list", "--broker", "redis://:secret@x"}, q...), "unknown broker scheme"},
		{"no scheme", append([]string{"list", "--broker", "guest:secret@x"}, q...), "no scheme"},
		{"show without id", append([]string{"show", "--broker", "amqp://x"}, q...), "--id is required"},
		{"purge without ids or yes", append([]string{"purge", "--broker", "amqp://x"}, q...), "--yes"},
		{"negative limit", append([]string{"list", "--broker", "amqp://x", "--limit", "-1"}, q...), "--limit"},
		{"argument", append([]string{"list", "--broker", "amqp://x", "extra"}, q...), "unexpected argument"},
		{"rabbitmq unreachable", append([]string{"list", "--broker", "amqp://guest:secret@" + dead + "/"}, q...), "connecting"},
		{"nats unreachable", append([]string{"list", "--broker", "nats://user:secret@" + dead}, q...), "unreachable"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary, append([]string{"dlq"}, c.args...)...)
			cmd.Env = env()
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			_ = cmd.Run()
			msg := stderr.String()
			if code := cmd.ProcessState.ExitCode(); code != exitUsage {
				t.Errorf("exit status %d, want 2; stderr %q", code, msg)
			}
			if strings.Count(msg, "\n") != 1 || !strings.HasSuffix(msg, "\n") || !strings.Contains(msg, c.want) {
				t.Errorf("stderr is not one line with %q: %q", c.want, msg)
			}
			if strings.Contains(msg, "secret") {
				t.Errorf("the password leaks: %q", msg)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout: %q", stdout.String())
			}
		})
	}
}
