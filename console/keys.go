package console

import (
	"errors"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// Paging of the keys list: a page shows the matches of the store pages it read, and
// reads store pages until it has pageSize matches or has scanned scanBudget records, so
// that a search over a large store costs bounded work per page view.
const (
	pageSize   = 50
	storePage  = 100
	scanBudget = 2000
)

// ages are the choices of the age filter: records created at least this long ago.
var ages = []struct {
	Value, Label string
	D            time.Duration
}{
	{"", "any age", 0},
	{"1m", "older than 1 minute", time.Minute},
	{"10m", "older than 10 minutes", 10 * time.Minute},
	{"1h", "older than 1 hour", time.Hour},
	{"24h", "older than 1 day", 24 * time.Hour},
}

// keysQuery is the keys page's search.
type keysQuery struct {
	Scope    string // exact scope, when ScopeSet
	ScopeSet bool
	Key      string // a substring of the key
	Route    string // the exact route the records were claimed under; "": any
	State    string
	Age      string
	Stuck    bool
	After    string // the store's cursor
}

func readKeysQuery(q url.Values) keysQuery {
	k := keysQuery{Key: q.Get("key"), Route: q.Get("route"), State: q.Get("state"), Age: q.Get("age"),
		Stuck: q.Get("stuck") == "1", After: q.Get("after")}
	if q.Has("scope") && q.Get("scope") != "" {
		k.Scope, k.ScopeSet = q.Get("scope"), true
		if k.Scope == `""` {
			k.Scope = "" // the anonymous scope, as the keys command shows it
		}
	}
	if k.State != string(idempotency.StateInProgress) && k.State != string(idempotency.StateDone) {
		k.State = ""
	}
	if k.Stuck {
		k.State = string(idempotency.StateInProgress)
	}
	return k
}

func (k keysQuery) minAge() time.Duration {
	for _, a := range ages {
		if a.Value == k.Age {
			return a.D
		}
	}
	return 0
}

func (k keysQuery) match(r idempotency.Record, now time.Time) bool {
	switch {
	case k.ScopeSet && r.Scope != k.Scope:
		return false
	case k.Key != "" && !strings.Contains(r.Key, k.Key):
		return false
	case k.Route != "" && r.Route != k.Route:
		return false
	case k.State != "" && string(r.State) != k.State:
		return false
	case k.Stuck && !stuck(r, now):
		return false
	case k.minAge() > 0 && now.Sub(r.CreatedAt) < k.minAge():
		return false
	}
	return true
}

// values is the query of the search, with the cursor after.
func (k keysQuery) values(after string) url.Values {
	v := url.Values{}
	if k.ScopeSet {
		v.Set("scope", showScope(k.Scope))
	}
	for name, s := range map[string]string{"key": k.Key, "route": k.Route, "state": k.State, "age": k.Age, "after": after} {
		if s != "" {
			v.Set(name, s)
		}
	}
	if k.Stuck {
		v.Set("stuck", "1")
	}
	return v
}

// stuck reports whether r is in progress past its lease: its owner died or gave up,
// and the next claim with the same request takes it over.
func stuck(r idempotency.Record, now time.Time) bool {
	return r.State == idempotency.StateInProgress && !r.LeaseUntil.After(now)
}

type keysData struct {
	Q        keysQuery
	ScopeArg string
	Ages     any
	Records  []idempotency.Record
	Routes   []string // the route filter's choices
	Scanned  int
	Next     template.URL // the query of the next page, or ""
	First    template.URL // the query of the first page, when this one is not
	CanList  bool
	Exact    bool // the search was a Store.Get of one scope and key
}

func (c *Console) keysPage(w http.ResponseWriter, r *http.Request) {
	q := readKeysQuery(r.URL.Query())
	d := &keysData{Q: q, Ages: ages, CanList: c.lister != nil}
	if q.ScopeSet {
		d.ScopeArg = showScope(q.Scope)
	}
	now := c.now()
	ctx := r.Context()
	switch {
	case q.ScopeSet && q.Key != "" && q.After == "":
		// One scope and key: the store's own lookup, then (when it lists) the other
		// keys of the scope that contain the text.
		d.Exact = true
		rec, err := c.opt.Store.Get(ctx, q.Scope, q.Key)
		switch {
		case errors.Is(err, idempotency.ErrNotFound):
		case err != nil:
			c.storeFailed(w, r, "reading the record", err)
			return
		case q.match(*rec, now):
			d.Records = append(d.Records, *rec)
		}
		if c.lister == nil {
			break
		}
		d.Exact = false
		fallthrough
	case c.lister != nil:
		seen := map[string]bool{}
		for _, rec := range d.Records {
			seen[rec.Key] = true
		}
		filter := idempotency.ListFilter{State: idempotency.State(q.State), Route: q.Route, After: q.After, Limit: storePage}
		if q.ScopeSet {
			filter.Scope = q.Scope
		}
		for {
			p, err := c.lister.List(ctx, filter)
			if err != nil {
				c.storeFailed(w, r, "listing the records", err)
				return
			}
			d.Scanned += len(p.Records)
			for _, rec := range p.Records {
				if q.match(rec, now) && !(q.ScopeSet && seen[rec.Key]) {
					rec.Response = lean(rec.Response)
					d.Records = append(d.Records, rec)
				}
			}
			if p.Next == "" {
				break
			}
			filter.After = p.Next
			if len(d.Records) >= pageSize || d.Scanned >= scanBudget {
				d.Next = template.URL(q.values(p.Next).Encode())
				break
			}
		}
	}
	if q.After != "" {
		d.First = template.URL(q.values("").Encode())
	}
	d.Routes = c.knownRoutes(q.Route, d.Records)
	c.render(w, r, http.StatusOK, "keys", c.newPage(r, "keys", "Keys", d))
}

// knownRoutes are the choices of the route filter, sorted: the routes of the records
// shown, those the history has counted requests of (the gateway's routes that served
// any), and the one searched for.
func (c *Console) knownRoutes(searched string, recs []idempotency.Record) []string {
	seen := map[string]bool{}
	if searched != "" {
		seen[searched] = true
	}
	for _, r := range recs {
		if r.Route != "" {
			seen[r.Route] = true
		}
	}
	if h := c.opt.History; h != nil {
		for _, ro := range h.Outcomes() {
			if ro.Route != "" { // "": requests no route matched, which store nothing
				seen[ro.Route] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// lean keeps what a list row shows of a response: its status.
func lean(r *idempotency.Response) *idempotency.Response {
	if r == nil {
		return nil
	}
	return &idempotency.Response{Status: r.Status, BodyOmitted: r.BodyOmitted}
}

// storeFailed answers a store error with 502 and logs it.
func (c *Console) storeFailed(w http.ResponseWriter, r *http.Request, what string, err error) {
	c.log.Error("console: store failed", "while", what, "err", err)
	c.fail(w, r, http.StatusBadGateway, "The store failed while "+what+": "+err.Error())
}

// recordData is one record's page.
type recordData struct {
	R        *idempotency.Record
	Query    template.URL // scope and key, for the links
	Headers  []headerLine
	Trailers []headerLine
	Body     bodyPreview
}

type headerLine struct {
	Name, Value string
	Redacted    bool
}

// sensitiveHeaders are never shown, whatever a store holds: they carry credentials.
var sensitiveHeaders = map[string]bool{
	"Authorization": true, "Proxy-Authorization": true, "Cookie": true, "Set-Cookie": true,
	"X-Api-Key": true, "X-Auth-Token": true,
}

func headerLines(h http.Header) []headerLine {
	var out []headerLine
	for _, name := range slices.Sorted(maps.Keys(h)) {
		for _, v := range h[name] {
			l := headerLine{Name: name, Value: v}
			if sensitiveHeaders[http.CanonicalHeaderKey(name)] {
				l.Value, l.Redacted = "", true
			}
			out = append(out, l)
		}
	}
	return out
}

// recordQuery is the query of a record's pages, encoded (so safe as a URL's query).
func recordQuery(scope, key string) template.URL {
	return template.URL(url.Values{"scope": {showScope(scope)}, "key": {key}}.Encode())
}

// recordKey reads the scope and key of a record's page.
func recordKey(v url.Values) (scope, key string, ok bool) {
	scope, key = v.Get("scope"), v.Get("key")
	if scope == `""` {
		scope = ""
	}
	return scope, key, key != ""
}

func (c *Console) readRecord(w http.ResponseWriter, r *http.Request) (*idempotency.Record, bool) {
	scope, key, ok := recordKey(r.URL.Query())
	if !ok {
		c.fail(w, r, http.StatusBadRequest, "Which record? The page needs a key (and its scope).")
		return nil, false
	}
	rec, err := c.opt.Store.Get(r.Context(), scope, key)
	if errors.Is(err, idempotency.ErrNotFound) {
		c.fail(w, r, http.StatusNotFound, "No record for key "+quote(key)+" in scope "+showScope(scope)+
			" (it was evicted, released or has expired).")
		return nil, false
	}
	if err != nil {
		c.storeFailed(w, r, "reading the record", err)
		return nil, false
	}
	return rec, true
}

func (c *Console) recordPage(w http.ResponseWriter, r *http.Request) {
	rec, ok := c.readRecord(w, r)
	if !ok {
		return
	}
	d := &recordData{R: rec, Query: recordQuery(rec.Scope, rec.Key)}
	if resp := rec.Response; resp != nil {
		d.Headers, d.Trailers = headerLines(resp.Header), headerLines(resp.Trailer)
		d.Body = preview(resp.Body, resp.BodyOmitted)
	}
	c.render(w, r, http.StatusOK, "record", c.newPage(r, "keys", "Key "+rec.Key, d))
}

func (c *Console) evictPage(w http.ResponseWriter, r *http.Request) {
	if c.opt.ReadOnly {
		c.fail(w, r, http.StatusForbidden, "This console is read-only: it evicts nothing.")
		return
	}
	rec, ok := c.readRecord(w, r)
	if !ok {
		return
	}
	c.render(w, r, http.StatusOK, "evict", c.newPage(r, "keys", "Evict "+rec.Key, &recordData{R: rec}))
}

// evict deletes the record of the form's scope and key.
func (c *Console) evict(w http.ResponseWriter, r *http.Request) {
	scope, key, ok := recordKey(r.PostForm)
	if !ok {
		c.fail(w, r, http.StatusBadRequest, "Which record? The form needs a key (and its scope).")
		return
	}
	if err := c.opt.Store.Delete(r.Context(), scope, key); err != nil {
		c.storeFailed(w, r, "evicting the record", err)
		return
	}
	c.log.Info("console: key evicted", "scope", scope, "key", key, "remote", r.RemoteAddr)
	http.Redirect(w, r, "/keys?"+url.Values{"done": {"Evicted key " + quote(key) + " in scope " + showScope(scope) +
		": the next request with it executes again."}}.Encode(), http.StatusSeeOther)
}
