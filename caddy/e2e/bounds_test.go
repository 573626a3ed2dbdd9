package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// holdFirst makes up hold the first execution of path until release is closed, and
// signal executing when it starts.
func holdFirst(t *testing.T, up *upstream, path string) (executing <-chan struct{}, release func()) {
	t.Helper()
	ex, rel := make(chan struct{}, 1), make(chan struct{})
	var first sync.Once
	up.hold = func(r *http.Request) {
		held := false
		if r.URL.Path == path {
			first.Do(func() { held = true })
		}
		if held {
			ex <- struct{}{}
			<-rel
		}
	}
	var once sync.Once
	release = func() { once.Do(func() { close(rel) }) }
	t.Cleanup(release)
	return ex, release
}

// TestMaxBodyMemory: max_body_memory bounds the keyed bodies held in memory: with a
// 1 MiB ceiling, a keyed request with a 600 KiB body in progress leaves no room for
// another, which is answered 503 with Retry-After; without the setting (256 MiB) it is
// served.
func TestMaxBodyMemory(t *testing.T) {
	t.Parallel()
	for _, set := range []bool{true, false} {
		t.Run(fmt.Sprintf("set=%v", set), func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			executing, release := holdFirst(t, up, "/a")
			bound := "max_body 1MiB"
			if set {
				bound += "\n\t\tmax_body_memory 1MiB"
			}
			site := fmt.Sprintf("%%s {\n\tidempotency {\n\t\tstore sqlite:%s\n\t\t%s\n\t}\n\treverse_proxy %s\n}\n",
				filepath.Join(t.TempDir(), "keys.db"), bound, up.URL)
			base := startCaddy(t, site).base
			body := `{"pad":"` + strings.Repeat("x", 600<<10) + `"}`
			first := sendAsync("POST", base+"/a", "k-a", body)
			<-executing
			b := send(t, "POST", base+"/b", "k-b", body)
			release()
			if a := <-first; a.status != 200 {
				t.Errorf("the first request: %d %q, want 200", a.status, a.body)
			}
			switch {
			case set && (b.status != http.StatusServiceUnavailable || b.header.Get("Retry-After") == ""):
				t.Errorf("a second 600 KiB body while the first is held, max_body_memory 1MiB: %d %q %v, want 503 with Retry-After", b.status, b.body, b.header)
			case !set && b.status != 200:
				t.Errorf("a second 600 KiB body while the first is held, max_body_memory left out: %d %q, want 200", b.status, b.body)
			}
		})
	}
}

// TestMaxWaiters: max_waiters bounds the duplicates waiting at once under conflict
// wait: with max_waiters 1, of two duplicates of a request in progress one waits and is
// answered the first's answer, replayed, and the other is answered 409 with Retry-After
// while the first is still in progress.
func TestMaxWaiters(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	executing, release := holdFirst(t, up, "/payments")
	site := fmt.Sprintf("%%s {\n\tidempotency {\n\t\tstore sqlite:%s\n\t\tconflict wait\n\t\tmax_waiters 1\n\t}\n\treverse_proxy %s\n}\n",
		filepath.Join(t.TempDir(), "keys.db"), up.URL)
	base := startCaddy(t, site).base
	first := sendAsync("POST", base+"/payments", "k-w", `{"amount":1}`)
	<-executing
	dups := make(chan answer, 2)
	for range 2 {
		go func() { dups <- <-sendAsync("POST", base+"/payments", "k-w", `{"amount":1}`) }()
	}
	var refused answer
	select {
	case refused = <-dups:
	case <-time.After(30 * time.Second):
		// With the default ceiling both duplicates wait for the first, held here.
		t.Error("no duplicate was answered while the first request was in progress: both wait, past max_waiters 1")
	}
	release()
	a := <-first
	waited := <-dups
	if refused.status == 0 {
		refused = <-dups
	}
	if refused.status != http.StatusConflict || refused.header.Get("Retry-After") == "" {
		t.Errorf("the duplicate past max_waiters 1: %d %q %v, want 409 with Retry-After", refused.status, refused.body, refused.header)
	}
	if waited.status != 200 || waited.body != a.body || waited.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the duplicate that waited: %d %q, want the first's answer %q replayed", waited.status, waited.body, a.body)
	}
	if n := up.count("/payments"); n != 1 {
		t.Errorf("the upstream executed the payment %d times, want 1", n)
	}
}
