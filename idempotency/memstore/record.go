package memstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/internal/headercodec"
)

// record is a key's record as the store keeps it: bytes in one of the arena's slabs,
// without pointers (see arena).
//
//	[0]      state: stateInProgress or stateDone
//	[1]      flags: flagAbandoned, flagResponse
//	[2:10]   token
//	[10:18]  created, [18:26] lease until, [26:34] expires: each the time's offset
//	         from the Store's base time, in ns (Store.offset)
//	then     scope, key, fingerprint, route and claim ID, each a uvarint length and
//	         its bytes
//	then     with flagResponse, the response's encoding (appendResponse) to the end
//
// Fixed fields are little-endian and change in place under the store's lock; a
// completion writes a new record.
type record []byte

const (
	offState   = 0
	offFlags   = 1
	offToken   = 2
	offCreated = 10
	offLease   = 18
	offExpires = 26
	headerLen  = 34
)

const (
	stateInProgress = 0
	stateDone       = 1
)

const (
	flagAbandoned = 1 << iota // Record.Abandoned
	flagResponse              // a response follows the strings
)

// fields are the parts of a new record but its response.
type fields struct {
	scope, key, fingerprint, route, claimID string
	token                                   int64
	created, lease, expires                 int64 // offsets (Store.offset)
}

// recordSize returns the length of f's record.
func recordSize(f *fields) int {
	n := headerLen
	for _, s := range [...]string{f.scope, f.key, f.fingerprint, f.route, f.claimID} {
		n += uvarintLen(len(s)) + len(s)
	}
	return n
}

// appendRecord appends the in-progress record of f, recordSize(f) bytes, to b.
func appendRecord(b []byte, f *fields) record {
	r := append(b, make([]byte, headerLen)...)
	r[offState] = stateInProgress
	binary.LittleEndian.PutUint64(r[offToken:], uint64(f.token))
	binary.LittleEndian.PutUint64(r[offCreated:], uint64(f.created))
	binary.LittleEndian.PutUint64(r[offLease:], uint64(f.lease))
	binary.LittleEndian.PutUint64(r[offExpires:], uint64(f.expires))
	for _, s := range [...]string{f.scope, f.key, f.fingerprint, f.route, f.claimID} {
		r = binary.AppendUvarint(r, uint64(len(s)))
		r = append(r, s...)
	}
	return r
}

// completedSize returns an upper bound of the length of r's record once done with
// resp.
func (r record) completedSize(v view, resp *idempotency.Response) int {
	return v.claimIDAt() + 1 + responseSize(resp)
}

// appendCompleted appends to b a copy of r, whose strings are v, done with resp, no
// longer abandoned, expiring at expires (an offset), and without its claim ID: at most
// r.completedSize bytes. Only a claim in progress is matched by its ID (Claim), so a
// settled key has no use for it, and it would take room until the key expires.
func (r record) appendCompleted(b []byte, v view, resp *idempotency.Response, expires int64) record {
	c := append(b, r[:v.claimIDAt()]...)
	c = append(c, 0) // the claim ID's length
	c[offState] = stateDone
	c[offFlags] = flagResponse
	binary.LittleEndian.PutUint64(c[offExpires:], uint64(expires))
	return appendResponse(c, resp)
}

func (r record) state() idempotency.State {
	if r[offState] == stateDone {
		return idempotency.StateDone
	}
	return idempotency.StateInProgress
}

func (r record) done() bool        { return r[offState] == stateDone }
func (r record) abandoned() bool   { return r[offFlags]&flagAbandoned != 0 }
func (r record) token() int64      { return int64(binary.LittleEndian.Uint64(r[offToken:])) }
func (r record) created() int64    { return int64(binary.LittleEndian.Uint64(r[offCreated:])) }
func (r record) leaseUntil() int64 { return int64(binary.LittleEndian.Uint64(r[offLease:])) }
func (r record) expires() int64    { return int64(binary.LittleEndian.Uint64(r[offExpires:])) }

func (r record) setAbandoned() { r[offFlags] |= flagAbandoned }
func (r record) setLeaseUntil(off int64) {
	binary.LittleEndian.PutUint64(r[offLease:], uint64(off))
}
func (r record) setExpires(off int64) {
	binary.LittleEndian.PutUint64(r[offExpires:], uint64(off))
}

// view is a record's strings, as parts of it, and where they end.
type view struct {
	scope, key, fingerprint, route, claimID []byte
	end                                     int
}

// claimIDAt returns where in the record the claim ID's length is: the last of its
// strings.
func (v view) claimIDAt() int { return v.end - len(v.claimID) - uvarintLen(len(v.claimID)) }

// view parses r's strings. r is the store's own encoding, so it cannot be malformed;
// were it, the store's invariants are gone and view panics.
func (r record) view() view {
	var v view
	i := headerLen
	for _, p := range [...]*[]byte{&v.scope, &v.key, &v.fingerprint, &v.route, &v.claimID} {
		n, k := binary.Uvarint(r[i:])
		if k <= 0 || uint64(len(r)-i-k) < n {
			panic(errCorrupt)
		}
		*p = r[i+k : i+k+int(n)]
		i += k + int(n)
	}
	v.end = i
	return v
}

// is reports whether r is the record of (scope, key).
func (r record) is(scope, key string) bool {
	v := r.view()
	return string(v.key) == key && string(v.scope) == scope
}

// response decodes r's response, or returns nil when it has none.
func (r record) response(v view) *idempotency.Response {
	if r[offFlags]&flagResponse == 0 {
		return nil
	}
	return decodeResponse(r[v.end:])
}

// text returns b as a string: like, when it holds the same bytes (no copy), else a
// copy of b.
func text(b []byte, like string) string {
	if string(b) == like {
		return like
	}
	return string(b)
}

func uvarintLen(n int) int {
	k := 1
	for ; n >= 0x80; n >>= 7 {
		k++
	}
	return k
}

// A response is encoded as: its status (a varint), a flags byte (respOmitted,
// respNilBody), the body's length (a uvarint), the body, and to the end the encoding of
// its header and trailer (package headercodec).
const (
	respOmitted = 1 << iota // BodyOmitted
	respNilBody             // Body is nil, not empty
)

// responseSize is an upper bound of the length of resp's encoding.
func responseSize(resp *idempotency.Response) int {
	return 2*binary.MaxVarintLen64 + 1 + len(resp.Body) + headercodec.Size(resp.Header, resp.Trailer)
}

// appendResponse appends the encoding of resp to b: a copy of it, so that the caller
// may change resp afterwards.
func appendResponse(b []byte, resp *idempotency.Response) []byte {
	b = binary.AppendVarint(b, int64(resp.Status))
	var flags byte
	if resp.BodyOmitted {
		flags |= respOmitted
	}
	if resp.Body == nil {
		flags |= respNilBody
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(len(resp.Body)))
	b = append(b, resp.Body...)
	return headercodec.Append(b, resp.Header, resp.Trailer)
}

// errCorrupt says that a record does not decode, which cannot happen: the store decodes
// only what it encoded.
var errCorrupt = errors.New("memstore: corrupt record")

// decodeResponse returns the response that b encodes. Its body is a copy: the caller
// may change it.
func decodeResponse(b []byte) *idempotency.Response {
	status, k := binary.Varint(b)
	if k <= 0 || len(b) == k {
		panic(errCorrupt)
	}
	flags := b[k]
	b = b[k+1:]
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		panic(errCorrupt)
	}
	body, rest := b[k:k+int(n)], b[k+int(n):]
	header, trailer, err := headercodec.Decode(rest)
	if err != nil {
		panic(fmt.Errorf("%w: %w", errCorrupt, err))
	}
	if header == nil {
		header = http.Header{} // a stored response always has a header map
	}
	resp := &idempotency.Response{Status: int(status), Header: header, Trailer: trailer, BodyOmitted: flags&respOmitted != 0}
	if flags&respNilBody == 0 {
		resp.Body = slices.Clone(body) // not nil: body is a part of b
	}
	return resp
}
