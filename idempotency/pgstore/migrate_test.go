package pgstore_test

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/pgstore"
)

//go:embed testdata/schema_v1.sql
var schemaV1 string

// Deployments whose table keeps response headers in jsonb, with live records in it:
// Migrate adds the new columns in place, the store reads the records written before
// (headers from the jsonb column), writes new ones byte for byte, and a store of the
// previous schema still reads the new records' status and body.
func TestMigrateFromJSONBHeader(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := newPool(t, testenv.PostgresURL(t), nil)
	st, schema := unmigrated(t, pool)
	table := pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()
	seq := pgx.Identifier{schema, "retrysafe_idempotency_token_seq"}.Sanitize()
	ddl := strings.NewReplacer("{schema}", pgx.Identifier{schema}.Sanitize(), "{table}", table, "{sequence}", seq,
		"{index}", pgx.Identifier{"retrysafe_idempotency_expires_at_idx"}.Sanitize()).Replace(schemaV1)
	if _, err := pool.Exec(ctx, ddl); err != nil {
		t.Fatalf("previous schema: %v", err)
	}
	// Records as the previous store wrote them: done with a header, done without one,
	// and one in progress.
	oldHeader := http.Header{"Content-Type": {"application/json"}, "Link": {"</a>; rel=a", "</b>; rel=b"}}
	oldJSON, err := json.Marshal(oldHeader)
	if err != nil {
		t.Fatal(err)
	}
	insert := `INSERT INTO ` + table + ` (scope, key, fingerprint, state, token, created_at, lease_until, expires_at,
		completed_at, status, header, body) VALUES ('\x73', $1, '\x6670', $2, nextval('` + seq + `'), now(), now() + $3::interval,
		now() + interval '1 hour', CASE WHEN $2 = 'done' THEN now() END, $4, $5, $6) RETURNING token`
	var inProgress int64
	for _, r := range []struct {
		key, state string
		lease      time.Duration
		status     *int
		header     []byte
		body       []byte
	}{
		{"old-done", "done", 0, ptr(201), oldJSON, []byte("old body")},
		{"old-bare", "done", 0, ptr(204), nil, nil},
		{"old-busy", "in_progress", time.Hour, nil, nil, nil},
	} {
		var tok int64
		if err := pool.QueryRow(ctx, insert, []byte(r.key), r.state, r.lease, r.status, r.header, r.body).Scan(&tok); err != nil {
			t.Fatalf("old record %s: %v", r.key, err)
		}
		if r.key == "old-busy" {
			inProgress = tok
		}
	}

	for range 2 { // idempotent
		if err := st.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	var columns []string
	rows, err := pool.Query(ctx, `SELECT column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '-')
		FROM information_schema.columns WHERE table_schema = $1 AND column_name IN ('header', 'headers', 'abandoned', 'route', 'claim_id')
		ORDER BY column_name`, schema)
	if err != nil {
		t.Fatal(err)
	}
	if columns, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if want := []string{"abandoned boolean NO false", "claim_id text YES -", "header jsonb YES -", "headers bytea YES -", "route text YES -"}; !reflect.DeepEqual(columns, want) {
		t.Errorf("columns after Migrate = %q, want %q", columns, want)
	}

	// The old records read as they were written.
	rec, err := st.Get(ctx, "s", "old-done")
	if err != nil {
		t.Fatal(err)
	}
	want := &idempotency.Response{Status: 201, Header: oldHeader, Body: []byte("old body")}
	if rec.State != idempotency.StateDone || rec.Abandoned || rec.Route != "" || !reflect.DeepEqual(rec.Response, want) {
		t.Errorf("old done record = %+v, response %+v; want %+v", rec, rec.Response, want)
	}
	replay, err := st.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: "old-done", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || replay.Claimed || !reflect.DeepEqual(replay.Existing.Response, want) {
		t.Errorf("replay of an old record = %+v, %v; want %+v", replay, err, want)
	}
	if rec, err := st.Get(ctx, "s", "old-bare"); err != nil || rec.Response == nil || rec.Response.Status != 204 || rec.Response.Header != nil {
		t.Errorf("old record without a header = %+v, %v", rec, err)
	}

	// The old in-progress record's owner abandons or completes it through the store;
	// the completion is kept byte for byte.
	if err := st.Abandon(ctx, "s", "old-busy", inProgress); err != nil {
		t.Fatalf("Abandon of an old record: %v", err)
	}
	newResp := idempotency.Response{Status: 201, Header: http.Header{"X-Raw": {"caf\xe9"}}, Trailer: http.Header{"X-Sum": {"1"}},
		Body: []byte("new body")}
	if err := st.Complete(ctx, idempotency.Completion{Scope: "s", Key: "old-busy", Token: inProgress, Response: newResp, TTL: time.Hour}); err != nil {
		t.Fatalf("Complete of an old record: %v", err)
	}
	if rec, err := st.Get(ctx, "s", "old-busy"); err != nil || !reflect.DeepEqual(*rec.Response, newResp) {
		t.Errorf("completed old record = %+v, %v; want %+v", rec, err, newResp)
	}

	// A store of the previous schema reads the new record: status and body, no header
	// (the jsonb column holds JSON null).
	var (
		status int
		header []byte
		body   []byte
	)
	if err := pool.QueryRow(ctx, "SELECT status, header, body FROM "+table+" WHERE key = $1", []byte("old-busy")).Scan(&status, &header, &body); err != nil {
		t.Fatal(err)
	}
	var h http.Header
	if err := json.Unmarshal(header, &h); header != nil && err != nil {
		t.Errorf("the previous store cannot decode the header column %q: %v", header, err)
	}
	if status != 201 || string(body) != "new body" || h != nil {
		t.Errorf("the previous store reads status %d, body %q, header %q", status, body, h)
	}

	// The previous store replaces that record (its takeover clears only the columns it
	// knows) and completes it with its own header: the store reads that header, not the
	// bytes left in the new column.
	var tok int64
	if err := pool.QueryRow(ctx, `UPDATE `+table+` SET state = 'in_progress', token = nextval('`+seq+`'),
		status = NULL, header = NULL, body = NULL, body_omitted = false, completed_at = NULL
		WHERE key = $1 RETURNING token`, []byte("old-busy")).Scan(&tok); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET state = 'done', status = 200, header = $2, body = 'again', completed_at = now()
		WHERE key = $1 AND token = $3`, []byte("old-busy"), oldJSON, tok); err != nil {
		t.Fatal(err)
	}
	again := &idempotency.Response{Status: 200, Header: oldHeader, Body: []byte("again")}
	if rec, err := st.Get(ctx, "s", "old-busy"); err != nil || !reflect.DeepEqual(rec.Response, again) {
		t.Errorf("record the previous store completed = %+v, %v; want %+v", rec.Response, err, again)
	}
}

func ptr[T any](v T) *T { return &v }

// Migrate on a table that has every column takes no lock that waits for the store's
// own writes, so a replica that starts while transactions hold rows (transaction mode)
// neither waits for them nor makes claims queue behind it.
func TestMigrateDoesNotWaitForWriters(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := newPool(t, testenv.PostgresURL(t), nil)
	st, schema := newStore(t, pool)
	if _, err := st.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// A transaction that has written the table, as WithTx's does, and stays open.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	table := pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()
	if _, err := tx.Exec(ctx, "UPDATE "+table+" SET lease_until = lease_until WHERE key = $1", []byte("k")); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := st.Migrate(mctx); err != nil {
		t.Errorf("Migrate beside an open write transaction: %v", err)
	}
}

// A role with only the privileges the store serves with — USAGE on the schema, SELECT,
// INSERT, UPDATE and DELETE on the table, USAGE on the sequence — starts the store once
// the schema's owner has migrated: its Migrate creates nothing and needs no privilege to
// create anything. Without the schema, or without one of the privileges, Migrate says
// what is missing.
func TestMigrateLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	admin := newPool(t, testenv.PostgresURL(t), nil)
	owned, schema := newStore(t, admin) // migrated by the owner
	role := testenv.Name("app")
	exec := func(sql string) {
		t.Helper()
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("CREATE ROLE " + role + " LOGIN")
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = admin.Exec(ctx, "DROP OWNED BY "+role)
		_, _ = admin.Exec(ctx, "DROP ROLE "+role)
	})
	table := pgx.Identifier{schema, "retrysafe_idempotency"}.Sanitize()
	exec("GRANT USAGE ON SCHEMA " + schema + " TO " + role)
	exec("GRANT SELECT, INSERT, UPDATE, DELETE ON " + table + " TO " + role)
	exec("GRANT USAGE ON SEQUENCE " + pgx.Identifier{schema, "retrysafe_idempotency_token_seq"}.Sanitize() + " TO " + role)

	u, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	pool := newPool(t, u.String(), nil)
	st, err := pgstore.New(pgstore.Config{Pool: pool, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatalf("Migrate by the serving role of a migrated schema: %v", err)
	}
	res, err := st.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", ID: "c", Lease: time.Minute, TTL: time.Hour})
	if err != nil || !res.Claimed {
		t.Fatalf("claim by the serving role: %+v %v", res, err)
	}
	if err := st.Complete(ctx, idempotency.Completion{Scope: "s", Key: "k", Token: res.Token, TTL: time.Hour,
		Response: idempotency.Response{Status: 201}}); err != nil {
		t.Fatalf("completion by the serving role: %v", err)
	}
	if err := st.Ping(ctx); err != nil {
		t.Errorf("Ping by the serving role: %v", err)
	}

	// A privilege missing: named.
	exec("REVOKE DELETE ON " + table + " FROM " + role)
	var se *pgstore.SchemaError
	if err := st.Migrate(ctx); !errors.As(err, &se) || !reflect.DeepEqual(se.Denied, []string{"DELETE on table " + table}) {
		t.Errorf("Migrate without DELETE: %v, want a SchemaError naming DELETE on %s", err, table)
	}
	// A column missing, which the role may not add: named, with the server's refusal.
	exec("ALTER TABLE " + table + " DROP COLUMN claim_id")
	if err := st.Migrate(ctx); !errors.As(err, &se) || !se.PermissionDenied() ||
		!reflect.DeepEqual(se.Missing, []string{"column " + table + `."claim_id"`}) {
		t.Errorf("Migrate of a table without claim_id by the serving role: %v, want a SchemaError naming the column, permission denied", err)
	}
	if err := owned.Migrate(ctx); err != nil {
		t.Fatalf("Migrate by the owner: %v", err)
	}
	// No schema at all.
	fresh, err := pgstore.New(pgstore.Config{Pool: pool, Schema: testenv.Name("none")})
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.Migrate(ctx); !errors.As(err, &se) || !se.PermissionDenied() || len(se.Missing) != 1 {
		t.Errorf("Migrate of a missing schema by the serving role: %v, want a SchemaError, permission denied", err)
	}
}
