package console

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/console/history"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/redeliver"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Options configures a Console. Store is required; every other field may be left zero.
type Options struct {
	// Store holds the idempotency records the keys pages show and evict. Listing needs
	// it to implement idempotency.Lister; without it, only a search by scope and key
	// (Store.Get) works.
	Store idempotency.Store
	// StoreName describes the store in the page header (with any password redacted).
	StoreName string
	// History, when set, gives the outcomes page its charts and store latencies: the
	// gateway's own counters sampled over the last hour. Its owner runs it (Run).
	// Nil: the page says the outcomes come from a gateway's counters.
	History *history.History
	// RouteTable, when set, writes the effective route table (as
	// configfile.File.WriteTable does) shown on the routes page.
	RouteTable func(io.Writer) error
	// DeadLetters are the dead-letter queues shown, by the name of their work queue.
	// The Console does not close them.
	DeadLetters map[string]redeliver.DeadLetters
	// ReadOnly hides every action (evict, replay, purge) and refuses their POSTs with 403.
	ReadOnly bool
	// AdminToken, when set, is asked of every request: Authorization: Bearer TOKEN, or
	// the session cookie the login form sets once given the token.
	AdminToken string
	// Logger receives one line per action taken (evict, replay, purge) and per failure.
	// Default: slog.Default().
	Logger *slog.Logger
	// Now is the clock of ages and of "stuck" (a lease past its end). Default time.Now.
	// The shared stores decide leases on their own clock: a process clock far from it
	// shows leases a little early or late.
	Now func() time.Time
}

// Console is the operator console: an http.Handler of server-rendered pages.
type Console struct {
	opt    Options
	lister idempotency.Lister // nil when the store cannot list
	queues []string           // sorted names of opt.DeadLetters
	log    *slog.Logger
	now    func() time.Time
	secret []byte // per-process key of the CSRF token and the session cookie
	pages  map[string]*template.Template
	static http.Handler
	mux    *http.ServeMux
}

// New returns a Console for opt, or an error when opt cannot make one.
func New(opt Options) (*Console, error) {
	if opt.Store == nil {
		return nil, errors.New("console: Options.Store is required")
	}
	for name, d := range opt.DeadLetters {
		if name == "" || d == nil {
			return nil, errors.New("console: Options.DeadLetters needs a name and a value for every queue")
		}
	}
	c := &Console{opt: opt, log: cmp.Or(opt.Logger, slog.Default()), now: opt.Now,
		queues: slices.Sorted(maps.Keys(opt.DeadLetters))}
	if c.now == nil {
		c.now = time.Now
	}
	c.lister, _ = opt.Store.(idempotency.Lister)
	c.secret = make([]byte, 32)
	if _, err := rand.Read(c.secret); err != nil {
		return nil, fmt.Errorf("console: random secret: %w", err)
	}
	if err := c.parseTemplates(); err != nil {
		return nil, err
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	c.static = http.StripPrefix("/static/", http.FileServerFS(sub))
	c.routes()
	return c, nil
}

func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "keys", http.StatusSeeOther)
	})
	m.Handle("GET /static/", c.static)
	m.HandleFunc("GET /login", c.loginPage)
	m.HandleFunc("POST /login", c.login)
	m.HandleFunc("POST /logout", c.logout)
	m.HandleFunc("GET /keys", c.keysPage)
	m.HandleFunc("GET /keys/record", c.recordPage)
	m.HandleFunc("GET /keys/evict", c.evictPage)
	m.HandleFunc("POST /keys/evict", c.action(c.evict))
	m.HandleFunc("GET /outcomes", c.outcomesPage)
	m.HandleFunc("GET /routes", c.routesPage)
	m.HandleFunc("GET /dlq", c.queuesPage)
	m.HandleFunc("GET /dlq/{queue}", c.deadLettersPage)
	m.HandleFunc("GET /dlq/{queue}/message", c.deadLetterPage)
	m.HandleFunc("GET /dlq/{queue}/purge", c.purgePage)
	m.HandleFunc("POST /dlq/{queue}/replay", c.action(c.replay))
	m.HandleFunc("POST /dlq/{queue}/purge", c.action(c.purge))
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusNotFound, "No such page.")
	})
	c.mux = m
}

// ServeHTTP serves the console's pages. Every response carries the security headers;
// every request but the login form's needs the admin token when one is set.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin") // no-referrer would make Chromium send "Origin: null" with the forms
	h.Set("Cache-Control", "no-store")
	if c.opt.AdminToken == "" && !plainHost(r.Host) {
		// Without a token the console trusts whoever reaches it, which is meant to be this
		// host: a page of another site whose name was made to resolve to 127.0.0.1 (DNS
		// rebinding) would be same-origin with it, and could read its pages and forms.
		// Such a request names that site's host; a local browser names an address.
		http.Error(w, "the console without an admin token answers only requests to an IP address or localhost", http.StatusMisdirectedRequest)
		return
	}
	if !c.authorized(r) && r.URL.Path != "/login" && !isStatic(r) {
		c.unauthorized(w, r)
		return
	}
	c.mux.ServeHTTP(w, r)
}

// plainHost reports whether the Host header names an IP address or localhost (with or
// without a port), as a browser on the console's own host does.
func plainHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return strings.EqualFold(host, "localhost") || net.ParseIP(host) != nil
}

// page is what every template receives.
type page struct {
	Title    string
	Nav      string // the current section: keys, outcomes, routes, dlq
	CSRF     string
	ReadOnly bool
	Login    bool // a token is set, so a logout button is shown
	Store    string
	Queues   []string
	Now      time.Time
	Flash    string
	Error    string
	Data     any
}

func (c *Console) newPage(r *http.Request, nav, title string, data any) *page {
	return &page{Title: title, Nav: nav, CSRF: c.csrfToken(r), ReadOnly: c.opt.ReadOnly,
		Login: c.opt.AdminToken != "", Store: c.opt.StoreName, Queues: c.queues, Now: c.now(),
		Flash: r.URL.Query().Get("done"), Data: data}
}

// render writes the page named name, buffered so that a template error is a clean 500.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, p *page) {
	t, ok := c.pages[name]
	if !ok {
		c.log.Error("console: no such template", "name", name)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	var b bytes.Buffer
	if err := t.ExecuteTemplate(&b, "layout", p); err != nil {
		c.log.Error("console: rendering a page", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// fail renders the error page with status and msg.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	p := c.newPage(r, "", http.StatusText(status), nil)
	p.Error = msg
	c.render(w, r, status, "error", p)
}

func (c *Console) parseTemplates() error {
	funcs := template.FuncMap{
		"stamp":       stamp,
		"ago":         func(t time.Time) string { return ago(c.now(), t) },
		"until":       func(t time.Time) string { return until(c.now(), t) },
		"scope":       showScope,
		"bytes":       formatBytes,
		"stuck":       func(r idempotency.Record) bool { return stuck(r, c.now()) },
		"recq":        func(r idempotency.Record) template.URL { return recordQuery(r.Scope, r.Key) },
		"statusClass": func(status int) int { return status / 100 },
		"sub":         func(a, b int) int { return a - b },
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return err
	}
	c.pages = map[string]*template.Template{}
	for _, n := range names {
		base := n[len("templates/") : len(n)-len(".html")]
		if base == "layout" {
			continue
		}
		t, err := template.New(base).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n)
		if err != nil {
			return fmt.Errorf("console: template %s: %w", n, err)
		}
		c.pages[base] = t
	}
	return nil
}

func isStatic(r *http.Request) bool {
	return r.Method == http.MethodGet && len(r.URL.Path) > len("/static/") && r.URL.Path[:len("/static/")] == "/static/"
}
