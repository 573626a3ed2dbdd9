package grpcidem

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
)

// The stored answer of a call is one protobuf-encoded envelope, the body of the record's
// response: its status code, the google.rpc.Status of a failure (message and details),
// the header and trailer metadata the method set, and the response message's bytes. The
// record's HTTP status is the code's (httpStatus), for operators' tools and for the
// engine's rule of which answers release the key.
const (
	fieldCode     = 1 // varint: the codes.Code
	fieldStatus   = 2 // bytes: google.rpc.Status of a failure
	fieldHeader   = 3 // bytes: one metadata pair (pairKey, pairValue)
	fieldTrailer  = 4 // bytes: one metadata pair
	fieldResponse = 5 // bytes: the response message, deterministically encoded
	pairKey       = 1
	pairValue     = 2
)

// envelope is a call's answer as it is stored and replayed.
type envelope struct {
	code     codes.Code
	status   []byte // google.rpc.Status; nil for OK
	header   metadata.MD
	trailer  metadata.MD
	response []byte // the response message; nil for a failure
	hasResp  bool
}

func (e *envelope) marshal() []byte {
	b := make([]byte, 0, 16+len(e.status)+len(e.response))
	b = protowire.AppendTag(b, fieldCode, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(e.code))
	if e.status != nil {
		b = protowire.AppendTag(b, fieldStatus, protowire.BytesType)
		b = protowire.AppendBytes(b, e.status)
	}
	b = appendMD(b, fieldHeader, e.header)
	b = appendMD(b, fieldTrailer, e.trailer)
	if e.hasResp {
		b = protowire.AppendTag(b, fieldResponse, protowire.BytesType)
		b = protowire.AppendBytes(b, e.response)
	}
	return b
}

func appendMD(b []byte, field protowire.Number, md metadata.MD) []byte {
	for k, vs := range md {
		for _, v := range vs {
			var p []byte
			p = protowire.AppendTag(p, pairKey, protowire.BytesType)
			p = protowire.AppendString(p, k)
			p = protowire.AppendTag(p, pairValue, protowire.BytesType)
			p = protowire.AppendString(p, v)
			b = protowire.AppendTag(b, field, protowire.BytesType)
			b = protowire.AppendBytes(b, p)
		}
	}
	return b
}

var errEnvelope = errors.New("grpcidem: the stored answer is not a call's envelope")

func unmarshalEnvelope(b []byte) (*envelope, error) {
	e := &envelope{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("%w: %w", errEnvelope, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == fieldCode && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: %w", errEnvelope, protowire.ParseError(n))
			}
			e.code, b = codes.Code(v), b[n:]
		case typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: %w", errEnvelope, protowire.ParseError(n))
			}
			b = b[n:]
			switch num {
			case fieldStatus:
				e.status = v
			case fieldResponse:
				e.response, e.hasResp = v, true
			case fieldHeader, fieldTrailer:
				k, val, err := consumePair(v)
				if err != nil {
					return nil, err
				}
				md := &e.header
				if num == fieldTrailer {
					md = &e.trailer
				}
				if *md == nil {
					*md = metadata.MD{}
				}
				(*md)[k] = append((*md)[k], val)
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, fmt.Errorf("%w: %w", errEnvelope, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	return e, nil
}

func consumePair(b []byte) (k, v string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return "", "", errEnvelope
		}
		b = b[n:]
		s, n := protowire.ConsumeString(b)
		if n < 0 {
			return "", "", errEnvelope
		}
		b = b[n:]
		switch num {
		case pairKey:
			k = s
		case pairValue:
			v = s
		}
	}
	return k, v, nil
}
