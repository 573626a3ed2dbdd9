package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"mime"
	"strings"
)

// Fingerprint returns the SHA-256 (hex) of a request's method, path, query, content type
// and body. Each part is length-prefixed, so no two different requests share a
// fingerprint by moving bytes from one part to another. With canonicalJSON, a JSON body is
// re-encoded first (object keys sorted, insignificant white space removed; numbers keep
// their text), so key order and formatting do not change the fingerprint; a body that is
// not JSON is hashed as it is.
func Fingerprint(method, path, rawQuery, contentType string, body []byte, canonicalJSON bool) string {
	return fingerprint(method, path, rawQuery, contentType, body, canonicalJSON, nil)
}

// fingerprint is Fingerprint, with the members ignore names removed from a JSON body
// before it is hashed (canonically: a body with them removed has no original text).
func fingerprint(method, path, rawQuery, contentType string, body []byte, canonicalJSON bool, ignore []pointer) string {
	contentType = mediaType(contentType)
	switch {
	case len(ignore) > 0:
		if doc, err := decodeJSON(body); err == nil {
			for _, p := range ignore {
				p.remove(doc)
			}
			if c, err := json.Marshal(doc); err == nil {
				body = c
			}
		}
	case canonicalJSON:
		if c, ok := canonical(body); ok {
			body = c
		}
	}
	// The parts are hashed in one call from a buffer on the stack when they fit in it
	// (most requests: a hash.Hash and every part written to it would each be an
	// allocation); a larger body is hashed where it is, after the other parts.
	var scratch [1024]byte
	b := appendPart(scratch[:0], method)
	b = appendPart(b, path)
	b = appendPart(b, rawQuery)
	b = appendPart(b, contentType)
	var sum [sha256.Size]byte
	if len(b)+8+len(body) <= len(scratch) {
		sum = sha256.Sum256(appendPart(b, body))
	} else {
		h := sha256.New()
		h.Write(b)
		h.Write(binary.BigEndian.AppendUint64(scratch[:0], uint64(len(body))))
		h.Write(body)
		h.Sum(sum[:0])
	}
	var digits [2 * sha256.Size]byte
	hex.Encode(digits[:], sum[:])
	return string(digits[:])
}

// appendPart appends part, prefixed with its length, to b.
func appendPart[T string | []byte](b []byte, part T) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(part)))
	return append(b, part...)
}

// mediaType returns contentType as the fingerprint takes it: its media type in lower
// case, with the charset parameter (lower-cased) and no other; as it is when it cannot
// be parsed. Media type names are case-insensitive; the charset matters.
func mediaType(contentType string) string {
	if plainMediaType(contentType) {
		return contentType // already in that form; most requests' is (application/json)
	}
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return contentType
	}
	if cs := params["charset"]; cs != "" {
		mt += ";charset=" + strings.ToLower(cs)
	}
	return mt
}

// plainMediaType reports whether s has only lower-case letters, digits and the
// punctuation "/-+._", and so no parameters, nothing that lower-casing or trimming
// changes, and nothing for parsing to take away.
func plainMediaType(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '/', c == '-', c == '+', c == '.', c == '_':
		default:
			return false
		}
	}
	return true
}

func canonical(body []byte) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return nil, false
	}
	out, err := json.Marshal(v) // maps marshal with sorted keys
	if err != nil {
		return nil, false
	}
	return out, true
}
