package jetstream

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	js "github.com/nats-io/nats.go/jetstream"

	"github.com/retrysafe/retrysafe/harness/natscluster"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
)

// findings returns the findings of check.
func findings(found []idempotency.Finding, check string) []idempotency.Finding {
	var out []idempotency.Finding
	for _, f := range found {
		if f.Check == check {
			out = append(out, f)
		}
	}
	return out
}

// TestInspectSingleServer inspects a queue on the shared single NATS server: missing
// (a refusal, and nothing created by looking), then declared with the defaults (one
// replica: warned, saying what a crash loses), on disk, with a short AckWait warned.
func TestInspectSingleServer(t *testing.T) {
	url := testenv.NATSURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := newConfig(t, url)
	cfg.MemoryStorage = false
	cfg.AckWait = time.Second

	found, err := Inspect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 || found[0].Check != CheckStream || found[0].Level != idempotency.FindingRefuse {
		t.Fatalf("missing queue: findings %+v, want one refusal %s", found, CheckStream)
	}
	j, err := js.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Stream(ctx, streamName(cfg.Queue)); !errors.Is(err, js.ErrStreamNotFound) {
		t.Fatalf("after Inspect of a missing queue, its stream: %v, want not found (Inspect writes nothing)", err)
	}

	if err := Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	found, err = Inspect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	reps := findings(found, CheckReplicas)
	if len(reps) != 3 {
		t.Fatalf("%d replica findings, want 3 (work, DLQ, bucket): %+v", len(reps), found)
	}
	for _, f := range reps {
		if f.Level != idempotency.FindingWarn || !strings.Contains(f.Setting, "replicas=1, a single server") ||
			!strings.Contains(f.Detail, "losing its disk loses every message") {
			t.Errorf("replicas finding %+v, want a warning for one replica on a single server saying what it loses", f)
		}
	}
	for _, f := range findings(found, CheckStorage) {
		if f.Level != idempotency.FindingOK || !strings.HasSuffix(f.Setting, "storage=File") {
			t.Errorf("storage finding %+v, want OK for file storage", f)
		}
	}
	if f := findings(found, CheckMaxDeliver); len(f) != 1 || f[0].Level != idempotency.FindingOK || !strings.Contains(f[0].Setting, "max_deliver=22 ") {
		t.Errorf("max-deliver findings %+v, want one OK with max_deliver=22 (20 deliveries + 2)", f)
	}
	if f := findings(found, CheckAckWait); len(f) != 1 || f[0].Level != idempotency.FindingWarn || f[0].Setting != "ack_wait=1s" {
		t.Errorf("ack-wait findings %+v, want one warning for ack_wait=1s", f)
	}
	if len(findings(found, CheckConsumer))+len(findings(found, CheckStream)) != 0 {
		t.Errorf("findings %+v: the declared streams and consumer reported missing", found)
	}

	// A MaxDeliver past the attempts but within the deliveries a failover can add.
	cfg.MaxDeliver = 10
	if err := Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	found, err = Inspect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if f := findings(found, CheckMaxDeliver); len(f) != 1 || f[0].Level != idempotency.FindingWarn || !strings.Contains(f[0].Detail, "a delivery is not an attempt") {
		t.Errorf("max-deliver findings %+v, want one warning for max_deliver=10 below max deliveries 20", f)
	}
}

// TestInspectMemoryStorage sees memory storage warned about.
func TestInspectMemoryStorage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := newConfig(t, embeddedURL)
	if err := Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	found, err := Inspect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := findings(found, CheckStorage)
	if len(st) != 3 {
		t.Fatalf("%d storage findings, want 3: %+v", len(st), found)
	}
	for _, f := range st {
		if f.Level != idempotency.FindingWarn || !strings.HasSuffix(f.Setting, "storage=Memory") {
			t.Errorf("storage finding %+v, want a warning for memory storage", f)
		}
	}
}

// TestInspectCluster declares a queue with the defaults on a 3-node cluster of its own:
// R3 everywhere, every finding OK.
func TestInspectCluster(t *testing.T) {
	c := natscluster.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := clusterConfig(c)
	if err := Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	found, err := Inspect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	reps := findings(found, CheckReplicas)
	if len(reps) != 3 {
		t.Fatalf("%d replica findings, want 3: %+v", len(reps), found)
	}
	for _, f := range found {
		if f.Level != idempotency.FindingOK {
			t.Errorf("finding %+v, want every finding OK on R3", f)
		}
	}
	for _, f := range reps {
		if !strings.Contains(f.Setting, "replicas=3, cluster ") {
			t.Errorf("replicas finding %+v, want replicas=3 on the cluster", f)
		}
	}
}
