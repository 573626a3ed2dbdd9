//go:build linux

package rabbitnode_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/retrysafe/retrysafe/harness/rabbitnode"
)

// TestStopKillRestart starts a node, checks that rabbitmqctl reaches it and names the
// pid Kill ends, then restarts it twice — after a clean stop and after a kill — and
// checks each time that the persistent messages published before are still there.
func TestStopKillRestart(t *testing.T) {
	n := rabbitnode.Start(t)
	t.Logf("node %s started in %v", n.Name, n.StartTimes()[0])
	if n.Port == 5672 || strings.HasPrefix(n.Name, "rabbit@") {
		t.Fatalf("node %s on port %d: the shared broker's name or port", n.Name, n.Port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := n.Ctl(ctx, "eval", "os:getpid().")
	if err != nil {
		t.Fatalf("rabbitmqctl eval: %v\n%s", err, out)
	}
	pid, err := n.Pid()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Trim(strings.TrimSpace(out), `"`); got != strconv.Itoa(pid) {
		t.Fatalf("rabbitmqctl says pid %s, the pid file %d", got, pid)
	}

	channel := func() *amqp.Channel {
		conn, err := amqp.Dial(n.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	queues := map[string]amqp.Table{"quorum": {"x-queue-type": "quorum"}, "classic": {}}
	publish := func(q string) {
		ch := channel()
		if _, err := ch.QueueDeclare(q, true, false, false, false, queues[q]); err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(q)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("confirm: %v %v", ok, err)
		}
	}
	// take receives the message of queue q (a quorum queue answers once it has
	// recovered its log, so a passive declare may count 0 before: consume instead).
	take := func(q string) {
		msgs, err := channel().ConsumeWithContext(ctx, q, "", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case d := <-msgs:
			if string(d.Body) != q {
				t.Fatalf("queue %s gave %q after the restart", q, d.Body)
			}
		case <-ctx.Done():
			t.Fatalf("the message of queue %s did not come back after the restart", q)
		}
	}

	publish("quorum")
	publish("classic")
	n.Stop()
	n.Restart()
	t.Logf("node restarted after a clean stop in %v", n.StartTimes()[1])
	take("quorum")
	take("classic")

	publish("classic")
	n.Kill()
	if n.Running() {
		t.Fatal("the node runs after Kill")
	}
	n.Restart()
	t.Logf("node restarted after a kill in %v", n.StartTimes()[2])
	take("classic")
}

// TestCluster starts a 3-node cluster, checks that every node runs in it, puts a
// message in a quorum queue (replicated on the three), kills the node the queue was
// declared on and takes the message from another.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three RabbitMQ nodes")
	}
	begin := time.Now()
	c := rabbitnode.StartCluster(t, 3)
	t.Logf("3-node cluster formed in %v (node starts %v, %v, %v)", time.Since(begin),
		c.Nodes[0].StartTimes()[0], c.Nodes[1].StartTimes()[0], c.Nodes[2].StartTimes()[0])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := c.Nodes[2].Ctl(ctx, "eval", "length(rabbit_nodes:all_running()).")
	if err != nil || strings.TrimSpace(out) != "3" {
		t.Fatalf("running nodes seen by %s: %q, %v; want 3", c.Nodes[2].Name, out, err)
	}
	channel := func(n *rabbitnode.Node) *amqp.Channel {
		conn, err := amqp.Dial(n.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	ch := channel(c.Nodes[0])
	if _, err := ch.QueueDeclare("replicated", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "replicated", true, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("confirm: %v %v", ok, err)
	}
	c.Nodes[0].Kill()
	killed := time.Now()
	var msgs <-chan amqp.Delivery
	for {
		msgs, err = channel(c.Nodes[1]).ConsumeWithContext(ctx, "replicated", "", true, false, false, false, nil)
		if err == nil {
			break
		}
		// Until the queue's members have elected a leader in place of the killed one, a
		// consume may fail with a broker error (541 INTERNAL_ERROR), which closes the
		// connection: a client connects again and retries, and so does the test.
		var amqpErr *amqp.Error
		if !errors.As(err, &amqpErr) {
			t.Fatal(err)
		}
		t.Logf("consume %v after the kill: %v; retrying", time.Since(killed), err)
		select {
		case <-ctx.Done():
			t.Fatalf("no consume on %s after the kill: %v", c.Nodes[1].Name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	select {
	case d := <-msgs:
		if string(d.Body) != "x" {
			t.Fatalf("got %q", d.Body)
		}
	case <-ctx.Done():
		t.Fatal("the message did not come from another node after the kill")
	}
	t.Logf("message taken from %s %v after the kill of %s", c.Nodes[1].Name, time.Since(killed), c.Nodes[0].Name)
}
