package jetstream

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/natscluster"
	"github.com/retrysafe/retrysafe/harness/testenv"
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
	eventually(t, time.Minute, "the INFO connection closed", func() bool {
		return len(logs.find(slog.LevelInfo, "jetstream: connection closed")) == 1
	})
	if got := logs.find(slog.LevelWarn, "jetstream: connection lost, reconnecting"); len(got) != 1 {
		t.Errorf("%d connection-lost records, want 1 (Close is not a loss)", len(got))
	}
}
