package redeliver_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	_ "modernc.org/sqlite"

	"github.com/retrysafe/retrysafe/redeliver"
	"github.com/retrysafe/retrysafe/redeliver/sqlitebox"
	"github.com/retrysafe/retrysafe/redeliver/sqlitebox/sqliteboxtest"
)

// openInbox returns a SQLite database with a business table and its inbox.
func openInbox(t *testing.T) (*sql.DB, *sqlitebox.Inbox) {
	t.Helper()
	return sqliteboxtest.Open(t, "CREATE TABLE effects (id TEXT NOT NULL)")
}

func counter(t *testing.T, reg *prometheus.Registry, name, queue string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "queue" && l.GetValue() == queue {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// With Config.Inbox, the handler writes in the inbox's transaction, a recorded id is
// acknowledged without running the handler and counted as a duplicate, a failure (or a
// panic) records nothing, and a delivery beyond max attempts whose id committed is a
// duplicate, not a dead letter.
func TestConsumerInbox(t *testing.T) {
	t.Parallel()
	db, box := openInbox(t)
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	runs := map[string]int{}
	h := func(ctx context.Context, m *redeliver.Message) error {
		mu.Lock()
		runs[m.ID]++
		n := runs[m.ID]
		mu.Unlock()
		tx := sqlitebox.Tx(ctx)
		if tx == nil {
			return errors.New("no inbox transaction in the handler's context")
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO effects (id) VALUES (?)", m.ID); err != nil {
			return err
		}
		switch {
		case m.ID == "fails-once" && n == 1:
			return errors.New("transient")
		case m.ID == "panics-once" && n == 1:
			panic("boom")
		}
		return nil
	}
	src := newFakeSource(1)
	stop := run(t, redeliver.Config{Source: src, Handler: h, Inbox: box, Registerer: reg,
		Policy: redeliver.Policy{MaxAttempts: 3, Backoff: testBackoff}})

	steps := []struct {
		m    redeliver.Message
		want string
	}{
		{redeliver.Message{ID: "a", Queue: "q"}, "ack"},
		{redeliver.Message{ID: "a", Queue: "q"}, "ack"},                    // duplicate
		{redeliver.Message{ID: "a", Queue: "q", DeliveryCount: 9}, "ack"},  // duplicate, not max attempts
		{redeliver.Message{ID: "b", Queue: "q", DeliveryCount: 9}, "dead"}, // never committed
		{redeliver.Message{ID: "fails-once", Queue: "q"}, "retry"},
		{redeliver.Message{ID: "fails-once", Queue: "q", DeliveryCount: 2}, "ack"},
		{redeliver.Message{ID: "panics-once", Queue: "q"}, "retry"},
		{redeliver.Message{ID: "panics-once", Queue: "q", DeliveryCount: 2}, "ack"},
		{redeliver.Message{Queue: "q"}, "dead"}, // no id: cannot be deduplicated
	}
	for i, s := range steps {
		m := s.m
		if got := src.push(&m).wait(t); got != s.want {
			t.Errorf("step %d (%+v): settled %q, want %q", i, s.m, got, s.want)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantRuns := map[string]int{"a": 1, "fails-once": 2, "panics-once": 2}
	for id, n := range wantRuns {
		if runs[id] != n {
			t.Errorf("handler ran %d times for %q, want %d", runs[id], id, n)
		}
	}
	if runs["b"] != 0 {
		t.Errorf("handler ran for a message delivered beyond max attempts")
	}
	rows := map[string]int{}
	r, err := db.Query("SELECT id FROM effects")
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var id string
		if err := r.Scan(&id); err != nil {
			t.Fatal(err)
		}
		rows[id]++
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"a": 1, "fails-once": 1, "panics-once": 1}; len(rows) != len(want) ||
		rows["a"] != 1 || rows["fails-once"] != 1 || rows["panics-once"] != 1 {
		t.Errorf("effects %v, want %v: each once, none from a failed attempt", rows, want)
	}
	if got := counter(t, reg, "retrysafe_redeliver_duplicates_total", "q"); got != 2 {
		t.Errorf("duplicates_total = %v, want 2", got)
	}
	if got := counter(t, reg, "retrysafe_redeliver_succeeded_total", "q"); got != 3 {
		t.Errorf("succeeded_total = %v, want 3", got)
	}
}

// A handler made by the inbox's own Handler, under a Consumer with that inbox, joins the
// Consumer's transaction: the id is recorded once, not found "already processed" by the
// handler's own insert.
func TestConsumerInboxNestedHandler(t *testing.T) {
	t.Parallel()
	db, box := openInbox(t)
	ran := 0
	src := newFakeSource(1)
	stop := run(t, redeliver.Config{Source: src, Inbox: box,
		Handler: box.Handler(func(ctx context.Context, tx *sql.Tx, m *redeliver.Message) error {
			ran++
			if tx != sqlitebox.Tx(ctx) {
				return errors.New("a second transaction")
			}
			_, err := tx.ExecContext(ctx, "INSERT INTO effects (id) VALUES (?)", m.ID)
			return err
		})})
	for range 2 {
		if got := src.push(&redeliver.Message{ID: "n", Queue: "q"}).wait(t); got != "ack" {
			t.Fatalf("settled %q, want ack", got)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM effects").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if ran != 1 || n != 1 {
		t.Errorf("handler ran %d times, %d effects; want 1 and 1", ran, n)
	}
}

// TestConsumerInboxMaxDeliveries: on a Source that counts attempts in the header, a
// message delivered more often than Policy.MaxDeliveries is dead-lettered unrun — unless
// the inbox has its id recorded: then a run of it committed, and it is a duplicate,
// acknowledged, never a dead letter of completed work.
func TestConsumerInboxMaxDeliveries(t *testing.T) {
	t.Parallel()
	_, box := openInbox(t)
	fs := newFakeSource(1)
	runs := map[string]int{}
	var mu sync.Mutex
	stop := run(t, redeliver.Config{Source: headerSource{fs}, Inbox: box,
		Policy: redeliver.Policy{MaxAttempts: 3, MaxDeliveries: 5, Backoff: testBackoff},
		Handler: func(ctx context.Context, m *redeliver.Message) error {
			mu.Lock()
			runs[m.ID]++
			mu.Unlock()
			_, err := sqlitebox.Tx(ctx).ExecContext(ctx, "INSERT INTO effects (id) VALUES (?)", m.ID)
			return err
		}})
	for i, s := range []struct {
		m    redeliver.Message
		want string
	}{
		{redeliver.Message{ID: "done", Queue: "q"}, "ack"},
		{redeliver.Message{ID: "done", Queue: "q", DeliveryCount: 9}, "ack"},   // completed: a duplicate
		{redeliver.Message{ID: "never", Queue: "q", DeliveryCount: 9}, "dead"}, // never committed
	} {
		m := s.m
		if got := fs.push(&m).wait(t); got != s.want {
			t.Errorf("step %d (%+v): settled %q, want %q", i, s.m, got, s.want)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if runs["done"] != 1 || runs["never"] != 0 {
		t.Errorf("handler runs %v, want done once and never none", runs)
	}
}
