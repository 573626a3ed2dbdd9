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
	errKeyQuoting = errors.New(`the Idempotency-Key is not a well-formed quoted string (a structured-field string: "...", with \" and \\ as the only escapes)`)
	errKeyList    = errors.New(`the Idempotency-Key is a list (a comma outside quotes): send one key`)
	errKeyParams  = errors.New(`the Idempotency-Key has parameters (";" after the key), which are not supported`)
	errKeyBare    = errors.New(`an unquoted Idempotency-Key may not contain '"', '\', ',', ';' or white space; quote it as a structured-field string`)
	errKeyMany    = errors.New("the request has more than one Idempotency-Key header")
)

// ParseKey validates an Idempotency-Key header value and returns the key. The header
// is a structured-field Item whose value is a String (RFC 8941): "abc", with \" and \\
// as the only escapes. The bare form abc is accepted as the same key, as many clients
// send it. Either way the key is 1 to 255 visible ASCII characters (no spaces).
// Anything else is an error: a list (a comma outside quotes, or several header lines),
// parameters, a broken quoted string, or a bare key containing '"', '\', ',' or ';'.
func ParseKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", errKeyEmpty
	}
	var key string
	if v[0] == '"' {
		k, rest, err := parseString(v)
		if err != nil {
			return "", err
		}
		switch rest = strings.TrimLeft(rest, " \t"); {
		case rest == "":
		case rest[0] == ',':
			return "", errKeyList
		case rest[0] == ';':
			return "", errKeyParams
		default:
			return "", errKeyQuoting
		}
		key = k
	} else {
		if i := strings.IndexAny(v, "\",;\\ \t"); i >= 0 {
			if v[i] == ',' {
				return "", errKeyList
			}
			return "", errKeyBare
		}
		key = v
	}
	switch {
	case key == "":
		return "", errKeyEmpty
	case len(key) > MaxKeyLen:
		return "", errKeyLong
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return "", errKeyChars
		}
	}
	return key, nil
}

// parseString parses the sf-string at the start of v (which starts with '"') and
// returns its value and what follows the closing quote.
func parseString(v string) (s, rest string, err error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			if i+1 == len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
				return "", "", errKeyQuoting
			}
			i++
			b.WriteByte(v[i])
		case c == '"':
			return b.String(), v[i+1:], nil
		case c < 0x20 || c > 0x7e:
			return "", "", errKeyChars
		default:
			b.WriteByte(c)
		}
	}
	return "", "", errKeyQuoting // no closing quote
}
