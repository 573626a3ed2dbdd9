// Package listcursor is the List cursor of the idempotency stores that page in (scope,
// key) order (memstore, sqlitestore, pgstore): the last record of a page, from which the
// next page continues. Each store encodes and decodes it here, so that the three agree
// and a cursor means the same whichever of them made it. (redisstore pages in SCAN
// order, and its cursor holds a SCAN position instead.)
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
