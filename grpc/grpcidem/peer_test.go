package grpcidem_test

import (
	"crypto/tls"
	"net/url"
	"testing"

	"github.com/retrysafe/retrysafe/grpc/grpcidem"
	"github.com/retrysafe/retrysafe/internal/tlsreload/tlstest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// certificate issues a leaf of ca as a tls.Certificate.
func certificate(t *testing.T, ca *tlstest.CA, l tlstest.Leaf) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(ca.Issue(t, l))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPeerScope: with PeerScope, callers are told apart by their verified client
// certificates (their SPIFFE IDs): the same key from two callers is two operations, and
// a caller's retry, with a new certificate of the same identity, is a replay.
func TestPeerScope(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	serverCreds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{certificate(t, ca, tlstest.Leaf{Serial: 2})},
		ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13})
	s := newSvc()
	addr, _ := serve(t, s, grpcidem.Config{Scope: grpcidem.PeerScope}, grpc.Creds(serverCreds))
	client := func(serial int64, id string) result {
		u, err := url.Parse(id)
		if err != nil {
			t.Fatal(err)
		}
		cert := certificate(t, ca, tlstest.Leaf{Serial: serial, ClientURIs: []*url.URL{u}})
		creds := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return invoke(t.Context(), testgrpcClient(conn), "k-peer", "peer", "")
	}
	alice := client(3, "spiffe://example.org/alice")
	bob := client(4, "spiffe://example.org/bob")
	alice2 := client(5, "spiffe://example.org/alice")
	for _, r := range []result{alice, bob, alice2} {
		if r.err != nil {
			t.Fatal(r.err)
		}
	}
	if n := s.count("peer"); n != 2 || bob.replayed() || !alice2.replayed() || alice2.String() != alice.String() {
		t.Errorf("executions %d (want 2: one per identity); bob replayed %v (want false); alice again %q replayed %v (want %q, true)",
			n, bob.replayed(), alice2, alice2.replayed(), alice)
	}
}
