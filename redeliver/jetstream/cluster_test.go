package jetstream

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/retrysafe/retrysafe/harness/natscluster"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/redeliver"
)

// logRecord is one captured log record: its level, message and attributes as text.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// captureHandler is a slog.Handler that keeps every record, for tests that assert on
// what a component logs.
type captureHandler struct {
	mu      *sync.Mutex
	records *[]logRecord
	attrs   []slog.Attr
}

func newCapture() *captureHandler {
	return &captureHandler{mu: &sync.Mutex{}, records: &[]logRecord{}}
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	*h.records = append(*h.records, rec)
	h.mu.Unlock()
	return nil
}

func (h *captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &captureHandler{mu: h.mu, records: h.records, attrs: append(slices.Clone(h.attrs), as...)}
}

func (h *captureHandler) WithGroup(string) slog.Handler { return h }

// find returns the records at level whose message is msg.
func (h *captureHandler) find(level slog.Level, msg string) []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logRecord
	for _, r := range *h.records {
		if r.level == level && r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

// clusterConfig returns a Config for a fresh queue on the cluster c, on file storage
// (what a node's restart keeps). The cluster is the test's own: nothing to delete.
func clusterConfig(c *natscluster.Cluster) Config {
	return Config{
		Queue:  testenv.Name("rsjs") + ".work",
		URL:    c.URLs(),
		Policy: testPolicy(),
		Logger: quietLogger(),
	}
}

// TestClusterConnectionLogged kills the node the Source's connection is on and sees the
// backend log the loss (WARN) and the reconnection to another node (INFO).
func TestClusterConnectionLogged(t *testing.T) {
	c := natscluster.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logs := newCapture()
	cfg := clusterConfig(c)
	cfg.Logger = slog.New(logs)
	src, err := NewSource(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = src.Close(ctx) }()
	on := c.Node(src.Conn().ConnectedServerName())
	if on == nil {
		t.Fatalf("connected to %q, not a node of the cluster", src.Conn().ConnectedServerName())
	}
	if got := logs.find(slog.LevelWarn, "jetstream: connection lost, reconnecting"); len(got) != 0 {
		t.Fatalf("connection loss logged before any: %v", got)
	}
	killed := slices.Index(c.Nodes(), on)
	c.Kill(killed)
	eventually(t, time.Minute, "the WARN connection lost and the INFO reconnected", func() bool {
		return len(logs.find(slog.LevelWarn, "jetstream: connection lost, reconnecting")) > 0 &&
			len(logs.find(slog.LevelInfo, "jetstream: reconnected")) > 0
	})
	re := logs.find(slog.LevelInfo, "jetstream: reconnected")[0]
	if re.attrs["server"] == "" || re.attrs["server"] == on.Name {
		t.Errorf("reconnected to server %q, want a node other than the killed %s", re.attrs["server"], on.Name)
	}
	if re.attrs["queue"] != cfg.Queue {
		t.Errorf("reconnected log has queue %q, want %q", re.attrs["queue"], cfg.Queue)
	}
	if err := src.Close(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the DEBUG connection closed", func() bool {
		return len(logs.find(slog.LevelDebug, "jetstream: connection closed")) == 1
	})
	if got := logs.find(slog.LevelWarn, "jetstream: connection lost, reconnecting"); len(got) != 1 {
		t.Errorf("%d connection-lost records, want 1 (Close is not a loss)", len(got))
	}
}

// resumeBound is how long a failover test waits for handling to resume before it fails:
// far above the seconds a fixed consumer takes, far below the settle timeout the tests
// set (a settlement to the dead node that held its handler slot would stall the
// consumer for that long).
const resumeBound = 60 * time.Second

// flow publishes n messages m-00000… (ids in publish order, so in stream order) to cfg's
// queue, asynchronously, and waits for every PubAck.
func flow(t *testing.T, c *natscluster.Cluster, cfg Config, from, n int) {
	t.Helper()
	j, err := js.New(c.Conn())
	if err != nil {
		t.Fatal(err)
	}
	for i := from; i < from+n; i++ {
		m := nats.NewMsg(cfg.Queue)
		m.Header.Set(js.MsgIDHeader, fmt.Sprintf("m-%05d", i))
		m.Data = []byte("body")
		if _, err := j.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-j.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatalf("%d publishes unacknowledged after a minute", j.PublishAsyncPending())
	}
}

// tracker records what the handler of a failover test completed. While held, the
// handler waits, and holding counts the handlers waiting.
type tracker struct {
	mu       sync.Mutex
	done     map[int]int // message index → completions
	max      int         // highest index completed
	after    int         // a completion of an index above it closes resumed
	resumed  chan struct{}
	resumeAt time.Time
	hold     chan struct{} // nil: not held
	holding  int
}

func newTracker() *tracker {
	return &tracker{done: map[int]int{}, after: math.MaxInt, resumed: make(chan struct{})}
}

func (tr *tracker) handle(ctx context.Context, m *redeliver.Message) error {
	var i int
	if _, err := fmt.Sscanf(m.ID, "m-%d", &i); err != nil {
		return redeliver.Decode(fmt.Errorf("unexpected message %q", m.ID))
	}
	tr.mu.Lock()
	if hold := tr.hold; hold != nil {
		tr.holding++
		tr.mu.Unlock()
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
		tr.mu.Lock()
	}
	defer tr.mu.Unlock()
	tr.done[i]++
	tr.max = max(tr.max, i)
	if i > tr.after && tr.resumeAt.IsZero() {
		tr.resumeAt = time.Now()
		close(tr.resumed)
	}
	return nil
}

// completed returns how many distinct messages completed.
func (tr *tracker) completed() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.done)
}

// holdAll makes every handler that starts from now on wait for release.
func (tr *tracker) holdAll() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.hold = make(chan struct{})
}

// held returns how many handlers wait.
func (tr *tracker) held() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.holding
}

// release lets the waiting handlers complete, and makes the completion of any message
// pulled from now on signal resumed: one whose index exceeds every index completed or
// held so far by more than the messages the Source may hold pulled ahead.
func (tr *tracker) release(slack int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	close(tr.hold)
	tr.hold = nil
	tr.after = tr.max + tr.holding + slack
}

// TestClusterConsumerLeaderKillResumes runs a consumer (concurrency 10) on an R3 stream
// with messages flowing, and kills the consumer leader's node (SIGKILL) while ten
// acknowledgements wait for its answer (see failover). Handling resumes once another
// node leads the consumer.
func TestClusterConsumerLeaderKillResumes(t *testing.T) {
	failover(t, 3, false)
}

// TestClusterStreamNodeKillResumes runs a consumer (concurrency 10) on an R1 stream with
// messages flowing, kills the stream's node (SIGKILL) while ten acknowledgements wait for
// its answer (see failover), and restarts it. Handling resumes once the node is back.
func TestClusterStreamNodeKillResumes(t *testing.T) {
	failover(t, 1, true)
}

// failover runs a consumer (concurrency 10, settle timeout ten minutes) on a stream of
// the given replicas with 4000 messages, and once 300 completed, kills the node that
// leads the consumer (with one replica: the stream's node) with ten acknowledgements in
// flight to it: it freezes the node (SIGSTOP) while ten handlers run, lets them
// complete, so their acknowledgements are sent to the frozen node, then kills it; with
// restart, it starts the node again. It measures the time from the kill (and from the
// restart) until a message pulled after the kill completes: settlements to the dead node
// that held handler slots would stop handling for the settle timeout. Every message
// completes in the end.
func failover(t *testing.T, replicas int, restart bool) {
	c := natscluster.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := clusterConfig(c)
	cfg.Replicas = replicas
	cfg.AckWait = 5 * time.Second
	if err := Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	const total, concurrency = 4000, 10
	flow(t, c, cfg, 0, total)
	names, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	leader := c.ConsumerLeader(names.Stream, names.Consumer)
	// The consumer's connection is on the leader's node.
	urls := []string{c.Nodes()[leader].URL()}
	for i, n := range c.Nodes() {
		if i != leader {
			urls = append(urls, n.URL())
		}
	}
	nc, err := Dial(ctx, strings.Join(urls, ","), "failover test", nats.DontRandomize())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.ConnectedServerName() != c.Nodes()[leader].Name {
		t.Fatalf("connected to %s, want the leader %s", nc.ConnectedServerName(), c.Nodes()[leader].Name)
	}
	cfg.Conn = nc
	tr := newTracker()
	r := run(t, cfg, tr.handle, func(rc *redeliver.Config) {
		rc.SettleTimeout = 10 * time.Minute
		rc.Concurrency = concurrency
	})
	eventually(t, time.Minute, "300 messages to complete", func() bool { return tr.completed() >= 300 })
	tr.holdAll()
	eventually(t, time.Minute, "every handler to be held", func() bool { return tr.held() == concurrency })
	c.Freeze(leader)
	sent := nc.Stats().OutMsgs
	tr.release(DefaultPrefetch + 50)
	// The ten acknowledgements are on their way to the frozen node once the connection
	// has counted them and written everything it buffered.
	eventually(t, time.Minute, "the acknowledgements to be sent", func() bool {
		b, err := nc.Buffered()
		return nc.Stats().OutMsgs >= sent+concurrency && err == nil && b == 0
	})
	killed := time.Now()
	c.Kill(leader)
	what := fmt.Sprintf("R%d stream, consumer leader %s killed with %d acknowledgements in flight",
		replicas, c.Nodes()[leader].Name, concurrency)
	var restarted time.Time
	if restart {
		restarted = time.Now()
		c.Restart(leader)
		what += fmt.Sprintf(", restarted at once (serving again %v after the kill)", time.Since(killed).Round(time.Millisecond))
	}
	select {
	case <-tr.resumed:
		tr.mu.Lock()
		at := tr.resumeAt
		tr.mu.Unlock()
		msg := fmt.Sprintf("%s: handling resumed %v after the kill", what, at.Sub(killed).Round(time.Millisecond))
		if restart {
			msg += fmt.Sprintf(", %v after the restart began", at.Sub(restarted).Round(time.Millisecond))
		}
		t.Log(msg)
	case <-time.After(resumeBound):
		t.Fatalf("%s: handling did not resume within %v (%d of %d completed)", what, resumeBound, tr.completed(), total)
	}
	eventually(t, 2*time.Minute, "every message to complete", func() bool { return tr.completed() == total })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}

// replicaWarning is the WARN a Source logs when it chooses one replica by default.
const replicaWarning = "jetstream: the work stream, the DLQ stream and the failure bucket have one replica " +
	"(no cluster of three servers seen): while their server is down the queue stops; a crash of it " +
	"(kill -9, power loss) can lose the consumer's last acknowledgements and delivery counts, so completed " +
	"messages run again and counts restart; losing its disk loses every message. Set Config.Replicas " +
	"to 3 on a cluster of three or more JetStream servers"

// streamReplicas returns the replica counts of cfg's work stream, DLQ stream and
// failure bucket, as the server has them.
func streamReplicas(t *testing.T, ctx context.Context, nc *nats.Conn, cfg Config) []int {
	t.Helper()
	full, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	j, err := js.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, name := range []string{full.Stream, full.DLQStream, "KV_" + full.FailureBucket} {
		s, err := j.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		got = append(got, s.CachedInfo().Config.Replicas)
	}
	return got
}

// TestClusterDefaultReplicas: on a 3-node cluster, given one node's URL, a Source
// creates its streams and bucket with three replicas and warns of nothing; an explicit
// Replicas wins.
func TestClusterDefaultReplicas(t *testing.T) {
	c := natscluster.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logs := newCapture()
	cfg := clusterConfig(c)
	cfg.URL = c.Nodes()[1].URL()
	cfg.Logger = slog.New(logs)
	src, err := NewSource(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := streamReplicas(t, ctx, c.Conn(), cfg); !slices.Equal(got, []int{3, 3, 3}) {
		t.Errorf("replicas of the work stream, DLQ stream and failure bucket = %v, want [3 3 3]", got)
	}
	if w := logs.find(slog.LevelWarn, replicaWarning); len(w) != 0 {
		t.Errorf("warned of one replica on a 3-node cluster: %v", w)
	}

	explicit := clusterConfig(c)
	explicit.Replicas = 1
	if err := Declare(ctx, explicit); err != nil {
		t.Fatal(err)
	}
	if got := streamReplicas(t, ctx, c.Conn(), explicit); !slices.Equal(got, []int{1, 1, 1}) {
		t.Errorf("explicit Replicas 1: replicas %v, want [1 1 1]", got)
	}
}

// TestSingleServerDefaultReplicas: on a single server (the shared one), a Source
// creates its streams with one replica and says at start what that loses.
func TestSingleServerDefaultReplicas(t *testing.T) {
	t.Parallel()
	url := testenv.NATSURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logs := newCapture()
	cfg := newConfig(t, url)
	cfg.Logger = slog.New(logs)
	src, err := NewSource(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := streamReplicas(t, ctx, connect(t, url), cfg); !slices.Equal(got, []int{1, 1, 1}) {
		t.Errorf("replicas %v, want [1 1 1]", got)
	}
	w := logs.find(slog.LevelWarn, replicaWarning)
	if len(w) != 1 {
		t.Fatalf("%d one-replica warnings, want 1", len(w))
	}
	if w[0].attrs["queue"] != cfg.Queue {
		t.Errorf("warning names queue %q, want %q", w[0].attrs["queue"], cfg.Queue)
	}
}
