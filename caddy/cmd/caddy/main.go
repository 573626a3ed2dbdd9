// Command caddy is Caddy with retrysafe's idempotency handler: Caddy's own main
// (caddycmd.Main) with Caddy's standard modules and this module's, as xcaddy builds it.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/retrysafe/retrysafe/caddy"
)

func main() {
	caddycmd.Main()
}
