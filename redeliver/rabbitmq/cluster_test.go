//go:build linux

package rabbitmq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/harness/rabbitnode"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/pgbox"
	"github.com/retrysafe/retrysafe/redeliver/redelivertest"
)

// resumeBound bounds the wait for handling to resume after a fault: a failure bound,
// not a margin (failover takes a few seconds; a node restart about ten).
const resumeBound = 90 * time.Second

// settleBound bounds the wait for every message of a phase to be applied.
const settleBound = 2 * time.Minute

// clusterAdvanced shortens the wait of a quorum queue's at-least-once dead-letter
// worker for the confirm of a dead letter it republished, from 3 minutes: after a kill
// -9 of the node leading the work queue, the worker of a delay queue waits that long
// before it republishes the retry copies it had sent there (see the package
// documentation, "Clusters").
const clusterAdvanced = "[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}]."

// TestCluster runs on one disposable 3-node RabbitMQ cluster (its start costs about
// 25 s, so every cluster test shares it): the kill -9 scenarios, and the conformance
// suite.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node RabbitMQ cluster and kills and restarts its nodes (about 2 minutes)")
	}
	begin := time.Now()
	c := rabbitnode.StartClusterWith(t, 3, rabbitnode.Options{Advanced: clusterAdvanced})
	t.Logf("3-node cluster up in %v", time.Since(begin).Round(time.Millisecond))
	t.Run("Faults", func(t *testing.T) { testClusterFaults(t, c) })
	t.Run("Conformance", func(t *testing.T) {
		redelivertest.Run(t, redelivertest.Harness{New: func(t *testing.T, p redeliver.Policy) *redelivertest.Queue {
			return conformanceQueueAt(t, c.URLs(), true, p)
		}})
	})
}

// clusterConsumer is a Consumer on a cluster with the library's defaults (quorum
// queues, reconnect backoff, prefetch) and the test's policy: 5 attempts, waits from
// 50ms. Its handler applies one effect per successful run — in the inbox's
// transaction, or in a transaction of its own without an inbox — to a table in
// PostgreSQL without a key, so that every application counts. Every fifth message
// fails its first run.
type clusterConsumer struct {
	name  string
	src   *Source
	queue string
	d     *db
	table string
	log   *runLog
	acks  *ackLog
	stop  func()

	// Under log.mu: the order of events (each run's start, each failed run's end), to
	// tell the run after a failure from a run that overlapped it.
	events  int64
	starts  map[string][]int64 // id → the event of each run's start
	failEnd map[string]int64   // id → the event of its failed first run's end
	counts  map[string][]int   // id → the broker's DeliveryCount of each run

	mu   sync.Mutex
	work time.Duration // how long each handler run works
}

const clusterMaxAttempts = 5

func startClusterConsumer(t *testing.T, name string, urls []string, first int, inbox bool) *clusterConsumer {
	t.Helper()
	ctx := context.Background()
	cc := &clusterConsumer{name: name, queue: "kill-" + name, d: newDB(t), log: newRunLog(), acks: &ackLog{},
		starts: map[string][]int64{}, failEnd: map[string]int64{}, counts: map[string][]int{}}
	cc.table = cc.d.schema + ".effects"
	if _, err := cc.d.pool.Exec(ctx, "CREATE TABLE "+cc.table+" (message_id text NOT NULL, attempt int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"); err != nil {
		t.Fatal(err)
	}
	// The topology is declared through node 0, which leads its quorum queues (RabbitMQ
	// places a new queue's leader on the declaring node); the consumer connects to node
	// first, and to the others in turn.
	pre, err := NewSource(ctx, Config{URL: urls[0], Queue: cc.queue, Delays: testDelays, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if !pre.Topology().Quorum {
		t.Fatal("the default topology is not quorum queues")
	}
	_ = pre.Close(ctx)
	order := append(slices.Clone(urls[first:]), urls[:first]...)
	src, err := NewSource(ctx, Config{URL: order[0], URLs: order[1:], Queue: cc.queue, Delays: testDelays, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	cc.src = src
	var box redeliver.Inbox
	if inbox {
		box = cc.d.inbox
	}
	insert := "INSERT INTO " + cc.table + " (message_id, attempt) VALUES ($1, $2)"
	handler := func(ctx context.Context, m *redeliver.Message) error {
		cc.log.mu.Lock()
		cc.log.runs[m.ID] = append(cc.log.runs[m.ID], m.Attempt)
		cc.events++
		cc.starts[m.ID] = append(cc.starts[m.ID], cc.events)
		cc.counts[m.ID] = append(cc.counts[m.ID], m.DeliveryCount)
		failFirst := len(cc.log.runs[m.ID]) == 1 && failsFirst(m.ID)
		cc.log.mu.Unlock()
		cc.log.total.Add(1)
		cc.mu.Lock()
		work := cc.work
		cc.mu.Unlock()
		select {
		case <-time.After(work):
		case <-ctx.Done():
			return ctx.Err()
		}
		if failFirst {
			cc.log.mu.Lock()
			cc.log.failures[m.ID]++
			cc.events++
			cc.failEnd[m.ID] = cc.events
			cc.log.mu.Unlock()
			return errors.New("first run fails")
		}
		var err error
		if inbox {
			_, err = pgbox.Tx(ctx).Exec(ctx, insert, m.ID, m.Attempt)
		} else {
			err = pgx.BeginFunc(ctx, cc.d.pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, insert, m.ID, m.Attempt)
				return err
			})
		}
		if err == nil {
			cc.log.mu.Lock()
			cc.log.done[m.ID] = true
			cc.log.mu.Unlock()
		}
		return err
	}
	c, err := redeliver.New(redeliver.Config{Source: watchSource{src, cc.acks}, Handler: handler, Inbox: box,
		Policy: testPolicy(clusterMaxAttempts), Concurrency: 4, Logger: quiet(), ShutdownGrace: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	var once sync.Once
	cc.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: Run: %v", name, err)
			}
		})
	}
	t.Cleanup(cc.stop)
	return cc
}

// completedOf returns how many messages whose id has prefix a run completed.
func (l *runLog) completedOf(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for id := range l.done {
		if strings.HasPrefix(id, prefix) {
			n++
		}
	}
	return n
}

// failsFirst reports whether message id (<phase>-<n>) fails its first run: every
// fifth.
func failsFirst(id string) bool {
	n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	return n%5 == 0
}

func (cc *clusterConsumer) setWork(d time.Duration) {
	cc.mu.Lock()
	cc.work = d
	cc.mu.Unlock()
}

// effects returns how many times each message's effect was applied, for the ids with
// prefix.
func (cc *clusterConsumer) effects(t *testing.T, prefix string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := cc.d.pool.Query(ctx, "SELECT message_id, count(*) FROM "+cc.table+" WHERE message_id LIKE $1 GROUP BY message_id", prefix+"%")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { got[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return got
}

// ackLog records every successful ack: when its delivery was received and when the
// broker took the ack.
type ackLog struct {
	mu   sync.Mutex
	acks [][2]time.Time
}

// firstAfter returns the time of the first ack of a delivery received after since:
// a message handled on a connection that works after since.
func (l *ackLog) firstAfter(since time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var first time.Time
	for _, a := range l.acks {
		if a[0].After(since) && (first.IsZero() || a[1].Before(first)) {
			first = a[1]
		}
	}
	return first, !first.IsZero()
}

// watchSource records the acks of its Source's deliveries in an ackLog.
type watchSource struct {
	*Source
	l *ackLog
}

func (s watchSource) Receive(ctx context.Context) (redeliver.Delivery, error) {
	d, err := s.Source.Receive(ctx)
	if err != nil {
		return nil, err
	}
	return &watchDelivery{Delivery: d, l: s.l, received: time.Now()}, nil
}

type watchDelivery struct {
	redeliver.Delivery
	l        *ackLog
	received time.Time
}

func (d *watchDelivery) Ack(ctx context.Context) error {
	err := d.Delivery.Ack(ctx)
	if err == nil {
		d.l.mu.Lock()
		d.l.acks = append(d.l.acks, [2]time.Time{d.received, time.Now()})
		d.l.mu.Unlock()
	}
	return err
}

// cluster wraps the harness's cluster with the inspection the scenarios need.
type cluster struct {
	t *testing.T
	c *rabbitnode.Cluster
}

// live returns a running node.
func (cl cluster) live() *rabbitnode.Node {
	for _, n := range cl.c.Nodes {
		if n.Running() {
			return n
		}
	}
	cl.t.Fatal("no node runs")
	return nil
}

// queueInfo returns, from rabbitmqctl list_queues on a running node, the given info
// items of every queue, by queue name.
func (cl cluster) queueInfo(items ...string) map[string]map[string]any {
	cl.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := cl.live()
	out, err := n.Ctl(ctx, append([]string{"list_queues", "-q", "--formatter", "json", "name"}, items...)...)
	if err != nil {
		cl.t.Fatalf("rabbitmqctl -n %s list_queues: %v\n%s", n.Name, err, out)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out[strings.IndexByte(out, '['):]), &rows); err != nil {
		cl.t.Fatalf("rabbitmqctl -n %s list_queues: %v\n%s", n.Name, err, out)
	}
	m := map[string]map[string]any{}
	for _, r := range rows {
		if name, ok := r["name"].(string); ok {
			m[name] = r
		}
	}
	return m
}

// leader returns the index of the node that leads queue q, or -1.
func (cl cluster) leader(q string) int {
	l := cl.queueInfo("leader")[q]["leader"]
	for i, n := range cl.c.Nodes {
		if l == n.Name {
			return i
		}
	}
	return -1
}

// messages returns the messages (ready and unacknowledged) of queue q.
func (cl cluster) messages(q string) int {
	v, ok := cl.queueInfo("messages")[q]["messages"].(float64)
	if !ok {
		cl.t.Fatalf("queue %s: no message count", q)
	}
	return int(v)
}

// membersOnline waits until every member of queue q is online.
func (cl cluster) membersOnline(q string) {
	cl.t.Helper()
	eventually(cl.t, 2*time.Minute, "every member of "+q+" online", func() bool {
		info := cl.queueInfo("members", "online")[q]
		members, _ := info["members"].([]any)
		online, _ := info["online"].([]any)
		return len(members) == len(cl.c.Nodes) && len(online) == len(members)
	})
}

// awaitAckUnless waits until cc acked a delivery received after since, or settled
// reports true (messages received before since may settle the rest of a phase after
// it), within settleBound; it fails the test, with the state of cc's queues, if
// neither comes.
func (cl cluster) awaitAckUnless(cc *clusterConsumer, since time.Time, what string, settled func() bool) bool {
	cl.t.Helper()
	deadline := time.Now().Add(settleBound)
	for {
		if _, ok := cc.acks.firstAfter(since); ok {
			return true
		}
		if settled() {
			return true
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	info := cl.queueInfo("messages_ready", "messages_unacknowledged", "consumers", "leader", "online")
	var state []string
	for _, q := range cc.src.Topology().Queues() {
		state = append(state, fmt.Sprintf("%s %v", q, info[q]))
	}
	cl.t.Errorf("%s: no ack within %v (%d messages done, %d handler runs); queues:\n%s",
		what, settleBound, cc.log.completed(), cc.log.total.Load(), strings.Join(state, "\n"))
	return false
}

// publish publishes ids to queue through a Publisher that knows every node.
func (cl cluster) publish(queue string, ids []string) {
	cl.t.Helper()
	urls := cl.c.URLs()
	pub, err := NewPublisher(context.Background(), PublisherConfig{URL: urls[0], URLs: urls[1:]})
	if err != nil {
		cl.t.Fatal(err)
	}
	defer pub.Close()
	for _, id := range ids {
		if err := pub.Publish(context.Background(), queue, &redeliver.Message{ID: id, Body: []byte(id)}); err != nil {
			cl.t.Fatal(err)
		}
	}
}

// testClusterFaults runs two consumers side by side through three faults of the
// cluster — one with pgbox's inbox, one without — each on its own queue and schema:
// (a) kill -9 of the node leading the queues while handlers run, (b) kill -9 of the
// node the consumers are connected to, (c) two clean stops of the consumers' node
// against slow handlers. After each fault the test waits, with the node still down,
// until handling resumes (an ack of a message received after the fault), then
// restarts the node; then until every message of the phase is settled. Per phase and
// consumer: no message lost, no dead letter, truthful attempts (the first run of a
// message is attempt 1, no run claims more attempts than the runs up to it, and the
// first run started after a failed first run ended is attempt 2); with the inbox no
// effect applied twice.
func testClusterFaults(t *testing.T, c *rabbitnode.Cluster) {
	cl := cluster{t: t, c: c}
	urls := c.URLs()
	// Both consumers connect to node 1 first, node 0 leading the queues.
	consumers := []*clusterConsumer{
		startClusterConsumer(t, "inbox", urls, 1, true),
		startClusterConsumer(t, "noinbox", urls, 1, false),
	}
	for _, cc := range consumers {
		cl.membersOnline(cc.queue)
	}
	// consumerNode returns the node the inbox consumer is connected to (the other
	// one tries the nodes in the same order).
	consumerNode := func() int {
		src := consumers[0].src
		return slices.Index(urls, src.nodes[src.node.Load()])
	}

	type fault struct {
		what string
		node func() int
		stop func(n *rabbitnode.Node)
	}
	kill := func(n *rabbitnode.Node) { n.Kill() }
	stop := func(n *rabbitnode.Node) { n.Stop() }
	phases := []struct {
		name     string
		messages int
		work     time.Duration
		faults   []fault
	}{
		{"a", 300, 50 * time.Millisecond, []fault{{"kill -9 of the queues' leader", func() int { return cl.leader(consumers[0].queue) }, kill}}},
		{"b", 300, 50 * time.Millisecond, []fault{{"kill -9 of the consumers' node", consumerNode, kill}}},
		{"c", 200, 500 * time.Millisecond, []fault{
			{"stop of the consumers' node", consumerNode, stop},
			{"stop of the consumers' node", consumerNode, stop},
		}},
	}
	for _, ph := range phases {
		var ids []string
		for i := range ph.messages {
			ids = append(ids, ph.name+"-"+strconv.Itoa(i))
		}
		// A fault's node is chosen before the handlers run towards it: rabbitmqctl takes a
		// second or two, and several on a busy machine, in which a phase of short
		// handlers could end. The first fault's node is chosen before the phase's
		// messages are published, a later one's after the fault before it.
		type target struct{ node, before, leader int }
		choose := func(f fault) target {
			i := f.node()
			if i < 0 {
				t.Fatalf("phase %s: no leader of %s", ph.name, consumers[0].queue)
			}
			return target{i, consumerNode(), cl.leader(consumers[0].queue)}
		}
		first := choose(ph.faults[0])
		for _, cc := range consumers {
			cc.setWork(ph.work)
			cl.publish(cc.queue, ids)
		}
		var lastFault time.Time
		for k, f := range ph.faults {
			// Fault while handlers run: after a share of the phase's messages.
			tg := first
			if k > 0 {
				tg = choose(f)
			}
			i, before, leader := tg.node, tg.before, tg.leader
			n := c.Nodes[i]
			want := (k + 1) * ph.messages / (len(ph.faults) + 3)
			eventually(t, resumeBound, fmt.Sprintf("phase %s: %d messages done", ph.name, want), func() bool {
				return consumers[0].log.completedOf(ph.name+"-") >= want && consumers[1].log.completedOf(ph.name+"-") >= want
			})
			at := time.Now()
			lastFault = at
			f.stop(n)
			down := time.Since(at)
			// A graceful stop takes seconds on a busy machine, in which a consumer may
			// settle the rest of the phase from deliveries it received before the fault:
			// then nothing is left to resume (checkClusterPhase still counts every message).
			resumed := make([]string, len(consumers))
			for j, cc := range consumers {
				if !cl.awaitAckUnless(cc, at, fmt.Sprintf("phase %s, %s consumer: handling resumed after the %s (node %d) while it is down", ph.name, cc.name, f.what, i),
					func() bool { return cc.log.completedOf(ph.name+"-") >= len(ids) }) {
					t.FailNow()
				}
				resumed[j] = "none left"
				if first, ok := cc.acks.firstAfter(at); ok {
					resumed[j] = first.Sub(at).Round(time.Millisecond).String()
				}
			}
			restartAt := time.Now()
			n.Restart()
			up := time.Now()
			// After the restart, the next ack of a message received after it, if the
			// phase has messages left: a consumer that failed over may have settled them
			// all while the node was down, or settle the last ones, received before the
			// restart, after it.
			afterRestart := make([]string, len(consumers))
			for j, cc := range consumers {
				afterRestart[j] = "none left"
				cl.awaitAckUnless(cc, up, fmt.Sprintf("phase %s, %s consumer: handling goes on after node %d's restart", ph.name, cc.name, i),
					func() bool { return cc.log.completedOf(ph.name+"-") >= len(ids) })
				if first, ok := cc.acks.firstAfter(up); ok {
					afterRestart[j] = first.Sub(up).Round(time.Millisecond).String()
				}
			}
			t.Logf("phase %s, fault %d: %s: node %d (leader was %d, consumers on %d, now on %d) down in %v; "+
				"handling resumed %v (inbox) / %v (no inbox) after the fault; node back in %v, next ack %v / %v after that",
				ph.name, k+1, f.what, i, leader, before, consumerNode(), down.Round(time.Millisecond),
				resumed[0], resumed[1], up.Sub(restartAt).Round(time.Millisecond),
				afterRestart[0], afterRestart[1])
			for _, cc := range consumers {
				cl.membersOnline(cc.queue)
			}
		}
		for _, cc := range consumers {
			checkClusterPhase(t, cl, cc, ph.name, ids, lastFault)
		}
	}
}

// checkClusterPhase waits until every message of the phase was applied and the
// consumer's queues are empty, then checks its runs and effects.
func checkClusterPhase(t *testing.T, cl cluster, cc *clusterConsumer, phase string, ids []string, lastFault time.Time) {
	t.Helper()
	topo := cc.src.Topology()
	// Wait until every message was applied and the queues are empty, or, if some
	// message is lost, until the queues are empty: the checks below say which.
	settled := func() bool {
		for _, q := range topo.Queues() {
			if q != topo.DLQ && cl.messages(q) != 0 {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(settleBound)
	for (len(cc.effects(t, phase+"-")) < len(ids) || !settled()) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	var last time.Time
	if err := cc.d.pool.QueryRow(context.Background(), "SELECT max(at) FROM "+cc.table+" WHERE message_id LIKE $1", phase+"-%").Scan(&last); err != nil {
		t.Fatal(err)
	}
	dead := cl.messages(topo.DLQ)
	applied := cc.effects(t, phase+"-")
	lost, twice := 0, 0
	for _, id := range ids {
		switch n := applied[id]; {
		case n == 0:
			lost++
			cc.log.mu.Lock()
			t.Errorf("phase %s, %s: %s lost: its effect was never applied (handler runs with attempts %v)", phase, cc.name, id, cc.log.runs[id])
			cc.log.mu.Unlock()
		case n > 1:
			twice += n - 1
		}
	}
	cc.log.mu.Lock()
	defer cc.log.mu.Unlock()
	runs, bad := 0, 0
	for _, id := range ids {
		r := cc.log.runs[id]
		runs += len(r)
		if len(r) == 0 || r[0] != 1 {
			bad++
			t.Errorf("phase %s, %s: %s's first run was attempt %v, want 1", phase, cc.name, id, r)
			continue
		}
		for k, a := range r {
			if a > k+1 {
				bad++
				t.Errorf("phase %s, %s: %s's run %d claimed attempt %d (attempts %v)", phase, cc.name, id, k+1, a, r)
				break
			}
		}
		if failsFirst(id) {
			// The first run that started after the failed one ended (a redelivery of a
			// delivery lost with a node may run alongside the first run, as attempt 1:
			// no attempt had failed yet) has attempt 2, unless it is the broker's
			// redelivery of the failed delivery itself: when the node was lost after the
			// retry's copy was confirmed but before the broker took the ack, the
			// Consumer saw its Retry succeed and the broker hands the original back, with
			// its count header unchanged and its delivery count advanced. A run of
			// attempt 1 that the broker delivers for the first time is still refused.
			next := slices.IndexFunc(cc.starts[id], func(e int64) bool { return e > cc.failEnd[id] })
			if next < 0 || r[next] != 2 && !(r[next] == 1 && cc.counts[id][next] > 1) {
				bad++
				t.Errorf("phase %s, %s: %s failed its first run; the run after it is #%d, want one with attempt 2 or a redelivery (attempts %v, delivery counts %v)", phase, cc.name, id, next+1, r, cc.counts[id])
			}
		}
	}
	if lost != 0 {
		t.Errorf("phase %s, %s: %d of %d messages lost (effect never applied)", phase, cc.name, lost, len(ids))
	}
	if dead != 0 {
		t.Errorf("phase %s, %s: %d dead letters, want none (every message succeeds by its second run)", phase, cc.name, dead)
	}
	if cc.name == "inbox" && twice != 0 {
		t.Errorf("phase %s, %s: %d effects applied twice, want none with the inbox", phase, cc.name, twice)
	}
	t.Logf("phase %s, %s consumer: %d messages, %d handler runs, %d lost, %d dead letters, %d effects applied twice, %d untruthful attempts, %d connects so far; last effect %v after the last fault",
		phase, cc.name, len(ids), runs, lost, dead, twice, bad, cc.src.Connects(), last.Sub(lastFault).Round(time.Millisecond))
}

// conformanceQueueAt is conformanceQueue on the nodes urls (the Source and Publisher
// knowing every node).
func conformanceQueueAt(t *testing.T, urls []string, quorum bool, p redeliver.Policy) *redelivertest.Queue {
	r := newRMQAt(t, urls, quorum)
	return conformanceQueueOf(t, r, quorum, p)
}
