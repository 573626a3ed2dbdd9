package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/tcpproxy"
	"github.com/retrysafe/retrysafe/harness/testenv"
)

// heldRun is a Caddy on PostgreSQL, reached through a TCP proxy of the test's, whose
// first keyed request executed while the proxy was cut: its answer is held.
type heldRun struct {
	p     *caddyProc
	up    *upstream
	link  *tcpproxy.Proxy
	dsn   string // through the proxy
	plain string // the same database and schema, direct
	first answer
}

// heldSite is the site block of the store dsn with a ttl, in front of up.
func heldSite(dsn, ttl string, up *upstream) string {
	return fmt.Sprintf("%%s {\n\tidempotency {\n\t\tstore %s\n\t\tttl %s\n\t}\n\treverse_proxy %s\n}\n",
		strings.ReplaceAll(dsn, "%", "%%"), ttl, up.URL)
}

// startHeld starts Caddy and sends the keyed request whose answer the store cannot
// take: the upstream executes it, and the store link is cut before it answers.
func startHeld(t *testing.T) *heldRun {
	t.Helper()
	u := postgresDSN(t, "caddyheld")
	link, err := tcpproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	h := &heldRun{up: newUpstream(t), link: link, plain: u.String()}
	u.Host = link.Addr()
	h.dsn = u.String()
	var cut sync.Once
	h.up.hold = func(r *http.Request) {
		if r.URL.Path == "/payments" {
			cut.Do(link.Cut)
		}
	}
	h.p = startCaddy(t, heldSite(h.dsn, "24h", h.up))
	h.first = send(t, "POST", h.p.base+"/payments", "k-held", `{"amount":1}`)
	if h.first.status != 200 || !link.Partitioned() {
		t.Fatalf("the keyed request executed while the store link was cut: %d %q (cut %v), want 200", h.first.status, h.first.body, link.Partitioned())
	}
	if strings.Contains(h.p.log.String(), "idempotency: held response stored") {
		t.Fatal("the answer was stored while the store link was cut")
	}
	return h
}

// reload replaces Caddy's configuration with site through the admin API.
func (p *caddyProc) reload(t *testing.T, site string) {
	t.Helper()
	if err := os.WriteFile(p.path, []byte(p.config(site)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(caddyBin, "reload", "--config", p.path, "--adapter", "caddyfile", "--address", p.admin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("caddy reload: %v\n%s", err, out)
	}
}

// replayedElsewhere checks that a Caddy of its own on the store, without the proxy and
// without anything held, replays the first answer: the store holds it.
func (h *heldRun) replayedElsewhere(t *testing.T) {
	t.Helper()
	other := startCaddy(t, heldSite(h.plain, "24h", h.up))
	a := send(t, "POST", other.base+"/payments", "k-held", `{"amount":1}`)
	if a.body != h.first.body || a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a retry through another Caddy on the store: %d %q, want the first answer replayed from the store (%q)", a.status, a.body, h.first.body)
	}
	if n := h.up.count("/payments"); n != 1 {
		t.Errorf("the upstream executed the keyed request %d times, want 1", n)
	}
}

// TestHeldAcrossReload: an answer held because the store link was cut when the request
// completed survives a reload that keeps the store: a retry during the outage, after the
// reload, is answered from the held answer (not executed again); once the link is back
// the held answer is stored, and replayed from the store.
func TestHeldAcrossReload(t *testing.T) {
	t.Parallel()
	h := startHeld(t)
	h.p.reload(t, heldSite(h.dsn, "25h", h.up))
	a := send(t, "POST", h.p.base+"/payments", "k-held", `{"amount":1}`)
	if a.status != 200 || a.body != h.first.body {
		t.Errorf("a retry after the reload, the store unreachable: %d %q, want the held answer %q", a.status, a.body, h.first.body)
	}
	if n := h.up.count("/payments"); n != 1 {
		t.Fatalf("after the reload the keyed request was executed %d times, want 1", n)
	}
	h.link.Restore()
	testenv.Eventually(t, 60*time.Second, func() bool {
		return strings.Contains(h.p.log.String(), "idempotency: held response stored")
	}, "the held answer to be stored once the link is back")
	if a := send(t, "POST", h.p.base+"/payments", "k-held", `{"amount":1}`); a.body != h.first.body || a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a retry after the link is back: %d %q, want the first answer replayed", a.status, a.body)
	}
	h.replayedElsewhere(t)
	if n := strings.Count(h.p.log.String(), "idempotency: store opened"); n != 1 {
		t.Errorf("the store was opened %d times, want once (shared across the reload)", n)
	}
}

// TestHeldHandlerDropped: a reload to a configuration without the handler closes the
// store, and the close stores the held answers for up to its shutdown timeout: a link
// back while the old configuration is stopped (before or during the close) has the held
// answer stored; a link still cut when the timeout ends loses it, and says so in the log
// (the key stays in progress until its lease ends, then a retry runs the request again).
func TestHeldHandlerDropped(t *testing.T) {
	t.Parallel()
	bare := func(up *upstream) string { return fmt.Sprintf("%%s {\n\treverse_proxy %s\n}\n", up.URL) }
	t.Run("link back", func(t *testing.T) {
		t.Parallel()
		h := startHeld(t)
		reloaded := make(chan struct{})
		go func() {
			defer close(reloaded)
			// Off the test's goroutine: the reload returns once the store is closed.
			if err := os.WriteFile(h.p.path, []byte(h.p.config(bare(h.up))), 0o600); err != nil {
				t.Error(err)
				return
			}
			cmd := exec.Command(caddyBin, "reload", "--config", h.p.path, "--adapter", "caddyfile", "--address", h.p.admin)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("caddy reload: %v\n%s", err, out)
			}
		}()
		// A keyed POST without a key is forwarded once the configuration without the
		// handler serves; the old one is being stopped. A keep-alive connection the old
		// configuration's server closes mid-reload is reset: that probe failed, the next
		// one asks again.
		testenv.Eventually(t, 60*time.Second, func() bool {
			a, err := do("POST", h.p.base+"/probe", "", `{}`)
			return err == nil && a.status == 200
		}, "the configuration without the handler to serve")
		h.link.Restore()
		<-reloaded
		log := h.p.log.String()
		if !strings.Contains(log, "idempotency: store closed") {
			t.Fatalf("the reload did not close the store")
		}
		if !strings.Contains(log, "idempotency: held response stored") || strings.Contains(log, "not stored before shutdown") {
			t.Errorf("the held answer was not stored when the store was closed with its link back")
		}
		h.replayedElsewhere(t)
	})
	t.Run("link cut", func(t *testing.T) {
		t.Parallel()
		h := startHeld(t)
		h.p.reload(t, bare(h.up))
		log := h.p.log.String()
		if !strings.Contains(log, "idempotency: store closed") {
			t.Fatalf("the reload did not close the store")
		}
		if !strings.Contains(log, "idempotency: response not stored before shutdown") {
			t.Errorf("a held answer the closed store could not take was not reported lost in the log")
		}
	})
}
