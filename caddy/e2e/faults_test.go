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
