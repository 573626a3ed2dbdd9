package fence

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Table names one of the caller's tables for conditional writes: rows with a key
// column, a column holding the fencing token that last wrote the row (for
// UpdateFenced) and a version column (for UpdateVersioned). A table needs only the
// columns of the methods it uses. The zero value of each field but Name means its
// default. Names are quoted identifiers, so they are case-sensitive; any name is safe.
//
//	CREATE TABLE accounts (
//	    id         text   PRIMARY KEY,
//	    balance    bigint NOT NULL,
//	    last_fence bigint NOT NULL DEFAULT 0, -- UpdateFenced
//	    version    bigint NOT NULL DEFAULT 0  -- UpdateVersioned
//	);
type Table struct {
	// Schema is the table's schema. Default none: the connection's search_path.
	Schema string
	// Name is the table's name. Required.
	Name string
	// Key is the column that identifies a row (unique). Default "id".
	Key string
	// Fence is the bigint column holding the last fencing token that wrote the row.
	// NULL counts as no token. Default "last_fence".
	Fence string
	// Version is the bigint column incremented by each versioned update. Default
	// "version".
	Version string
}

// UpdateFenced writes the columns of set (column name → value) of the row whose key is
// key, inside the caller's transaction tx, and records token as the row's last fencing
// token, in one statement:
//
//	UPDATE t SET c1 = $3, …, last_fence = $2 WHERE id = $1 AND last_fence <= $2
//
// A token older than the one that last wrote the row is stale: nothing is written and
// the error wraps ErrStaleToken; a missing row gives ErrNotFound. An equal token may
// write again (the same holder, several writes). The row stays locked until tx ends,
// so an older token cannot write after it either. set may be empty: the statement then
// only advances the token, to guard writes that follow it in tx. Return the error from
// the transaction so that it rolls back.
//
// This protects the row without reading the lease table, so it also works where the
// lease lives elsewhere; Check protects any write, by the lease row itself.
func (t Table) UpdateFenced(ctx context.Context, tx pgx.Tx, key any, token int64, set map[string]any) error {
	tbl, keyCol, fenceCol, err := t.names(t.Fence, "last_fence")
	if err != nil {
		return err
	}
	assign, args, err := assignments(set, []any{key, token}, keyCol, fenceCol)
	if err != nil {
		return fmt.Errorf("fence: update %s: %w", tbl, err)
	}
	q := "UPDATE " + tbl + " SET " + assign + fenceCol + " = $2 WHERE " + keyCol + " = $1 AND (" +
		fenceCol + " IS NULL OR " + fenceCol + " <= $2)"
	tag, err := tx.Exec(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("fence: update %s: %w", tbl, err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	var current int64
	err = tx.QueryRow(ctx, "SELECT coalesce("+fenceCol+", 0) FROM "+tbl+" WHERE "+keyCol+" = $1", key).Scan(&current)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("fence: update %s %v: %w", tbl, key, ErrNotFound)
	case err != nil:
		return fmt.Errorf("fence: update %s: %w", tbl, err)
	}
	return fmt.Errorf("fence: update %s %v with token %d: the row was written with token %d: %w",
		tbl, key, token, current, ErrStaleToken)
}

// UpdateVersioned is a compare-and-swap, inside the caller's transaction tx: it writes
// the columns of set (column name → value) of the row whose key is key only if the
// row's version is still version (the one the caller read), and increments the version,
// in one statement:
//
//	UPDATE t SET c1 = $3, …, version = version + 1 WHERE id = $1 AND version = $2 RETURNING version
//
// It returns the new version. When the version has moved, nothing is written and the
// error wraps ErrConflict (read the row again and retry); a missing row gives
// ErrNotFound. set may be empty: the statement then only bumps the version, to guard
// writes that follow it in tx (the row stays locked until tx ends). Return the error
// from the transaction so that it rolls back.
func (t Table) UpdateVersioned(ctx context.Context, tx pgx.Tx, key any, version int64, set map[string]any) (int64, error) {
	tbl, keyCol, verCol, err := t.names(t.Version, "version")
	if err != nil {
		return 0, err
	}
	assign, args, err := assignments(set, []any{key, version}, keyCol, verCol)
	if err != nil {
		return 0, fmt.Errorf("fence: update %s: %w", tbl, err)
	}
	q := "UPDATE " + tbl + " SET " + assign + verCol + " = " + verCol + " + 1 WHERE " + keyCol +
		" = $1 AND " + verCol + " = $2 RETURNING " + verCol
	var next int64
	err = tx.QueryRow(ctx, q, args...).Scan(&next)
	if err == nil {
		return next, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("fence: update %s: %w", tbl, err)
	}
	var current *int64
	err = tx.QueryRow(ctx, "SELECT "+verCol+" FROM "+tbl+" WHERE "+keyCol+" = $1", key).Scan(&current)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, fmt.Errorf("fence: update %s %v: %w", tbl, key, ErrNotFound)
	case err != nil:
		return 0, fmt.Errorf("fence: update %s: %w", tbl, err)
	}
	now := "NULL"
	if current != nil {
		now = strconv.FormatInt(*current, 10)
	}
	return 0, fmt.Errorf("fence: update %s %v at version %d: the version is now %s: %w",
		tbl, key, version, now, ErrConflict)
}

// names returns the quoted table, key column and guard column (col, or def).
func (t Table) names(col, def string) (table, key, guard string, err error) {
	if t.Name == "" {
		return "", "", "", errors.New("fence: Table.Name is empty")
	}
	id := pgx.Identifier{t.Name}
	if t.Schema != "" {
		id = pgx.Identifier{t.Schema, t.Name}
	}
	return id.Sanitize(), pgx.Identifier{cmp.Or(t.Key, "id")}.Sanitize(),
		pgx.Identifier{cmp.Or(col, def)}.Sanitize(), nil
}

// assignments returns "c1 = $3, c2 = $4, " for set's columns in sorted order (so a
// statement's text is stable and pgx's statement cache reuses it), and args with their
// values appended. The key and guard columns cannot be set.
func assignments(set map[string]any, args []any, key, guard string) (string, []any, error) {
	cols := make([]string, 0, len(set))
	for c := range set {
		cols = append(cols, c)
	}
	slices.Sort(cols)
	var b strings.Builder
	for _, c := range cols {
		q := pgx.Identifier{c}.Sanitize()
		if c == "" || q == key || q == guard {
			return "", nil, fmt.Errorf("column %q cannot be set", c)
		}
		args = append(args, set[c])
		b.WriteString(q + " = $" + strconv.Itoa(len(args)) + ", ")
	}
	return b.String(), args, nil
}
