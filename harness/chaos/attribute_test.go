package chaos

import (
	"strings"
	"testing"
	"time"
)

// TestAttribute gives Attribute one scenario per cause, built as the suite would see it,
// and checks that each extra execution gets its cause: an attribution that cannot tell
// an allowed window from a bug would pass every run.
func TestAttribute(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	procs := []Process{
		{Replica: "gw-1", PID: 100, Start: ms(-60000)},
		{Replica: "gw-2", PID: 200, Start: ms(-60000)},
	}
	exec := func(replica string, arrived, answered int) Execution {
		return Execution{User: "u", Key: "k", Ref: "r", Replica: replica, Conn: 1, Request: 1, Arrived: ms(arrived), Answered: ms(answered)}
	}
	on := func(e Execution, conn uint64, req int) Execution {
		e.Conn, e.Request = conn, req
		return e
	}
	timed := func(l GatewayLine, latency, upstream int) GatewayLine {
		l.Latency, l.UpstreamLatency = time.Duration(latency)*time.Millisecond, time.Duration(upstream)*time.Millisecond
		return l
	}
	line := func(replica string, pid, at int, outcome string, status int, upErr, err string) GatewayLine {
		return GatewayLine{Replica: replica, PID: pid, Time: ms(at), Outcome: outcome, Status: status, UpstreamError: upErr, Err: err}
	}
	cases := []struct {
		name   string
		prev   func(e *Execution)
		cur    Execution
		lines  []GatewayLine
		procs  []Process
		parts  []Partition
		fos    []Failover
		cuts   []BodyCut
		want   Cause
		reason string // CauseAnswerLost's reason
		words  string // in the detail
	}{
		{name: "replica killed before it logged the request",
			cur: exec("gw-2", 2600, 2610),
			procs: []Process{{Replica: "gw-1", PID: 100, Start: ms(-60000), End: ms(40), Killed: true},
				{Replica: "gw-1", PID: 101, Start: ms(600)}, {Replica: "gw-2", PID: 200, Start: ms(-60000)}},
			want: CauseKilled, words: "gw-1#100 was killed"},
		{name: "replica killed while its request was in transit to the upstream",
			prev: func(e *Execution) { e.Arrived, e.Answered = ms(1000), ms(1010) },
			cur:  exec("gw-2", 2600, 2610),
			procs: []Process{{Replica: "gw-1", PID: 100, Start: ms(-60000), End: ms(40), Killed: true},
				{Replica: "gw-1", PID: 101, Start: ms(1500)}, {Replica: "gw-2", PID: 200, Start: ms(-60000)}},
			want: CauseKilled, words: "gw-1#100 was killed at 12:00:00.040, 960ms before the upstream got the request it had sent"},
		{name: "replica killed before it logged the request, other requests of the key logged on it",
			cur: exec("gw-2", 9000, 9010),
			lines: []GatewayLine{timed(line("gw-1", 100, 2500, "store-not-durable", 503, "", ""), 1, 0),
				timed(line("gw-1", 100, 2600, "client-gone", 0, "", ""), 2000, 0)},
			procs: []Process{{Replica: "gw-1", PID: 100, Start: ms(-60000), End: ms(4000), Killed: true},
				{Replica: "gw-1", PID: 101, Start: ms(4600)}, {Replica: "gw-2", PID: 200, Start: ms(-60000)}},
			fos:  []Failover{{Kind: "redis", Start: ms(400), Lost: ms(3900), Promoted: ms(6200), End: ms(6600)}},
			want: CauseKilled, words: "gw-1#100 was killed"},
		{name: "answer held by the upstream link",
			prev:  func(e *Execution) { e.Fault, e.FaultRequest = "read-timeout", 4 },
			cur:   exec("gw-2", 4600, 4610),
			lines: []GatewayLine{line("gw-1", 100, 2510, "abandoned", 504, "timeout", "context deadline exceeded")},
			want:  CauseAnswerLost, reason: "read-timeout", words: "injected read-timeout"},
		{name: "answer reset on a new connection",
			prev:  func(e *Execution) { e.Fault, e.FaultRequest = "response-reset", 1 },
			cur:   exec("gw-1", 3000, 3010),
			lines: []GatewayLine{line("gw-1", 100, 20, "abandoned", 502, "failed", "read: connection reset by peer")},
			want:  CauseAnswerLost, reason: "response-reset", words: "injected response-reset"},
		{name: "slow answer",
			prev:  func(e *Execution) { e.Answered, e.Slow = ms(3200), 3200*time.Millisecond },
			cur:   exec("gw-1", 4700, 4710),
			lines: []GatewayLine{line("gw-1", 100, 2505, "abandoned", 504, "timeout", "context deadline exceeded")},
			want:  CauseAnswerLost, reason: "slow answer", words: "began its answer 3.2s after"},
		{name: "resent by the transport",
			prev:  func(e *Execution) { e.Fault, e.FaultRequest, e.Request = "response-lost", 3, 3 },
			cur:   on(exec("gw-1", 15, 20), 7, 12), // an idle connection from the transport's pool
			lines: []GatewayLine{line("gw-1", 100, 12, "conflict", 409, "", ""), line("gw-1", 100, 30, "executed", 201, "", "")},
			want:  CauseResend, words: "forwarded it twice in one request"},
		{name: "resent after a loss on a connection parked in the idle pool",
			prev:  func(e *Execution) { e.Fault, e.FaultRequest = "response-reset", 1 },
			cur:   on(exec("gw-1", 15, 20), 7, 3),
			lines: []GatewayLine{line("gw-1", 100, 30, "executed", 201, "", "")},
			want:  CauseResend, words: "request 1 of its connection"},
		{name: "two owners at once, one line each",
			cur: on(exec("gw-1", 3, 30), 7, 3),
			lines: []GatewayLine{timed(line("gw-1", 100, 40, "executed", 201, "", ""), 200, 24),
				timed(line("gw-1", 100, 40, "lease-lost", 201, "", ""), 2400, 30)},
			want: CauseStore, words: "lease-lost"},
		{name: "two forwards in one request without a lost answer",
			cur:   exec("gw-1", 15, 20),
			lines: []GatewayLine{line("gw-1", 100, 30, "executed", 201, "", "")},
			want:  CauseUnexplained, words: "no request of the key ending in between"},
		{name: "retried a moment before the owner logged its timeout",
			prev: func(e *Execution) { e.Answered, e.Slow = ms(3300), 3300*time.Millisecond },
			cur:  on(exec("gw-1", 4837, 4840), 9, 1),
			lines: []GatewayLine{timed(line("gw-1", 100, 4838, "abandoned", 504, "timeout", "context deadline exceeded"), 4838, 2500),
				timed(line("gw-1", 100, 4850, "executed", 201, "", ""), 13, 3)},
			want: CauseAnswerLost, reason: "slow answer", words: "began its answer 3.3s after"},
		{name: "two owners in one process, the first lost its lease",
			cur: on(exec("gw-1", 4700, 4705), 2, 1),
			lines: []GatewayLine{timed(line("gw-1", 100, 4720, "executed", 201, "", ""), 20, 5),
				timed(line("gw-1", 100, 4725, "lease-lost", 201, "", ""), 4725, 10)},
			want: CauseStore, words: "lease-lost"},
		{name: "second forward while the owner still waited for the answer",
			prev:  func(e *Execution) { e.Fault, e.FaultRequest = "read-timeout", 2 },
			cur:   exec("gw-2", 1000, 1010),
			lines: []GatewayLine{timed(line("gw-1", 100, 2600, "abandoned", 504, "timeout", "context deadline exceeded"), 2600, 2500)},
			want:  CauseUnexplained, words: "abandoned 504"},
		{name: "answer held for the store, the holder killed before it stored it",
			cur:   exec("gw-2", 7000, 7010),
			lines: []GatewayLine{line("gw-1", 100, 3200, "stored-later", 201, "", "")},
			procs: []Process{{Replica: "gw-1", PID: 100, Start: ms(-60000), End: ms(4000), Killed: true},
				{Replica: "gw-2", PID: 200, Start: ms(-60000)}},
			parts: []Partition{{Kind: "stall", Start: ms(5), End: ms(3100)}},
			want:  CauseKilled, words: "held the answer"},
		{name: "answer held for the store, the holder alive: the store's fault",
			cur:   exec("gw-2", 7000, 7010),
			lines: []GatewayLine{line("gw-1", 100, 3200, "stored-later", 201, "", "")},
			parts: []Partition{{Kind: "stall", Start: ms(5), End: ms(3100)}},
			want:  CauseStore, words: "stored-later"},
		{name: "completion failed on the store",
			cur:   exec("gw-2", 7000, 7010),
			lines: []GatewayLine{line("gw-1", 100, 5100, "store-error", 201, "", "")},
			want:  CauseStore, words: "store-error"},
		{name: "owner lost its lease, logged after the takeover",
			cur:   exec("gw-2", 4000, 4010),
			lines: []GatewayLine{line("gw-1", 100, 6000, "lease-lost", 201, "", "")},
			want:  CauseStore, words: "lease-lost"},
		{name: "partition between the executions, owner silent",
			cur:   exec("gw-2", 4000, 4010),
			parts: []Partition{{Kind: "stall", Start: ms(5), End: ms(4500)}},
			want:  CauseStore, words: "store partition stall"},
		{name: "a latency spike is no partition",
			cur:   exec("gw-2", 4000, 4010),
			parts: []Partition{{Kind: "latency", Start: ms(5), End: ms(1500), Latency: 100 * time.Millisecond}},
			want:  CauseUnexplained, words: "logged nothing"},
		{name: "a failover between the executions",
			cur:   exec("gw-2", 9000, 9010),
			lines: []GatewayLine{timed(line("gw-1", 100, 5200, "executed", 201, "", ""), 5200, 10)},
			fos:   []Failover{{Kind: "postgres", Start: ms(100), Lost: ms(6000), Promoted: ms(7000), End: ms(7000)}},
			want:  CauseFailover, words: "store failover between the two executions"},
		{name: "a failover between, the forwarding replica killed first: its window",
			cur:   exec("gw-2", 9000, 9010),
			procs: []Process{{Replica: "gw-1", PID: 100, Start: ms(-60000), End: ms(40), Killed: true}, {Replica: "gw-2", PID: 200, Start: ms(-60000)}},
			fos:   []Failover{{Kind: "redis", Start: ms(100), Lost: ms(3000), Promoted: ms(5000), End: ms(5500)}},
			want:  CauseKilled, words: "gw-1#100 was killed"},
		{name: "a failover over before the first execution is not its cause",
			cur:   exec("gw-2", 9000, 9010),
			lines: []GatewayLine{line("gw-1", 100, 30, "executed", 201, "", "")},
			fos:   []Failover{{Kind: "postgres", Start: ms(-9000), Lost: ms(-3000), Promoted: ms(-2000), End: ms(-2000)}},
			want:  CauseUnexplained, words: "executed 201"},
		{name: "slow reader cut off",
			prev:  func(e *Execution) { e.Pad = 2_000_000 },
			cur:   exec("gw-2", 6000, 6010),
			lines: []GatewayLine{line("gw-1", 100, 2510, "abandoned", 201, "body-failed", "context deadline exceeded")},
			cuts:  []BodyCut{{At: ms(5100), Read: 40960, Err: "unexpected EOF", Slow: true}},
			want:  CauseSlowReader, words: "the client read slowly"},
		{name: "body broke off with no reason on the upstream side",
			cur:   exec("gw-2", 6000, 6010),
			lines: []GatewayLine{line("gw-1", 100, 2510, "abandoned", 201, "body-failed", "context deadline exceeded")},
			want:  CauseUnexplained, words: "no fault on the upstream link"},
		{name: "a stored answer, then another execution",
			cur:   exec("gw-2", 6000, 6010),
			lines: []GatewayLine{line("gw-1", 100, 30, "executed", 201, "", "")},
			want:  CauseUnexplained, words: "executed 201"},
		{name: "an outcome the suite does not know",
			cur:   exec("gw-2", 6000, 6010),
			lines: []GatewayLine{line("gw-1", 100, 30, "stored-later", 201, "", "")},
			want:  CauseUnexplained, words: "stored-later"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			prev := exec("gw-1", 0, 10)
			prev.ID = 1
			if tc.prev != nil {
				tc.prev(&prev)
			}
			cur := tc.cur
			cur.ID = 2
			ev := Evidence{Executions: []Execution{cur, prev, {User: "u", Key: "other", Arrived: ms(0)}},
				Lines: map[string][]GatewayLine{"k": tc.lines}, Processes: procs, Partitions: tc.parts, Failovers: tc.fos,
				BodyCuts: map[string][]BodyCut{"k": tc.cuts}, UpstreamTimeout: 2500 * time.Millisecond}
			if tc.procs != nil {
				ev.Processes = tc.procs
			}
			a := Attribute(ev)
			if a.Executions != 3 || a.Keys != 1 || len(a.Extras) != 1 {
				t.Fatalf("attribution %+v, want one extra execution of one payment", a)
			}
			x := a.Extras[0]
			if x.Cause != tc.want || a.ByCause[tc.want] != 1 {
				t.Fatalf("cause %v (%s), want %v", x.Cause, x.Detail, tc.want)
			}
			if x.Prev.ID != 1 || x.Cur.ID != 2 {
				t.Errorf("the executions were not taken in arrival order: prev %d, cur %d", x.Prev.ID, x.Cur.ID)
			}
			if !strings.Contains(x.Detail, tc.words) {
				t.Errorf("detail %q lacks %q", x.Detail, tc.words)
			}
			if tc.reason != "" && a.ByReason[tc.reason] != 1 {
				t.Errorf("reasons %v, want %s", a.ByReason, tc.reason)
			}
			if got, want := a.Unallowed(), map[bool]int{true: 0, false: 1}[tc.want.Allowed()]; got != want {
				t.Errorf("Unallowed() = %d, want %d", got, want)
			}
			d := ev.Describe(x, 12)
			if !strings.Contains(d, "key k (user u, ref r)") || !strings.Contains(d, "first:") || !strings.Contains(d, "why:") {
				t.Errorf("description:\n%s", d)
			}
			for _, l := range tc.lines {
				if !strings.Contains(d, l.Outcome) {
					t.Errorf("description lacks the line %s:\n%s", l, d)
				}
			}
		})
	}
}

func TestParseLine(t *testing.T) {
	t.Parallel()
	level, msg, key, gl, _ := parseLine(`{"time":"2025-01-01T12:00:01.5Z","level":"INFO","msg":"request","method":"POST","path":"/payments",`+
		`"outcome":"stored-later","status":201,"latency_ms":3.456,"upstream_latency_ms":1.5,"key":"k1","upstream_error":"body-failed","err":"boom","client_gone":true,"new_attr":7,"remote":"x"}`, "gw-1", 42)
	want := GatewayLine{Replica: "gw-1", PID: 42, Time: time.Date(2025, 1, 1, 12, 0, 1, 5e8, time.UTC), Outcome: "stored-later", Status: 201,
		UpstreamError: "body-failed", Err: "boom", ClientGone: true, Latency: 3456 * time.Microsecond, UpstreamLatency: 1500 * time.Microsecond, Rest: "new_attr=7"}
	if level != "INFO" || msg != "request" || key != "k1" || gl != want {
		t.Errorf("got %q %q %q %+v\nwant %+v", level, msg, key, gl, want)
	}
	// A status of another type, a line that is not JSON: zero values, no panic.
	if _, _, _, gl, _ := parseLine(`{"msg":"request","status":"201","key":"k"}`, "gw", 1); gl.Status != 0 {
		t.Errorf("status %d from a string", gl.Status)
	}
	if level, msg, key, _, attrs := parseLine("panic: oops", "gw", 1); level != "" || msg != "" || key != "" || attrs != nil {
		t.Error("a line that is not JSON parsed")
	}
}

// TestFailoverImpact: what the report says of a failover comes from the gateways' lines:
// the last request executed before the primary's loss and the first after (by when each
// sent its completion, not when it was logged), and the 503s and held answers between.
func TestFailoverImpact(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	f := Failover{Kind: "postgres", Start: ms(0), Lost: ms(6000), Promoted: ms(7000), End: ms(7000)}
	l := func(at int, outcome string, status, latency, upstream int) GatewayLine {
		return GatewayLine{Replica: "gw-1", PID: 1, Time: ms(at), Outcome: outcome, Status: status,
			Latency: time.Duration(latency) * time.Millisecond, UpstreamLatency: time.Duration(upstream) * time.Millisecond}
	}
	lines := map[string][]GatewayLine{
		"a": {l(-30, "executed", 201, 10, 5)},
		// A slow reader: its completion was sent at -3s, its line logged during the stall.
		"b": {l(2000, "executed", 201, 5000, 10)},
		"c": {l(1500, "store-not-durable", 503, 0, 0), l(2500, "store-not-durable", 503, 0, 0), l(6500, "store-error", 503, 0, 0)},
		"d": {l(5100, "stored-later", 201, 5400, 300)},
		"e": {l(7800, "executed", 201, 20, 8), l(9000, "executed", 201, 10, 5)},
		"f": {l(9500, "store-not-durable", 503, 0, 0), l(9600, "store-error", 503, 0, 0)}, // after the first executed
	}
	fi := failoverImpact(f, lines, nil)
	if !fi.LastExecuted.Equal(ms(-35)) || !fi.FirstExecuted.Equal(ms(7788)) {
		t.Errorf("last executed %s, first %s; want -35ms and +7.788s", fi.LastExecuted.Sub(t0), fi.FirstExecuted.Sub(t0))
	}
	if fi.NotDurable != 2 || fi.StoreErrors != 1 || fi.Held != 1 {
		t.Errorf("between: %d not durable, %d store errors, %d held; want 2, 1, 1", fi.NotDurable, fi.StoreErrors, fi.Held)
	}
	if !fi.FirstNotDurable.Equal(ms(1500)) || !fi.LastNotDurable.Equal(ms(9500)) {
		t.Errorf("not durable from %s to %s", fi.FirstNotDurable.Sub(t0), fi.LastNotDurable.Sub(t0))
	}
	if fi.Unwritable() != 7788*time.Millisecond || !fi.HeldBack(500*time.Millisecond) {
		t.Errorf("unwritable %s, held back %v", fi.Unwritable(), fi.HeldBack(500*time.Millisecond))
	}
	if s := fi.Summary(); !strings.Contains(s, "store unwritable 7.788s") || !strings.Contains(s, "503 store-not-durable 2") {
		t.Errorf("summary %q", s)
	}

	// A duplicate that arrived 2.5s into the stall, waited for its key's owner, took the
	// key over after the promotion and executed: the upstream answered it at +7.9s, and
	// its completion went after that, not at its start plus its upstream call.
	waiter := map[string][]GatewayLine{"w": {l(8000, "executed", 201, 5500, 50)}}
	for k, v := range lines {
		waiter[k] = v
	}
	execs := []Execution{{Key: "w", Replica: "gw-1", Arrived: ms(7850), Answered: ms(7900)}}
	if fi := failoverImpact(f, waiter, execs); !fi.HeldBack(500*time.Millisecond) || !fi.FirstExecuted.Equal(ms(7788)) {
		t.Errorf("a waiter executed after the promotion counted as a write during the stall: last %s, first %s",
			fi.LastExecuted.Sub(t0), fi.FirstExecuted.Sub(t0))
	}
	if fi := failoverImpact(f, waiter, nil); fi.HeldBack(500 * time.Millisecond) {
		t.Errorf("without the upstream's word, the waiter's start + upstream call (+2.55s) should count as during the stall")
	}

	// A write acknowledged during the stall: the stall held nothing back.
	lines["g"] = []GatewayLine{l(3000, "executed", 201, 10, 5)}
	if fi := failoverImpact(f, lines, nil); fi.HeldBack(500 * time.Millisecond) {
		t.Errorf("a request executed 2.995s into the stall, and HeldBack says the stall held writes back")
	}
}
