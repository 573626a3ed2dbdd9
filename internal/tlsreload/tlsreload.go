// Package tlsreload serves a certificate and its private key read from two PEM files,
// and reads them again when told to (retrysafe gateway does on SIGHUP), so that a
// renewed certificate is served without a restart and without dropping a connection.
//
// A reload swaps the pair only once both files have been read and checked together: a
// file half written, a key that does not match its certificate or a certificate
// already expired leaves the serving pair in place, as a reload may be asked for at any
// moment of a renewal, and serving nothing (or a broken pair) would refuse every client.
package tlsreload

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// MinVersion is the lowest TLS version ServerConfig accepts: TLS 1.0 and 1.1 are
// deprecated (RFC 8996), and every client still in use speaks 1.2.
const MinVersion = tls.VersionTLS12

// SoonWindow is the longest warning a certificate gets before it expires: a pair whose
// certificate has less than this left, or less than a third of its lifetime (for
// certificates that live hours or days), is logged at WARN level when it is loaded, as
// its renewal is late.
const SoonWindow = 7 * 24 * time.Hour

// Options are what Load takes besides the files. The zero value is ready to use.
type Options struct {
	// Logger receives the lines of Load and Reload. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock a certificate's expiry is checked against. Default time.Now.
	Now func() time.Time
}

// Pair is a certificate and key pair read from files, the one now served in an atomic
// pointer, so that handshakes never wait on a reload.
type Pair struct {
	certFile, keyFile string
	opt               Options
	mu                sync.Mutex // one Reload at a time: two must not swap out of order
	cur               atomic.Pointer[tls.Certificate]
}

// Load reads the certificate (the leaf first, then any intermediates) from certFile
// and its private key from keyFile, checks that they match and that the certificate
// has not expired, and logs the certificate it serves (INFO), or that it expires soon
// (WARN, see SoonWindow). Its error names the file at fault.
func Load(certFile, keyFile string, opt Options) (*Pair, error) {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	p := &Pair{certFile: certFile, keyFile: keyFile, opt: opt}
	c, err := p.read()
	if err != nil {
		return nil, err
	}
	p.cur.Store(c)
	p.logServed("TLS certificate loaded", c)
	return p, nil
}

// Reload reads both files again and, when they load as Load requires, serves them
// from the next handshake on (connections already open keep theirs) and logs the new
// certificate at INFO level. Otherwise it logs one ERROR line naming the file and the
// reason, keeps serving the pair it had, and returns that error too.
func (p *Pair) Reload() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, err := p.read()
	if err != nil {
		p.opt.Logger.Error("TLS certificate reload refused; the serving certificate stays",
			"err", err.Error(), "serving_serial", serial(p.cur.Load().Leaf))
		return err
	}
	p.cur.Store(c)
	p.logServed("TLS certificate reloaded", c)
	return nil
}

// GetCertificate returns the pair now served, for tls.Config.GetCertificate.
func (p *Pair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return p.cur.Load(), nil
}

// Leaf returns the certificate now served.
func (p *Pair) Leaf() *x509.Certificate { return p.cur.Load().Leaf }

// ServerConfig returns a server configuration that serves the pair (reloads
// included), TLS 1.2 at least, with HTTP/2 offered before HTTP/1.1 (ALPN), so that an
// http.Server serving a tls.NewListener of it speaks both.
func (p *Pair) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     MinVersion,
		GetCertificate: p.GetCertificate,
		NextProtos:     []string{"h2", "http/1.1"},
	}
}

// read reads and checks both files.
func (p *Pair) read() (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(p.certFile)
	if err != nil {
		return nil, fmt.Errorf("reading the certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(p.keyFile)
	if err != nil {
		return nil, fmt.Errorf("reading the key: %w", err)
	}
	// The certificate file alone first, so that an error in it is not blamed on the key.
	var der []byte
	for rest := certPEM; der == nil; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return nil, fmt.Errorf("certificate %s: no PEM CERTIFICATE block in it", p.certFile)
		}
		if b.Type == "CERTIFICATE" {
			der = b.Bytes
		}
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: %w", p.certFile, err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("key %s (of certificate %s): %s", p.keyFile, p.certFile, strings.TrimPrefix(err.Error(), "tls: "))
	}
	c.Leaf = leaf
	if now := p.opt.Now(); now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("certificate %s expired at %s", p.certFile, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return &c, nil
}

// logServed logs the certificate c, now served, and warns when it expires soon.
func (p *Pair) logServed(msg string, c *tls.Certificate) {
	attrs := []any{"cert", p.certFile, "subject", c.Leaf.Subject.String(), "serial", serial(c.Leaf),
		"not_after", c.Leaf.NotAfter.UTC().Format(time.RFC3339)}
	p.opt.Logger.Info(msg, attrs...)
	if left, soon := expiresSoon(c.Leaf, p.opt.Now()); soon {
		p.opt.Logger.Warn("TLS certificate expires soon; renew it and send SIGHUP", append(attrs, "left", left.Round(time.Minute).String())...)
	}
}

// expiresSoon reports how long leaf has left at now, and whether that is less than
// SoonWindow or a third of its lifetime, whichever is shorter.
func expiresSoon(leaf *x509.Certificate, now time.Time) (time.Duration, bool) {
	left := leaf.NotAfter.Sub(now)
	return left, left < min(SoonWindow, leaf.NotAfter.Sub(leaf.NotBefore)/3)
}

// serial is a certificate's serial number as openssl x509 -serial prints it.
func serial(c *x509.Certificate) string {
	if c == nil || c.SerialNumber == nil {
		return ""
	}
	return fmt.Sprintf("%X", c.SerialNumber)
}
