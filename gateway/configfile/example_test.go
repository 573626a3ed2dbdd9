package configfile_test

import (
	"fmt"
	"os"

	"github.com/retrysafe/retrysafe/gateway/configfile"
)

// Parse a file and print what the gateway will do.
func ExampleParse() {
	src := `
upstreams:
  api: http://127.0.0.1:3000
routes:
  - match: POST /payments
    wait_timeout: 20s
  - match: POST /refunds
    conflict: reject
  - match: POST /search
    mode: off
`
	f, err := configfile.Parse("gateway.yaml", []byte(src), configfile.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(f.Gateway.Routes), "routes to", f.Gateway.Upstream)
	if err := f.WriteTable(os.Stdout); err != nil {
		fmt.Println(err)
	}
	// Output:
	// 3 routes to http://127.0.0.1:3000
	// UPSTREAM  URL
	// api       http://127.0.0.1:3000
	//
	// ROUTE           MODE                 UPSTREAM  KEY                     SCOPE          FINGERPRINT  CONFLICT  TTL  LEASE  LIMITS
	// POST /payments  required POST        api       header Idempotency-Key  authorization  full         wait 20s  24h  30s    body 1MiB, response 4MiB
	// POST /refunds   required POST        api       header Idempotency-Key  authorization  full         reject    24h  30s    body 1MiB, response 4MiB
	// POST /search    off                  api       -                       -              -            -         -    -      -
	// / (catch-all)   required POST,PATCH  api       header Idempotency-Key  authorization  full         wait 10s  24h  30s    body 1MiB, response 4MiB
}

// Every error is reported with its line; a flag's override, with the flag.
func ExampleParse_errors() {
	src := `
upstreams:
  api: http://127.0.0.1:3000
defaults:
  tll: 24h
routes:
  - match: POST /payments
    upstream: payments
`
	_, err := configfile.Parse("gateway.yaml", []byte(src), configfile.Options{
		Overrides: []configfile.Override{{Key: "defaults.lease", Value: "soon", Source: "--lease"}},
	})
	fmt.Println(err)
	// Output:
	// --lease: defaults.lease: "soon" is not a duration (such as 30s, 5m, 24h)
	// gateway.yaml:5: unknown field "tll" in defaults (did you mean ttl?)
	// gateway.yaml:8: routes[0].upstream: unknown upstream "payments": want one of api, or an absolute URL (http://host:port)
}
