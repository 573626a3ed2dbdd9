package console_test

import (
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retrysafe/retrysafe/console"
	"github.com/retrysafe/retrysafe/console/history"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/idempotency/memstore"
)

// put stores a record through the store's own API: claimed and, with resp, completed.
func put(t *testing.T, s idempotency.Store, scope, key string, resp *idempotency.Response) {
	t.Helper()
	ctx := context.Background()
	res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: scope, Key: key, Fingerprint: "fp-" + key,
		Lease: time.Minute, TTL: time.Hour})
	if err != nil || !res.Claimed {
		t.Fatalf("claim %q: %v %+v", key, err, res)
	}
	if resp != nil {
		if err := s.Complete(ctx, idempotency.Completion{Scope: scope, Key: key, Token: res.Token, Response: *resp, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
}

func serve(t *testing.T, opt console.Options) *httptest.Server {
	t.Helper()
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c, err := console.New(opt)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	return srv
}

// client follows no redirects, so that a test sees each answer.
func client(t *testing.T) *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, c *http.Client, u string, header ...string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), res.Header
}

func post(t *testing.T, c *http.Client, u string, form url.Values, header ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func csrfOf(t *testing.T, page string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token in the page:\n%s", page)
	}
	return m[1]
}

// TestPages: every page answers 200 with the security headers, and shows what it is
// about.
func TestPages(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	put(t, s, "alice", "pay-1", &idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)})
	put(t, s, "", "pay-2", nil)
	srv := serve(t, console.Options{Store: s, StoreName: "memory:",
		RouteTable: func(w io.Writer) error {
			_, err := io.WriteString(w, "ROUTE          MODE\nPOST /payments  required\n")
			return err
		}})
	c := client(t)
	for _, p := range []struct{ path, want string }{
		{"/keys", "pay-1"},
		{"/keys?state=in_progress", "pay-2"},
		{"/keys/record?scope=alice&key=pay-1", "{&#34;id&#34;:1}"},
		{"/keys/evict?scope=alice&key=pay-1", "Evict key"},
		{"/routes", "POST /payments"},
		{"/outcomes", "gateway"},
		{"/dlq", "No dead-letter queue"},
		{"/static/console.css", "--accent"},
	} {
		status, body, h := get(t, c, srv.URL+p.path)
		if status != http.StatusOK || !strings.Contains(body, p.want) {
			t.Errorf("GET %s: %d, want 200 with %q:\n%s", p.path, status, p.want, body)
		}
		for name, want := range map[string]string{"X-Frame-Options": "DENY", "Cache-Control": "no-store"} {
			if h.Get(name) != want {
				t.Errorf("GET %s: %s %q, want %q", p.path, name, h.Get(name), want)
			}
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
			t.Errorf("GET %s: Content-Security-Policy %q", p.path, csp)
		}
	}
	if status, body, _ := get(t, c, srv.URL+"/keys?state=done"); status != 200 || strings.Contains(body, "pay-2") {
		t.Errorf("the state filter shows an in-progress record among the done ones:\n%s", body)
	}
	if status, _, _ := get(t, c, srv.URL+"/keys/record?scope=alice&key=nope"); status != http.StatusNotFound {
		t.Errorf("a missing record: %d, want 404", status)
	}
}

// TestEvict: the confirmation page changes nothing; the POST needs the CSRF token and
// the same origin; with them the record is deleted from the store.
func TestEvict(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	put(t, s, "alice", "pay-1", &idempotency.Response{Status: 200})
	srv := serve(t, console.Options{Store: s})
	c := client(t)
	_, page, _ := get(t, c, srv.URL+"/keys/evict?scope=alice&key=pay-1")
	if _, err := s.Get(context.Background(), "alice", "pay-1"); err != nil {
		t.Fatalf("the confirmation page deleted the record: %v", err)
	}
	token := csrfOf(t, page)
	form := url.Values{"scope": {"alice"}, "key": {"pay-1"}}
	if status, _ := post(t, c, srv.URL+"/keys/evict", form); status != http.StatusForbidden {
		t.Errorf("POST without the CSRF token: %d, want 403", status)
	}
	form.Set("csrf", strings.Repeat("0", len(token)))
	if status, _ := post(t, c, srv.URL+"/keys/evict", form); status != http.StatusForbidden {
		t.Errorf("POST with a wrong CSRF token: %d, want 403", status)
	}
	form.Set("csrf", token)
	if status, _ := post(t, c, srv.URL+"/keys/evict", form, "Origin", "https://evil.example"); status != http.StatusForbidden {
		t.Errorf("POST from another origin: %d, want 403", status)
	}
	if status, _ := post(t, c, srv.URL+"/keys/evict", form, "Sec-Fetch-Site", "cross-site"); status != http.StatusForbidden {
		t.Errorf("POST from another site: %d, want 403", status)
	}
	if _, err := s.Get(context.Background(), "alice", "pay-1"); err != nil {
		t.Fatalf("a refused POST deleted the record: %v", err)
	}
	if status, _ := post(t, c, srv.URL+"/keys/evict", form, "Origin", srv.URL, "Sec-Fetch-Site", "same-origin"); status != http.StatusSeeOther {
		t.Errorf("POST with the token: %d, want 303", status)
	}
	if _, err := s.Get(context.Background(), "alice", "pay-1"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("after the eviction Get says %v, want ErrNotFound", err)
	}
}

// TestReadOnly: no action is offered, and their POSTs are refused even with the token.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	put(t, s, "alice", "pay-1", &idempotency.Response{Status: 200})
	rw := serve(t, console.Options{Store: s})
	ro := serve(t, console.Options{Store: s, ReadOnly: true})
	c := client(t)
	_, page, _ := get(t, c, rw.URL+"/keys/evict?scope=alice&key=pay-1")
	token := csrfOf(t, page)
	for _, path := range []string{"/keys", "/keys/record?scope=alice&key=pay-1"} {
		if _, body, _ := get(t, c, ro.URL+path); strings.Contains(body, "Evict") || !strings.Contains(body, "read-only") {
			t.Errorf("read-only %s offers an eviction or does not say it is read-only:\n%s", path, body)
		}
	}
	if status, _, _ := get(t, c, ro.URL+"/keys/evict?scope=alice&key=pay-1"); status != http.StatusForbidden {
		t.Errorf("read-only confirmation page: %d, want 403", status)
	}
	for _, tok := range []string{token, ""} {
		// Refused as read-only, before the CSRF token is even looked at.
		if status, body := post(t, c, ro.URL+"/keys/evict", url.Values{"scope": {"alice"}, "key": {"pay-1"}, "csrf": {tok}}); status != http.StatusForbidden || !strings.Contains(body, "This console is read-only") {
			t.Errorf("read-only POST: %d, want 403 saying read-only:\n%s", status, body)
		}
	}
	if _, err := s.Get(context.Background(), "alice", "pay-1"); err != nil {
		t.Errorf("the read-only console deleted the record: %v", err)
	}
}

// TestAdminToken: without the token every page is refused; the bearer token and the
// login form's cookie let a request in; a wrong token does not.
func TestAdminToken(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	put(t, s, "alice", "pay-1", &idempotency.Response{Status: 200})
	const token = "s3cret-token"
	srv := serve(t, console.Options{Store: s, AdminToken: token})
	c := client(t)
	for _, path := range []string{"/keys", "/keys/record?scope=alice&key=pay-1", "/routes", "/outcomes", "/dlq"} {
		status, body, _ := get(t, c, srv.URL+path)
		if status != http.StatusUnauthorized || strings.Contains(body, "pay-1</a>") {
			t.Errorf("GET %s without the token: %d, want 401 without the data:\n%s", path, status, body)
		}
		if status, _, _ := get(t, c, srv.URL+path, "Authorization", "Bearer wrong"); status != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong token: %d, want 401", path, status)
		}
		if status, _, _ := get(t, c, srv.URL+path, "Authorization", "Bearer "+token); status != http.StatusOK {
			t.Errorf("GET %s with the bearer token: %d, want 200", path, status)
		}
	}
	if status, _ := post(t, c, srv.URL+"/keys/evict", url.Values{"scope": {"alice"}, "key": {"pay-1"}}); status != http.StatusUnauthorized {
		t.Errorf("POST without the token: %d, want 401", status)
	}
	if status, _ := post(t, c, srv.URL+"/login", url.Values{"token": {"wrong"}}); status != http.StatusUnauthorized {
		t.Errorf("login with a wrong token: %d, want 401", status)
	}
	if status, _ := post(t, c, srv.URL+"/login", url.Values{"token": {token}, "next": {"//evil.example/"}}); status != http.StatusSeeOther {
		t.Fatalf("login: %d, want 303", status)
	}
	u, _ := url.Parse(srv.URL)
	for _, ck := range c.Jar.Cookies(u) {
		if strings.Contains(ck.Value, token) {
			t.Errorf("the session cookie holds the token: %q", ck.Value)
		}
	}
	status, body, _ := get(t, c, srv.URL+"/keys")
	if status != http.StatusOK || !strings.Contains(body, "pay-1") {
		t.Errorf("GET /keys after the login: %d:\n%s", status, body)
	}
	if status, _ := post(t, c, srv.URL+"/logout", nil, "Origin", "https://evil.example"); status != http.StatusForbidden {
		t.Errorf("logout from another site: %d, want 403", status)
	}
	if status, _ := post(t, c, srv.URL+"/logout", nil); status != http.StatusSeeOther {
		t.Errorf("logout: %d, want 303", status)
	}
	if status, _, _ := get(t, c, srv.URL+"/keys"); status != http.StatusUnauthorized {
		t.Errorf("GET /keys after the logout: %d, want 401", status)
	}
}

// TestRecordPage: credentials among stored headers are never shown, the body is
// escaped, a long body truncated and a binary one shown as hex.
func TestRecordPage(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	put(t, s, "a", "creds", &idempotency.Response{Status: 200, Header: http.Header{
		"Authorization": {"Bearer leaked-token"}, "Cookie": {"sid=leaked-cookie"}, "X-Request-Id": {"r-1"}},
		Body: []byte(`<script>alert(1)</script>`)})
	put(t, s, "a", "long", &idempotency.Response{Status: 200, Body: []byte(strings.Repeat("é", 10000) + "TAIL")})
	put(t, s, "a", "bin", &idempotency.Response{Status: 200, Body: []byte{0x89, 'P', 'N', 'G', 0, 1, 2, 0xff}})
	put(t, s, "a", "big", &idempotency.Response{Status: 200, BodyOmitted: true})
	srv := serve(t, console.Options{Store: s})
	c := client(t)
	_, body, _ := get(t, c, srv.URL+"/keys/record?scope=a&key=creds")
	for _, leak := range []string{"leaked-token", "leaked-cookie", "<script>alert"} {
		if strings.Contains(body, leak) {
			t.Errorf("the record page shows %q:\n%s", leak, body)
		}
	}
	if !strings.Contains(body, "r-1") || !strings.Contains(body, "(redacted)") || !strings.Contains(body, "&lt;script&gt;") {
		t.Errorf("the record page lacks the other header, the redaction or the escaped body:\n%s", body)
	}
	_, body, _ = get(t, c, srv.URL+"/keys/record?scope=a&key=long")
	if strings.Contains(body, "TAIL") || !strings.Contains(body, "first part shown") || !strings.Contains(body, "19.5 KiB") {
		t.Errorf("a long body is not truncated with its size:\n%.600s", body)
	}
	_, body, _ = get(t, c, srv.URL+"/keys/record?scope=a&key=bin")
	if !strings.Contains(body, "binary") || !strings.Contains(body, "89 50 4e 47") {
		t.Errorf("a binary body is not shown as hex:\n%s", body)
	}
	_, body, _ = get(t, c, srv.URL+"/keys/record?scope=a&key=big")
	if !strings.Contains(body, "Not stored") {
		t.Errorf("an omitted body is not said to be omitted:\n%s", body)
	}
}

// TestStuck: a record in progress past its lease is stuck (badge and filter); one whose
// lease runs is not.
func TestStuck(t *testing.T) {
	t.Parallel()
	now := time.Now()
	clock := func() time.Time { return now }
	s := memstore.NewWithClock(clock)
	put(t, s, "a", "old", nil)
	now = now.Add(2 * time.Minute) // past the minute's lease of "old"
	put(t, s, "a", "fresh", nil)
	put(t, s, "a", "finished", &idempotency.Response{Status: 200})
	srv := serve(t, console.Options{Store: s, Now: clock})
	c := client(t)
	_, body, _ := get(t, c, srv.URL+"/keys?stuck=1")
	if !strings.Contains(body, ">old</a>") || strings.Contains(body, ">fresh</a>") || strings.Contains(body, ">finished</a>") {
		t.Errorf("the stuck filter:\n%s", body)
	}
	if strings.Count(body, `class="badge stuck"`) != 1 {
		t.Errorf("want one stuck badge:\n%s", body)
	}
	_, body, _ = get(t, c, srv.URL+"/keys?age=1m")
	if !strings.Contains(body, ">old</a>") || strings.Contains(body, ">fresh</a>") {
		t.Errorf("the age filter:\n%s", body)
	}
	_, body, _ = get(t, c, srv.URL+"/keys?key=fre")
	if strings.Contains(body, ">old</a>") || !strings.Contains(body, ">fresh</a>") {
		t.Errorf("the key search:\n%s", body)
	}
}

// TestPaging: a search over more records than a page follows the store's cursor
// across store pages, and the console's pages together show every match once.
func TestPaging(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	const n = 260
	want := 0
	for i := range n {
		kind := "n" // not matched by the search; in key order between those matched
		if i%3 == 0 {
			kind = "m"
			want++
		}
		put(t, s, "p", fmt.Sprintf("k%04d-%s", i, kind), &idempotency.Response{Status: 200})
	}
	srv := serve(t, console.Options{Store: s})
	c := client(t)
	seen := map[string]int{}
	next := "/keys?key=-m"
	linkRE := regexp.MustCompile(`href="/keys\?([^"]*after=[^"]*)">Next page`)
	keyRE := regexp.MustCompile(`>(k\d{4}-[mn])</a>`)
	pages := 0
	for ; next != ""; pages++ {
		if pages > 10 {
			t.Fatal("the pages never end")
		}
		_, body, _ := get(t, c, srv.URL+strings.ReplaceAll(next, "&amp;", "&"))
		for _, m := range keyRE.FindAllStringSubmatch(body, -1) {
			seen[m[1]]++
		}
		next = ""
		if m := linkRE.FindStringSubmatch(body); m != nil {
			next = "/keys?" + m[1]
		}
	}
	if pages < 2 {
		t.Errorf("%d matches on %d page, want more than one page", want, pages)
	}
	if len(seen) != want {
		t.Errorf("the pages showed %d records, want %d", len(seen), want)
	}
	for k, v := range seen {
		if v != 1 || !strings.HasSuffix(k, "-m") {
			t.Errorf("%s shown %d times", k, v)
		}
	}
}

// putOn claims key in scope under route, as a gateway route's middleware does.
func putOn(t *testing.T, s idempotency.Store, scope, key, route string) {
	t.Helper()
	res, err := s.Claim(context.Background(), idempotency.ClaimRequest{Scope: scope, Key: key, Fingerprint: "fp-" + key,
		Lease: time.Minute, TTL: time.Hour, Route: route})
	if err != nil || !res.Claimed {
		t.Fatalf("claim %q: %v %+v", key, err, res)
	}
}

// TestRouteFilter: the keys page filters by the route a record was claimed under,
// offers the routes of the records shown and those the history counted, keeps the
// filter across pages, and shows each record's route, in the list and on its page.
func TestRouteFilter(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	putOn(t, s, "a", "pay-1", "POST /payments")
	putOn(t, s, "a", "pay-2", "POST /payments")
	putOn(t, s, "a", "ref-1", "POST /refunds")
	putOn(t, s, "a", "old-1", "")
	for i := range 120 {
		putOn(t, s, "b", fmt.Sprintf("bulk-%03d", i), "POST /bulk")
	}
	reg := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "retrysafe_gateway_requests_total"}, []string{"route", "outcome"})
	reg.MustRegister(requests)
	requests.WithLabelValues("POST /orders", "executed").Inc()
	requests.WithLabelValues("", "no-route").Inc()
	h := history.New(reg, history.Options{})
	if err := h.Sample(); err != nil {
		t.Fatal(err)
	}
	srv := serve(t, console.Options{Store: s, History: h})
	c := client(t)
	keys := regexp.MustCompile(`>((?:pay|ref|old|bulk)-\d+)</a>`)
	shown := func(body string) []string {
		var out []string
		for _, m := range keys.FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"route=" + url.QueryEscape("POST /payments"), []string{"pay-1", "pay-2"}},
		{"route=" + url.QueryEscape("POST /refunds") + "&state=in_progress", []string{"ref-1"}},
		{"route=" + url.QueryEscape("POST /payments") + "&scope=a&key=ref-1", nil},
		{"route=" + url.QueryEscape("POST /payments") + "&scope=a&key=pay-2", []string{"pay-2"}},
		{"route=" + url.QueryEscape("POST /nowhere"), nil},
		{"scope=a", []string{"old-1", "pay-1", "pay-2", "ref-1"}},
	} {
		status, body, _ := get(t, c, srv.URL+"/keys?"+tc.query)
		if got := shown(body); status != http.StatusOK || strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("GET /keys?%s: %d, shows %q, want %q", tc.query, status, got, tc.want)
		}
	}
	// The store filters: the page scans only the route's records.
	_, body, _ := get(t, c, srv.URL+"/keys?route="+url.QueryEscape("POST /payments"))
	if !strings.Contains(body, "2 records scanned") {
		t.Errorf("filtering by route scanned more than the route's 2 records:\n%s", body)
	}
	_, body, _ = get(t, c, srv.URL+"/keys?scope=a")
	options := regexp.MustCompile(`<option value="([^"]*)"`)
	var routes []string
	for _, m := range options.FindAllStringSubmatch(body[strings.Index(body, `name="route"`):strings.Index(body, `name="state"`)], -1) {
		routes = append(routes, m[1])
	}
	if want := []string{"", "POST /orders", "POST /payments", "POST /refunds"}; strings.Join(routes, "|") != strings.Join(want, "|") {
		t.Errorf("the route filter offers %q, want %q (the records' routes and the history's)", routes, want)
	}
	if !strings.Contains(body, `<td class="route">POST /refunds</td>`) {
		t.Errorf("the list has no Route column with the record's route:\n%s", body)
	}
	_, body, _ = get(t, c, srv.URL+"/keys?route="+url.QueryEscape("POST /refunds"))
	if !strings.Contains(body, `<option value="POST /refunds" selected>`) {
		t.Errorf("the route searched for is not the selected choice:\n%s", body)
	}

	// The filter stays on the next pages: they show the route's keys, each once, and
	// not those of another route that follow them in the store's order.
	putOn(t, s, "c", "pay-3", "POST /payments")
	next := regexp.MustCompile(`href="/keys\?([^"]*after=[^"]*)">Next page`)
	seen := map[string]bool{}
	page := "route=" + url.QueryEscape("POST /bulk")
	for pages := 0; page != ""; pages++ {
		if pages > 5 {
			t.Fatal("the pages never end")
		}
		_, body, _ = get(t, c, srv.URL+"/keys?"+page)
		for _, k := range shown(body) {
			if !strings.HasPrefix(k, "bulk-") || seen[k] {
				t.Errorf("page %d of POST /bulk shows %s", pages, k)
			}
			seen[k] = true
		}
		page = ""
		if m := next.FindStringSubmatch(body); m != nil {
			page = html.UnescapeString(m[1])
		}
	}
	if len(seen) != 120 {
		t.Errorf("the pages of POST /bulk showed %d keys, want 120", len(seen))
	}

	_, body, _ = get(t, c, srv.URL+"/keys/record?scope=a&key=ref-1")
	if !strings.Contains(body, "<dt>Route</dt>") || !strings.Contains(body, "POST /refunds") {
		t.Errorf("the record page does not show its route:\n%s", body)
	}
	_, body, _ = get(t, c, srv.URL+"/keys/record?scope=a&key=old-1")
	if !strings.Contains(body, "none recorded") {
		t.Errorf("the page of a record without a route:\n%s", body)
	}
}

// TestRebindingRefused: without an admin token the console answers only requests that
// name an address or localhost, so that a site whose name was made to resolve to this
// host (DNS rebinding) cannot read its pages; with a token any name is served.
func TestRebindingRefused(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	open := serve(t, console.Options{Store: s})
	c := client(t)
	for host, want := range map[string]int{
		"":                   http.StatusOK, // the test server's own 127.0.0.1:port
		"localhost:9090":     http.StatusOK,
		"[::1]:9090":         http.StatusOK,
		"evil.example":       http.StatusMisdirectedRequest,
		"evil.example:9090":  http.StatusMisdirectedRequest,
		"127.0.0.1.nip.test": http.StatusMisdirectedRequest,
	} {
		req, _ := http.NewRequest(http.MethodGet, open.URL+"/keys", nil)
		if host != "" {
			req.Host = host
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("Host %q without a token: %d, want %d", host, res.StatusCode, want)
		}
	}
	const token = "rebind-token"
	guarded := serve(t, console.Options{Store: s, AdminToken: token})
	req, _ := http.NewRequest(http.MethodGet, guarded.URL+"/keys", nil)
	req.Host = "console.internal.example"
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("a named host with the token: %d, want 200", res.StatusCode)
	}
}
