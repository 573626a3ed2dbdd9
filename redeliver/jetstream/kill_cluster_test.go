package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/harness/natscluster"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/pgbox"
	"github.com/retrysafe/retrysafe/redeliver/redelivertest"
)

// The kill suite's sizes: each scenario publishes killBatch messages before its first
// fault and killBatch/3 more after each restart (so that handling after the restart is
// measured on messages that need the restarted cluster), and faults first once killAfter
// of them were acknowledged, then (repeated faults) once ten more were.
const killBatch, killAfter = 300, 100

// killRunTime is how long a handler run takes, so that a fault finds handlers running
// (their effect alone takes a millisecond).
const killRunTime = 5 * time.Millisecond

// killAckWait is the suite's AckWait, one of the two settings that differ from the
// library's defaults: a delivery lost with a node (pulled through it, or whose acknowledgement it
// swallowed) comes back after AckWait, and the default 30s would make each scenario
// last that long. It stays well above Prefetch × the slowest handler's time.
const killAckWait = 3 * time.Second

// killSettleTimeout is the Consumer's SettleTimeout, shortened from the default 30s for
// the same reason: a Retry whose failure record was written through a node that dies
// under it waits for an answer until the timeout, and its message comes back only after
// that, so with the default a kill of the connection's node makes a scenario last 30s. It
// stays above a leader election (about five seconds), so that an acknowledgement re-sent
// to the new leader is not given up on.
const killSettleTimeout = 10 * time.Second

// killEffects is the PostgreSQL side of the kill suite: a pgbox inbox and a table with
// one row per committed run of the handler's insert, so that an effect applied twice is
// two rows.
type killEffects struct {
	pool  *pgxpool.Pool
	box   *pgbox.Inbox
	table string
}

func newKillEffects(t *testing.T) *killEffects {
	t.Helper()
	ctx := t.Context()
	schema := testenv.Schema(t, "rskill")
	pool := testenv.PostgresPool(t, 16)
	table := pgx.Identifier{schema, "effects"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+
		"; CREATE TABLE "+table+" (queue text NOT NULL, message_id text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	box, err := pgbox.NewInbox(pgbox.InboxConfig{Pool: pool, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &killEffects{pool: pool, box: box, table: table}
}

func (e *killEffects) insert() string {
	return "INSERT INTO " + e.table + " (queue, message_id) VALUES ($1, $2)"
}

// applied returns the effects of queue per message id.
func (e *killEffects) applied(ctx context.Context, queue string) (map[string]int, error) {
	rows, err := e.pool.Query(ctx, "SELECT message_id, count(*) FROM "+e.table+" WHERE queue = $1 GROUP BY message_id", queue)
	if err != nil {
		return nil, err
	}
	got := map[string]int{}
	var id string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { got[id] = n; return nil })
	return got, err
}

// killRun is one scenario's handler and the record of what happened to each message:
// the handler's runs (the Attempt and DeliveryCount each saw, and whether it failed) and
// the settlements the broker confirmed.
type killRun struct {
	fx    *killEffects
	queue string
	inbox bool
	slow  time.Duration // each run takes this long before its effect

	mu       sync.Mutex
	runs     map[string][]killRec
	running  int
	acks     []ackRec
	acked    map[string]int
	deadSent map[string]int
	// slowestRetry is the longest a Retry took: one that waits on a dead node holds
	// its handler's slot meanwhile.
	slowestRetry time.Duration
}

type killRec struct {
	attempt, deliveryCount int
	failed                 bool
}

// ackRec is a confirmed acknowledgement: when Ack was called and when it returned nil.
type ackRec struct{ start, end time.Time }

func newKillRun(fx *killEffects, queue string, inbox bool, slow time.Duration) *killRun {
	return &killRun{fx: fx, queue: queue, inbox: inbox, slow: slow,
		runs: map[string][]killRec{}, acked: map[string]int{}, deadSent: map[string]int{}}
}

// handle fails the first run of every fifth message; every other run inserts the
// message's effect, in the inbox's transaction with the inbox, in one of its own without.
func (k *killRun) handle(ctx context.Context, m *redeliver.Message) error {
	var i int
	if _, err := fmt.Sscanf(m.ID, "m-%d", &i); err != nil {
		return redeliver.Decode(fmt.Errorf("unexpected message %q", m.ID))
	}
	k.mu.Lock()
	n := len(k.runs[m.ID])
	fail := i%5 == 0 && n == 0
	k.runs[m.ID] = append(k.runs[m.ID], killRec{attempt: m.Attempt, deliveryCount: m.DeliveryCount, failed: true})
	k.running++
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		k.running--
		k.mu.Unlock()
	}()
	if k.slow > 0 {
		t := time.NewTimer(k.slow)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if fail {
		return errors.New("first run of every fifth message fails")
	}
	var err error
	if k.inbox {
		_, err = pgbox.Tx(ctx).Exec(ctx, k.fx.insert(), k.queue, m.ID)
	} else {
		err = pgx.BeginFunc(ctx, k.fx.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, k.fx.insert(), k.queue, m.ID)
			return err
		})
	}
	if err == nil {
		k.mu.Lock()
		k.runs[m.ID][n].failed = false
		k.mu.Unlock()
	}
	return err
}

// ackedCount returns how many distinct messages had an acknowledgement confirmed.
func (k *killRun) ackedCount() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.acked)
}

func (k *killRun) handlersRunning() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.running
}

// ackSince returns when the first acknowledgement called at or after since was
// confirmed.
func (k *killRun) ackSince(since time.Time) (time.Time, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var first time.Time
	for _, a := range k.acks {
		if !a.start.Before(since) && (first.IsZero() || a.end.Before(first)) {
			first = a.end
		}
	}
	return first, !first.IsZero()
}

// settledAll reports whether every id had an acknowledgement or a dead-lettering
// confirmed.
func (k *killRun) settledAll(ids []string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, id := range ids {
		if k.acked[id] == 0 && k.deadSent[id] == 0 {
			return false
		}
	}
	return true
}

// unsettled returns the ids without a confirmed settlement.
func (k *killRun) unsettled(ids []string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, id := range ids {
		if k.acked[id] == 0 && k.deadSent[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

// attemptAnomalies checks that the attempts the handler saw are truthful: a message's
// first run has Attempt 1, no run's Attempt exceeds the runs it had so far (itself
// included), and the run after a failed first run has Attempt 2.
func (k *killRun) attemptAnomalies() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	ids := make([]string, 0, len(k.runs))
	for id := range k.runs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		recs := k.runs[id]
		for i, r := range recs {
			var rule string
			switch {
			case i == 0 && r.attempt != 1:
				rule = "first run"
			case r.attempt > i+1:
				rule = "more than its runs"
			case i == 1 && recs[0].failed && r.attempt != 2:
				rule = "run after a failed first run"
			default:
				continue
			}
			out = append(out, fmt.Sprintf("%s run %d (%s): Attempt %d, DeliveryCount (NumDelivered) %d; runs %s",
				id, i+1, rule, r.attempt, r.deliveryCount, fmtRuns(recs)))
		}
	}
	return out
}

func fmtRuns(recs []killRec) string {
	parts := make([]string, len(recs))
	for i, r := range recs {
		res := "ok"
		if r.failed {
			res = "failed"
		}
		parts[i] = fmt.Sprintf("[attempt %d, delivered %d, %s]", r.attempt, r.deliveryCount, res)
	}
	return strings.Join(parts, " ")
}

// watchedSource is the scenario's Source (every method of *Source, so the Consumer sees
// its Heartbeat), whose deliveries record their confirmed settlements in a killRun.
type watchedSource struct {
	*Source
	k *killRun
}

func (s watchedSource) Receive(ctx context.Context) (redeliver.Delivery, error) {
	d, err := s.Source.Receive(ctx)
	if err != nil {
		return nil, err
	}
	return &watchedDelivery{Delivery: d, k: s.k}, nil
}

type watchedDelivery struct {
	redeliver.Delivery
	k *killRun
}

func (d *watchedDelivery) Ack(ctx context.Context) error {
	start := time.Now()
	err := d.Delivery.Ack(ctx)
	if err == nil {
		end := time.Now()
		d.k.mu.Lock()
		d.k.acks = append(d.k.acks, ackRec{start: start, end: end})
		d.k.acked[d.Message().ID]++
		d.k.mu.Unlock()
	}
	return err
}

func (d *watchedDelivery) Retry(ctx context.Context, r redeliver.RetryInfo) error {
	start := time.Now()
	err := d.Delivery.Retry(ctx, r)
	took := time.Since(start)
	d.k.mu.Lock()
	d.k.slowestRetry = max(d.k.slowestRetry, took)
	d.k.mu.Unlock()
	return err
}

func (d *watchedDelivery) DeadLetter(ctx context.Context, info redeliver.DeadInfo) error {
	err := d.Delivery.DeadLetter(ctx, info)
	if err == nil {
		d.k.mu.Lock()
		d.k.deadSent[d.Message().ID]++
		d.k.mu.Unlock()
	}
	return err
}

// publishKill publishes messages m-<from>… m-<from+n-1> to cfg's queue on the harness's
// connection and waits until the stream stored each: a publish that fails (a node died
// under it, the stream was electing a leader) is sent again with the same id, which the
// stream's deduplication stores once.
func publishKill(t *testing.T, c *natscluster.Cluster, cfg Config, from, n int) []string {
	t.Helper()
	j, err := js.New(c.Conn())
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, n)
	for i := from; i < from+n; i++ {
		ids = append(ids, fmt.Sprintf("m-%05d", i))
	}
	todo := ids
	for round := 0; len(todo) > 0; round++ {
		if round == 20 {
			t.Fatalf("%d publishes still failing after %d rounds", len(todo), round)
		}
		futures := make([]js.PubAckFuture, len(todo))
		for i, id := range todo {
			m := nats.NewMsg(cfg.Queue)
			m.Header.Set(js.MsgIDHeader, id)
			m.Data = []byte("body of " + id)
			if futures[i], err = j.PublishMsgAsync(m); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-j.PublishAsyncComplete():
		case <-time.After(time.Minute):
			t.Fatalf("%d publishes unacknowledged after a minute", j.PublishAsyncPending())
		}
		var again []string
		for i, f := range futures {
			select {
			case <-f.Ok():
			case <-f.Err():
				again = append(again, todo[i])
			}
		}
		todo = again
	}
	return ids
}

// killScenario says what a scenario of TestClusterKill faults.
type killScenario struct {
	replicas int           // 0: the library's default (3 on the cluster)
	noInbox  bool          // run without Config.Inbox: at-least-once
	slow     time.Duration // each handler run's time (killRunTime when zero)
	// target picks the node to kill in the given cycle, from the leaders of the
	// stream and its consumer, and says whether the consumer's connection is to be on
	// it (else on another node).
	target func(cycle, streamLeader, consumerLeader int) (node int, connOn bool)
	cycles int
	// atOnce restarts the node right after the kill instead of waiting for handling to
	// resume first (a stream with no other replica resumes only with its node).
	atOnce bool
}

// TestClusterKill runs a Consumer with the library's defaults (the work stream R3 on the
// cluster; AckWait and SettleTimeout shortened, see killAckWait) and Config.Inbox on PostgreSQL against a
// 3-node cluster whose nodes are killed (SIGKILL) and restarted while handlers run. Every
// fifth message fails its first run. In each scenario every message's effect is applied
// exactly once, none is dead-lettered, the attempts the handler sees are truthful (see
// killRun.attemptAnomalies), and handling resumes after each fault and each restart: the
// time from the fault (and the restart) to the next confirmed acknowledgement is logged.
// One scenario runs without the inbox and logs how many effects were applied twice. The
// backends' conformance suite runs on the cluster last.
func TestClusterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts JetStream cluster nodes: about a minute")
	}
	c := natscluster.Start(t)
	fx := newKillEffects(t)
	// streamLeader and consumerLeader kill that leader's node, the connection on
	// another node.
	streamLeader := func(_, sl, _ int) (int, bool) { return sl, false }
	consumerLeader := func(_, _, cl int) (int, bool) { return cl, false }
	// The node the connection is on, leading neither the stream nor its consumer where
	// the leaders leave one such node (they always do: two leaders, three nodes).
	connNode := func(_, sl, cl int) (int, bool) {
		for i := range natscluster.Size {
			if i != sl && i != cl {
				return i, true
			}
		}
		return sl, true
	}
	scenarios := []struct {
		name string
		s    killScenario
	}{
		{"stream-leader", killScenario{target: streamLeader, cycles: 1}},
		{"consumer-leader", killScenario{target: consumerLeader, cycles: 1}},
		{"connection-node", killScenario{target: connNode, cycles: 1}},
		{"repeated-slow", killScenario{slow: 100 * time.Millisecond, cycles: 3,
			target: func(cycle, _, _ int) (int, bool) { return cycle % natscluster.Size, false }}},
		{"r1-stream-node", killScenario{replicas: 1, target: streamLeader, cycles: 1, atOnce: true}},
		{"r1-stream-node-no-inbox", killScenario{replicas: 1, target: streamLeader, cycles: 1, atOnce: true, noInbox: true}},
	}
	for _, sc := range scenarios {
		if !t.Run(sc.name, func(t *testing.T) { runKillScenario(t, c, fx, sc.s) }) {
			// A scenario that failed may have left a node down; the next ones would
			// measure that.
			for i, n := range c.Nodes() {
				if !n.Running() {
					c.Restart(i)
				}
			}
		}
	}
	t.Run("conformance", func(t *testing.T) { clusterConformance(t, c) })
}

func runKillScenario(t *testing.T, c *natscluster.Cluster, fx *killEffects, s killScenario) {
	began := time.Now()
	// A bound on the scenario's store and broker calls, not on its duration: on a busy
	// machine a scenario has taken three minutes.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cfg := clusterConfig(c)
	cfg.Policy = redeliver.Policy{MaxAttempts: 5}
	cfg.AckWait = killAckWait
	cfg.Replicas = s.replicas
	if err := Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		del := cfg
		del.Conn = c.Conn()
		if err := DeleteTopology(dctx, del); err != nil {
			t.Logf("deleting the topology: %v", err)
		}
	}()
	names, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	replicas := streamReplicas(t, ctx, c.Conn(), cfg)[0]
	want := s.replicas
	if want == 0 {
		want = natscluster.Size
	}
	if replicas != want {
		t.Fatalf("work stream has %d replicas, want %d", replicas, want)
	}
	sl, cl := c.StreamLeader(names.Stream), c.ConsumerLeader(names.Stream, names.Consumer)
	target, connOn := s.target(0, sl, cl)
	// The consumer's connection: first URL the node it is to be on (the target, or the
	// next node), never randomized.
	first := target
	if !connOn {
		first = (target + 1) % natscluster.Size
	}
	urls := []string{c.Nodes()[first].URL()}
	for i, n := range c.Nodes() {
		if i != first {
			urls = append(urls, n.URL())
		}
	}
	nc, err := Dial(ctx, strings.Join(urls, ","), "kill test", nats.DontRandomize())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.ConnectedServerName(); got != c.Nodes()[first].Name {
		t.Fatalf("connected to %s, want %s", got, c.Nodes()[first].Name)
	}
	cfg.Conn = nc

	ids := publishKill(t, c, cfg, 0, killBatch)
	slow := s.slow
	if slow == 0 {
		slow = killRunTime
	}
	k := newKillRun(fx, cfg.Queue, !s.noInbox, slow)
	src, err := NewSource(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rc := redeliver.Config{Source: watchedSource{Source: src, k: k}, Handler: k.handle, Policy: cfg.Policy,
		Logger: cfg.Logger, Registerer: reg, SettleTimeout: killSettleTimeout}
	if !s.noInbox {
		rc.Inbox = fx.box
	}
	consumer, err := redeliver.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- consumer.Run(runCtx) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		stopRun()
		return <-runErr
	}
	defer func() { _ = stop() }()

	role := func(node int) string {
		var r []string
		if node == sl {
			r = append(r, "stream leader")
		}
		if node == cl {
			r = append(r, "consumer leader")
		}
		if c.Nodes()[node].Name == nc.ConnectedServerName() {
			r = append(r, "the connection's server")
		}
		if len(r) == 0 {
			return "a follower"
		}
		return strings.Join(r, ", ")
	}
	var figures []string
	for cycle := range s.cycles {
		if cycle > 0 {
			sl = c.StreamLeader(names.Stream)
			cl = c.ConsumerLeader(names.Stream, names.Consumer)
			target, _ = s.target(cycle, sl, cl)
		}
		// The first fault once killAfter messages were acknowledged, each later one
		// once handling is under way again.
		threshold := killAfter
		if cycle > 0 {
			threshold = k.ackedCount() + 10
		}
		eventually(t, time.Minute, fmt.Sprintf("%d acknowledgements", threshold), func() bool { return k.ackedCount() >= threshold })
		node := c.Nodes()[target]
		what := fmt.Sprintf("R%d, killed %s (%s) with %d handlers running, %d of %d messages acknowledged",
			replicas, node.Name, role(target), k.handlersRunning(), k.ackedCount(), len(ids))
		killed := time.Now()
		c.Kill(target)
		if !s.atOnce {
			at := awaitAck(t, k, killed, what)
			what += fmt.Sprintf(": resumed %v after the kill", at.Sub(killed).Round(time.Millisecond))
		}
		restarted := time.Now()
		c.Restart(target)
		served := time.Now()
		more := publishKill(t, c, cfg, len(ids), killBatch/3)
		ids = append(ids, more...)
		at := awaitAck(t, k, restarted, what)
		if s.atOnce {
			what += fmt.Sprintf(": resumed %v after the kill", at.Sub(killed).Round(time.Millisecond))
		}
		what += fmt.Sprintf("; Restart returned (node serving, meta leader agreed) after %v, next acknowledgement %v after the restart began",
			served.Sub(restarted).Round(time.Millisecond), at.Sub(restarted).Round(time.Millisecond))
		figures = append(figures, what)
		t.Logf("cycle %d: %s", cycle+1, what)
	}

	// Done once every message had a settlement confirmed and the broker holds nothing
	// delivered and unsettled, nor anything left to deliver.
	nt := c.Conn()
	tail := time.Now()
	var settledAt time.Time
	eventually(t, 90*time.Second, "every message settled and the consumer idle", func() bool {
		if !k.settledAll(ids) {
			return false
		}
		if settledAt.IsZero() {
			settledAt = time.Now()
		}
		st, ok := tryQueueState(nt, cfg)
		return ok && st.ackPending == 0 && st.unpulled == 0
	})
	k.mu.Lock()
	slowest := k.slowestRetry
	k.mu.Unlock()
	t.Logf("after the last restart: every message settled in %v, the consumer idle %v later; the slowest Retry took %v",
		settledAt.Sub(tail).Round(time.Millisecond), time.Since(settledAt).Round(time.Millisecond), slowest.Round(time.Millisecond))
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	leftover, _ := tryQueueState(nt, cfg)

	// The DLQ is read once the cluster answers for it: a request made while the
	// restarted node rejoins can time out.
	var dead []redeliver.DeadLetter
	eventually(t, time.Minute, "the DLQ to be listed", func() bool {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		dl, err := NewDeadLetters(ctx, cfg)
		if err != nil {
			t.Logf("opening the DLQ: %v", err)
			return false
		}
		defer func() { _ = dl.Close() }()
		if dead, err = dl.List(ctx, 0); err != nil {
			t.Logf("listing the DLQ: %v", err)
			return false
		}
		return true
	})
	applied, err := fx.applied(ctx, cfg.Queue)
	if err != nil {
		t.Fatal(err)
	}
	var lost, doubled []string
	runs, reruns := 0, 0
	k.mu.Lock()
	for _, id := range ids {
		switch n := applied[id]; {
		case n == 0:
			lost = append(lost, id)
		case n > 1:
			doubled = append(doubled, fmt.Sprintf("%s×%d", id, n))
		}
		runs += len(k.runs[id])
		reruns += max(len(k.runs[id])-1, 0)
	}
	k.mu.Unlock()
	anomalies := k.attemptAnomalies()
	summary := fmt.Sprintf("%d messages, %d handler runs (%d beyond a first run), %d duplicates caught by the inbox, "+
		"%d effects lost, %d applied twice or more, %d dead letters, %d attempt anomalies, %d messages left in the work stream; %v in all",
		len(ids), runs, reruns, int(killDuplicates(t, reg)), len(lost), len(doubled), len(dead), len(anomalies), leftover.work,
		time.Since(began).Round(time.Millisecond))
	t.Log(summary)
	if len(lost) > 0 {
		t.Errorf("%d effects never applied: %v", len(lost), lost)
	}
	for i, d := range dead {
		if i < 5 {
			t.Errorf("dead letter %s: %+v", d.Message.ID, d.Info)
		}
	}
	if len(dead) > 0 {
		t.Errorf("%d dead letters, want none", len(dead))
	}
	if s.noInbox {
		t.Logf("without the inbox (at-least-once): %d of %d effects applied twice or more: %v", len(doubled), len(ids), doubled)
	} else if len(doubled) > 0 {
		t.Errorf("with the inbox, %d effects applied twice or more: %v", len(doubled), doubled)
	}
	for i, a := range anomalies {
		if i < 20 {
			t.Errorf("untruthful attempt: %s", a)
		}
	}
	if len(anomalies) > 0 {
		t.Errorf("%d untruthful attempts", len(anomalies))
	}
}

// awaitAck waits (bounded by resumeBound) for an acknowledgement called at or after
// since to be confirmed, and returns when it was.
func awaitAck(t *testing.T, k *killRun, since time.Time, what string) time.Time {
	t.Helper()
	var at time.Time
	eventually(t, resumeBound, what+": handling to resume", func() bool {
		var ok bool
		at, ok = k.ackSince(since)
		return ok
	})
	return at
}

// tryQueueState is queueState that reports a failed request (a node down, a leader
// being elected) instead of failing the test.
func tryQueueState(nc *nats.Conn, cfg Config) (st state, ok bool) {
	c, err := cfg.withDefaults()
	if err != nil {
		return st, false
	}
	j, err := js.New(nc)
	if err != nil {
		return st, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	str, err := j.Stream(ctx, c.Stream)
	if err != nil {
		return st, false
	}
	st.work = str.CachedInfo().State.Msgs
	cons, err := j.Consumer(ctx, c.Stream, c.Consumer)
	if err != nil {
		return st, false
	}
	ci := cons.CachedInfo()
	st.ackPending, st.unpulled = ci.NumAckPending, int(ci.NumPending)
	return st, true
}

func killDuplicates(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "retrysafe_redeliver_duplicates_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// clusterConformance runs the backends' shared suite on the cluster, with the default
// replicas (three) and file storage.
func clusterConformance(t *testing.T, c *natscluster.Cluster) {
	nc := c.Conn()
	redelivertest.Run(t, redelivertest.Harness{
		Deduplicates: true,
		New: func(t *testing.T, p redeliver.Policy) *redelivertest.Queue {
			cfg := clusterConfig(c)
			cfg.Policy = p
			ctx := context.Background()
			if err := Declare(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := DeleteTopology(ctx, cfg); err != nil {
					t.Logf("cleanup: %v", err)
				}
			})
			if got := streamReplicas(t, ctx, nc, cfg)[0]; got != 3 {
				t.Fatalf("work stream has %d replicas, want 3", got)
			}
			return conformanceQueue(t, nc, cfg)
		},
	})
}
