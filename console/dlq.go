package console

import (
	"errors"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/retrysafe/retrysafe/redeliver"
)

// dlqListLimit is the most dead letters a queue's page lists (RabbitMQ peeks at each
// one it lists: it takes and requeues them).
const dlqListLimit = 200

type queuesData struct {
	Queues []string
}

func (c *Console) queuesPage(w http.ResponseWriter, r *http.Request) {
	if len(c.queues) == 1 {
		http.Redirect(w, r, "/dlq/"+url.PathEscape(c.queues[0]), http.StatusSeeOther)
		return
	}
	c.render(w, r, http.StatusOK, "queues", c.newPage(r, "dlq", "Dead letters", &queuesData{Queues: c.queues}))
}

// queue returns the dead letters of the path's queue, or answers 404.
func (c *Console) queue(w http.ResponseWriter, r *http.Request) (string, redeliver.DeadLetters, bool) {
	name := r.PathValue("queue")
	d, ok := c.opt.DeadLetters[name]
	if !ok {
		c.fail(w, r, http.StatusNotFound, "No dead-letter queue "+quote(name)+" is configured.")
		return "", nil, false
	}
	return name, d, true
}

type deadLettersData struct {
	Queue   string
	Path    string // the queue's path segment, escaped
	Letters []redeliver.DeadLetter
	Limited bool
	// The filter: a reason, and text the last error contains (case-insensitive). Listed
	// is how many the broker listed before it.
	Reason, Err string
	Reasons     []string // the reasons of the listed dead letters, for the filter's choices
	Listed      int
}

func (c *Console) deadLettersPage(w http.ResponseWriter, r *http.Request) {
	name, dl, ok := c.queue(w, r)
	if !ok {
		return
	}
	list, err := dl.List(r.Context(), dlqListLimit)
	if err != nil {
		c.brokerFailed(w, r, name, "listing the dead letters", err)
		return
	}
	q := r.URL.Query()
	d := &deadLettersData{Queue: name, Path: url.PathEscape(name), Limited: len(list) == dlqListLimit,
		Reason: q.Get("reason"), Err: strings.TrimSpace(q.Get("err")), Listed: len(list)}
	seen := map[string]bool{}
	for _, l := range list {
		if reason := string(l.Info.Reason); reason != "" && !seen[reason] {
			seen[reason] = true
			d.Reasons = append(d.Reasons, reason)
		}
		if d.Reason != "" && string(l.Info.Reason) != d.Reason ||
			d.Err != "" && !strings.Contains(strings.ToLower(l.Info.Err), strings.ToLower(d.Err)) {
			continue
		}
		d.Letters = append(d.Letters, l)
	}
	slices.Sort(d.Reasons)
	c.render(w, r, http.StatusOK, "deadletters", c.newPage(r, "dlq", "Dead letters of "+name, d))
}

type deadLetterData struct {
	Queue   string
	Path    string
	L       *redeliver.DeadLetter
	Headers []headerLine
	Body    bodyPreview
}

func (c *Console) deadLetterPage(w http.ResponseWriter, r *http.Request) {
	name, dl, ok := c.queue(w, r)
	if !ok {
		return
	}
	id := r.URL.Query().Get("id")
	l, err := dl.Get(r.Context(), id)
	if errors.Is(err, redeliver.ErrNotFound) {
		c.fail(w, r, http.StatusNotFound, "No dead letter with id "+quote(id)+" in the DLQ of "+quote(name)+
			" (it was replayed or purged).")
		return
	}
	if err != nil {
		c.brokerFailed(w, r, name, "reading the dead letter", err)
		return
	}
	h := http.Header{}
	for _, k := range slices.Sorted(maps.Keys(l.Header)) {
		h[k] = []string{l.Header[k]}
	}
	d := &deadLetterData{Queue: name, Path: url.PathEscape(name), L: l, Headers: headerLines(h), Body: preview(l.Body, false)}
	c.render(w, r, http.StatusOK, "deadletter", c.newPage(r, "dlq", "Dead letter "+id, d))
}

// selection reads the ids of a form or query (id, repeated), and all=1.
func selection(v url.Values) (ids []string, all bool) {
	for _, id := range v["id"] {
		if id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, v.Get("all") == "1"
}

type purgeData struct {
	Queue string
	Path  string
	IDs   []string
	All   bool
}

func (c *Console) purgePage(w http.ResponseWriter, r *http.Request) {
	if c.opt.ReadOnly {
		c.fail(w, r, http.StatusForbidden, "This console is read-only: it purges nothing.")
		return
	}
	c.purgeConfirm(w, r, r.URL.Query())
}

// purgeConfirm renders the confirmation page of a purge of the selection in v.
func (c *Console) purgeConfirm(w http.ResponseWriter, r *http.Request, v url.Values) {
	name, _, ok := c.queue(w, r)
	if !ok {
		return
	}
	ids, all := selection(v)
	if len(ids) == 0 && !all {
		c.fail(w, r, http.StatusBadRequest, "Select the dead letters to purge.")
		return
	}
	d := &purgeData{Queue: name, Path: url.PathEscape(name), IDs: ids, All: all && len(ids) == 0}
	c.render(w, r, http.StatusOK, "purge", c.newPage(r, "dlq", "Purge dead letters of "+name, d))
}

// replay republishes the selected dead letters (or all of them with all=1) to their
// work queue with a fresh attempt count.
func (c *Console) replay(w http.ResponseWriter, r *http.Request) {
	c.apply(w, r, "replay", func(dl redeliver.DeadLetters, ids []string) (int, error) {
		return dl.Replay(r.Context(), ids...)
	})
}

// purge asks for a confirmation first: a form without confirm=1 (the list's "Purge
// selected" button) renders the confirmation page, which posts again with it.
func (c *Console) purge(w http.ResponseWriter, r *http.Request) {
	if r.PostForm.Get("confirm") != "1" {
		c.purgeConfirm(w, r, r.PostForm)
		return
	}
	c.apply(w, r, "purge", func(dl redeliver.DeadLetters, ids []string) (int, error) {
		return dl.Purge(r.Context(), ids...)
	})
}

// apply runs a replay or a purge of the form's selection. An empty selection is
// refused rather than taken as "all": all needs all=1.
func (c *Console) apply(w http.ResponseWriter, r *http.Request, verb string, do func(redeliver.DeadLetters, []string) (int, error)) {
	name, dl, ok := c.queue(w, r)
	if !ok {
		return
	}
	ids, all := selection(r.PostForm)
	c.log.Debug("console: "+verb, "queue", name, "ids", ids, "all", all)
	if len(ids) == 0 && !all {
		c.fail(w, r, http.StatusBadRequest, "Select the dead letters to "+verb+".")
		return
	}
	n, err := do(dl, ids)
	done := map[string]string{"replay": "replayed", "purge": "purged"}[verb]
	c.log.Info("console: dead letters "+done, "queue", name, "count", n, "ids", ids, "all", len(ids) == 0, "remote", r.RemoteAddr)
	if err != nil {
		c.brokerFailed(w, r, name, verb+"ing ("+strconv.Itoa(n)+" done before the failure)", err)
		return
	}
	msg := done + " " + plural(n, "dead letter")
	if verb == "replay" {
		msg += " to " + name + ", attempt counts reset"
	}
	if len(ids) > n {
		msg += "; " + strconv.Itoa(len(ids)-n) + " of the selected were no longer in the DLQ"
	}
	http.Redirect(w, r, "/dlq/"+url.PathEscape(name)+"?"+url.Values{"done": {upper(msg) + "."}}.Encode(), http.StatusSeeOther)
}

func (c *Console) brokerFailed(w http.ResponseWriter, r *http.Request, queue, what string, err error) {
	c.log.Error("console: broker failed", "queue", queue, "while", what, "err", err)
	c.fail(w, r, http.StatusBadGateway, "The broker failed while "+what+": "+err.Error())
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

func upper(s string) string {
	if s == "" {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}
