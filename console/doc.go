// Package console is the operator console of retrysafe: server-rendered pages, served
// by the gateway's admin listener at / and by `retrysafe console` without a gateway,
// for the engineer paged at night about "payments stuck".
//
// Pages:
//
//   - Keys: the idempotency records of the store, searched by key (a substring) and
//     scope, filtered by route (the gateway route a record was claimed under,
//     Record.Route: the routes of the records shown and those the history counted),
//     state and age; "stuck" records (in progress past their lease: the owner died or
//     gave up) are a filter and a badge. A record's page shows its state, route,
//     stored status, headers and a body preview (escaped, truncated, binary bodies as a
//     hex dump), fencing token, abandoned flag and its times. Evict (Store.Delete) asks
//     for a confirmation: the next request with the key executes again.
//   - Outcomes: per route over the last hour, from the gateway's own counters
//     (package console/history), as inline SVG drawn by the server, and the store's
//     latency percentiles.
//   - Routes: the effective policy table (Options.RouteTable).
//   - Dead letters: the DLQs of redeliver work queues (Options.DeadLetters): list, show,
//     replay one or a selection with a fresh attempt count, purge after a confirmation.
//
// Safety rules, and why:
//
//   - Every state-changing action is a POST carrying a CSRF token, an HMAC under a
//     per-process random secret compared in constant time; Origin and Sec-Fetch-Site
//     must say the same site when the browser sends them. A GET never changes state,
//     so a link or a prefetch cannot evict a key.
//   - Options.ReadOnly hides the actions and refuses their POSTs with 403.
//   - With Options.AdminToken every request needs the token: Authorization: Bearer, or
//     the session cookie (HttpOnly, SameSite=Strict, holding an HMAC of the token, not
//     the token) that the login form sets once given it; compared in constant time. Only
//     the stylesheet, the script and the icon under /static/ are served without it
//     (the login form needs them, and they hold no data). The cookie is valid until the
//     process restarts (its secret is per process) or the operator logs out.
//   - Every response carries a Content-Security-Policy that allows only the console's
//     own stylesheet and script (no inline script), X-Frame-Options: DENY and
//     Cache-Control: no-store (pages show stored responses).
//   - Everything shown is escaped by html/template; header values that carry
//     credentials (Authorization, Cookie, …) are never shown, whatever a store holds.
//
// The console imports neither the gateway nor the command: the command composes them,
// giving it the store, the route table as a function and the gateway's history.
package console
