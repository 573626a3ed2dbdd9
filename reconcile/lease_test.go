package reconcile_test

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/retrysafe/fence"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/reconcile"
)

// pgEnv is a pool and a migrated fence store in a fresh schema, dropped when the test
// ends.
type pgEnv struct {
	pool   *pgxpool.Pool
	leases *fence.Store
	schema string
}

func newPG(t *testing.T) pgEnv {
	t.Helper()
	schema := testenv.Schema(t, "reconcile") // named before the pool, which is closed before it is dropped
	e := pgEnv{pool: testenv.PostgresPool(t, 6), schema: schema}
	e.leases = e.store(t)
	if err := e.leases.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return e
}

// store returns another fence store on the environment's lease table (another replica).
func (e pgEnv) store(t *testing.T) *fence.Store {
	t.Helper()
	st, err := fence.New(fence.Config{Pool: e.pool, Schema: e.schema, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// tableLister lists key → value from a table of the environment.
func (e pgEnv) tableLister(table string) reconcile.ListerFunc[string] {
	return func(ctx context.Context) (map[string]string, error) {
		rows, err := e.pool.Query(ctx, "SELECT key, value FROM "+e.schema+"."+table)
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		var k, v string
		_, err = pgx.ForEachRow(rows, []any{&k, &v}, func() error { out[k] = v; return nil })
		return out, err
	}
}

// Desired and actual state in PostgreSQL; the repairs are fenced by the lease (Check,
// and the row's last token). Injected drift of each kind is found in one pass and
// repaired.
func TestLeasedRepair(t *testing.T) {
	t.Parallel()
	e := newPG(t)
	ctx := t.Context()
	if _, err := e.pool.Exec(ctx, "CREATE TABLE "+e.schema+".desired (key text PRIMARY KEY, value text NOT NULL);"+
		"CREATE TABLE "+e.schema+".actual (key text PRIMARY KEY, value text NOT NULL, last_fence bigint NOT NULL DEFAULT 0);"+
		"INSERT INTO "+e.schema+".desired VALUES ('a', '1'), ('b', '2'), ('c', '3'), ('d', '4');"+
		"INSERT INTO "+e.schema+".actual VALUES ('a', '1', 0), ('c', 'three', 0), ('d', '4', 0), ('x', '9', 0)"); err != nil {
		t.Fatal(err)
	}
	actual := fence.Table{Schema: e.schema, Name: "actual", Key: "key"}
	r, err := reconcile.New(reconcile.Config[string]{
		Name: "grants", Desired: e.tableLister("desired"), Actual: e.tableLister("actual"),
		Leases: e.leases, LeaseTTL: 5 * time.Second, Logger: quiet, Retry: fast,
		Repair: func(ctx context.Context, d reconcile.Drift[string]) error {
			lease, ok := fence.FromContext(ctx)
			if !ok {
				return errors.New("no lease in the repair's context")
			}
			return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				if err := lease.Check(ctx, tx); err != nil {
					return err
				}
				var err error
				switch d.Kind {
				case reconcile.Missing:
					_, err = tx.Exec(ctx, "INSERT INTO "+e.schema+".actual VALUES ($1, $2, $3)", d.Key, d.Desired, lease.Token())
				case reconcile.Extra:
					_, err = tx.Exec(ctx, "DELETE FROM "+e.schema+".actual WHERE key = $1", d.Key)
				case reconcile.Different:
					err = actual.UpdateFenced(ctx, tx, d.Key, lease.Token(), map[string]any{"value": d.Desired})
				}
				return err
			})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunOnce(ctx)
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	if rep.Missing != 1 || rep.Extra != 1 || rep.Different != 1 || rep.Repaired != 3 || rep.Token <= 0 {
		t.Errorf("report %+v", rep)
	}
	got, err := e.tableLister("actual")(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"a": "1", "b": "2", "c": "3", "d": "4"}; !maps.Equal(got, want) {
		t.Errorf("actual after the pass %v, want %v", got, want)
	}
	var fenceC int64
	if err := e.pool.QueryRow(ctx, "SELECT last_fence FROM "+e.schema+".actual WHERE key = 'c'").Scan(&fenceC); err != nil {
		t.Fatal(err)
	}
	if fenceC != rep.Token {
		t.Errorf("c written with token %d, want the pass's %d", fenceC, rep.Token)
	}

	again, err := r.RunOnce(ctx)
	if err != nil || again.Drifted() != 0 || again.Token <= rep.Token {
		t.Errorf("second pass: %+v, %v; want no drift and a greater token than %d", again, err, rep.Token)
	}
}

// While another replica holds the lease, a pass is skipped without listing anything.
func TestSkippedWhileHeld(t *testing.T) {
	t.Parallel()
	e := newPG(t)
	ctx := t.Context()
	other, err := e.store(t).Acquire(ctx, "sync", "other-replica", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Release(context.Background()) }()
	desired := newSide(wantDesired)
	r, err := reconcile.New(reconcile.Config[string]{
		Name: "sync", Desired: desired, Actual: newSide(nil), Leases: e.leases, Logger: quiet,
		Repair: func(context.Context, reconcile.Drift[string]) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunOnce(ctx)
	if err != nil || !rep.Skipped || desired.lists.Load() != 0 {
		t.Errorf("RunOnce while held: %+v, %v, %d listings", rep, err, desired.lists.Load())
	}
}

// A lease lost in the middle of a pass cancels the repair's context and stops the pass.
func TestLeaseLostMidPass(t *testing.T) {
	t.Parallel()
	e := newPG(t)
	ctx := t.Context()
	var thief *fence.Lease
	defer func() {
		if thief != nil {
			_ = thief.Release(context.Background())
		}
	}()
	r, err := reconcile.New(reconcile.Config[string]{
		Name: "sync", Desired: newSide(wantDesired), Actual: newSide(nil), Leases: e.leases,
		// A TTL of seconds: a loaded machine must not lose the lease on its own before
		// the first repair takes it over; the heartbeat (every TTL/3) notices the takeover.
		LeaseTTL: 3 * time.Second, Logger: quiet, Retry: fast,
		Repair: func(ctx context.Context, d reconcile.Drift[string]) error {
			if d.Key != "a" {
				t.Errorf("repair of %s after the lease was lost", d.Key)
				return nil
			}
			// Another replica takes the lease over (here by force).
			if _, err := e.pool.Exec(ctx, "UPDATE "+e.schema+".retrysafe_leases SET expires_at = clock_timestamp() WHERE name = 'sync'"); err != nil {
				return err
			}
			var err error
			if thief, err = e.store(t).Acquire(context.Background(), "sync", "thief", time.Minute); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(15 * time.Second):
				return errors.New("the repair's context was not cancelled")
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunOnce(ctx)
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("RunOnce: %v, want ErrLeaseLost", err)
	}
	if len(rep.Items) != 4 || rep.Items[0].Attempts != 1 || rep.Failed != 1 || rep.Items[1].Attempts != 0 {
		t.Errorf("report %+v; want the first repair tried once and the others not at all", rep)
	}
}

// Two replicas run the loop, each stopping and restarting now and then, so the lease
// changes hands; their repairs never overlap.
func TestReplicasNeverRepairConcurrently(t *testing.T) {
	t.Parallel()
	e := newPG(t)
	type tenure struct {
		replica    string
		token      int64
		start, end time.Time
	}
	var (
		mu       sync.Mutex
		repairs  []tenure
		active   atomic.Int64
		overlaps atomic.Int64
	)
	// A stopped replica stays down until another one has started a repair (it took the
	// lease over) or none runs: the handover is what the downtime is for. changed is
	// closed, and replaced, whenever started or running changes.
	var (
		stateMu sync.Mutex
		started = map[string]int{} // repairs started, by replica
		running = map[string]bool{}
		changed = make(chan struct{})
	)
	// notify and others are called with stateMu held.
	notify := func() { close(changed); changed = make(chan struct{}) }
	others := func(name string) (repairs int, up bool) {
		for r, n := range started {
			if r != name {
				repairs += n
			}
		}
		for r, ok := range running {
			up = up || r != name && ok
		}
		return repairs, up
	}
	down := func(name string, end time.Time) {
		stateMu.Lock()
		defer stateMu.Unlock()
		running[name] = false
		notify()
		from, _ := others(name)
		for {
			if n, up := others(name); n > from || !up {
				break
			}
			ch := changed
			stateMu.Unlock()
			select {
			case <-ch:
			case <-time.After(time.Until(end)):
			}
			stateMu.Lock()
			if !time.Now().Before(end) {
				break
			}
		}
		running[name] = true
		notify()
	}
	newReplica := func(name string) *reconcile.Reconciler[string] {
		r, err := reconcile.New(reconcile.Config[string]{
			Name: "sync", Holder: name, Desired: newSide(wantDesired), Actual: newSide(nil), // never repaired: every pass repairs 4 items
			Leases: e.store(t), LeaseTTL: 500 * time.Millisecond, Interval: 20 * time.Millisecond,
			Logger: quiet, Retry: fast,
			Repair: func(ctx context.Context, d reconcile.Drift[string]) error {
				if active.Add(1) > 1 {
					overlaps.Add(1)
				}
				defer active.Add(-1)
				stateMu.Lock()
				started[name]++
				notify()
				stateMu.Unlock()
				var token int64
				if lease, ok := fence.FromContext(ctx); ok {
					token = lease.Token()
				}
				start := time.Now()
				select {
				case <-ctx.Done():
				case <-time.After(3 * time.Millisecond):
				}
				mu.Lock()
				repairs = append(repairs, tenure{name, token, start, time.Now()})
				mu.Unlock()
				return context.Cause(ctx)
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	end := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	names := []string{"replica-a", "replica-b"}
	for _, name := range names {
		running[name] = true
	}
	for _, name := range names {
		r := newReplica(name)
		wg.Go(func() {
			for time.Now().Before(end) {
				ctx, cancel := context.WithTimeout(t.Context(), time.Duration(100+rand.IntN(200))*time.Millisecond)
				if err := r.Run(ctx); !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s: Run returned %v", name, err)
				}
				cancel()
				down(name, end)
			}
		})
	}
	wg.Wait()

	if n := overlaps.Load(); n > 0 {
		t.Errorf("%d repairs started while another ran", n)
	}
	slices.SortFunc(repairs, func(a, b tenure) int { return a.start.Compare(b.start) })
	replicas := map[string]bool{}
	handoffs := 0
	for i, r := range repairs {
		replicas[r.replica] = true
		if i == 0 {
			continue
		}
		prev := repairs[i-1]
		if r.start.Before(prev.end) {
			t.Errorf("repair by %s (token %d) started %s before the repair by %s (token %d) ended",
				r.replica, r.token, prev.end.Sub(r.start), prev.replica, prev.token)
		}
		if r.token < prev.token {
			t.Errorf("token went back from %d to %d", prev.token, r.token)
		}
		if r.token != prev.token {
			handoffs++
		}
	}
	t.Logf("%d repairs, %d lease changes", len(repairs), handoffs)
	if len(replicas) != 2 || handoffs == 0 {
		t.Errorf("repairs by %v with %d lease changes; want both replicas, taking turns", slices.Collect(maps.Keys(replicas)), handoffs)
	}
}
