package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/faultproxy"
	"github.com/retrysafe/retrysafe/harness/testenv"
)

// TestLostAnswers: a client that retries each payment with its key until it gets an
// answer, through a proxy in front of Caddy that loses or cuts a third of the answers
// after the upstream executed the request, gets every payment executed once. The same
// run without the directive executes some twice.
func TestLostAnswers(t *testing.T) {
	t.Parallel()
	const payments = 40
	for _, protected := range []bool{true, false} {
		t.Run(fmt.Sprintf("directive=%v", protected), func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			site := fmt.Sprintf("%%s {\n\treverse_proxy %s\n}\n", up.URL)
			if protected {
				site = fmt.Sprintf("%%s {\n\tidempotency {\n\t\tstore sqlite:%s\n\t}\n\treverse_proxy %s\n}\n", filepath.Join(t.TempDir(), "keys.db"), up.URL)
			}
			p := startCaddy(t, site)
			fp, err := faultproxy.Start(context.Background(), faultproxy.Config{Target: strings.TrimPrefix(p.base, "http://"),
				Seed: 7, ResponseLost: 0.15, ResponseReset: 0.1, Reset: 0.1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = fp.Close() })
			tr := &http.Transport{}
			t.Cleanup(tr.CloseIdleConnections)
			client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			attempts := 0
			for i := range payments {
				path := fmt.Sprintf("/payments/%d", i)
				for try := 1; ; try++ {
					if try > 30 {
						t.Fatalf("payment %d: no answer in 30 attempts", i)
					}
					attempts++
					req, err := http.NewRequest("POST", fp.URL()+path, strings.NewReader(`{"amount":1}`))
					if err != nil {
						t.Fatal(err)
					}
					req.Header.Set("Idempotency-Key", fmt.Sprintf("pay-%d", i))
					req.Header.Set("Content-Type", "application/json")
					res, err := client.Do(req)
					if err != nil {
						continue // the answer was lost: retry with the same key
					}
					_, rerr := io.Copy(io.Discard, res.Body)
					_ = res.Body.Close()
					if rerr == nil && res.StatusCode == 200 {
						break
					}
				}
			}
			dups, missing := 0, 0
			for i := range payments {
				switch n := up.count(fmt.Sprintf("/payments/%d", i)); {
				case n > 1:
					dups += n - 1
				case n == 0:
					missing++
				}
			}
			st := fp.Stats()
			t.Logf("directive=%v: %d payments, %d client calls (net/http resends more by itself), %d answers lost or cut, %d duplicate executions, %d never executed",
				protected, payments, attempts, st.Faults, dups, missing)
			if st.Faults == 0 {
				t.Fatal("the proxy injected no fault")
			}
			if protected && (dups != 0 || missing != 0) {
				t.Errorf("with the directive: %d duplicate executions and %d payments never executed, want 0 and 0", dups, missing)
			}
			if !protected && dups == 0 {
				t.Errorf("without the directive no payment ran twice: the faults did not make the client retry an executed request")
			}
		})
	}
}

// TestKill: Caddy killed (SIGKILL) while the upstream executes a keyed request leaves
// the key in progress: a Caddy started again on the same store answers its retry 409
// until the lease has run out, then forwards it again (the documented window: the first
// execution's outcome was never stored), and replays that answer afterwards. conflict
// reject makes the refusal immediate (wait would hold the retry until the takeover).
func TestKill(t *testing.T) {
	t.Parallel()
	const lease = 10 * time.Second
	up := newUpstream(t)
	executing, _ := holdFirst(t, up, "/payments")
	db := filepath.Join(t.TempDir(), "keys.db")
	site := fmt.Sprintf("%%s {\n\tidempotency {\n\t\tstore sqlite:%s\n\t\tlease %s\n\t\tttl 1h\n\t\tconflict reject\n\t}\n\treverse_proxy %s\n}\n", db, lease, up.URL)
	p := startCaddy(t, site)
	go func() {
		req, _ := http.NewRequest("POST", p.base+"/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Idempotency-Key", "k-kill")
		req.Header.Set("Content-Type", "application/json")
		if res, err := http.DefaultClient.Do(req); err == nil {
			_ = res.Body.Close()
		}
	}()
	<-executing
	p.kill()
	killed := time.Now()

	q := startCaddy(t, site)
	// The key is in progress until the lease runs out, a lease after the claim, which
	// came before the kill: a retry sent well within the lease must be refused.
	if restarted := time.Since(killed); restarted < lease/2 {
		if a := send(t, "POST", q.base+"/payments", "k-kill", `{"amount":1}`); a.status != http.StatusConflict {
			t.Errorf("a retry %s after the kill: %d %q, want 409 (the key in progress)", time.Since(killed), a.status, a.body)
		}
	} else {
		t.Logf("Caddy took %s to start again: the retry within the lease is not checked", restarted)
	}
	var last answer
	testenv.Eventually(t, 60*time.Second, func() bool {
		last = send(t, "POST", q.base+"/payments", "k-kill", `{"amount":1}`)
		return last.status == 200
	}, "the retry to be forwarded once the lease ran out")
	since := time.Since(killed)
	t.Logf("the retry was forwarded again %s after the kill (lease %s)", since, lease)
	if since < lease {
		t.Errorf("the retry was forwarded %s after the kill, within the lease (%s)", since, lease)
	}
	if n := up.count("/payments"); n != 2 {
		t.Errorf("the upstream executed the payment %d times, want 2 (once before the kill, once after the lease)", n)
	}
	if a := send(t, "POST", q.base+"/payments", "k-kill", `{"amount":1}`); a.body != last.body || a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a retry after the second execution: %d %q, want %q replayed", a.status, a.body, last.body)
	}
	if n := up.count("/payments"); n != 2 {
		t.Errorf("the upstream executed the payment %d times in all, want 2", n)
	}
}
