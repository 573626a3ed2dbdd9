package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// pointer is a parsed JSON pointer (RFC 6901): its reference tokens, unescaped.
type pointer []string

// parsePointer parses s: "" (the whole document) or "/" followed by tokens separated by
// "/", in which ~1 stands for "/" and ~0 for "~".
func parsePointer(s string) (pointer, error) {
	if s == "" {
		return pointer{}, nil
	}
	if s[0] != '/' {
		return nil, fmt.Errorf("JSON pointer %q does not start with /", s)
	}
	toks := strings.Split(s[1:], "/")
	for i, t := range toks {
		for j := 0; j < len(t); j++ {
			if t[j] == '~' && (j+1 == len(t) || t[j+1] != '0' && t[j+1] != '1') {
				return nil, fmt.Errorf("JSON pointer %q: ~ must be followed by 0 or 1", s)
			}
		}
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return toks, nil
}

// get returns the value p names in v, a document decoded with UseNumber.
func (p pointer) get(v any) (any, bool) {
	for _, tok := range p {
		switch c := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = c[tok]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) || tok != strconv.Itoa(i) {
				return nil, false
			}
			v = c[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// remove deletes from v the object member p names, when there is one. (Array elements
// are not removed: removing one would renumber the rest.)
func (p pointer) remove(v any) {
	if len(p) == 0 {
		return
	}
	if parent, ok := p[:len(p)-1].get(v); ok {
		if obj, ok := parent.(map[string]any); ok {
			delete(obj, p[len(p)-1])
		}
	}
}

// decodeJSON decodes body, one JSON value and nothing after it, numbers kept as text.
func decodeJSON(body []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value")
	}
	return v, nil
}

var errBodyKeyMissing = errors.New("no key in the body")

// bodyKey returns the key at p in a JSON body: a string, or a number as written, of 1
// to MaxKeyLen visible ASCII characters.
func bodyKey(body []byte, p pointer) (string, error) {
	doc, err := decodeJSON(body)
	if err != nil {
		return "", errBodyKeyMissing
	}
	v, ok := p.get(doc)
	if !ok {
		return "", errBodyKeyMissing
	}
	var key string
	switch k := v.(type) {
	case string:
		key = k
	case json.Number:
		key = k.String()
	default:
		return "", errors.New("the key in the body is not a string or a number")
	}
	switch {
	case key == "":
		return "", errors.New("the key in the body is empty")
	case len(key) > MaxKeyLen:
		return "", fmt.Errorf("the key in the body is longer than %d characters", MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return "", errors.New("the key in the body must be visible ASCII characters (0x21-0x7E)")
		}
	}
	return key, nil
}
