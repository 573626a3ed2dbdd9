package chaos

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// Execution is one execution of a payment by the upstream: a request whose ledger row
// was committed.
type Execution struct {
	ID        uint64 // the upstream's number for it, also sent back as X-Exec-Id
	User, Key string
	Ref       string
	RowID     int64
	// Replica is the gateway replica whose connection brought the request ("" when not
	// known); Conn numbers that connection at the upstream, and Request the request on
	// it, from 1 (above 1: the gateway reused the connection).
	Replica string
	Conn    uint64
	Request int
	Arrived time.Time // the request was read
	// Answered is when the upstream began writing its answer, after any delay it added
	// (Slow).
	Answered time.Time
	Slow     time.Duration
	// Held is how long the upstream held the answer back at a failover's start (see
	// upstream.holdAnswers), always shorter than the gateways' upstream timeout.
	Held     time.Duration
	Pad      int    // bytes of padding in the answer
	WriteErr string // "": the whole answer was written to the connection
	// Fault is the kind of the fault the upstream link injected on this answer ("" for
	// none), FaultRequest the request's number on the gateway's connection then.
	Fault        string
	FaultRequest int
	// Absorbed: the ledger deduplicates (dedup mode) and already held the payment; the
	// delivery found it instead of making another row.
	Absorbed bool
}

// Delivered reports whether the answer left the upstream whole and the upstream link
// forwarded it.
func (e Execution) Delivered() bool { return e.WriteErr == "" && e.Fault == "" }

func (e Execution) String() string {
	s := fmt.Sprintf("exec %d %s via %s conn %d req %d, answered +%s", e.ID, e.Arrived.Format(timeFormat),
		cmp.Or(e.Replica, "?"), e.Conn, e.Request, e.Answered.Sub(e.Arrived).Round(time.Millisecond))
	if e.Slow > 0 {
		s += fmt.Sprintf(" (slowed %s)", e.Slow.Round(time.Millisecond))
	}
	if e.Held > 0 {
		s += fmt.Sprintf(" (held %s as the failover began)", e.Held.Round(time.Millisecond))
	}
	if e.Pad > 0 {
		s += fmt.Sprintf(", %d B padding", e.Pad)
	}
	switch {
	case e.Fault != "":
		s += fmt.Sprintf(", upstream link fault %s on request %d of its connection", e.Fault, e.FaultRequest)
	case e.WriteErr != "":
		s += ", answer not written: " + e.WriteErr
	default:
		s += ", delivered"
	}
	return s
}

const timeFormat = "15:04:05.000"

// GatewayLine is one "request" line of a gateway's log, as far as the suite reads it.
type GatewayLine struct {
	Replica       string
	PID           int
	Time          time.Time
	Outcome       string
	Status        int
	UpstreamError string // the gateway's name for a failed upstream call: timeout, failed, body-failed, …
	Err           string
	// Latency is the request's whole time in the gateway, UpstreamLatency its upstream
	// call's (0: not logged).
	Latency, UpstreamLatency time.Duration
	ClientGone               bool
	Rest                     string // the line's other attributes, "name=value" in name order
}

func (l GatewayLine) String() string {
	s := fmt.Sprintf("%s %s#%d %s %d", l.Time.Format(timeFormat), l.Replica, l.PID, l.Outcome, l.Status)
	if l.UpstreamError != "" {
		s += " upstream_error=" + l.UpstreamError
	}
	if l.Err != "" {
		s += fmt.Sprintf(" err=%q", l.Err)
	}
	if l.ClientGone {
		s += " client_gone"
	}
	if l.Latency > 0 {
		s += fmt.Sprintf(" latency=%s", roundDuration(l.Latency))
	}
	if l.UpstreamLatency > 0 {
		s += fmt.Sprintf(" upstream_latency=%s", roundDuration(l.UpstreamLatency))
	}
	if l.Rest != "" {
		s += " " + l.Rest
	}
	return s
}

// ownerLine reports whether the line can be the one of a request that owned the key
// (claimed it and ran): every line but those of requests that were answered without
// running — a replay, a 409, a 422, a rejected key or body — and a claim the store
// failed (503). Outcome names the suite does not know count as owners.
func (l GatewayLine) ownerLine() bool {
	switch l.Outcome {
	case "replayed", "conflict", "mismatch", "missing-key", "invalid-key", "too-large", "bad-body",
		"pass-through", "budget-exhausted":
		return false
	case "store-error": // a 503, whose line names no status when the client had gone
		return l.Status != 503 && l.Status != 0
	case "store-not-durable":
		return false
	}
	return l.Status != 409 && l.Status != 422
}

// parseLine reads one JSON log line of a gateway defensively: a line that is not JSON,
// or lacks an attribute, or has one of another type, gives zero values, and attributes
// the suite does not know are kept (rendered) rather than rejected. It returns the
// line's level and message, and for a "request" line with a key the key and the line.
func parseLine(s, replica string, pid int) (level, msg, key string, gl GatewayLine, attrs map[string]any) {
	if err := json.Unmarshal([]byte(s), &attrs); err != nil {
		return "", "", "", GatewayLine{}, nil
	}
	str := func(name string) string {
		v, _ := attrs[name].(string)
		return v
	}
	level, msg = str("level"), str("msg")
	if msg != "request" {
		return level, msg, "", GatewayLine{}, attrs
	}
	key = str("key")
	gl = GatewayLine{Replica: replica, PID: pid, Outcome: str("outcome"), UpstreamError: str("upstream_error"), Err: str("err")}
	gl.Time, _ = time.Parse(time.RFC3339Nano, str("time"))
	if v, ok := attrs["status"].(float64); ok {
		gl.Status = int(v)
	}
	gl.ClientGone, _ = attrs["client_gone"].(bool)
	if v, ok := attrs["latency_ms"].(float64); ok { // the gateway logs durations in milliseconds
		gl.Latency = millis(v)
	}
	if v, ok := attrs["upstream_latency_ms"].(float64); ok {
		gl.UpstreamLatency = millis(v)
	}
	var rest []string
	for name, v := range attrs {
		switch name {
		case "time", "level", "msg", "method", "path", "key", "outcome", "status", "upstream_error", "err", "client_gone", "remote",
			"latency_ms", "upstream_latency_ms":
			continue
		}
		if f, ok := v.(float64); ok && strings.HasSuffix(name, "_ms") {
			v = roundDuration(millis(f))
		}
		rest = append(rest, fmt.Sprintf("%s=%v", name, v))
	}
	sort.Strings(rest)
	gl.Rest = strings.Join(rest, " ")
	return level, msg, key, gl, attrs
}

// millis is the duration of ms milliseconds.
func millis(ms float64) time.Duration {
	return time.Duration(math.Round(ms * float64(time.Millisecond)))
}

func roundDuration(d time.Duration) time.Duration {
	if d >= time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}

// forwardFailed reports whether the line says the gateway forwarded the request and then
// gave the key up to its lease because no whole answer came: a 504 upstream timeout, a
// 502 broken connection, or a body that broke off.
func (l GatewayLine) forwardFailed() bool {
	switch l.UpstreamError {
	case "timeout", "failed", "body-failed":
		return true
	}
	return strings.Contains(l.Outcome, "abandon") && (l.Status == 502 || l.Status == 504)
}

// storeTrouble reports whether the line says the store failed the request's owner.
func (l GatewayLine) storeTrouble() bool {
	return l.Outcome == "store-error" || l.Outcome == "lease-lost"
}

// HeldAndLost reports whether a gateway process held the key's answer because the store
// could not take it (a "stored-later" line) and was then killed: the client got the
// answer, the store never did.
func (ev Evidence) HeldAndLost(key string) bool {
	for _, l := range ev.Lines[key] {
		if l.Outcome != "stored-later" {
			continue
		}
		for _, p := range ev.Processes {
			if p.Replica == l.Replica && p.PID == l.PID && p.Killed {
				return true
			}
		}
	}
	return false
}

// Process is one process of a gateway replica.
type Process struct {
	Replica string
	PID     int
	Start   time.Time
	End     time.Time // zero: still running when the evidence was taken
	Killed  bool      // ended by the suite's SIGKILL
}

// Partition is one fault of the gateways' link to their store.
type Partition struct {
	Kind       string // "cut", "stall" or "latency"
	Start, End time.Time
	Latency    time.Duration // "latency" only
}

func (p Partition) String() string {
	s := fmt.Sprintf("%s %s–%s (%s)", p.Kind, p.Start.Format(timeFormat), p.End.Format(timeFormat), p.End.Sub(p.Start).Round(time.Millisecond))
	if p.Latency > 0 {
		s += fmt.Sprintf(" +%s", p.Latency.Round(time.Millisecond))
	}
	return s
}

// Failover is one failover of the store: its synchronous standby (or the replica the
// store waits for) cut off from the primary first, then the primary lost and the standby
// promoted in its place.
type Failover struct {
	Kind string // "postgres" (a promotion) or "redis" (a Sentinel failover)
	// Start is when the standby's replication link stalled: from then on no write could
	// be acknowledged. Lost is when the primary was lost (stopped immediately, or
	// SIGKILLed); Promoted when the standby took writes (PostgreSQL: pg_ctl promote
	// returned; Redis: the Sentinel switched masters); End when writes could be
	// acknowledged again (PostgreSQL: at the promotion, the promoted standby commits
	// alone; Redis: once a new replica of the promoted master is online).
	Start, Lost, Promoted, End time.Time
}

func (f Failover) String() string {
	since := func(t time.Time) string { return "+" + t.Sub(f.Start).Round(time.Millisecond).String() }
	switch f.Kind {
	case "postgres":
		return fmt.Sprintf("%s synchronous standby's replication link stalled; %s primary stopped (immediate); %s standby promoted, writable",
			f.Start.Format(timeFormat), since(f.Lost), since(f.Promoted))
	case "redis":
		return fmt.Sprintf("%s replica's replication link stalled; %s master SIGKILLed; %s Sentinel switched to the replica; %s a new replica online (WAIT met again)",
			f.Start.Format(timeFormat), since(f.Lost), since(f.Promoted), since(f.End))
	}
	return fmt.Sprintf("%s %s failover, lost %s, promoted %s, end %s", f.Start.Format(timeFormat), f.Kind, since(f.Lost), since(f.Promoted), since(f.End))
}

// BodyCut is a response body that broke off while a client read it.
type BodyCut struct {
	At   time.Time
	Read int64 // bytes read before the break
	Err  string
	Slow bool // the client was reading this answer slowly on purpose
}

// Evidence is everything the attribution looks at.
type Evidence struct {
	Executions []Execution
	Lines      map[string][]GatewayLine // by Idempotency-Key
	Processes  []Process
	Partitions []Partition
	Failovers  []Failover
	BodyCuts   map[string][]BodyCut // by Idempotency-Key
	// UpstreamTimeout is the gateways' --upstream-timeout: an upstream that began its
	// answer later than that was too late.
	UpstreamTimeout time.Duration
}

// Cause is why a payment was executed again.
type Cause int

// The causes. The first two are the documented windows a gateway in front of a service
// that does not deduplicate cannot close; the others must never happen.
const (
	// CauseKilled: the replica that forwarded the previous execution was killed before it
	// logged the request (so before it stored the answer); after the lease a retry
	// forwarded again.
	CauseKilled Cause = iota + 1
	// CauseAnswerLost: the previous execution's answer never (fully) reached the gateway —
	// the upstream link withheld, reset or cut it, or the upstream began it too late —
	// and the gateway answered 504 or 502 (or broke the body off) and left the key to its
	// lease, after which a retry forwarded again.
	CauseAnswerLost
	// CauseResend: the same gateway request reached the upstream twice: after the answer
	// was lost on a keep-alive connection it counts as reused, the gateway's HTTP
	// transport sent the request again on another one by itself.
	CauseResend
	// CauseStore: the owner could not store the answer, or lost its lease, while the
	// store was unreachable (partition, restart), and a retry took the key over.
	CauseStore
	// CauseSlowReader: the answer reached the gateway whole and in time, but the client
	// read it slowly; the gateway's upstream timeout cut the answer off, the key was left
	// to its lease, and a retry forwarded again.
	CauseSlowReader
	// CauseFailover: a failover of the store came between the two executions, and nothing
	// else explains the second: the promoted standby lacked the key's completion, or its
	// claim, though the gateway had taken it as acknowledged (with a synchronous standby,
	// or Redis with wait=N, a failover loses no acknowledged write).
	CauseFailover
	// CauseUnexplained: none of the above.
	CauseUnexplained
)

// Causes returns every cause, in order.
func Causes() []Cause {
	return []Cause{CauseKilled, CauseAnswerLost, CauseResend, CauseStore, CauseSlowReader, CauseFailover, CauseUnexplained}
}

// Allowed reports whether the cause is a documented window.
func (c Cause) Allowed() bool { return c == CauseKilled || c == CauseAnswerLost }

func (c Cause) String() string {
	switch c {
	case CauseKilled:
		return "replica killed"
	case CauseAnswerLost:
		return "answer lost"
	case CauseResend:
		return "transport resend"
	case CauseStore:
		return "store unreachable"
	case CauseSlowReader:
		return "slow reader"
	case CauseFailover:
		return "store failover"
	case CauseUnexplained:
		return "unexplained"
	}
	return fmt.Sprintf("Cause(%d)", int(c))
}

// Extra is one execution beyond the first of a payment, and why it happened.
type Extra struct {
	Cause Cause
	// Detail says what showed the cause: the kill, the fault, the gateway line.
	Detail    string
	Prev, Cur Execution
}

// Attribution is the verdict on every execution beyond the first of a payment.
type Attribution struct {
	Executions int // executions in all
	Keys       int // payments (user, key) executed more than once
	Extras     []Extra
	ByCause    map[Cause]int
	// ByReason splits CauseAnswerLost by what kept the answer from the gateway: the
	// upstream link's fault kind, "slow answer" (the upstream delayed it on purpose) or
	// "slow upstream" (the ledger was slow).
	ByReason map[string]int
}

// Unallowed returns the number of extra executions with a cause that is not allowed.
func (a Attribution) Unallowed() int {
	n := 0
	for c, v := range a.ByCause {
		if !c.Allowed() {
			n += v
		}
	}
	return n
}

// Slack for comparing times taken by different processes on one machine, and for the
// distance between a request leaving a gateway and reaching the upstream (the upstream
// link adds a few milliseconds of latency).
const (
	clockSlack   = 5 * time.Millisecond
	transitSlack = 300 * time.Millisecond
)

// Attribute finds, for every execution beyond the first of a payment, why it happened.
// Executions of a payment are taken in arrival order, and each is explained by what
// became of the one before it:
//
//   - the same gateway process forwarded both with no request of the key ending in
//     between, the first on a connection whose answer the upstream link lost or reset,
//     the second at once on another connection: CauseResend;
//   - the process that forwarded the first was killed after it forwarded and before it
//     logged the request: CauseKilled;
//   - the line of the request that forwarded the first (the owner's line, found by its
//     process and its start and end) says the forward failed (504, 502, body broken off),
//     the second came after the gateway stopped waiting for the answer, and the upstream
//     side shows why the answer did not arrive (a fault of the upstream link on it, or an
//     answer begun later than the upstream timeout): CauseAnswerLost;
//   - the same failed forward with an answer that left the upstream whole and in time,
//     while the client read slowly and its body broke off: CauseSlowReader;
//   - the owner's line says the store failed it (store-error, lease-lost; logged before
//     the second execution or after it), or a store partition overlapped the two
//     executions: CauseStore;
//   - anything else: CauseUnexplained.
func Attribute(ev Evidence) Attribution {
	a := Attribution{Executions: len(ev.Executions), ByCause: map[Cause]int{}, ByReason: map[string]int{}}
	type userKey struct{ user, key string }
	byKey := map[userKey][]Execution{}
	var order []userKey
	for _, e := range ev.Executions {
		k := userKey{e.User, e.Key}
		if byKey[k] == nil {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], e)
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i].user != order[j].user {
			return order[i].user < order[j].user
		}
		return order[i].key < order[j].key
	})
	for _, k := range order {
		es := byKey[k]
		if len(es) < 2 {
			continue
		}
		a.Keys++
		sort.Slice(es, func(i, j int) bool { return es[i].Arrived.Before(es[j].Arrived) })
		for i := 1; i < len(es); i++ {
			x := ev.explain(es[i-1], es[i])
			a.Extras = append(a.Extras, x)
			a.ByCause[x.Cause]++
			if x.Cause == CauseAnswerLost {
				a.ByReason[answerLostReason(es[i-1])]++
			}
		}
	}
	return a
}

// answerLostReason names what kept prev's answer from the gateway.
func answerLostReason(prev Execution) string {
	switch {
	case prev.Fault != "":
		return prev.Fault
	case prev.Slow > 0:
		return "slow answer"
	default:
		return "slow upstream"
	}
}

// candidates returns the processes of e's replica that can have forwarded e. When none
// was running as e arrived, it returns the one that ended last before, with inTransit
// set: e was sent by it and reached the upstream after its end.
func (ev Evidence) candidates(e Execution) (procs []Process, inTransit bool) {
	var last *Process // the replica's process that ended last before e arrived
	for i, p := range ev.Processes {
		if p.Replica != e.Replica || p.Start.After(e.Arrived.Add(clockSlack)) {
			continue
		}
		if !p.End.IsZero() && p.End.Before(e.Arrived.Add(-transitSlack)) {
			if last == nil || p.End.After(last.End) {
				last = &ev.Processes[i]
			}
			continue
		}
		procs = append(procs, p)
	}
	// No process of the replica was running when e arrived: the request was in transit
	// longer than transitSlack (a starved proxy on a loaded machine), and its sender can
	// only be the process that ended last before, since a process started after e
	// arrived cannot have sent it.
	if len(procs) == 0 && last != nil {
		return []Process{*last}, true
	}
	return procs, false
}

// linesOf returns key's owner lines from process p logged in [from, to).
func (ev Evidence) linesOf(key string, p Process, from, to time.Time) []GatewayLine {
	var out []GatewayLine
	for _, l := range ev.Lines[key] {
		if l.Replica == p.Replica && l.PID == p.PID && l.ownerLine() && !l.Time.Before(from.Add(-clockSlack)) && l.Time.Before(to) {
			out = append(out, l)
		}
	}
	return out
}

func (ev Evidence) explain(prev, cur Execution) Extra {
	x := Extra{Prev: prev, Cur: cur}
	procs, inTransit := ev.candidates(prev)
	far := cur.Arrived.Add(time.Hour) // "until the end"

	// One gateway process forwarded both with no request of the key ending in between.
	sameProc := ""
	for _, p := range procs {
		if p.Replica != cur.Replica || (!p.End.IsZero() && p.End.Before(cur.Arrived)) {
			continue
		}
		if len(ev.linesOf(cur.Key, p, prev.Arrived, cur.Arrived)) > 0 {
			continue
		}
		// http.Transport resends at once, on another connection (a new one, or an idle
		// one from its pool), after a failure on a connection it counts as reused: one
		// that served a request before, or one it dialed and parked in its idle pool
		// before this request took it.
		if (prev.Fault == "response-lost" || prev.Fault == "response-reset") && cur.Conn != prev.Conn &&
			cur.Arrived.Sub(prev.Answered) < time.Second {
			x.Cause = CauseResend
			x.Detail = fmt.Sprintf("%s#%d forwarded it twice in one request: the answer of the first was lost (%s, request %d of its connection), the second went on connection %d %s later",
				p.Replica, p.PID, prev.Fault, prev.FaultRequest, cur.Conn, cur.Arrived.Sub(prev.Answered).Round(time.Millisecond))
			return x
		}
		sameProc = fmt.Sprintf("%s#%d forwarded it twice with no request of the key ending in between (two owners at once, or two forwards in one request)", p.Replica, p.PID)
	}

	// The forwarding process was killed before it logged the request. Lines of the key's
	// other requests on that process (a retry refused, a duplicate that waited), which
	// began after prev reached the upstream, are not the forwarding request's.
	began := func(l GatewayLine) bool {
		return l.Latency <= 0 || !l.Time.Add(-l.Latency).After(prev.Arrived.Add(clockSlack))
	}
	for _, p := range procs {
		if !p.Killed || !inTransit && p.End.Before(prev.Arrived.Add(-transitSlack)) || !p.End.Before(cur.Arrived) {
			continue
		}
		if !slices.ContainsFunc(ev.linesOf(cur.Key, p, prev.Arrived, far), began) {
			x.Cause = CauseKilled
			if inTransit {
				x.Detail = fmt.Sprintf("%s#%d was killed at %s, %s before the upstream got the request it had sent, before it logged it",
					p.Replica, p.PID, p.End.Format(timeFormat), prev.Arrived.Sub(p.End).Round(time.Millisecond))
			} else {
				x.Detail = fmt.Sprintf("%s#%d was killed at %s, %s after the upstream got the request, before it logged it",
					p.Replica, p.PID, p.End.Format(timeFormat), p.End.Sub(prev.Arrived).Round(time.Millisecond))
			}
			return x
		}
	}

	// The line of the request that forwarded prev: an owner line of its process whose
	// request began before prev reached the upstream and ended after. When there are
	// several (two owners at once), the one that says the store failed it wins, then a
	// failed forward, then the earliest.
	rank := func(l GatewayLine) int {
		switch {
		case l.storeTrouble():
			return 0
		case l.forwardFailed():
			return 1
		}
		return 2
	}
	own, found := GatewayLine{}, false
	for _, p := range procs {
		for _, l := range ev.linesOf(cur.Key, p, prev.Arrived, far) {
			if !began(l) {
				continue // began after prev: another request
			}
			if !found || rank(l) < rank(own) || rank(l) == rank(own) && l.Time.Before(own.Time) {
				own, found = l, true
			}
		}
	}
	if found && own.forwardFailed() {
		// The gateway stopped waiting for the answer about UpstreamLatency after the
		// upstream got the request; a retry may forward again only after that.
		gaveUp := own.Time
		if own.UpstreamLatency > 0 {
			gaveUp = prev.Arrived.Add(own.UpstreamLatency)
		}
		late := prev.Answered.Sub(prev.Arrived) >= ev.UpstreamTimeout-100*time.Millisecond
		switch {
		case cur.Arrived.Before(gaveUp.Add(-clockSlack)):
			// A second forward while the owner still waited for the answer: judged below.
		case prev.Fault != "":
			x.Cause = CauseAnswerLost
			x.Detail = fmt.Sprintf("the upstream link injected %s on the answer; the gateway logged: %s", prev.Fault, own)
			return x
		case late:
			x.Cause = CauseAnswerLost
			x.Detail = fmt.Sprintf("the upstream began its answer %s after the request (timeout %s); the gateway logged: %s",
				prev.Answered.Sub(prev.Arrived).Round(time.Millisecond), ev.UpstreamTimeout, own)
			return x
		default:
			for _, c := range ev.BodyCuts[cur.Key] {
				if c.Slow && !c.At.Before(prev.Arrived) && c.At.Before(cur.Arrived) {
					x.Cause = CauseSlowReader
					x.Detail = fmt.Sprintf("the answer left the upstream whole %s after the request, no fault on it; the client read slowly and its body broke off at %s after %d bytes (%s); the gateway logged: %s",
						prev.Answered.Sub(prev.Arrived).Round(time.Millisecond), c.At.Format(timeFormat), c.Read, c.Err, own)
					return x
				}
			}
			x.Cause = CauseUnexplained
			x.Detail = fmt.Sprintf("the gateway gave the key up (%s) though the answer left the upstream whole %s after the request with no fault on the upstream link",
				own, prev.Answered.Sub(prev.Arrived).Round(time.Millisecond))
			return x
		}
	}
	// The owner held the answer the store could not take (stored-later), to store it when
	// the store answered, and was killed before it could: the process died between
	// forwarding and storing.
	if found && own.Outcome == "stored-later" {
		for _, p := range procs {
			if p.Replica == own.Replica && p.PID == own.PID && p.Killed && p.End.Before(cur.Arrived) {
				x.Cause = CauseKilled
				x.Detail = fmt.Sprintf("%s#%d held the answer for a store it could not reach and was killed at %s, before it stored it; its line: %s",
					p.Replica, p.PID, p.End.Format(timeFormat), own)
				return x
			}
		}
	}
	// A failover between the two: the owner's claim or completion, which it took as
	// acknowledged, was not on the standby promoted.
	for _, f := range ev.Failovers {
		if f.Start.Before(cur.Arrived) && f.End.After(prev.Arrived.Add(-transitSlack)) {
			x.Cause = CauseFailover
			x.Detail = "store failover between the two executions: " + f.String()
			if found {
				x.Detail += "; the owner's request line: " + own.String()
			}
			return x
		}
	}
	// Store trouble shows in the owner's line, which may come after the takeover: an owner
	// stuck on the store logs only when its store calls give up.
	if found && own.storeTrouble() {
		x.Cause = CauseStore
		x.Detail = "the owner's request line: " + own.String()
		return x
	}
	for _, p := range ev.Partitions {
		if p.Kind != "latency" && p.Start.Before(cur.Arrived) && p.End.After(prev.Arrived) {
			x.Cause = CauseStore
			x.Detail = "store partition " + p.String() + " between the two executions"
			if found {
				x.Detail += "; the owner's request line: " + own.String()
			}
			return x
		}
	}
	x.Cause = CauseUnexplained
	switch {
	case len(procs) == 0:
		x.Detail = "no gateway process of replica " + cmp.Or(prev.Replica, "?") + " was running when the first execution arrived"
	case found:
		x.Detail = "the owner's request line: " + own.String()
		if sameProc != "" {
			x.Detail = sameProc + "; " + x.Detail
		}
	case sameProc != "":
		x.Detail = sameProc
	default:
		x.Detail = "the forwarding process logged nothing for the key after the first execution and was not killed"
	}
	return x
}

// DescribeKey renders what the gateways and the client logged of key: its gateway
// request lines (up to maxLines, in time order) and the client's broken bodies.
func (ev Evidence) DescribeKey(key string, maxLines int) string {
	var b strings.Builder
	lines := append([]GatewayLine(nil), ev.Lines[key]...)
	sort.Slice(lines, func(i, j int) bool { return lines[i].Time.Before(lines[j].Time) })
	fmt.Fprintf(&b, "      gateway request lines of the key (%d):", len(lines))
	for i, l := range lines {
		if i == maxLines {
			fmt.Fprintf(&b, "\n        … %d more", len(lines)-maxLines)
			break
		}
		fmt.Fprintf(&b, "\n        %s", l)
	}
	if len(lines) == 0 {
		b.WriteString(" none")
	}
	for _, c := range ev.BodyCuts[key] {
		fmt.Fprintf(&b, "\n      client body broke off at %s after %d bytes (slow reader %v): %s", c.At.Format(timeFormat), c.Read, c.Slow, c.Err)
	}
	return b.String()
}

// DescribeExecutions renders the executions of key and the kills of gateway processes
// from a second before the first of them to within d after the last, then
// DescribeKey's lines: what a failure report about the key (stuck, or unlike what its
// client saw) needs.
func (ev Evidence) DescribeExecutions(key string, d time.Duration, maxLines int) string {
	var b strings.Builder
	var es []Execution
	for _, e := range ev.Executions {
		if e.Key == key {
			es = append(es, e)
		}
	}
	sort.Slice(es, func(i, j int) bool { return es[i].Arrived.Before(es[j].Arrived) })
	fmt.Fprintf(&b, "      executions of the key (%d):", len(es))
	for _, e := range es {
		fmt.Fprintf(&b, "\n        %s", e)
	}
	if len(es) > 0 {
		from, to := es[0].Arrived.Add(-time.Second), es[len(es)-1].Arrived.Add(d)
		for _, p := range ev.Processes {
			if p.Killed && p.End.After(from) && p.End.Before(to) {
				fmt.Fprintf(&b, "\n      kill: %s#%d at %s", p.Replica, p.PID, p.End.Format(timeFormat))
			}
		}
		for _, p := range ev.Partitions {
			if p.Start.Before(to) && p.End.After(from) {
				fmt.Fprintf(&b, "\n      store link: %s", p)
			}
		}
		for _, f := range ev.Failovers {
			if f.Start.Before(to) && f.End.After(from) {
				fmt.Fprintf(&b, "\n      store failover: %s", f)
			}
		}
	}
	b.WriteString("\n" + ev.DescribeKey(key, maxLines))
	return b.String()
}

// Describe renders x for a failure report: the payment, both executions, what showed
// the cause, and the key's gateway request lines (up to maxLines, in time order).
func (ev Evidence) Describe(x Extra, maxLines int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  %s: key %s (user %s, ref %s)\n", x.Cause, x.Cur.Key, x.Cur.User, x.Cur.Ref)
	fmt.Fprintf(&b, "      first:  %s\n", x.Prev)
	fmt.Fprintf(&b, "      again:  %s\n", x.Cur)
	fmt.Fprintf(&b, "      why:    %s\n", x.Detail)
	b.WriteString(ev.DescribeKey(x.Cur.Key, maxLines))
	return b.String()
}

// DescribeFailover renders f and every gateway request line logged from a second before
// it began to after past its end, in time order, with its key: what the gateways did
// through the failover.
func (ev Evidence) DescribeFailover(f Failover, after time.Duration) string {
	type keyed struct {
		key string
		l   GatewayLine
	}
	var ls []keyed
	from, to := f.Start.Add(-time.Second), f.End.Add(after)
	for k, kls := range ev.Lines {
		for _, l := range kls {
			if !l.Time.Before(from) && l.Time.Before(to) {
				ls = append(ls, keyed{k, l})
			}
		}
	}
	sort.Slice(ls, func(i, j int) bool { return ls[i].l.Time.Before(ls[j].l.Time) })
	var b strings.Builder
	fmt.Fprintf(&b, "store failover: %s\n  gateway request lines from %s to %s (%d):", f, from.Format(timeFormat), to.Format(timeFormat), len(ls))
	for _, k := range ls {
		fmt.Fprintf(&b, "\n    %s key %s", k.l, k.key)
	}
	return b.String()
}
