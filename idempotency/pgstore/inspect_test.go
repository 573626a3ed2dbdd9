package pgstore_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/harness/pgcluster"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/idempotencytest"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

// inspect returns what Inspect finds through a pool on rawURL.
func inspect(t *testing.T, rawURL string) []idempotency.Finding {
	t.Helper()
	st, err := pgstore.New(pgstore.Config{Pool: newPool(t, rawURL, nil)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	found, err := st.Inspect(ctx)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return found
}

// want is a finding expected among others: its level and check, and words its setting
// and its detail hold.
type want = idempotencytest.WantFinding

// withUser returns rawURL with user and the query parameters of params added.
func withUser(t *testing.T, rawURL, user string, params ...string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		u.User = url.User(user)
	}
	q := u.Query()
	for i := 0; i+1 < len(params); i += 2 {
		q.Set(params[i], params[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// createRole creates a login role with no privilege beyond connecting, dropped at the
// end of the test, and returns its name.
func createRole(t *testing.T, exec func(ctx context.Context, sql string) error) string {
	t.Helper()
	role := testenv.Name("rs_role")
	if err := exec(t.Context(), "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := exec(ctx, "DROP ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
			t.Errorf("dropping role %s: %v", role, err)
		}
	})
	return role
}

// TestInspectSingleServer: the shared server, a primary without standbys, with fsync and
// synchronous_commit on, keeps the promise as long as its disk survives; a role whose
// sessions have synchronous_commit=off is warned; a role without pg_read_all_stats gets
// the same findings, no error, and is told what it would not see.
func TestInspectSingleServer(t *testing.T) {
	t.Parallel()
	base := testenv.PostgresURL(t)
	var fsync, syncCommit, names string
	admin := newPool(t, base, nil)
	if err := admin.QueryRow(t.Context(), `SELECT current_setting('fsync'), current_setting('synchronous_commit'),
		current_setting('synchronous_standby_names')`).Scan(&fsync, &syncCommit, &names); err != nil {
		t.Fatal(err)
	}
	if fsync != "on" || syncCommit != "on" || names != "" {
		t.Skipf("the shared server is not a plain primary (fsync=%s synchronous_commit=%s synchronous_standby_names=%q)", fsync, syncCommit, names)
	}
	idempotencytest.CheckFindings(t, "superuser", inspect(t, base),
		want{Level: idempotency.FindingOK, Check: pgstore.CheckRecovery, Setting: "=false", Detail: "primary"},
		want{Level: idempotency.FindingOK, Check: pgstore.CheckFsync, Setting: "fsync=on", Detail: "flushed"},
		want{Level: idempotency.FindingOK, Check: pgstore.CheckSynchronousCommit, Setting: "synchronous_commit=on", Detail: "flushed on this server"},
		want{Level: idempotency.FindingOK, Check: pgstore.CheckStandby, Setting: "no standby", Detail: "as long as its disk does"})

	exec := func(ctx context.Context, sql string) error { _, err := admin.Exec(ctx, sql); return err }
	role := createRole(t, exec)
	if err := exec(t.Context(), "ALTER ROLE "+pgx.Identifier{role}.Sanitize()+" SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	idempotencytest.CheckFindings(t, "least-privilege role", inspect(t, withUser(t, base, role)),
		want{Level: idempotency.FindingOK, Check: pgstore.CheckRecovery, Setting: "=false", Detail: "primary"},
		want{Level: idempotency.FindingOK, Check: pgstore.CheckFsync, Setting: "fsync=on", Detail: "flushed"},
		want{Level: idempotency.FindingWarn, Check: pgstore.CheckSynchronousCommit, Setting: "synchronous_commit=off", Detail: "crash of the server can lose the last acknowledged keys"},
		want{Level: idempotency.FindingOK, Check: pgstore.CheckStandby, Setting: "no standby", Detail: "as long as its disk does"},
		want{Level: idempotency.FindingOK, Check: pgstore.CheckPrivileges, Setting: role, Detail: "GRANT pg_read_all_stats"})
}

// TestInspectReplicated: on a primary with two standbys, each setting of
// synchronous_standby_names and synchronous_commit is reported with what a failover
// can lose; a synchronous standby named and not connected makes commits wait; a role
// without pg_read_all_stats is told that it cannot see the standbys' sync_state, and
// sees it once granted; the standby itself is refused.
func TestInspectReplicated(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{Standbys: 2, Sync: true})
	primary, s1 := c.Primary, c.Standbys[0]
	base := primary.URL()
	fsyncOff := want{Level: idempotency.FindingWarn, Check: pgstore.CheckFsync, Setting: "fsync=off", Detail: "OS crash or power loss can lose acknowledged keys"}
	// names sets synchronous_standby_names and waits until the primary reports each
	// standby in the sync_state given.
	names := func(value, state1, state2 string) {
		t.Helper()
		if err := primary.Set(ctx, "synchronous_standby_names", value); err != nil {
			t.Fatal(err)
		}
		for i, state := range []string{state1, state2} {
			if err := c.AwaitStreaming(ctx, c.Standbys[i], state); err != nil {
				t.Fatal(err)
			}
		}
	}

	idempotencytest.CheckFindings(t, "FIRST 1 (standby1)", inspect(t, base), fsyncOff,
		want{Level: idempotency.FindingOK, Check: pgstore.CheckStandby, Setting: "standby standby1 (127.0.0.1): sync_state=sync", Detail: "loses no completed key"},
		want{Level: idempotency.FindingWarn, Check: pgstore.CheckStandby, Setting: "standby standby2 (127.0.0.1): sync_state=async", Detail: "asynchronous standby standby2: a failover to it can lose the last completed keys; they would run again"},
		want{Level: idempotency.FindingOK, Check: pgstore.CheckSynchronousCommit, Setting: "synchronous_commit=on", Detail: "once the synchronous standbys have flushed it"})
	idempotencytest.CheckFindings(t, "synchronous_commit=local", inspect(t, withUser(t, base, "", "synchronous_commit", "local")), fsyncOff,
		want{Level: idempotency.FindingWarn, Check: pgstore.CheckSynchronousCommit, Setting: "synchronous_commit=local", Detail: "do not wait for the synchronous standbys"},
		want{Level: idempotency.FindingWarn, Check: pgstore.CheckStandby, Setting: "standby2", Detail: "asynchronous"})

	// A role without pg_read_all_stats sees the standbys' names, not their addresses or
	// sync_state.
	exec := func(ctx context.Context, sql string) error { return primary.Exec(ctx, sql) }
	role := createRole(t, exec)
	idempotencytest.CheckFindings(t, "least-privilege role", inspect(t, withUser(t, base, role)), fsyncOff,
		want{Level: idempotency.FindingWarn, Check: pgstore.CheckStandby, Setting: "standby standby1: sync_state hidden from role " + role, Detail: "cannot tell"},
		want{Level: idempotency.FindingWarn, Check: pgstore.CheckStandby, Setting: "standby standby2: sync_state hidden", Detail: "cannot tell"},
		want{Level: idempotency.FindingWarn, Check: pgstore.CheckPrivileges, Setting: "role " + role + ": no pg_read_all_stats", Detail: "cannot see the sync_state of the 2 standby(s) connected: GRANT pg_read_all_stats (or pg_monitor) TO \"" + role + `"`})
	if err := exec(ctx, "GRANT pg_read_all_stats TO "+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	idempotencytest.CheckFindings(t, "role granted pg_read_all_stats", inspect(t, withUser(t, base, role)), fsyncOff,
		want{Level: idempotency.FindingOK, Check: pgstore.CheckStandby, Setting: "standby1 (127.0.0.1): sync_state=sync", Detail: "loses no completed key"},
		want{Level: idempotency.FindingWarn, Check: pgstore.CheckStandby, Setting: "standby2 (127.0.0.1): sync_state=async", Detail: "can lose the last completed keys"})

	names("ANY 1 (standby1, standby2)", "quorum", "quorum")
	idempotencytest.CheckFindings(t, "ANY 1", inspect(t, base), fsyncOff,
		want{Level: idempotency.FindingOK, Check: pgstore.CheckStandby, Setting: "standby1 (127.0.0.1): sync_state=quorum", Detail: "on 1 of the quorum's standbys"},
		want{Level: idempotency.FindingOK, Check: pgstore.CheckStandby, Setting: "standby2 (127.0.0.1): sync_state=quorum", Detail: "fail over to the most advanced"})

	names("FIRST 1 (standby1, standby2)", "sync", "potential")
	idempotencytest.CheckFindings(t, "FIRST 1 of two", inspect(t, base), fsyncOff,
		want{Level: idempotency.FindingOK, Check: pgstore.CheckStandby, Setting: "standby1 (127.0.0.1): sync_state=sync", Detail: "loses no completed key"},
		want{Level: idempotency.FindingOK, Check: pgstore.CheckStandby, Setting: "standby2 (127.0.0.1): sync_state=potential", Detail: "not to it"})

	// A named standby that is not connected: with another to confirm commits nothing
	// waits; as the second of two needed, every commit waits.
	names(`FIRST 1 (standby1, "Ghost")`, "sync", "async")
	idempotencytest.CheckFindings(t, "FIRST 1 with a ghost", inspect(t, base), fsyncOff,
		want{Level: idempotency.FindingWarn, Check: pgstore.CheckStandby, Setting: "standby2", Detail: "asynchronous"},
		want{Level: idempotency.FindingOK, Check: pgstore.CheckStandby, Setting: "synchronous standby Ghost not connected", Detail: "the 1 connected synchronous standby(s) acknowledge commits meanwhile"})
	names(`FIRST 2 (standby1, "Ghost")`, "sync", "async")
	idempotencytest.CheckFindings(t, "FIRST 2 with a ghost", inspect(t, base), fsyncOff,
		want{Level: idempotency.FindingWarn, Check: pgstore.CheckStandby, Setting: "standby2", Detail: "asynchronous"},
		want{Level: idempotency.FindingWarn, Check: pgstore.CheckStandby, Setting: `synchronous standby Ghost not connected, synchronous_standby_names='FIRST 2 (standby1, "Ghost")'`, Detail: "1 of the 2 synchronous standbys a commit needs are connected: every commit waits, so keyed requests are refused (503 store-not-durable)"})

	names("", "async", "async")
	idempotencytest.CheckFindings(t, "asynchronous", inspect(t, base), fsyncOff,
		want{Level: idempotency.FindingWarn, Check: pgstore.CheckStandby, Setting: "standby standby1 (127.0.0.1): sync_state=async", Detail: "asynchronous standby standby1: a failover to it can lose the last completed keys; they would run again"},
		want{Level: idempotency.FindingWarn, Check: pgstore.CheckStandby, Setting: "standby standby2 (127.0.0.1): sync_state=async", Detail: "can lose the last completed keys"})

	// The standby itself takes no writes.
	idempotencytest.CheckFindings(t, "a standby", inspect(t, s1.URL()), fsyncOff,
		want{Level: idempotency.FindingRefuse, Check: pgstore.CheckRecovery, Setting: "pg_is_in_recovery()=true", Detail: "the server is a standby and takes no writes"},
		want{Level: idempotency.FindingOK, Check: pgstore.CheckStandby, Setting: "no standby", Detail: "as long as its disk does"})
}
