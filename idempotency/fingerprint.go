package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"hash"
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
	h := sha256.New()
	part(h, []byte(method))
	part(h, []byte(path))
	part(h, []byte(rawQuery))
	mt, params, err := mime.ParseMediaType(contentType)
	if err == nil {
		// Media type names are case-insensitive; the charset parameter matters.
		contentType = mt
		if cs := params["charset"]; cs != "" {
			contentType += ";charset=" + strings.ToLower(cs)
		}
	}
	part(h, []byte(contentType))
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
	part(h, body)
	return hex.EncodeToString(h.Sum(nil))
}

func part(h hash.Hash, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
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
