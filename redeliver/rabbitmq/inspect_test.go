package rabbitmq

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// byCheck returns the findings by check, failing on a check reported twice.
func byCheck(t *testing.T, found []idempotency.Finding) map[string]idempotency.Finding {
	t.Helper()
	m := map[string]idempotency.Finding{}
	for _, f := range found {
		if _, dup := m[f.Check]; dup {
			t.Fatalf("check %s reported twice: %+v", f.Check, found)
		}
		m[f.Check] = f
	}
	return m
}

// TestInspect inspects topologies on the shared broker: a quorum one (every finding
// OK, the node count said to be unchecked), a classic one (warned, saying what a crash
// loses), one missing its DLQ and a delay queue, and a missing queue (a refusal, and
// nothing declared by looking).
func TestInspect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	declared := func(t *testing.T, quorum bool) *rmq {
		r := newRMQ(t, quorum)
		src, err := NewSource(ctx, r.config())
		if err != nil {
			t.Fatal(err)
		}
		if err := src.Close(ctx); err != nil {
			t.Fatal(err)
		}
		return r
	}

	t.Run("quorum", func(t *testing.T) {
		r := declared(t, true)
		found, err := Inspect(ctx, r.config())
		if err != nil {
			t.Fatal(err)
		}
		m := byCheck(t, found)
		for _, c := range []string{CheckQueueType, CheckDLQ, CheckRetryQueues, CheckCluster} {
			if m[c].Level != idempotency.FindingOK {
				t.Errorf("%s: %+v, want OK", c, m[c])
			}
		}
		if got := m[CheckQueueType].Setting; got != "queue "+r.queue+": x-queue-type=quorum" {
			t.Errorf("queue type setting %q", got)
		}
		if !strings.Contains(m[CheckCluster].Setting, "nodes: not checked") {
			t.Errorf("cluster finding %+v, want the node count said to be unchecked", m[CheckCluster])
		}
	})

	t.Run("classic", func(t *testing.T) {
		r := declared(t, false)
		found, err := Inspect(ctx, r.config())
		if err != nil {
			t.Fatal(err)
		}
		f := byCheck(t, found)[CheckQueueType]
		if f.Level != idempotency.FindingWarn || f.Setting != "queue "+r.queue+": x-queue-type=classic" ||
			!strings.Contains(f.Detail, "redelivers messages already acknowledged") || !strings.Contains(f.Detail, "no delivery count") {
			t.Errorf("queue type finding %+v, want a warning for a classic queue saying what a crash loses", f)
		}
		if r.count(t, r.queue) != 0 {
			t.Error("the classic work queue holds messages after Inspect")
		}
	})

	t.Run("partial", func(t *testing.T) {
		r := declared(t, true)
		ch, err := r.admin.Channel()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{r.topo.DLQ, r.topo.Delays[0].Name} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Fatal(err)
			}
		}
		_ = ch.Close()
		found, err := Inspect(ctx, r.config())
		if err != nil {
			t.Fatal(err)
		}
		m := byCheck(t, found)
		if m[CheckDLQ].Level != idempotency.FindingWarn || !strings.HasSuffix(m[CheckDLQ].Setting, ": missing") {
			t.Errorf("DLQ finding %+v, want a warning: missing", m[CheckDLQ])
		}
		if f := m[CheckRetryQueues]; f.Level != idempotency.FindingWarn || !strings.Contains(f.Setting, r.topo.Delays[0].Name) ||
			strings.Contains(f.Setting, r.topo.Delays[1].Name) {
			t.Errorf("retry queues finding %+v, want a warning naming the one deleted", f)
		}
		if ok, err := queueExists(ctx, r.admin, r.topo.DLQ); err != nil || ok {
			t.Errorf("the DLQ after Inspect: exists %v, %v; want still missing (Inspect declares nothing)", ok, err)
		}
	})

	t.Run("missing", func(t *testing.T) {
		r := newRMQ(t, true)
		found, err := Inspect(ctx, r.config())
		if err != nil {
			t.Fatal(err)
		}
		if len(found) != 1 || found[0].Check != CheckQueue || found[0].Level != idempotency.FindingRefuse {
			t.Fatalf("findings %+v, want one refusal %s", found, CheckQueue)
		}
		if ok, err := queueExists(ctx, r.admin, r.queue); err != nil || ok {
			t.Errorf("the work queue after Inspect: exists %v, %v; want still missing", ok, err)
		}
	})

	t.Run("unreachable", func(t *testing.T) {
		if _, err := Inspect(ctx, Config{URL: "amqp://guest:guest@127.0.0.1:1/", Queue: "q"}); err == nil {
			t.Error("Inspect of a broker that does not answer: nil error")
		}
	})
}
