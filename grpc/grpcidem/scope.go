package grpcidem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// AuthorizationScope is the default scope: the SHA-256 of the call's authorization
// metadata (all its values, in order), or "" (one anonymous scope) when there is none,
// as the HTTP middleware scopes by the Authorization header. Two callers with different
// credentials never share a key.
func AuthorizationScope(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	vs := md.Get("authorization")
	if len(vs) == 0 {
		return ""
	}
	h := sha256.New()
	for _, v := range vs {
		h.Write([]byte(v))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// MetadataScope returns a scope that is the value of the named metadata entry, as set by
// the authentication layer in front (which must overwrite any value a client sends: the
// entry is trusted as it is). A call without it is the anonymous scope "".
func MetadataScope(name string) func(context.Context) string {
	return func(ctx context.Context) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if vs := md.Get(name); len(vs) > 0 {
			return vs[0]
		}
		return ""
	}
}

// PeerScope scopes calls by the authenticated peer of a mutual-TLS connection: the URI
// names of its verified certificate (a SPIFFE ID, for a service mesh) when it has any,
// else its subject, hashed. A call over a connection without a verified client
// certificate is the anonymous scope "": use PeerScope only on a server that requires
// client certificates (tls.RequireAndVerifyClientCert).
func PeerScope(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return ""
	}
	leaf := info.State.VerifiedChains[0][0]
	h := sha256.New()
	if len(leaf.URIs) > 0 {
		for _, u := range leaf.URIs {
			h.Write([]byte("uri:" + u.String()))
			h.Write([]byte{0})
		}
	} else {
		h.Write([]byte("subject:"))
		h.Write(leaf.RawSubject)
	}
	return hex.EncodeToString(h.Sum(nil))
}
