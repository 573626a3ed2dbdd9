package sqlitestore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"modernc.org/sqlite"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/sqlitestore"
)

// The previous binary's statements, as it ran them: a rollback to it runs these against
// a migrated table. (testdata/schema_v1.sql is its schema.)
const (
	v1Claim = `INSERT INTO "retrysafe_idempotency" (scope, key, fingerprint, state, token, created_at,
			lease_until, expires_at, status, header, body, body_omitted)
		VALUES (?, ?, ?, 'in_progress', ?, ?, ?, ?, NULL, NULL, NULL, 0)
		ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint,
			state = excluded.state, token = excluded.token, created_at = excluded.created_at,
			lease_until = excluded.lease_until, expires_at = excluded.expires_at,
			status = NULL, header = NULL, body = NULL, body_omitted = 0`
	v1Complete = `UPDATE "retrysafe_idempotency" SET state = 'done', status = ?, header = ?, body = ?,
		body_omitted = ?, expires_at = ? WHERE scope = ? AND key = ? AND state = 'in_progress' AND token = ?`
	v1Read = `SELECT status, header, body FROM "retrysafe_idempotency" WHERE scope = ? AND key = ?`
)

// v1Record reads a done record as the previous binary did: status, the header column
// (JSON text, nil when NULL) and body.
func v1Record(t *testing.T, db *sql.DB, scope, key string) (status int, header, body []byte) {
	t.Helper()
	if err := db.QueryRow(v1Read, scope, key).Scan(&status, &header, &body); err != nil {
		t.Fatal(err)
	}
	return status, header, body
}

// columns returns the table's columns as pragma table_info describes them.
func columns(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT name, type, "notnull", coalesce(dflt_value, 'NULL'), pk FROM pragma_table_info(?)`, table)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rows.Close() }()
	var cols []string
	for rows.Next() {
		var name, typ, dflt string
		var notNull, pk int
		if err := rows.Scan(&name, &typ, &notNull, &dflt, &pk); err != nil {
			t.Fatal(err)
		}
		cols = append(cols, fmt.Sprintf("%s %s notnull=%d default=%s pk=%d", name, typ, notNull, dflt, pk))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return cols
}

// A database file made by the previous schema, with live records in it, is migrated in
// place by Open: its records are read and completed through the store, and new
// completions keep headers byte for byte.
func TestMigrateFromPreviousSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v1.db")
	now := time.UnixMilli(1_700_000_000_000).UTC()
	ms := now.UnixMilli()
	old, err := os.ReadFile(filepath.Join("testdata", "schema_v1.sql"))
	if err != nil {
		t.Fatal(err)
	}
	db := openDB(t, path)
	if _, err := db.Exec(string(old)); err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct {
		query string
		args  []any
	}{
		// A completed record and one in progress, written as the previous binary wrote them.
		{`INSERT INTO retrysafe_idempotency (scope, key, fingerprint, state, token, created_at, lease_until,
			expires_at, status, header, body, body_omitted) VALUES ('s', 'done', 'fp', 'done', 7, ?, ?, ?, 201, ?, ?, 0)`,
			[]any{ms, ms + 60_000, ms + 3_600_000, `{"Content-Type":["application/json"],"Link":["</a>","</b>"]}`, []byte(`{"id":1}`)}},
		{`INSERT INTO retrysafe_idempotency (scope, key, fingerprint, state, token, created_at, lease_until,
			expires_at, status, header, body, body_omitted) VALUES ('s', 'running', 'fp', 'in_progress', 8, ?, ?, ?, NULL, NULL, NULL, 0)`,
			[]any{ms, ms + 60_000, ms + 3_600_000}},
		{`UPDATE retrysafe_idempotency_token SET last = 8`, nil},
	} {
		if _, err := db.Exec(q.query, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	before := columns(t, db, "retrysafe_idempotency")

	s := openConfig(t, sqlitestore.Config{Path: path, Clock: at(now.Add(time.Second))})
	after := columns(t, db, "retrysafe_idempotency")
	if want := append(slices.Clone(before), "headers BLOB notnull=0 default=NULL pk=0",
		"abandoned INTEGER notnull=1 default=0 pk=0", "route TEXT notnull=0 default=NULL pk=0",
		"claim_id TEXT notnull=0 default=NULL pk=0"); !slices.Equal(after, want) {
		t.Errorf("columns after Migrate:\n%q\nwant\n%q", after, want)
	}
	fresh := openDB(t, filepath.Join(t.TempDir(), "fresh.db"))
	if _, err := sqlitestore.New(ctx, fresh, sqlitestore.Config{}); err != nil {
		t.Fatal(err)
	}
	if got := columns(t, fresh, "retrysafe_idempotency"); !slices.Equal(got, after) {
		t.Errorf("a new table and a migrated one differ:\nnew      %q\nmigrated %q", got, after)
	}

	// The old record's header comes from the old column, for Get and for a replay.
	wantOld := idempotency.Response{Status: 201, Body: []byte(`{"id":1}`),
		Header: http.Header{"Content-Type": {"application/json"}, "Link": {"</a>", "</b>"}}}
	rec, err := s.Get(ctx, "s", "done")
	if err != nil {
		t.Fatal(err)
	}
	sameStored(t, "Get of the old record", rec.Response, wantOld)
	if rec.Token != 7 || rec.Abandoned || !rec.ExpiresAt.Equal(now.Add(time.Hour)) || rec.Route != "" {
		t.Errorf("old record = %+v", rec)
	}
	res := claim(t, s, "done")
	if res.Claimed || res.Existing == nil {
		t.Fatalf("claim of the old done record = %+v", res)
	}
	sameStored(t, "replay of the old record", res.Existing.Response, wantOld)
	other := claimReq("done")
	other.Fingerprint = "other"
	if res, err := s.Claim(ctx, other); err != nil || res.Claimed || res.Existing.Response != nil {
		t.Errorf("mismatching claim of the old record = %+v, %v; want a lean existing record", res, err)
	}

	// The old in-progress record is owned by its token: it can be abandoned and completed.
	if err := s.Abandon(ctx, "s", "running", 8); err != nil {
		t.Fatalf("Abandon of the old in-progress record: %v", err)
	}
	if rec, err := s.Get(ctx, "s", "running"); err != nil || !rec.Abandoned {
		t.Fatalf("abandoned old record = %+v, %v", rec, err)
	}
	wantNew := idempotency.Response{Status: 200, Body: []byte("caf\xe9"),
		Header:  http.Header{"Content-Type": {"text/plain; charset=iso-8859-1"}, "X-Latin1": {"caf\xe9"}},
		Trailer: http.Header{"X-Checksum": {"\xde\xad"}}}
	if err := s.Complete(ctx, idempotency.Completion{Scope: "s", Key: "running", Token: 8, Response: wantNew, TTL: time.Hour}); err != nil {
		t.Fatalf("Complete of the old in-progress record: %v", err)
	}
	rec, err = s.Get(ctx, "s", "running")
	if err != nil {
		t.Fatal(err)
	}
	sameStored(t, "Get of the completed old record", rec.Response, wantNew)
	if rec.Abandoned {
		t.Error("a completed record is still abandoned")
	}
	// The previous binary, of a schema no release had, reads its status and body; the
	// header is in headers alone, which every released binary reads: this store does not
	// write the JSON column.
	status, header, body := v1Record(t, db, "s", "running")
	if status != 200 || string(body) != "caf\xe9" || header != nil {
		t.Errorf("previous binary reads status %d body %q header %q; want 200, %q and NULL", status, body, header, "caf\xe9")
	}
	if tok := claim(t, s, "new").Token; tok <= 8 {
		t.Errorf("token %d after migration, want > 8", tok)
	}

	// Migrate is idempotent, and a reopened store reads everything again.
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openConfig(t, sqlitestore.Config{Path: path})
	for key, want := range map[string]idempotency.Response{"done": wantOld, "running": wantNew} {
		rec, err := s.Get(ctx, "s", key)
		if err != nil {
			t.Fatal(err)
		}
		sameStored(t, "after reopen, "+key, rec.Response, want)
	}
}

// During a rollback the previous binary writes records without knowing the new
// columns; what it writes must win over what those columns held for the record before.
func TestPreviousBinaryWrites(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	now := time.UnixMilli(1_700_000_000_000).UTC()
	var clock time.Time
	s := openConfig(t, sqlitestore.Config{Path: path, Clock: func() time.Time { return clock }})
	db := openDB(t, path)
	clock = now

	// A record completed by this store, with headers only the new column holds exactly.
	res := claim(t, s, "k")
	if err := s.Complete(ctx, idempotency.Completion{Scope: "s", Key: "k", Token: res.Token, TTL: time.Minute,
		Response: idempotency.Response{Status: 201, Header: http.Header{"X-New": {"\xff"}}}}); err != nil {
		t.Fatal(err)
	}
	// It expires; the previous binary claims it again and completes it.
	later := now.Add(time.Hour).UnixMilli()
	if _, err := db.Exec(v1Claim, "s", "k", "fp", 100, later, later+60_000, later+3_600_000); err != nil {
		t.Fatal(err)
	}
	clock = now.Add(time.Hour)
	if rec, err := s.Get(ctx, "s", "k"); err != nil || rec.State != idempotency.StateInProgress || rec.Response != nil {
		t.Fatalf("record claimed by the previous binary = %+v, %v", rec, err)
	}
	if _, err := db.Exec(v1Complete, 200, `{"X-Old":["yes"]}`, []byte("old"), false, later+3_600_000, "s", "k", 100); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "s", "k")
	if err != nil {
		t.Fatal(err)
	}
	sameStored(t, "record completed by the previous binary", rec.Response,
		idempotency.Response{Status: 200, Header: http.Header{"X-Old": {"yes"}}, Body: []byte("old")})
	if res := claim(t, s, "k"); res.Claimed || res.Existing.Response == nil || res.Existing.Response.Header.Get("X-Old") != "yes" {
		t.Errorf("replay of the record completed by the previous binary = %+v", res.Existing)
	}

	// An abandoned record whose lease ran out, taken over by the previous binary, is
	// no longer abandoned: its new owner renews it.
	res = claim(t, s, "a")
	if err := s.Abandon(ctx, "s", "a", res.Token); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(2 * time.Minute)
	ms := clock.UnixMilli()
	if _, err := db.Exec(v1Claim, "s", "a", "fp", 101, ms, ms+60_000, ms+3_600_000); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, "s", "a"); err != nil || rec.Token != 101 || rec.Abandoned {
		t.Errorf("record taken over by the previous binary = %+v, %v; want token 101, not abandoned", rec, err)
	}
}

// A lost claim that is no replay (a 422 here) is decided without reading the stored
// body: SQLite's page counters of the connection that runs the claim show every page
// the claim fetched, and a body of 1 MiB spans 256 pages.
func TestLostClaimDoesNotReadBody(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, filepath.Join(t.TempDir(), "lean.db"))
	db.SetMaxOpenConns(1) // the store's statements and the counters use one connection
	s, err := sqlitestore.New(ctx, db, sqlitestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	res := claim(t, s, "k")
	big := idempotency.Response{Status: 201, Header: http.Header{"X": {"y"}}, Body: make([]byte, 1<<20)}
	if err := s.Complete(ctx, idempotency.Completion{Scope: "s", Key: "k", Token: res.Token, Response: big, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	pages := func(f func()) int {
		t.Helper()
		fetches := func() (n int) {
			c, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			err = c.Raw(func(dc any) error {
				st, ok := dc.(sqlite.DBStatus)
				if !ok {
					return errors.New("driver connection has no DBStatus")
				}
				for _, op := range []sqlite.DBStatusOp{sqlite.DBStatusCacheHit, sqlite.DBStatusCacheMiss} {
					v, _, err := st.Status(op, false)
					if err != nil {
						return err
					}
					n += v
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := fetches()
		f()
		return fetches() - before
	}
	mismatch := claimReq("k")
	mismatch.Fingerprint = "other"
	lost := pages(func() {
		if res, err := s.Claim(ctx, mismatch); err != nil || res.Claimed || res.Existing.Response != nil {
			t.Errorf("mismatching claim = %+v, %v", res, err)
		}
	})
	replay := pages(func() {
		if res, err := s.Claim(ctx, claimReq("k")); err != nil || res.Claimed || len(res.Existing.Response.Body) != 1<<20 {
			t.Errorf("replay = %+v, %v", res, err)
		}
	})
	t.Logf("pages fetched: %d by the 422, %d by the replay", lost, replay)
	if replay < 200 {
		t.Fatalf("the replay fetched %d pages: the counters do not see the body", replay)
	}
	if lost > 10 {
		t.Errorf("the mismatching claim fetched %d pages: it read the stored body", lost)
	}
}

// Abandoned survives a restart: it is a column, not process memory.
func TestAbandonPersists(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	s := open(t, path)
	res := claim(t, s, "k")
	if err := s.Abandon(ctx, "s", "k", res.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	if rec, err := s.Get(ctx, "s", "k"); err != nil || !rec.Abandoned {
		t.Errorf("after reopen: %+v, %v; want abandoned", rec, err)
	}
	if got := claim(t, s, "k"); got.Claimed || !got.Existing.Abandoned {
		t.Errorf("claim in the abandoned lease = %+v; want the abandoned record", got)
	}
}

func sameStored(t *testing.T, what string, got *idempotency.Response, want idempotency.Response) {
	t.Helper()
	if got == nil {
		t.Errorf("%s: no response", what)
		return
	}
	norm := func(h http.Header) http.Header {
		if len(h) == 0 {
			return nil
		}
		return h
	}
	if got.Status != want.Status || string(got.Body) != string(want.Body) || got.BodyOmitted != want.BodyOmitted ||
		!reflect.DeepEqual(norm(got.Header), norm(want.Header)) || !reflect.DeepEqual(norm(got.Trailer), norm(want.Trailer)) {
		t.Errorf("%s: response %+v, want %+v", what, *got, want)
	}
}

// DeleteExpired spares an in-progress record whose lease still runs, even past its
// ExpiresAt (a record claimed with a TTL shorter than its lease, or renewed by a
// previous binary, whose Extend left ExpiresAt alone).
func TestDeleteExpiredSparesRunningLease(t *testing.T) {
	ctx := context.Background()
	now := time.UnixMilli(1_700_000_000_000).UTC()
	var clock time.Time
	s := openConfig(t, sqlitestore.Config{Path: filepath.Join(t.TempDir(), "idem.db"), Clock: func() time.Time { return clock }})
	clock = now
	r := claimReq("k")
	r.Lease, r.TTL = time.Hour, time.Minute
	if _, err := s.Claim(ctx, r); err != nil {
		t.Fatal(err)
	}
	clock = now.Add(2 * time.Minute)
	if n, err := s.DeleteExpired(ctx, 10); err != nil || n != 0 {
		t.Fatalf("DeleteExpired inside the lease = %d, %v; want 0", n, err)
	}
	if _, err := s.Get(ctx, "s", "k"); err != nil {
		t.Fatal(err)
	}
	clock = now.Add(time.Hour)
	if n, err := s.DeleteExpired(ctx, 10); err != nil || n != 1 {
		t.Fatalf("DeleteExpired after the lease = %d, %v; want 1", n, err)
	}
}
