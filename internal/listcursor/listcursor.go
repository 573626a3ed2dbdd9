// Package listcursor is how the idempotency stores that page in (scope, key) order
// (memstore, sqlitestore, pgstore) make their List pages and cursors: a cursor is the
// last record of a page, from which the next page continues. The stores encode and
// decode it here, so that they agree and a cursor means the same whichever of them made
// it. (redisstore pages in SCAN order, and its cursor holds a SCAN position instead.)
//
// A cursor is the scope and the key, each in unpadded base64url, joined by a dot: it
// holds any bytes (keys and scopes may hold NUL or bytes that are not UTF-8), and it is
// safe in a URL's query and on a command line.
package listcursor

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/retrysafe/retrysafe/idempotency"
)

// ErrInvalid is what Decode returns, wrapped, for a string that no Encode made.
var ErrInvalid = errors.New("invalid list cursor")

// Encode returns the cursor after the record (scope, key).
func Encode(scope, key string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(scope)) + "." + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// Decode returns the scope and key of a cursor made by Encode, or an error that wraps
// ErrInvalid.
func Decode(cursor string) (scope, key string, err error) {
	a, b, ok := strings.Cut(cursor, ".")
	s, err1 := base64.RawURLEncoding.DecodeString(a)
	k, err2 := base64.RawURLEncoding.DecodeString(b)
	if !ok || err1 != nil || err2 != nil {
		return "", "", fmt.Errorf("%w %q", ErrInvalid, cursor)
	}
	return string(s), string(k), nil
}

// Rows are the rows of a query for a page: a pgx.Rows or a *sql.Rows.
type Rows interface {
	Next() bool
	Err() error
}

// Page reads a page of at most limit records from rows, which the store queried with
// a limit of limit+1, in (scope, key) order: a row after the limit-th says that another
// page follows, and Next is then the cursor after the page's last record. scan reads
// the current row. Errors come as scan or rows returned them.
func Page[R Rows](rows R, limit int, scan func(R) (*idempotency.Record, error)) (idempotency.ListPage, error) {
	var page idempotency.ListPage
	for rows.Next() {
		if len(page.Records) == limit {
			last := page.Records[limit-1]
			page.Next = Encode(last.Scope, last.Key)
			break
		}
		rec, err := scan(rows)
		if err != nil {
			return idempotency.ListPage{}, err
		}
		page.Records = append(page.Records, *rec)
	}
	if err := rows.Err(); err != nil {
		return idempotency.ListPage{}, err
	}
	return page, nil
}
