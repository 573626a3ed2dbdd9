package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/internal/tlsreload/tlstest"
)

// tlsReply is a reply over HTTPS, with the serial number of the certificate served and
// the protocol spoken.
type tlsReply struct {
	reply
	serial, proto string
}

// tlsDo sends req on a new connection of a client that trusts ca alone and offers
// HTTP/2, so that each request sees the certificate served at that moment.
func tlsDo(ca *tlstest.CA, req *http.Request) tlsReply {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	res, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return tlsReply{reply: reply{err: err}}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return tlsReply{reply: reply{status: res.StatusCode, header: res.Header, body: string(b), err: err},
		serial: fmt.Sprintf("%X", res.TLS.PeerCertificates[0].SerialNumber), proto: res.Proto}
}

func tlsPost(t *testing.T, ca *tlstest.CA, base, path, key string) tlsReply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(`{"amount":100}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return tlsDo(ca, req)
}

func tlsGet(t *testing.T, ca *tlstest.CA, u string) tlsReply {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tlsDo(ca, req)
}

// logged matches a JSON log line whose msg is msg and whose other members hold the
// values of want.
func logged(msg string, want map[string]string) func(string) bool {
	return func(line string) bool {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil || m["msg"] != msg {
			return false
		}
		for k, v := range want {
			if s, _ := m[k].(string); !strings.Contains(s, v) {
				return false
			}
		}
		return true
	}
}

// countLogged counts the lines logged with msg.
func countLogged(p *proc, msg string) int {
	n := 0
	for _, line := range strings.Split(p.log(), "\n") {
		if logged(msg, nil)(line) {
			n++
		}
	}
	return n
}

func hup(t *testing.T, p *proc) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}

const (
	msgReloaded = "TLS certificate reloaded"
	msgRefused  = "TLS certificate reload refused; the serving certificate stays"
)

// TestE2ETLS: with --tls-cert and --tls-key (from the environment), both listeners
// serve HTTPS to a real TLS client: a keyed POST runs once upstream and its retry is
// replayed, over HTTP/2; /readyz answers on the admin listener; plain HTTP is refused.
// A certificate renewed in place is served after SIGHUP, and a broken one is refused
// while the one served stays.
func TestE2ETLS(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	ca.WriteLeaf(t, certFile, keyFile, tlstest.Leaf{Serial: 0x100})
	up := newUpstream(t)
	gw := startGateway(t, []string{"RETRYSAFE_UPSTREAM=" + up.URL, "RETRYSAFE_TLS_CERT=" + certFile, "RETRYSAFE_TLS_KEY=" + keyFile},
		"--store", sqliteDSN(t))
	if !strings.HasPrefix(gw.addr, "https://") || !strings.HasPrefix(gw.admin, "https://") {
		t.Fatalf("the listening line does not say both listeners serve HTTPS: %s, %s", gw.addr, gw.admin)
	}
	gw.awaitLog("the certificate's line", 10*time.Second, logged("TLS certificate loaded", map[string]string{"serial": "100", "listener": "proxy, admin", "cert": certFile}))

	key := testenv.Name("tls")
	first := tlsPost(t, ca, gw.addr, "/pay", key)
	if first.err != nil || first.status != http.StatusCreated || first.serial != "100" || first.proto != "HTTP/2.0" {
		t.Fatalf("the first POST: %v, serial %s, %s; want 201 from serial 100 over HTTP/2.0", first.reply, first.serial, first.proto)
	}
	retry := tlsPost(t, ca, gw.addr, "/pay", key)
	if retry.status != http.StatusCreated || retry.body != first.body || retry.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry: %v, want the first answer replayed (%s)", retry.reply, first.body)
	}
	if n := up.callsFor(key); n != 1 {
		t.Fatalf("the upstream ran the keyed POST %d times, want 1", n)
	}
	if r := tlsGet(t, ca, gw.admin+"/readyz"); r.err != nil || r.status != http.StatusOK || r.serial != "100" {
		t.Fatalf("GET /readyz on the admin listener: %v, serial %s", r.reply, r.serial)
	}

	// Plain HTTP to either TLS port: refused, and nothing reaches the upstream.
	plainKey := testenv.Name("plain")
	for _, base := range []string{gw.addr, gw.admin} {
		plain := "http://" + strings.TrimPrefix(base, "https://")
		r := post(context.Background(), plain, "/pay", plainKey, `{}`)
		if r.err != nil || r.status != http.StatusBadRequest || !strings.Contains(r.body, "HTTP request to an HTTPS server") {
			t.Errorf("plain HTTP to %s: %v, want 400 Client sent an HTTP request to an HTTPS server", plain, r)
		}
	}
	if n := up.callsFor(plainKey); n != 0 {
		t.Errorf("plain HTTP reached the upstream %d times", n)
	}

	t.Run("curl", func(t *testing.T) {
		curl, err := exec.LookPath("curl")
		if err != nil {
			t.Skip("no curl on this machine")
		}
		caFile := filepath.Join(t.TempDir(), "ca.pem")
		tlstest.WriteFile(t, caFile, ca.PEM)
		run := func(args ...string) string {
			t.Helper()
			out, err := exec.Command(curl, append([]string{"-sS", "-i", "--cacert", caFile}, args...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("curl %v: %v\n%s", args, err, out)
			}
			return strings.ToLower(string(out))
		}
		k := testenv.Name("curl")
		post := []string{"-X", "POST", "-H", "Idempotency-Key: " + k, "-H", "Content-Type: application/json", "--data", "{}", gw.addr + "/pay"}
		if out := run(post...); !strings.HasPrefix(out, "http/2 201") {
			t.Errorf("curl's POST: %s", out)
		}
		if out := run(post...); !strings.HasPrefix(out, "http/2 201") || !strings.Contains(out, "idempotent-replayed: true") {
			t.Errorf("curl's retry: %s, want the answer replayed", out)
		}
		if n := up.callsFor(k); n != 1 {
			t.Errorf("curl's POST ran %d times upstream, want 1", n)
		}
		if out := run(gw.admin + "/readyz"); !strings.HasPrefix(out, "http/2 200") {
			t.Errorf("curl's GET /readyz: %s", out)
		}
	})

	// Renewed in place: served from the next connection on, on both listeners.
	ca.WriteLeaf(t, certFile, keyFile, tlstest.Leaf{Serial: 0x200})
	hup(t, gw)
	gw.awaitLog("the reload", 10*time.Second, logged(msgReloaded, map[string]string{"serial": "200", "cert": certFile}))
	for _, u := range []string{gw.addr + "/healthz", gw.admin + "/healthz"} {
		if r := tlsGet(t, ca, u); r.err != nil || r.serial != "200" {
			t.Errorf("GET %s after the reload: %v, serial %s, want 200", u, r.reply, r.serial)
		}
	}

	// A broken certificate: refused with one line naming the file; the served one stays.
	tlstest.WriteFile(t, certFile, []byte("-----BEGIN CERTIFICATE-----\nMIIB\n"))
	hup(t, gw)
	gw.awaitLog("the refusal", 10*time.Second, logged(msgRefused, map[string]string{"err": certFile, "serving_serial": "200"}))
	if r := tlsPost(t, ca, gw.addr, "/pay", key); r.err != nil || r.serial != "200" || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a retry after the refused reload: %v, serial %s; want the replay, served by 200", r.reply, r.serial)
	}
	if r := tlsGet(t, ca, gw.admin+"/readyz"); r.err != nil || r.status != http.StatusOK || r.serial != "200" {
		t.Errorf("GET /readyz after the refused reload: %v, serial %s", r.reply, r.serial)
	}
	if n := up.callsFor(key); n != 1 {
		t.Errorf("the upstream ran the keyed POST %d times, want 1", n)
	}
	// One pair for both listeners: one line for each reload.
	if r, f := countLogged(gw, msgReloaded), countLogged(gw, msgRefused); r != 1 || f != 1 {
		t.Errorf("%d reload and %d refusal lines, want 1 and 1", r, f)
	}
	if strings.Contains(gw.log(), "SIGHUP ignored") {
		t.Errorf("SIGHUP was ignored:\n%s", gw.log())
	}
}

// TestE2ETLSConfigFile: the file's tls and admin_tls give each listener its pair;
// SIGHUP reads both pairs and the file again; a file that names other certificate
// files is taken, but its new files only at a restart, which the reload says.
func TestE2ETLSConfigFile(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	file := func(name string) string { return filepath.Join(dir, name) }
	ca.WriteLeaf(t, file("proxy.crt"), file("proxy.key"), tlstest.Leaf{Serial: 0x300})
	ca.WriteLeaf(t, file("admin.crt"), file("admin.key"), tlstest.Leaf{Serial: 0x400})
	config := func(proxyCert string) string {
		return fmt.Sprintf("upstreams:\n  api: ${API_URL}\ntls: {cert: %s, key: %s}\nadmin_tls:\n  cert: %s\n  key: %s\n",
			file(proxyCert), file("proxy.key"), file("admin.crt"), file("admin.key"))
	}
	cfgFile := file("gateway.yaml")
	tlstest.WriteFile(t, cfgFile, []byte(config("proxy.crt")))
	up := newUpstream(t)
	gw := startGateway(t, []string{"API_URL=" + up.URL}, "--config", cfgFile, "--store", "memory:")

	serials := func() (proxy, admin string) {
		p, a := tlsGet(t, ca, gw.addr+"/healthz"), tlsGet(t, ca, gw.admin+"/readyz")
		if p.err != nil || a.err != nil || a.status != http.StatusOK {
			t.Fatalf("proxy: %v; admin: %v", p.reply, a.reply)
		}
		return p.serial, a.serial
	}
	if p, a := serials(); p != "300" || a != "400" {
		t.Fatalf("serials %s and %s, want 300 on the proxy and 400 on the admin listener", p, a)
	}
	key := testenv.Name("tlsfile")
	if r := tlsPost(t, ca, gw.addr, "/pay", key); r.status != http.StatusCreated {
		t.Fatalf("POST: %v", r.reply)
	}

	// The admin listener's certificate renewed, and a file that names another proxy
	// certificate: both pairs read again, the file's new name kept for a restart.
	ca.WriteLeaf(t, file("admin.crt"), file("admin.key"), tlstest.Leaf{Serial: 0x401})
	otherCert, _ := ca.Issue(t, tlstest.Leaf{Serial: 0x999})
	tlstest.WriteFile(t, file("other.crt"), otherCert) // never read: its name takes a restart
	tlstest.WriteFile(t, cfgFile, []byte(config("other.crt")))
	hup(t, gw)
	gw.awaitLog("the admin pair's reload", 10*time.Second, logged(msgReloaded, map[string]string{"serial": "401", "listener": "admin"}))
	gw.awaitLog("the file's reload", 10*time.Second, logged("config reloaded, but these settings take effect only at a restart; the running ones stay", map[string]string{"settings": "tls"}))
	if p, a := serials(); p != "300" || a != "401" {
		t.Fatalf("after SIGHUP: serials %s and %s, want 300 and 401", p, a)
	}
	if n := countLogged(gw, msgRefused); n != 0 {
		t.Errorf("%d refusals:\n%s", n, gw.log())
	}
	if r := tlsPost(t, ca, gw.addr, "/pay", key); r.header.Get("Idempotent-Replayed") != "true" || up.callsFor(key) != 1 {
		t.Errorf("the retry: %v; upstream calls %d", r.reply, up.callsFor(key))
	}
}

// TestE2ESIGHUPNothingToReload: without a file or a certificate, SIGHUP is logged and
// ignored, and the gateway serves on.
func TestE2ESIGHUPNothingToReload(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	gw := startGateway(t, nil, "--upstream", up.URL, "--store", "memory:")
	hup(t, gw)
	gw.awaitLog("the line", 10*time.Second, logged("SIGHUP ignored: there is no --config file or TLS certificate to reload", nil))
	if r := post(context.Background(), gw.addr, "/pay", testenv.Name("hup"), `{}`); r.status != http.StatusCreated {
		t.Fatalf("after SIGHUP: %v", r)
	}
}

// TestE2ETLSBadFlags: a certificate without its key, a file missing, a pair that does
// not match: one line on stderr, exit status 2, before listening.
func TestE2ETLSBadFlags(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	file := func(name string) string { return filepath.Join(dir, name) }
	ca.WriteLeaf(t, file("a.crt"), file("a.key"), tlstest.Leaf{Serial: 1})
	ca.WriteLeaf(t, file("b.crt"), file("b.key"), tlstest.Leaf{Serial: 2})
	ca.WriteLeaf(t, file("old.crt"), file("old.key"), tlstest.Leaf{Serial: 3, NotBefore: time.Now().Add(-72 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	tlstest.WriteFile(t, file("junk.crt"), []byte("not a certificate\n"))
	tlstest.WriteFile(t, file("half.yaml"), []byte("upstreams: {api: 'http://127.0.0.1:1'}\ntls:\n  cert: "+file("a.crt")+"\n"))
	missing := file("missing.crt")
	cases := []struct {
		name string
		env  []string
		args []string
		want []string // in the message
	}{
		{"cert without key", nil, []string{"--tls-cert", file("a.crt")}, []string{"--tls-cert needs --tls-key"}},
		{"key without cert", nil, []string{"--tls-key", file("a.key")}, []string{"--tls-key needs --tls-cert"}},
		{"cert without key from env", []string{"RETRYSAFE_TLS_CERT=" + file("a.crt")}, nil, []string{"--tls-cert needs --tls-key"}},
		{"admin cert without key", nil, []string{"--admin-tls-cert", file("a.crt")}, []string{"--admin-tls-cert needs --admin-tls-key"}},
		{"missing file", nil, []string{"--tls-cert", missing, "--tls-key", file("a.key")}, []string{missing, "no such file"}},
		{"mismatched pair", nil, []string{"--tls-cert", file("a.crt"), "--tls-key", file("b.key")}, []string{file("b.key"), "private key does not match public key"}},
		{"not a certificate", nil, []string{"--tls-cert", file("junk.crt"), "--tls-key", file("a.key")}, []string{file("junk.crt"), "no PEM CERTIFICATE"}},
		{"expired", nil, []string{"--tls-cert", file("old.crt"), "--tls-key", file("old.key")}, []string{file("old.crt"), "expired at"}},
		{"admin pair mismatched", nil, []string{"--tls-cert", file("a.crt"), "--tls-key", file("a.key"), "--admin-tls-cert", file("b.crt"), "--admin-tls-key", file("a.key")},
			[]string{"admin listener", "private key does not match"}},
		{"admin pair without admin", nil, []string{"--admin", "off", "--admin-tls-cert", file("a.crt"), "--admin-tls-key", file("a.key")}, []string{"--admin off"}},
		{"half pair in the file", nil, []string{"--config", file("half.yaml")}, []string{"half.yaml:2: tls: want both cert and key"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"gateway", "--store", "memory:", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}
			if !strings.Contains(strings.Join(c.args, " "), "--config") {
				args = append(args, "--upstream", "http://127.0.0.1:1")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary, append(args, c.args...)...)
			cmd.Env = env(append([]string{"RETRYSAFE_LOG_LEVEL=error"}, c.env...)...)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			_ = cmd.Run()
			msg := stderr.String()
			if code := cmd.ProcessState.ExitCode(); code != exitUsage {
				t.Errorf("exit status %d, want 2; stderr %q", code, msg)
			}
			if strings.Count(msg, "\n") != 1 || !strings.HasSuffix(msg, "\n") {
				t.Errorf("stderr is not one line: %q", msg)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("stderr %q does not say %q", msg, w)
				}
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout: %q", stdout.String())
			}
		})
	}
}
