package tlsreload_test

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/tlsreload"
	"github.com/retrysafe/retrysafe/internal/tlsreload/tlstest"
)

// logBuf collects JSON log lines.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// lines returns the lines logged at level with msg.
func (l *logBuf) lines(t *testing.T, level, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["level"] == level && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

type fixture struct {
	ca                *tlstest.CA
	certFile, keyFile string
	log               *logBuf
	opt               tlsreload.Options
}

func newFixture(t *testing.T) *fixture {
	dir := t.TempDir()
	f := &fixture{ca: tlstest.NewCA(t), certFile: filepath.Join(dir, "tls.crt"), keyFile: filepath.Join(dir, "tls.key"), log: &logBuf{}}
	f.opt = tlsreload.Options{Logger: slog.New(slog.NewJSONHandler(f.log, nil))}
	return f
}

// serve serves p's pair over HTTPS on a loopback port until the test ends, and returns
// its URL.
func serve(t *testing.T, p *tlsreload.Pair) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.Proto)
	}), ErrorLog: log.New(io.Discard, "", 0)} // the refused handshakes the tests make
	go func() { _ = srv.Serve(tls.NewListener(ln, p.ServerConfig())) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + ln.Addr().String()
}

// get sends GET url on a new connection, trusting ca alone, and returns the serial of
// the certificate served and the protocol the server says it spoke.
func get(t *testing.T, ca *tlstest.CA, url string, cfg *tls.Config) (serial, proto string, err error) {
	t.Helper()
	if cfg == nil {
		cfg = &tls.Config{}
	}
	cfg.RootCAs = ca.Pool()
	// HTTP/2 is attempted unless the test's config asks for HTTP/1.1 alone.
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: len(cfg.NextProtos) == 0}
	defer tr.CloseIdleConnections()
	res, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get(url)
	if err != nil {
		return "", "", err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return "", "", err
	}
	return fmt.Sprintf("%X", res.TLS.PeerCertificates[0].SerialNumber), string(body), nil
}

func TestServeAndReload(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ca.WriteLeaf(t, f.certFile, f.keyFile, tlstest.Leaf{Serial: 0x1A})
	p, err := tlsreload.Load(f.certFile, f.keyFile, f.opt)
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, p)
	serial, proto, err := get(t, f.ca, url, nil)
	if err != nil || serial != "1A" || proto != "HTTP/2.0" {
		t.Fatalf("GET: serial %q, proto %q, err %v; want 1A over HTTP/2.0", serial, proto, err)
	}
	if _, proto, err := get(t, f.ca, url, &tls.Config{NextProtos: []string{"http/1.1"}}); err != nil || proto != "HTTP/1.1" {
		t.Fatalf("an HTTP/1.1 client: proto %q, err %v", proto, err)
	}
	if got := f.log.lines(t, "INFO", "TLS certificate loaded"); len(got) != 1 || got[0]["serial"] != "1A" ||
		got[0]["subject"] != "CN=retrysafe test server" || got[0]["cert"] != f.certFile || got[0]["not_after"] == "" {
		t.Errorf("the load's line: %v", got)
	}

	f.ca.WriteLeaf(t, f.certFile, f.keyFile, tlstest.Leaf{Serial: 0x2B})
	if err := p.Reload(); err != nil {
		t.Fatal(err)
	}
	if serial, _, err := get(t, f.ca, url, nil); err != nil || serial != "2B" {
		t.Fatalf("after the reload: serial %q, err %v; want 2B", serial, err)
	}
	if got := f.log.lines(t, "INFO", "TLS certificate reloaded"); len(got) != 1 || got[0]["serial"] != "2B" {
		t.Errorf("the reload's line: %v", got)
	}
	if p.Leaf().SerialNumber.Int64() != 0x2B {
		t.Errorf("Leaf: serial %v", p.Leaf().SerialNumber)
	}
}

func TestMinVersion(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ca.WriteLeaf(t, f.certFile, f.keyFile, tlstest.Leaf{Serial: 1})
	p, err := tlsreload.Load(f.certFile, f.keyFile, f.opt)
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, p)
	_, _, err = get(t, f.ca, url, &tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11})
	if err == nil || !strings.Contains(err.Error(), "protocol version") {
		t.Fatalf("a TLS 1.1 client: %v, want a protocol version alert", err)
	}
	if _, _, err := get(t, f.ca, url, &tls.Config{MaxVersion: tls.VersionTLS12}); err != nil {
		t.Fatalf("a TLS 1.2 client: %v", err)
	}
}

// TestRefused: files that do not make a pair fail Load, and make Reload keep the pair
// it serves, with one ERROR line naming the file.
func TestRefused(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	otherCert, _ := ca.Issue(t, tlstest.Leaf{Serial: 9})
	_, otherKey := ca.Issue(t, tlstest.Leaf{Serial: 10})
	expiredCert, expiredKey := ca.Issue(t, tlstest.Leaf{Serial: 11, NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	cases := []struct {
		name      string
		cert, key []byte // nil: no such file
		want      string // the file named in the error is "cert" or "key"
		wantFile  string
	}{
		{"garbage certificate", []byte("not PEM\n"), otherKey, "no PEM CERTIFICATE block", "cert"},
		{"key in the certificate's place", otherKey, otherKey, "no PEM CERTIFICATE block", "cert"},
		{"truncated certificate", otherCert[:len(otherCert)/2], otherKey, "no PEM CERTIFICATE block", "cert"},
		{"mismatched pair", otherCert, otherKey, "private key does not match public key", "key"},
		{"garbage key", otherCert, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), "key", "key"},
		{"missing certificate", nil, otherKey, "no such file", "cert"},
		{"missing key", otherCert, nil, "no such file", "key"},
		{"expired", expiredCert, expiredKey, "expired at", "cert"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.ca = ca
			f.ca.WriteLeaf(t, f.certFile, f.keyFile, tlstest.Leaf{Serial: 7})
			p, err := tlsreload.Load(f.certFile, f.keyFile, f.opt)
			if err != nil {
				t.Fatal(err)
			}
			url := serve(t, p)
			write := func(name string, data []byte) {
				if data == nil {
					if err := os.Remove(name); err != nil {
						t.Fatal(err)
					}
					return
				}
				tlstest.WriteFile(t, name, data)
			}
			write(f.certFile, c.cert)
			write(f.keyFile, c.key)
			named := map[string]string{"cert": f.certFile, "key": f.keyFile}[c.wantFile]
			check := func(what string, err error) {
				t.Helper()
				if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), named) {
					t.Errorf("%s: %v, want an error with %q naming %s", what, err, c.want, named)
				}
			}
			check("Reload", p.Reload())
			if serial, _, err := get(t, ca, url, nil); err != nil || serial != "7" {
				t.Errorf("after the refused reload: serial %q, err %v; want the pair served before, 7", serial, err)
			}
			errs := f.log.lines(t, "ERROR", "TLS certificate reload refused; the serving certificate stays")
			if len(errs) != 1 || !strings.Contains(errs[0]["err"].(string), named) || errs[0]["serving_serial"] != "7" {
				t.Errorf("the refusal's lines: %v", errs)
			}
			if got := f.log.lines(t, "INFO", "TLS certificate reloaded"); len(got) != 0 {
				t.Errorf("a reload was logged: %v", got)
			}
			_, err = tlsreload.Load(f.certFile, f.keyFile, f.opt)
			check("Load", err)
		})
	}
}

// TestExpiresSoon: a certificate near its end is served, with a WARN line.
func TestExpiresSoon(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name                string
		notBefore, notAfter time.Time
		warn                bool
	}{
		{"90 days, 60 left", now.Add(-30 * 24 * time.Hour), now.Add(60 * 24 * time.Hour), false},
		{"90 days, 3 left", now.Add(-87 * 24 * time.Hour), now.Add(3 * 24 * time.Hour), true},
		{"a day, 20h left", now.Add(-4 * time.Hour), now.Add(20 * time.Hour), false},
		{"a day, 6h left", now.Add(-18 * time.Hour), now.Add(6 * time.Hour), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.opt.Now = func() time.Time { return now }
			f.ca.WriteLeaf(t, f.certFile, f.keyFile, tlstest.Leaf{Serial: 3, NotBefore: c.notBefore, NotAfter: c.notAfter})
			if _, err := tlsreload.Load(f.certFile, f.keyFile, f.opt); err != nil {
				t.Fatal(err)
			}
			warns := f.log.lines(t, "WARN", "TLS certificate expires soon; renew it and send SIGHUP")
			if got := len(warns) == 1; got != c.warn || len(warns) > 1 {
				t.Errorf("warning lines %v, want a warning: %v", warns, c.warn)
			}
		})
	}
}

// TestReloadDuringHandshakes: handshakes while the pair is swapped see one pair or
// the other, whole (run with -race).
func TestReloadDuringHandshakes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ca.WriteLeaf(t, f.certFile, f.keyFile, tlstest.Leaf{Serial: 1})
	p, err := tlsreload.Load(f.certFile, f.keyFile, f.opt)
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, p)
	const reloads = 5
	done := make(chan struct{})
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, _, err := get(t, f.ca, url, nil); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := 2; i < 2+reloads; i++ {
		f.ca.WriteLeaf(t, f.certFile, f.keyFile, tlstest.Leaf{Serial: int64(i)})
		if err := p.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if serial, _, err := get(t, f.ca, url, nil); err != nil || serial != fmt.Sprintf("%X", 1+reloads) {
		t.Fatalf("after the reloads: %q %v", serial, err)
	}
}
