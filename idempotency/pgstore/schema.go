package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// columns are the table's columns, as schema.sql creates them: Migrate adds those a
// table lacks.
var columns = []string{"scope", "key", "fingerprint", "state", "token", "attempts", "created_at", "lease_until",
	"expires_at", "completed_at", "status", "headers", "header", "body", "body_omitted", "abandoned", "route", "claim_id", "kept_until"}

// SchemaError is Migrate's error when the schema is not ready for the store: something
// is missing and applying the schema failed (often because the role may not create it),
// or everything is there but the role lacks a privilege the store serves with.
type SchemaError struct {
	// Missing are what the schema lacks: "schema x", "table x.y", "sequence x.y_token_seq",
	// "index y_expires_at_idx", "column x.y.z".
	Missing []string
	// Denied are the privileges the role lacks: "USAGE on schema x", "INSERT on table
	// x.y", "USAGE on sequence x.y_token_seq".
	Denied []string
	// Err is the error of applying the schema, when Missing is not empty.
	Err error
}

func (e *SchemaError) Error() string {
	if len(e.Missing) > 0 {
		return fmt.Sprintf("pgstore: the schema lacks %s, and applying it failed: %v", list(e.Missing), e.Err)
	}
	return "pgstore: the role lacks " + list(e.Denied)
}

func (e *SchemaError) Unwrap() error { return e.Err }

// PermissionDenied reports whether the schema is missing something and the role may not
// create it (SQLSTATE 42501): its owner must migrate.
func (e *SchemaError) PermissionDenied() bool {
	var pgErr *pgconn.PgError
	return errors.As(e.Err, &pgErr) && pgErr.Code == "42501"
}

// list names up to four items, then how many more.
func list(items []string) string {
	if len(items) > 4 {
		return strings.Join(items[:4], ", ") + fmt.Sprintf(" and %d more", len(items)-4)
	}
	return strings.Join(items, ", ")
}

// inspect reads the catalogs (readable by every role, whatever its privileges on the
// schema): what the store's schema lacks, and, when nothing, which of the privileges the
// store serves with the role lacks.
func (s *Store) inspect(ctx context.Context) (missing, denied []string, err error) {
	var (
		schemaOID, tableOID, seqOID *uint32
		index                       bool
		have                        []string
	)
	err = s.do(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, `WITH n AS (SELECT oid FROM pg_namespace WHERE nspname = $1),
	rel AS (SELECT c.oid, c.relname, c.relkind FROM pg_class AS c JOIN n ON c.relnamespace = n.oid
		WHERE c.relname IN ($2, $3, $4))
SELECT (SELECT oid FROM n), (SELECT oid FROM rel WHERE relname = $2 AND relkind IN ('r', 'p')),
	(SELECT oid FROM rel WHERE relname = $3 AND relkind = 'S'), EXISTS (SELECT FROM rel WHERE relname = $4 AND relkind = 'i'),
	ARRAY(SELECT attname::text FROM pg_attribute
		WHERE attrelid = (SELECT oid FROM rel WHERE relname = $2 AND relkind IN ('r', 'p')) AND attnum > 0 AND NOT attisdropped)`,
			s.names.schema, s.names.table, s.names.sequence, s.names.index).Scan(&schemaOID, &tableOID, &seqOID, &index, &have)
	})
	if err != nil {
		return nil, nil, err
	}
	q := func(names ...string) string { return pgx.Identifier(names).Sanitize() }
	table, seq := q(s.names.schema, s.names.table), q(s.names.schema, s.names.sequence)
	switch {
	case schemaOID == nil:
		return []string{"schema " + q(s.names.schema)}, nil, nil
	case tableOID == nil:
		missing = append(missing, "table "+table)
	default:
		for _, c := range columns {
			if !slices.Contains(have, c) {
				missing = append(missing, "column "+table+"."+q(c))
			}
		}
		if !index {
			missing = append(missing, "index "+q(s.names.index))
		}
	}
	if seqOID == nil {
		missing = append(missing, "sequence "+seq)
	}
	if len(missing) > 0 {
		return missing, nil, nil
	}
	var usage, sel, ins, upd, del, next bool
	err = s.do(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, `SELECT has_schema_privilege($1::oid, 'USAGE'), has_table_privilege($2::oid, 'SELECT'),
	has_table_privilege($2::oid, 'INSERT'), has_table_privilege($2::oid, 'UPDATE'), has_table_privilege($2::oid, 'DELETE'),
	has_sequence_privilege($3::oid, 'USAGE') OR has_sequence_privilege($3::oid, 'UPDATE')`,
			*schemaOID, *tableOID, *seqOID).Scan(&usage, &sel, &ins, &upd, &del, &next)
	})
	if err != nil {
		return nil, nil, err
	}
	for _, p := range []struct {
		ok   bool
		what string
	}{
		{usage, "USAGE on schema " + q(s.names.schema)}, {sel, "SELECT on table " + table}, {ins, "INSERT on table " + table},
		{upd, "UPDATE on table " + table}, {del, "DELETE on table " + table}, {next, "USAGE on sequence " + seq},
	} {
		if !p.ok {
			denied = append(denied, p.what)
		}
	}
	return nil, denied, nil
}
