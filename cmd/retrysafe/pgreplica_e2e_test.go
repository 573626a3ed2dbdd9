//go:build linux

package main

// End-to-end tests of the gateway on replicated PostgreSQL: disposable clusters of a
// primary and a standby (harness/pgcluster), which the tests lose and promote.

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/harness/pgcluster"
	"github.com/retrysafe/retrysafe/harness/testenv"
)

// clusterDSN is the gateway's store on every node of c (the primary first), in schema.
func clusterDSN(c *pgcluster.Cluster, schema string) string {
	return c.MultiHostURL(url.Values{"schema": {schema}})
}

// recordState returns the state of key's record on node ("in_progress", "done" or
// "missing"), or "down" when node does not answer.
func recordState(ctx context.Context, node *pgcluster.Node, schema, key string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var state string
	err := node.QueryRow(ctx, `SELECT coalesce((SELECT state FROM `+pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()+
		` WHERE key = $1), 'missing')`, []any{[]byte(key)}, &state)
	if err != nil {
		return "down"
	}
	return state
}

// storeCalls returns how many store calls of operation op the gateway has made (and
// finished), from its /metrics.
func storeCalls(t *testing.T, gw *proc, op string) int {
	t.Helper()
	res, err := http.Get(gw.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	prefix := `retrysafe_gateway_store_duration_seconds_count{operation="` + op + `"} `
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return n
		}
	}
	return 0
}

// TestE2EPostgresSyncStandbyThenPrimaryLost: the synchronous standby is lost while the
// upstream works on a request, and the primary after the completion committed on it
// alone (the completion's wait for the standby cancelled at the store timeout); then the
// standby, which has the claim but not the completion, is promoted. The gateway must
// not take the completion as stored — neither from the primary's answer nor by reading
// the record back from it — but hold the answer and write it again until a server
// acknowledges it: on the promoted standby. The retry is a replay: one execution.
func TestE2EPostgresSyncStandbyThenPrimaryLost(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{Standbys: 1, Sync: true})
	standby := c.Standbys[0]
	const schema = "e2e_sync"
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", clusterDSN(c, schema), "--upstream", up.URL)

	k := testenv.Name("sync")
	first := make(chan reply, 1)
	go func() { first <- post(ctx, gw.addr, "/held-once", k, `{"amount":1}`) }()
	await(t, "the request upstream", 10*time.Second, up.arrived(k))
	if err := standby.Stop(ctx); err != nil { // the synchronous standby lost, with the claim
		t.Fatal(err)
	}
	up.release(k)
	answer := <-first
	if answer.status != 201 {
		t.Fatalf("the first answer: %v", answer)
	}
	// The completion's commit waits for the lost standby until the store timeout cancels
	// the wait: it is then committed on the primary alone. The gateway's next completion
	// call (the answer held and sent again) runs on the primary too, before it is lost.
	waitFor(t, "the completion committed on the primary alone", 30*time.Second, func() bool {
		return recordState(ctx, c.Primary, schema, k) == "done"
	})
	waitFor(t, "the gateway's second completion call", 30*time.Second, func() bool { return storeCalls(t, gw, "complete") >= 2 })
	if err := c.Primary.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := recordState(ctx, standby, schema, k); got != "in_progress" {
		t.Fatalf("the standby has the key %s, want in_progress (the claim, not the completion)", got)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the held answer stored on the promoted standby", 30*time.Second, func() bool {
		return recordState(ctx, standby, schema, k) == "done"
	})
	r := post(ctx, gw.addr, "/held-once", k, `{"amount":1}`)
	if r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" || r.body != answer.body {
		t.Errorf("the retry after the failover: %v, want the first answer replayed (%s)", r, answer.body)
	}
	if n := up.callsFor(k); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

// TestE2EPostgresFailover: a gateway on every node of a cluster, its DSN naming them
// all (target_session_attrs=read-write), serves through the loss of the primary and the
// promotion of its synchronous standby: the first requests after the promotion are
// served, although the gateway's pooled connections to the lost primary are broken and
// pgxpool hands out without a ping those used in the last second (each store call whose
// connection broke runs once more on a fresh one), and the keys completed before are
// replayed, not run again.
func TestE2EPostgresFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{Standbys: 1, Sync: true})
	const schema = "e2e_failover"
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", clusterDSN(c, schema), "--upstream", up.URL)
	var before []string
	for range 5 {
		k := testenv.Name("before")
		if r := post(ctx, gw.addr, "/pay", k, `{}`); r.status != 201 {
			t.Fatalf("before the failover: %v", r)
		}
		before = append(before, k)
	}
	if err := c.Primary.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Standbys[0].Promote(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if r := post(ctx, gw.addr, "/pay", testenv.Name("after"), `{}`); r.status != 201 {
			t.Errorf("request %d after the promotion: %v", i+1, r)
		}
	}
	for _, k := range before {
		r := post(ctx, gw.addr, "/pay", k, `{}`)
		if r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" || up.callsFor(k) != 1 {
			t.Errorf("a key completed before the failover, retried after it: %v, %d executions", r, up.callsFor(k))
		}
	}
}

// TestE2EPostgresAsyncFailover: with an asynchronous standby, a failover may lose the
// last writes the primary acknowledged: their keys run again. That is the documented
// window of asynchronous replication, and the only one: a key completed before the
// standby fell behind is replayed after the failover, and only the key completed while
// it lagged (its link cut) runs a second time.
func TestE2EPostgresAsyncFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{Standbys: 1})
	standby := c.Standbys[0]
	const schema = "e2e_async"
	up := newUpstream(t)
	gw := startGateway(t, nil, "--store", clusterDSN(c, schema), "--upstream", up.URL)
	replicated, lagged := testenv.Name("replicated"), testenv.Name("lagged")
	if r := post(ctx, gw.addr, "/pay", replicated, `{}`); r.status != 201 {
		t.Fatal(r)
	}
	if err := c.AwaitReplayed(ctx, standby); err != nil {
		t.Fatal(err)
	}
	standby.Link().Cut() // the standby falls behind; the primary does not wait for it
	if r := post(ctx, gw.addr, "/pay", lagged, `{}`); r.status != 201 {
		t.Fatal(r)
	}
	if err := c.Primary.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if r := post(ctx, gw.addr, "/pay", replicated, `{}`); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" ||
		up.callsFor(replicated) != 1 {
		t.Errorf("the key replicated before the failover: %v, %d executions; want a replay", r, up.callsFor(replicated))
	}
	r := post(ctx, gw.addr, "/pay", lagged, `{}`)
	if r.status != 201 || up.callsFor(lagged) != 2 {
		t.Fatalf("the key acknowledged while the standby lagged: %v, %d executions; want run again (2)", r, up.callsFor(lagged))
	}
	t.Logf("the documented window of asynchronous replication: the key acknowledged while the standby lagged ran twice")
}

// TestE2EPostgresLeastPrivilege: once the schema's owner ran retrysafe migrate, the
// gateway starts and serves as a role that has only USAGE on the schema, SELECT,
// INSERT, UPDATE and DELETE on the table and USAGE on the sequence — no CREATE on the
// database. Before that, it refuses to start with one line that says to run retrysafe
// migrate.
func TestE2EPostgresLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	admin, err := pgx.Connect(ctx, testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	schema := testenv.Schema(t, "e2e")
	role := testenv.Name("gw")
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), testenv.PostgresURL(t))
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = conn.Exec(context.Background(), "DROP ROLE "+role)
	})
	dsnAs := func(user string) string {
		u, err := url.Parse(testenv.PostgresURL(t))
		if err != nil {
			t.Fatal(err)
		}
		if user != "" {
			u.User = url.User(user)
		}
		q := u.Query()
		q.Set("schema", schema)
		u.RawQuery = q.Encode()
		return u.String()
	}
	up := newUpstream(t)

	out, code := runBinary(t, "gateway", "--store", dsnAs(role), "--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin", "off")
	if code != 2 || strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, "retrysafe migrate") {
		t.Fatalf("the gateway as the serving role before the schema exists: exit %d, %q; want 2 and one line naming retrysafe migrate", code, out)
	}
	if out, code := runBinary(t, "migrate", "--store", dsnAs("")); code != 0 {
		t.Fatalf("retrysafe migrate as the owner: %d %s", code, out)
	}
	for _, grant := range []string{
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + schema + ".retrysafe_idempotency TO " + role,
		"GRANT USAGE ON SEQUENCE " + schema + ".retrysafe_idempotency_token_seq TO " + role,
	} {
		if _, err := admin.Exec(ctx, grant); err != nil {
			t.Fatal(err)
		}
	}
	gw := startGateway(t, nil, "--store", dsnAs(role), "--upstream", up.URL)
	k := testenv.Name("least")
	if r := post(ctx, gw.addr, "/pay", k, `{}`); r.status != 201 {
		t.Fatalf("as the serving role: %v", r)
	}
	if r := post(ctx, gw.addr, "/pay", k, `{}`); r.header.Get("Idempotent-Replayed") != "true" || up.callsFor(k) != 1 {
		t.Errorf("the retry as the serving role: %v, %d executions", r, up.callsFor(k))
	}
	res, err := http.Get(gw.admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("/readyz as the serving role: %d", res.StatusCode)
	}
}
