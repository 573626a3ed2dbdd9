package fence_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/fence"
)

func TestTable(t *testing.T) {
	t.Parallel()
	pool, schema := newEnv(t, 4)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema+"; CREATE TABLE "+schema+`."Items" (
		"Key" text PRIMARY KEY, "Value" text, fence bigint, rev bigint NOT NULL DEFAULT 0);
		INSERT INTO `+schema+`."Items" ("Key", "Value") VALUES ('a', 'init'), ('b', 'init')`); err != nil {
		t.Fatal(err)
	}
	items := fence.Table{Schema: schema, Name: "Items", Key: "Key", Fence: "fence", Version: "rev"}
	inTx := func(fn func(tx pgx.Tx) error) error { return pgx.BeginFunc(ctx, pool, fn) }
	value := func(key string) string {
		t.Helper()
		var v string
		if err := pool.QueryRow(ctx, "SELECT \"Value\" FROM "+schema+".\"Items\" WHERE \"Key\" = $1", key).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}

	t.Run("fenced", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			key   string
			token int64
			set   map[string]any
			want  error
			value string
		}{
			{"NULL fence counts as none", "a", 5, map[string]any{"Value": "t5"}, nil, "t5"},
			{"same token writes again", "a", 5, map[string]any{"Value": "t5 again"}, nil, "t5 again"},
			{"newer token", "a", 7, map[string]any{"Value": "t7"}, nil, "t7"},
			{"older token", "a", 6, map[string]any{"Value": "t6"}, fence.ErrStaleToken, "t7"},
			{"guard only", "a", 8, nil, nil, "t7"},
			{"older than the guard", "a", 7, map[string]any{"Value": "late"}, fence.ErrStaleToken, "t7"},
			{"missing row", "zz", 9, map[string]any{"Value": "x"}, fence.ErrNotFound, ""},
		} {
			err := inTx(func(tx pgx.Tx) error { return items.UpdateFenced(ctx, tx, tc.key, tc.token, tc.set) })
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
			}
			if tc.value != "" && value(tc.key) != tc.value {
				t.Errorf("%s: value %q, want %q", tc.name, value(tc.key), tc.value)
			}
		}
	})

	t.Run("versioned", func(t *testing.T) {
		var next int64
		err := inTx(func(tx pgx.Tx) (err error) {
			next, err = items.UpdateVersioned(ctx, tx, "b", 0, map[string]any{"Value": "v1"})
			return err
		})
		if err != nil || next != 1 || value("b") != "v1" {
			t.Fatalf("first update: version %d, %v, value %q", next, err, value("b"))
		}
		// Two writers read version 1; the first to commit wins.
		tx1, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx1.Rollback(ctx) }()
		if _, err := items.UpdateVersioned(ctx, tx1, "b", 1, map[string]any{"Value": "winner"}); err != nil {
			t.Fatal(err)
		}
		if err := tx1.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		err = inTx(func(tx pgx.Tx) error {
			_, err := items.UpdateVersioned(ctx, tx, "b", 1, map[string]any{"Value": "loser"})
			return err
		})
		if !errors.Is(err, fence.ErrConflict) {
			t.Errorf("lost CAS: %v, want ErrConflict", err)
		}
		if value("b") != "winner" {
			t.Errorf("value %q after a lost CAS, want the winner's", value("b"))
		}
		err = inTx(func(tx pgx.Tx) error {
			_, err := items.UpdateVersioned(ctx, tx, "nope", 0, nil)
			return err
		})
		if !errors.Is(err, fence.ErrNotFound) {
			t.Errorf("missing row: %v, want ErrNotFound", err)
		}
	})

	t.Run("invalid", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			tbl  fence.Table
			set  map[string]any
		}{
			{"no name", fence.Table{}, nil},
			{"set the key", items, map[string]any{"Key": "x"}},
			{"set the fence", items, map[string]any{"fence": 1}},
			{"empty column", items, map[string]any{"": 1}},
			{"unknown column", items, map[string]any{`"; DROP TABLE x; --`: 1}},
		} {
			err := inTx(func(tx pgx.Tx) error { return tc.tbl.UpdateFenced(ctx, tx, "a", 100, tc.set) })
			if err == nil {
				t.Errorf("%s: UpdateFenced succeeded", tc.name)
			}
		}
		err := inTx(func(tx pgx.Tx) error {
			_, err := items.UpdateVersioned(ctx, tx, "a", 0, map[string]any{"rev": 5})
			return err
		})
		if err == nil {
			t.Error("UpdateVersioned setting the version column succeeded")
		}
	})
}
