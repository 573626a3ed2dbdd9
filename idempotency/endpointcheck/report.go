package endpointcheck

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Verdict is a case's outcome.
type Verdict string

// Verdicts.
const (
	Pass          Verdict = "pass"
	Fail          Verdict = "fail"
	NotApplicable Verdict = "n/a"
)

// Level says whether a case's failure fails the check.
type Level string

// Levels.
const (
	// Required: a failure means retries against the endpoint are not safe.
	Required Level = "required"
	// Advisory: a failure is worth fixing, but retries stay safe.
	Advisory Level = "advisory"
)

// Case IDs, stable for machines (Result.ID).
const (
	CaseMissingKey   = "missing-key"
	CaseReplay       = "replay"
	CaseReplayMarker = "replay-marker"
	CaseConcurrent   = "concurrent"
	CaseOtherBody    = "other-body"
	CaseOtherRoute   = "other-route"
	CaseScopes       = "two-credentials"
	CaseKeyEmpty     = "key-empty"
	CaseKeyLong      = "key-256"
	CaseKeyControl   = "key-control"
	CaseRetryAfter   = "retry-after"
	CaseProblemJSON  = "problem-json"
)

// Result is one case's row.
type Result struct {
	ID       string  `json:"id"`
	Name     string  `json:"name"`
	Expect   string  `json:"expect"`
	Source   string  `json:"source"` // where the expectation comes from
	Observed string  `json:"observed"`
	Verdict  Verdict `json:"verdict"`
	Level    Level   `json:"level"`
}

// Report is the outcome of a Check.
type Report struct {
	Method     string   `json:"method"`
	URL        string   `json:"url"`
	OtherRoute string   `json:"other_route"`
	Requests   int      `json:"requests"` // requests sent
	Results    []Result `json:"results"`
	Notes      []string `json:"notes,omitempty"`
}

// Failed reports whether a required case failed.
func (r *Report) Failed() bool {
	for _, res := range r.Results {
		if res.Level == Required && res.Verdict == Fail {
			return true
		}
	}
	return false
}

// Result returns the result of the case with the given ID.
func (r *Report) Result(id string) (Result, bool) {
	for _, res := range r.Results {
		if res.ID == id {
			return res, true
		}
	}
	return Result{}, false
}

// WriteJSON writes the report as one indented JSON object, with "failed" added.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		*Report
		Failed bool `json:"failed"`
	}{r, r.Failed()})
}

// WriteText writes the report as a table for people, with a summary line.
func (r *Report) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "%s %s (other route %s): %d requests sent\n\n", r.Method, r.URL, r.OtherRoute, r.Requests)
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tVERDICT\tLEVEL\tEXPECTED\tSOURCE\tOBSERVED")
	var pass, fail, failReq, na int
	for _, res := range r.Results {
		v := string(res.Verdict)
		switch res.Verdict {
		case Pass:
			pass++
		case Fail:
			fail++
			v = "FAIL"
			if res.Level == Required {
				failReq++
			}
		case NotApplicable:
			na++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", res.Name, v, res.Level, res.Expect, res.Source, res.Observed)
	}
	tw.Flush()
	for _, n := range r.Notes {
		fmt.Fprintf(ew, "\nnote: %s", n)
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(ew)
	}
	fmt.Fprintf(ew, "\n%d passed, %d failed (%d required), %d not applicable: ", pass, fail, failReq, na)
	if failReq > 0 {
		fmt.Fprintln(ew, "retries against this endpoint are NOT safe")
	} else {
		fmt.Fprintln(ew, "every required case passed")
	}
	return ew.err
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

// distinguishable reports whether two executions of the endpoint give different
// responses: the first responses to two different keys differ. Only then do identical
// responses prove a replay (when there is no replay marker).
func (o *observations) distinguishable() bool {
	w := o.winner()
	return o.first.ok() && w != nil && !o.first.same(w)
}

// markerKnown reports whether the API marks its replays (Idempotent-Replayed: true on
// the sequential replay).
func (o *observations) markerKnown() bool { return o.second.replayed() && !o.first.replayed() }

// winner is the first response of the concurrent burst that is neither an error nor a
// 409 (nil if none).
func (o *observations) winner() *response {
	for _, r := range o.concurrent {
		if r.ok() && r.status != http.StatusConflict {
			return r
		}
	}
	return nil
}

func success(r *response) bool { return r.ok() && r.status >= 200 && r.status < 300 }

func clientError(r *response) bool { return r.ok() && r.status >= 400 && r.status < 500 }

// verdicts evaluates every case.
func (o *observations) verdicts() []Result {
	out := []Result{
		o.missingKey(), o.replay(), o.replayMarker(), o.concurrentCase(), o.otherBodyCase(),
		o.otherRouteCase(), o.scopes(),
		o.malformed(CaseKeyEmpty, "malformed key: empty", "IETF draft", Required, o.keyEmpty),
		o.malformed(CaseKeyLong, "malformed key: 256 characters", "Stripe", Advisory, o.keyLong),
		o.malformed(CaseKeyControl, "malformed key: control character", "IETF draft", Required, o.keyControl),
		o.retryAfterCase(), o.problemJSON(),
	}
	return out
}

func (o *observations) missingKey() Result {
	res := Result{ID: CaseMissingKey, Name: "missing key", Expect: "400 when keys are required",
		Source: "IETF draft", Level: Advisory}
	r := o.missing
	switch {
	case r.ok() && r.status == http.StatusBadRequest:
		res.Verdict, res.Observed = Pass, r.describe()
	case success(r):
		res.Verdict = NotApplicable
		res.Observed = r.String() + ": keys optional (the request executed without a key, unprotected)"
	default:
		res.Verdict, res.Observed = Fail, r.describe()
	}
	return res
}

func (o *observations) replay() Result {
	res := Result{ID: CaseReplay, Name: "same key, same body, sequential",
		Expect: "same status and body", Source: "IETF draft, Stripe", Level: Required}
	a, b := o.first, o.second
	wait := ""
	if n := len(o.secondWait); n > 0 {
		wait = fmt.Sprintf(" (after %d× 409)", n)
	}
	switch {
	case !a.ok() || !b.ok():
		res.Verdict, res.Observed = Fail, a.String()+" then "+b.String()+wait
	case a.same(b) && b.replayed():
		res.Verdict = Pass
		res.Observed = fmt.Sprintf("%d then %d%s, identical bodies, Idempotent-Replayed: true", a.status, b.status, wait)
	case a.same(b) && !o.distinguishable():
		res.Verdict = NotApplicable
		res.Observed = fmt.Sprintf("%d twice, identical bodies, but two different keys got identical responses too and no replay marker was sent: a replay cannot be told from a second execution", a.status)
	case a.same(b):
		res.Verdict = Pass
		res.Observed = fmt.Sprintf("%d then %d%s, identical bodies", a.status, b.status, wait)
	case b.status == http.StatusConflict:
		res.Verdict = Fail
		res.Observed = fmt.Sprintf("%d then still 409 after %d tries: the first request's result was never recorded", a.status, len(o.secondWait)+1)
	case a.status == b.status:
		res.Verdict = Fail
		res.Observed = fmt.Sprintf("%d then %d%s, bodies differ: executed twice", a.status, b.status, wait)
	default:
		res.Verdict = Fail
		res.Observed = fmt.Sprintf("%d then %d%s", a.status, b.status, wait)
	}
	return res
}

func (o *observations) replayMarker() Result {
	res := Result{ID: CaseReplayMarker, Name: "replay marker", Expect: "Idempotent-Replayed: true on the replay",
		Source: "Stripe", Level: Advisory}
	a, b := o.first, o.second
	switch {
	case !a.same(b):
		res.Verdict, res.Observed = NotApplicable, "no replay to look at"
	case a.replayed():
		res.Verdict, res.Observed = Fail, "the first (executing) response says Idempotent-Replayed: true"
	case b.replayed():
		res.Verdict, res.Observed = Pass, "Idempotent-Replayed: true"
	default:
		res.Verdict, res.Observed = Fail, "no Idempotent-Replayed header: a client cannot tell a replay from an execution"
	}
	return res
}

func (o *observations) concurrentCase() Result {
	res := Result{ID: CaseConcurrent, Name: fmt.Sprintf("same key, same body, %d concurrent", o.concurrency),
		Expect: "one execution (identical, or 409s and one)", Source: "IETF draft", Level: Required}
	var errs, conflicts int
	type group struct {
		r *response
		n int
	}
	var groups []*group
	for _, r := range o.concurrent {
		switch {
		case !r.ok():
			errs++
			continue
		case r.status == http.StatusConflict:
			conflicts++
			continue
		}
		found := false
		for _, g := range groups {
			if g.r.same(r) {
				g.n++
				found = true
				break
			}
		}
		if !found {
			groups = append(groups, &group{r: r, n: 1})
		}
	}
	// Per status, in order of appearance: how many, and how many different bodies.
	var parts []string
	for i, g := range groups {
		if slices.ContainsFunc(groups[:i], func(h *group) bool { return h.r.status == g.r.status }) {
			continue
		}
		n, distinct := 0, 0
		for _, h := range groups[i:] {
			if h.r.status == g.r.status {
				n += h.n
				distinct++
			}
		}
		part := fmt.Sprintf("%d× %d", n, g.r.status)
		if distinct > 1 {
			part += fmt.Sprintf(" (%d different bodies)", distinct)
		}
		parts = append(parts, part)
	}
	if conflicts > 0 {
		parts = append(parts, fmt.Sprintf("%d× 409", conflicts))
	}
	if errs > 0 {
		parts = append(parts, fmt.Sprintf("%d× error (%s)", errs, firstErr(o.concurrent)))
	}
	summary := strings.Join(parts, ", ")
	switch {
	case errs > 0:
		res.Verdict, res.Observed = Fail, summary
	case len(groups) == 0:
		res.Verdict, res.Observed = Fail, summary+": nothing executed"
	case len(groups) > 1:
		res.Verdict = Fail
		res.Observed = fmt.Sprintf("%s: executed %d times", summary, len(groups))
	case !o.distinguishable() && !o.markerKnown():
		res.Verdict = NotApplicable
		res.Observed = summary + ", identical, but different keys get identical responses too: executions cannot be counted"
	default:
		res.Verdict, res.Observed = Pass, summary+", identical bodies"
	}
	return res
}

func firstErr(rs []*response) string {
	for _, r := range rs {
		if r.err != nil {
			return oneLine(r.err.Error())
		}
	}
	return ""
}

func (o *observations) otherBodyCase() Result {
	res := Result{ID: CaseOtherBody, Name: "same key, other body", Expect: "422 (or a 4xx that is not a replay)",
		Source: "IETF draft", Level: Required}
	r := o.otherBody
	switch {
	case !r.ok():
		res.Verdict, res.Observed = Fail, r.String()
	case r.status == http.StatusUnprocessableEntity && !r.replayed():
		res.Verdict, res.Observed = Pass, r.describe()
	case r.replayed() || (success(r) && r.same(o.first)):
		res.Verdict, res.Observed = Fail, r.String()+": replayed the first request's response for another payload"
	case clientError(r):
		res.Verdict, res.Observed = Pass, r.describe()+": rejected, though the IETF draft says 422"
	case success(r):
		res.Verdict, res.Observed = Fail, r.String()+": executed another payload under a used key"
	default:
		res.Verdict, res.Observed = Fail, r.describe()
	}
	return res
}

func (o *observations) otherRouteCase() Result {
	res := Result{ID: CaseOtherRoute, Name: "same key, other route", Expect: "not the first route's response",
		Source: "IETF draft", Level: Required}
	r := o.otherRoute
	switch {
	case !r.ok():
		res.Verdict, res.Observed = Fail, r.String()
	case r.replayed() || r.same(o.first):
		res.Verdict, res.Observed = Fail, r.String()+": answered with the first route's response"
	default:
		res.Verdict, res.Observed = Pass, r.describe()
	}
	return res
}

func (o *observations) scopes() Result {
	res := Result{ID: CaseScopes, Name: "same key, two credentials", Expect: "two independent executions",
		Source: "IETF draft, Stripe", Level: Required}
	if !o.twoAuths {
		res.Verdict, res.Observed = NotApplicable, "needs two credentials (two Auth values; --auth twice)"
		return res
	}
	a, b := o.scopeA, o.scopeB
	switch {
	case !a.ok() || !b.ok():
		res.Verdict, res.Observed = Fail, a.String()+" then "+b.String()
	case b.status == http.StatusUnauthorized || b.status == http.StatusForbidden:
		res.Verdict, res.Observed = NotApplicable, b.String()+": the second credential was refused"
	case b.replayed():
		res.Verdict, res.Observed = Fail, b.String()+" Idempotent-Replayed: true: replayed the first credential's response"
	case b.status == http.StatusConflict || b.status == http.StatusUnprocessableEntity:
		res.Verdict, res.Observed = Fail, b.describe()+": the key is shared across credentials"
	case a.same(b) && o.distinguishable():
		res.Verdict, res.Observed = Fail, fmt.Sprintf("%d twice, identical bodies: the second credential got the first one's response", a.status)
	case a.same(b):
		res.Verdict = NotApplicable
		res.Observed = fmt.Sprintf("%d twice, identical bodies, no replay marker: cannot tell", a.status)
	default:
		res.Verdict, res.Observed = Pass, fmt.Sprintf("%d then %d, different bodies", a.status, b.status)
	}
	return res
}

func (o *observations) malformed(id, name, source string, level Level, r *response) Result {
	res := Result{ID: id, Name: name, Expect: "400", Source: source, Level: level}
	if id == CaseKeyLong {
		res.Expect = "400 (keys: at most 255 characters)"
	}
	switch {
	case r.ok() && r.status == http.StatusBadRequest:
		res.Verdict, res.Observed = Pass, r.describe()
	case success(r):
		res.Verdict, res.Observed = Fail, r.String()+": accepted (and executed)"
	default:
		res.Verdict, res.Observed = Fail, r.describe()
	}
	return res
}

func (o *observations) conflicts() []*response {
	var out []*response
	for _, rs := range [][]*response{o.concurrent, o.secondWait, o.scopeBWait} {
		for _, r := range rs {
			if r.ok() && r.status == http.StatusConflict {
				out = append(out, r)
			}
		}
	}
	return out
}

func (o *observations) retryAfterCase() Result {
	res := Result{ID: CaseRetryAfter, Name: "409 Retry-After", Expect: "Retry-After on every 409",
		Source: "RFC 9110", Level: Required}
	cs := o.conflicts()
	if len(cs) == 0 {
		res.Verdict, res.Observed = NotApplicable, "no 409 seen"
		return res
	}
	values := map[string]int{}
	missing := 0
	for _, r := range cs {
		if _, ok := retryAfter(r.header, time.Now()); ok {
			values[strings.TrimSpace(r.header.Get("Retry-After"))]++
		} else {
			missing++
		}
	}
	if missing > 0 {
		res.Verdict = Fail
		res.Observed = fmt.Sprintf("%d of %d 409s without a valid Retry-After", missing, len(cs))
		return res
	}
	vs := make([]string, 0, len(values))
	for v := range values {
		vs = append(vs, v)
	}
	sort.Strings(vs)
	res.Verdict = Pass
	res.Observed = fmt.Sprintf("%d× 409, Retry-After: %s", len(cs), strings.Join(vs, ", "))
	return res
}

func (o *observations) problemJSON() Result {
	res := Result{ID: CaseProblemJSON, Name: "problem+json errors", Expect: "application/problem+json errors",
		Source: "IETF draft, RFC 9457", Level: Advisory}
	type named struct {
		what string
		r    *response
	}
	var errs []named
	add := func(what string, rs ...*response) {
		for _, r := range rs {
			if clientError(r) {
				errs = append(errs, named{what, r})
			}
		}
	}
	add("missing key", o.missing)
	add("other body", o.otherBody)
	if o.otherRoute.ok() && o.otherRoute.status == http.StatusUnprocessableEntity {
		add("other route", o.otherRoute)
	}
	add("empty key", o.keyEmpty)
	add("256-character key", o.keyLong)
	add("control-character key", o.keyControl)
	add("in-flight", o.conflicts()...)
	if len(errs) == 0 {
		res.Verdict, res.Observed = NotApplicable, "no idempotency error seen"
		return res
	}
	var bad []string
	seen := map[string]bool{}
	nbad := 0
	for _, e := range errs {
		if e.r.problem() {
			continue
		}
		nbad++
		mt := e.r.mediaType()
		if mt == "" {
			mt = "no Content-Type"
		}
		d := e.what + " " + strconv.Itoa(e.r.status) + " " + mt
		if !seen[d] {
			seen[d] = true
			bad = append(bad, d)
		}
	}
	if nbad == 0 {
		res.Verdict, res.Observed = Pass, fmt.Sprintf("all %d error responses", len(errs))
		return res
	}
	res.Verdict = Fail
	res.Observed = fmt.Sprintf("%d of %d error responses are not: %s", nbad, len(errs), strings.Join(bad, "; "))
	return res
}

// notes are remarks on the run as a whole.
func (o *observations) notes() []string {
	var out []string
	if r := o.first; r.ok() && !success(r) {
		out = append(out, fmt.Sprintf("the first keyed request was answered %s, not 2xx: check --data, --header and --auth; the verdicts compare error responses", r.describe()))
	}
	if o.first.ok() && o.first.truncated {
		out = append(out, "responses over 1 MiB were compared on their first MiB only")
	}
	if o.quotedKeys {
		out = append(out, "keys were sent in the IETF draft's quoted form")
	}
	return out
}
