package grpcidem

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// KeyMetadata is the metadata entry a key is read from by default, the same name the
// client interceptor (grpcretry.KeyMetadata) sends it under.
const KeyMetadata = "idempotency-key"

// KeyFunc returns the key of a call to method with request req, or "" when it has none.
// An error says the call's key is malformed; the call is refused with INVALID_ARGUMENT.
type KeyFunc func(ctx context.Context, method string, req proto.Message) (string, error)

// MetadataKey is the default KeyFunc: the idempotency-key metadata entry. More than one
// value is an error: a key is one operation's.
func MetadataKey(ctx context.Context, _ string, _ proto.Message) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vs := md.Get(KeyMetadata)
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
		if vs[0] == "" {
			return "", fmt.Errorf("empty %s", KeyMetadata)
		}
		return vs[0], nil
	default:
		return "", fmt.Errorf("%d values of %s; a call has one key", len(vs), KeyMetadata)
	}
}

// FieldKey returns a KeyFunc that reads the key from a string field of the request
// message, by its dotted path of field names ("request_id", "options.request_id"), as
// AIP-155 asks APIs to carry a request_id. A request whose message has no such field,
// or leaves it empty (a message field on the path unset included), has no key. The
// key is part of the request, so it is covered by the fingerprint too.
func FieldKey(path string) KeyFunc {
	names := strings.Split(path, ".")
	return func(_ context.Context, _ string, req proto.Message) (string, error) {
		if req == nil {
			return "", nil
		}
		m := req.ProtoReflect()
		for i, name := range names {
			fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
			if fd == nil {
				return "", nil
			}
			last := i == len(names)-1
			switch {
			case last && fd.Kind() == protoreflect.StringKind && !fd.IsList() && !fd.IsMap():
				return m.Get(fd).String(), nil
			case !last && fd.Kind() == protoreflect.MessageKind && !fd.IsList() && !fd.IsMap():
				if !m.Has(fd) {
					return "", nil
				}
				m = m.Get(fd).Message()
			default:
				return "", fmt.Errorf("field %s of %s is not a string", path, req.ProtoReflect().Descriptor().FullName())
			}
		}
		return "", nil
	}
}

// FirstKey returns a KeyFunc that tries fs in order and returns the first key found:
// FirstKey(MetadataKey, FieldKey("request_id")) takes a key from either.
func FirstKey(fs ...KeyFunc) KeyFunc {
	return func(ctx context.Context, method string, req proto.Message) (string, error) {
		for _, f := range fs {
			k, err := f(ctx, method, req)
			if err != nil || k != "" {
				return k, err
			}
		}
		return "", nil
	}
}

// quoteKey writes a key as an RFC 8941 string, the form the engine parses without
// reading any character as a separator; the engine then checks its length and that it
// is visible ASCII.
func quoteKey(k string) string {
	var b strings.Builder
	b.Grow(len(k) + 2)
	b.WriteByte('"')
	for i := 0; i < len(k); i++ {
		if c := k[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(k[i])
	}
	b.WriteByte('"')
	return b.String()
}
