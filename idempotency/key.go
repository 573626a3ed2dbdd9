package idempotency

import (
	"errors"
	"strings"
)

// MaxKeyLen is the longest key accepted, in characters.
const MaxKeyLen = 255

var (
	errKeyEmpty   = errors.New("the Idempotency-Key header is empty")
	errKeyLong    = errors.New("the Idempotency-Key is longer than 255 characters")
	errKeyChars   = errors.New("the Idempotency-Key must be visible ASCII characters (0x21-0x7E)")
	errKeyQuoting = errors.New("the Idempotency-Key is not a well-formed quoted string")
	errKeyMany    = errors.New("the request has more than one Idempotency-Key header")
)

// ParseKey validates an Idempotency-Key header value and returns the key. The IETF
// draft's structured-field string form ("abc", with \" and \\ escapes) and the bare form
// (abc) denote the same key. A key is 1 to 255 visible ASCII characters.
func ParseKey(v string) (string, error) {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && v[0] == '"' {
		if v[len(v)-1] != '"' {
			return "", errKeyQuoting
		}
		var b strings.Builder
		inner := v[1 : len(v)-1]
		for i := 0; i < len(inner); i++ {
			c := inner[i]
			switch c {
			case '\\':
				if i+1 == len(inner) || (inner[i+1] != '"' && inner[i+1] != '\\') {
					return "", errKeyQuoting
				}
				i++
				b.WriteByte(inner[i])
			case '"':
				return "", errKeyQuoting
			default:
				b.WriteByte(c)
			}
		}
		v = b.String()
	}
	switch {
	case v == "":
		return "", errKeyEmpty
	case len(v) > MaxKeyLen:
		return "", errKeyLong
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return "", errKeyChars
		}
	}
	return v, nil
}
