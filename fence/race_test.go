package fence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/retrysafe/fence"
	"github.com/retrysafe/retrysafe/harness/testenv"
)

// 50 goroutines compete for one lease (RETRYSAFE_LONG=1: for 20 s, else 5 s). Each
// holder records its tenure [acquired, released) by the database's clock, with its
// token, in a table whose exclusion constraint refuses two overlapping tenures; the
// tokens must increase with time. Holders release after a short while, some hold for
// more than a TTL (the heartbeat renews), and some crash (never release: the next
// holder waits for the expiry).
func TestCompetingHolders(t *testing.T) {
	t.Parallel()
	const (
		goroutines = 50
		ttl        = 500 * time.Millisecond
	)
	pool, schema := newEnv(t, 10)
	st := newStore(t, pool, schema, fence.Config{})
	// Crashing holders do not renew, so that their tenure ends exactly at the expiry
	// they know of.
	crashing := sameTable(t, pool, schema, fence.Config{ManualRenew: true})
	tenures := schema + ".tenures"
	if _, err := pool.Exec(t.Context(), `CREATE TABLE `+tenures+` (
		token  bigint    PRIMARY KEY,
		holder text      NOT NULL,
		during tstzrange NOT NULL,
		EXCLUDE USING gist (during WITH &&))`); err != nil {
		t.Fatal(err)
	}
	record := func(l *fence.Lease) error {
		_, err := pool.Exec(context.Background(), "INSERT INTO "+tenures+" VALUES ($1, $2, tstzrange($3, $4, '[)'))",
			l.Token(), l.Holder(), l.Acquired(), l.Expires())
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23P01" { // exclusion_violation
			return fmt.Errorf("tenure of token %d [%s, %s) overlaps another: %w", l.Token(),
				l.Acquired().Format(time.RFC3339Nano), l.Expires().Format(time.RFC3339Nano), err)
		}
		return err
	}

	// The holders compete for contention(), and on until minAcquisitions leases were
	// taken, which a busy machine may not reach in that time (two minutes more at most).
	const minAcquisitions = 20
	end := time.Now().Add(contention())
	giveUp := end.Add(2 * time.Minute)
	var acquisitions, crashes, long, lost, held atomic.Int64
	compete := func() bool {
		now := time.Now()
		return now.Before(end) || acquisitions.Load() < minAcquisitions && now.Before(giveUp)
	}
	var crashedMu sync.Mutex
	var crashed []*fence.Lease // never released: the test waits for their Contexts to end
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			holder := fmt.Sprintf("g%02d", g)
			for compete() {
				crash := rand.IntN(20) == 0
				store := st
				if crash {
					store = crashing
				}
				l, err := store.Acquire(t.Context(), "the-lease", holder, ttl)
				if errors.Is(err, fence.ErrHeld) {
					held.Add(1)
					// A contender asks again after a while, as a real one polls: the lease
					// is freed in the database, by a release or by its clock passing the
					// expiry, and nothing tells the contenders.
					time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
					continue
				}
				if err != nil {
					t.Errorf("%s: Acquire: %v", holder, err)
					return
				}
				acquisitions.Add(1)
				// The holder's work: up to a few milliseconds, or, now and then, more
				// than a TTL. The database's clock decides expiry, so a holder holds for
				// real time for the heartbeat (or its absence) to matter.
				hold := time.Duration(rand.IntN(3000)) * time.Microsecond
				switch {
				case crash:
					crashes.Add(1) // never released; its Context ends after the TTL
					crashedMu.Lock()
					crashed = append(crashed, l)
					crashedMu.Unlock()
					hold = 0
				case rand.IntN(25) == 0:
					long.Add(1)
					hold = ttl + ttl/2 // the heartbeat keeps it
				}
				time.Sleep(hold)
				if !crash {
					// A holder may lose its lease (here when the pool is too busy for its
					// renewals): allowed, and the tenure it records ends at its expiry.
					switch err := l.Release(context.Background()); {
					case errors.Is(err, fence.ErrLeaseLost):
						lost.Add(1)
					case err != nil:
						t.Errorf("%s: Release token %d: %v", holder, l.Token(), err)
					}
				}
				if err := record(l); err != nil {
					t.Errorf("%s: %v", holder, err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d acquisitions (%d crashed, %d held past the TTL, %d lost before release), %d ErrHeld",
		acquisitions.Load(), crashes.Load(), long.Load(), lost.Load(), held.Load())
	if acquisitions.Load() < minAcquisitions {
		t.Errorf("only %d acquisitions", acquisitions.Load())
	}

	rows, err := pool.Query(t.Context(), "SELECT token FROM "+tenures+" ORDER BY lower(during)")
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(tokens)) != acquisitions.Load() {
		t.Errorf("%d tenures recorded, want %d", len(tokens), acquisitions.Load())
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Errorf("tenure %d has token %d, not greater than the previous tenure's %d", i, tokens[i], tokens[i-1])
		}
	}
	var last int64
	if err := pool.QueryRow(t.Context(), "SELECT token FROM "+schema+".retrysafe_leases WHERE name = 'the-lease'").Scan(&last); err != nil {
		t.Fatal(err)
	}
	if len(tokens) > 0 && last != slices.Max(tokens) {
		t.Errorf("the lease row's token %d is not the greatest issued, %d", last, slices.Max(tokens))
	}
	// The crashed holders' heartbeats end at their local deadline, a TTL after their
	// acquisition: goleak must not find them.
	for _, l := range crashed {
		waitDone(t, l.Context(), ttl+10*time.Second)
	}
}

// The classic pause: A acquires, stalls past its TTL, B acquires (a greater token) and
// writes; A wakes and writes. Both of A's conditional writes (by the lease row, and by
// the row's last token) are rejected and B's data is intact.
func TestClassicPause(t *testing.T) {
	t.Parallel()
	pool, schema := newEnv(t, 4)
	paused := newStore(t, pool, schema, fence.Config{ManualRenew: true}) // A stalls: no heartbeat
	st := sameTable(t, pool, schema, fence.Config{})
	ctx := t.Context()
	data := fence.Table{Schema: schema, Name: "data"}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+`.data (
		id text PRIMARY KEY, owner text NOT NULL, last_fence bigint NOT NULL DEFAULT 0);
		INSERT INTO `+schema+".data (id, owner) VALUES ('x', 'nobody')"); err != nil {
		t.Fatal(err)
	}
	// write is the holders' business write: both checks, then the data.
	write := func(l *fence.Lease, byLease, byRow bool) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if byLease {
				if err := l.Check(ctx, tx); err != nil {
					return err
				}
			}
			if byRow {
				return data.UpdateFenced(ctx, tx, "x", l.Token(), map[string]any{"owner": l.Holder()})
			}
			_, err := tx.Exec(ctx, "UPDATE "+schema+".data SET owner = $1 WHERE id = 'x'", l.Holder())
			return err
		})
	}

	a, err := paused.Acquire(ctx, "job", "A", 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	release(t, a)
	waitExpired(t, pool, a) // A stalls past its TTL
	b, err := st.Acquire(ctx, "job", "B", time.Minute)
	if err != nil {
		t.Fatalf("B's Acquire after A's expiry: %v", err)
	}
	release(t, b)
	if b.Token() <= a.Token() {
		t.Fatalf("B's token %d is not greater than A's %d", b.Token(), a.Token())
	}
	if err := write(b, true, true); err != nil {
		t.Fatalf("B's write: %v", err)
	}

	// A wakes up and writes, checking the lease, the row's token, or both.
	for _, tc := range []struct {
		name           string
		byLease, byRow bool
	}{{"lease row", true, false}, {"last token", false, true}, {"both", true, true}} {
		if err := write(a, tc.byLease, tc.byRow); !errors.Is(err, fence.ErrStaleToken) {
			t.Errorf("A's write checked by %s: %v, want ErrStaleToken", tc.name, err)
		}
	}
	var owner string
	var lastFence int64
	if err := pool.QueryRow(ctx, "SELECT owner, last_fence FROM "+schema+".data WHERE id = 'x'").Scan(&owner, &lastFence); err != nil {
		t.Fatal(err)
	}
	if owner != "B" || lastFence != b.Token() {
		t.Errorf("data: owner %q, last_fence %d; want B's write (token %d)", owner, lastFence, b.Token())
	}
	if err := a.Renew(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("A's Renew: %v, want ErrLeaseLost", err)
	}
	if err := a.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("A's Release: %v, want ErrLeaseLost", err)
	}
	if err := b.Release(ctx); err != nil {
		t.Errorf("B's Release: %v", err)
	}
}

// Check's FOR SHARE lock holds a takeover back until the checking transaction ends, so a
// write made after a successful Check never interleaves with the next holder's, even
// when the transaction outlives the lease.
func TestCheckHoldsTakeover(t *testing.T) {
	t.Parallel()
	pool, schema := newEnv(t, 4)
	paused := newStore(t, pool, schema, fence.Config{ManualRenew: true})
	st := sameTable(t, pool, schema, fence.Config{})
	ctx := t.Context()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".log (holder text, at timestamptz)"); err != nil {
		t.Fatal(err)
	}
	// A's Check must come before the expiry: a TTL of seconds for a loaded machine.
	const ttl = 2 * time.Second
	a, err := paused.Acquire(ctx, "job", "A", ttl)
	if err != nil {
		t.Fatal(err)
	}
	release(t, a)

	var b *fence.Lease
	var bErr error
	acquired := make(chan struct{})
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := a.Check(ctx, tx); err != nil {
			return err
		}
		waitExpired(t, pool, a) // the lease expires while the transaction runs
		go func() {
			defer close(acquired)
			b, bErr = st.Acquire(ctx, "job", "B", time.Minute) // waits for A's row lock
		}()
		// A writes only once B's takeover waits for A's lock, as the database reports.
		testenv.Eventually(t, 10*time.Second, func() bool {
			var waiting int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, schema).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			return waiting > 0
		}, "B's Acquire to wait for A's lock")
		_, err := tx.Exec(ctx, "INSERT INTO "+schema+".log VALUES ('A', clock_timestamp())")
		return err
	})
	if err != nil {
		t.Fatalf("A's transaction: %v", err)
	}
	<-acquired
	if bErr != nil {
		t.Fatalf("B's Acquire: %v", bErr)
	}
	release(t, b)
	var aWrote time.Time
	if err := pool.QueryRow(ctx, "SELECT at FROM "+schema+".log WHERE holder = 'A'").Scan(&aWrote); err != nil {
		t.Fatal(err)
	}
	if !b.Acquired().After(aWrote) {
		t.Errorf("B acquired at %s, not after A's write at %s", b.Acquired(), aWrote)
	}
	if b.Token() <= a.Token() {
		t.Errorf("B's token %d is not greater than A's %d", b.Token(), a.Token())
	}
}

// 20 writers update one row by compare-and-swap, each appending its id to an array and
// logging the accepted update in the same transaction. Each retries on ErrConflict
// until accepted: every update is applied exactly once, and none is lost.
func TestConcurrentCAS(t *testing.T) {
	t.Parallel()
	const writers = 20
	pool, schema := newEnv(t, 10)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema+"; CREATE TABLE "+schema+`.counter (
		id int PRIMARY KEY, ids int[] NOT NULL DEFAULT '{}', version bigint NOT NULL DEFAULT 0);
		INSERT INTO `+schema+`.counter (id) VALUES (1);
		CREATE TABLE `+schema+".applied (writer int, version bigint)"); err != nil {
		t.Fatal(err)
	}
	counter := fence.Table{Schema: schema, Name: "counter"}
	var conflicts, attempts atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			<-start
			for {
				attempts.Add(1)
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var ids []int32
					var version int64
					if err := tx.QueryRow(ctx, "SELECT ids, version FROM "+schema+".counter WHERE id = 1").Scan(&ids, &version); err != nil {
						return err
					}
					next, err := counter.UpdateVersioned(ctx, tx, 1, version, map[string]any{"ids": append(ids, int32(w))})
					if err != nil {
						return err
					}
					_, err = tx.Exec(ctx, "INSERT INTO "+schema+".applied VALUES ($1, $2)", w, next)
					return err
				})
				switch {
				case err == nil:
					return
				case errors.Is(err, fence.ErrConflict):
					conflicts.Add(1)
				default:
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	t.Logf("%d attempts, %d conflicts", attempts.Load(), conflicts.Load())
	if attempts.Load() != writers+conflicts.Load() {
		t.Errorf("%d attempts, want %d accepted + %d conflicts", attempts.Load(), writers, conflicts.Load())
	}

	var ids []int32
	var version int64
	if err := pool.QueryRow(ctx, "SELECT ids, version FROM "+schema+".counter WHERE id = 1").Scan(&ids, &version); err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	want := make([]int32, writers)
	for i := range want {
		want[i] = int32(i)
	}
	if !slices.Equal(ids, want) {
		t.Errorf("ids %v, want each writer once: %v", ids, want)
	}
	if version != writers {
		t.Errorf("version %d, want %d", version, writers)
	}
	rows, err := pool.Query(ctx, "SELECT version FROM "+schema+".applied ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range versions {
		if v != int64(i+1) {
			t.Fatalf("accepted versions %v, want 1…%d once each", versions, writers)
		}
	}
	if len(versions) != writers {
		t.Errorf("%d accepted updates logged, want %d", len(versions), writers)
	}
}
