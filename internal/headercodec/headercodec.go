// Package headercodec encodes a stored response's headers and trailers as bytes, so that
// the SQL and Redis stores keep them byte for byte: a header value need not be UTF-8
// (net/http passes any byte but CR, LF and NUL), and text encodings such as JSON would
// replace such bytes with U+FFFD.
//
// The encoding is a version byte (1) followed by two sections, the header and the
// trailer. A section is a flag byte (0: nil, 1: present), then, when present, the
// number of names, and for each name in sorted order its length and bytes, the number
// of values, and each value's length and bytes; numbers are unsigned varints. Sorting
// makes the encoding of equal headers equal.
package headercodec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
)

const version = 1

// ErrMalformed is wrapped by the errors of Decode.
var ErrMalformed = errors.New("headercodec: malformed encoding")

// Encode returns the encoding of header and trailer. A nil header and an empty one
// decode differently (nil and empty), as do nil and empty trailers.
func Encode(header, trailer http.Header) []byte {
	return Append(make([]byte, 0, Size(header, trailer)), header, trailer)
}

// Append appends the encoding of header and trailer to b.
func Append(b []byte, header, trailer http.Header) []byte {
	b = append(b, version)
	b = appendSection(b, header)
	return appendSection(b, trailer)
}

// Size is at least the length of the encoding of header and trailer.
func Size(header, trailer http.Header) int { return 1 + size(header) + size(trailer) }

func size(h http.Header) int {
	n := 1 + binary.MaxVarintLen64
	for k, vs := range h {
		n += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	return n
}

func appendSection(b []byte, h http.Header) []byte {
	if h == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	var few [16]string // most headers have as few names: sorted on the stack
	names := few[:0]
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		b = appendString(b, k)
		vs := h[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Decode returns the header and trailer that b encodes. It never panics on bad input:
// anything Encode did not produce is an error wrapping ErrMalformed. The names and values
// share one string, and a section's value slices one array (each capped, so that an
// append to one copies it): a few allocations, whatever the number of headers.
func Decode(b []byte) (header, trailer http.Header, err error) {
	d := decoder{b: b, all: string(b), n: len(b)}
	if v := d.byte(); v != version {
		return nil, nil, fmt.Errorf("%w: version %d", ErrMalformed, v)
	}
	header = d.section()
	trailer = d.section()
	if d.err == nil && len(d.b) > 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(d.b))
	}
	if d.err != nil {
		return nil, nil, d.err
	}
	return header, trailer, nil
}

type decoder struct {
	b   []byte
	all string // b whole, as a string: the strings decoded are parts of it
	n   int    // len(all)
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformed, what)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.fail("truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// count reads a number of items, each at least min bytes long, so that a corrupt count
// cannot make Decode allocate more than the input can hold.
func (d *decoder) count(min int) int {
	n, k := uvarint(d.b)
	if k <= 0 || n > uint64(len(d.b)-k)/uint64(min) {
		d.fail("bad count")
		return 0
	}
	d.b = d.b[k:]
	return int(n)
}

func (d *decoder) string() string {
	n, k := uvarint(d.b)
	if k <= 0 || n > uint64(len(d.b)-k) {
		d.fail("bad length")
		return ""
	}
	at := d.n - len(d.b) + k
	d.b = d.b[k+int(n):]
	return d.all[at : at+int(n)]
}

// uvarint is binary.Uvarint that also rejects (k = 0) a number not written in its
// shortest form, so that every input decodes from exactly one encoding.
func uvarint(b []byte) (uint64, int) {
	n, k := binary.Uvarint(b)
	if k > 1 && b[k-1] == 0 {
		return 0, 0
	}
	return n, k
}

func (d *decoder) section() http.Header {
	switch d.byte() {
	case 0:
		return nil
	case 1:
	default:
		d.fail("bad section flag")
		return nil
	}
	names := d.count(2)
	h := make(http.Header, names)
	slab := make([]string, 0, names) // the values of the section, most names having one
	prev := ""
	for i := range names {
		k := d.string()
		if d.err != nil {
			return nil
		}
		if i > 0 && k <= prev {
			d.fail("names out of order")
			return nil
		}
		prev = k
		n := d.count(1)
		if cap(slab)-len(slab) < n {
			slab = make([]string, 0, max(n, names))
		}
		vs := slab[len(slab) : len(slab)+n : len(slab)+n]
		slab = slab[:len(slab)+n]
		for j := range vs {
			vs[j] = d.string()
		}
		h[k] = vs
	}
	return h
}
