// Package tlstest makes a certificate authority and the server certificates it signs,
// for tests that serve TLS to a real client: the client trusts the CA (Pool), the
// server serves a leaf written to files (WriteLeaf).
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"testing"
	"time"
)

// CA is a certificate authority made for one test.
type CA struct {
	Cert *x509.Certificate
	PEM  []byte // Cert, PEM-encoded, for clients that read a file (curl --cacert)
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA valid from an hour ago for a day.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "retrysafe test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}
}

// Pool returns a pool holding the CA alone, for tls.Config.RootCAs.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Leaf is what a certificate says beside its key.
type Leaf struct {
	Serial              int64
	NotBefore, NotAfter time.Time // zero: from an hour ago for a day
	// ClientURIs, when set, make the leaf a client certificate (for mutual TLS) whose
	// URI names are these (SPIFFE IDs, say), instead of a server certificate.
	ClientURIs []*url.URL
}

// Issue signs a server certificate for 127.0.0.1, ::1 and localhost with a new key (a
// client certificate, with Leaf.ClientURIs), and returns both PEM-encoded.
func (ca *CA) Issue(t testing.TB, l Leaf) (certPEM, keyPEM []byte) {
	t.Helper()
	if l.NotBefore.IsZero() {
		l.NotBefore = time.Now().Add(-time.Hour)
	}
	if l.NotAfter.IsZero() {
		l.NotAfter = l.NotBefore.Add(25 * time.Hour)
	}
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(l.Serial),
		Subject:      pkix.Name{CommonName: "retrysafe test server"},
		NotBefore:    l.NotBefore,
		NotAfter:     l.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	if l.ClientURIs != nil {
		tmpl.Subject.CommonName = "retrysafe test client"
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		tmpl.IPAddresses, tmpl.DNSNames, tmpl.URIs = nil, nil, l.ClientURIs
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

// WriteLeaf issues a leaf (Issue) and writes it to certFile and keyFile, replacing
// what they held.
func (ca *CA) WriteLeaf(t testing.TB, certFile, keyFile string, l Leaf) {
	t.Helper()
	certPEM, keyPEM := ca.Issue(t, l)
	WriteFile(t, certFile, certPEM)
	WriteFile(t, keyFile, keyPEM)
}

// WriteFile writes data to name, mode 0600, failing t on an error.
func WriteFile(t testing.TB, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}
