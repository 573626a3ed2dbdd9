package grpcidem_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/grpc/grpcidem"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// pki is a test CA that issues server and client certificates.
type pki struct {
	t    *testing.T
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newPKI(t *testing.T) *pki {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &pki{t: t, cert: cert, key: key, pool: pool}
}

func (p *pki) issue(serial int64, uri string, server bool) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: uri},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		u, err := url.Parse(uri)
		if err != nil {
			p.t.Fatal(err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		p.t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestPeerScope: with PeerScope, callers are told apart by their verified client
// certificates (their SPIFFE IDs): the same key from two callers is two operations, and
// a caller's retry is a replay.
func TestPeerScope(t *testing.T) {
	t.Parallel()
	ca := newPKI(t)
	serverCreds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{ca.issue(2, "server", true)},
		ClientCAs: ca.pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13})
	s := newSvc()
	addr, _ := serve(t, s, grpcidem.Config{Scope: grpcidem.PeerScope}, grpc.Creds(serverCreds))
	client := func(serial int64, id string) result {
		creds := credentials.NewTLS(&tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{ca.issue(serial, id, false)}, MinVersion: tls.VersionTLS13})
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return invoke(t.Context(), testgrpcClient(conn), "k-peer", "peer", "")
	}
	alice := client(3, "spiffe://example.org/alice")
	bob := client(4, "spiffe://example.org/bob")
	alice2 := client(5, "spiffe://example.org/alice") // a new certificate, the same identity
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
