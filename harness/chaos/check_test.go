package chaos

import (
	"strings"
	"testing"
	"time"
)

// TestCheck shows that each check catches what it is meant to: the checker of a chaos
// suite that cannot fail proves nothing.
func TestCheck(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	ok := func(user, ref, key string, id int64) (Payment, Row, StoreRecord) {
		r := Row{ID: id, User: user, Key: key, Ref: ref, Amount: 100 + id}
		return Payment{User: user, Ref: ref, Amount: r.Amount, Key: key, Status: 201, Answer: r}, r,
			StoreRecord{Key: key, Status: 201, AnswerID: id}
	}
	p1, r1, s1 := ok("alice", "a-1", "k1", 1)
	p2, r2, s2 := ok("alice", "a-2", "k2", 2)
	p3, r3, s3 := ok("bob", "b-1", "k3", 3)
	base := func() ([]Payment, []Row, []StoreRecord) {
		return []Payment{p1, p2, p3}, []Row{r1, r2, r3}, []StoreRecord{s1, s2, s3}
	}

	cases := []struct {
		name   string
		change func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord)
		want   func(c Checks) int // the count that must be 1
		words  string             // in the evidence
		judged bool               // OK does not judge it (duplicates: Attribute does)
	}{
		{"duplicate under the same key", func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord) {
			d := r1
			d.ID = 9
			return ps, append(rs, d), ss
		}, func(c Checks) int { return c.Duplicates }, "duplicate: payment alice/a-1", true},
		{"duplicate answered with its second row", func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord) {
			d := r1
			d.ID = 9
			ps[0].Answer, ss[0].AnswerID = d, 9
			return ps, append(rs, d), ss
		}, func(c Checks) int { return c.Duplicates + c.Mismatched }, "duplicate: payment alice/a-1", true},
		{"duplicate under another key", func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord) {
			d := r2
			d.ID, d.Key = 9, "k-changed"
			return ps, append(rs, d), ss
		}, func(c Checks) int { return c.Duplicates }, "duplicate: payment alice/a-2", false},
		{"lost", func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord) {
			return ps, rs[1:], ss
		}, func(c Checks) int { return c.Lost }, "lost: payment alice/a-1", false},
		{"phantom", func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord) {
			return ps, append(rs, Row{ID: 9, User: "carol", Key: "k9", Ref: "c-1", Amount: 5}), ss
		}, func(c Checks) int { return c.Phantoms }, "phantom: ledger row 9", false},
		{"phantom in another scope", func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord) {
			return ps, append(rs, Row{ID: 9, User: "bob", Key: "k1", Ref: "a-1", Amount: 101}), ss
		}, func(c Checks) int { return c.Phantoms }, "phantom: ledger row 9", false},
		{"answer names another payment", func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord) {
			ps[0].Answer.ID = 2
			return ps, rs, ss
		}, func(c Checks) int { return c.Mismatched }, "mismatched: payment alice/a-1", false},
		{"row with another amount", func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord) {
			rs[2].Amount++
			ps[2].Answer.Amount++
			return ps, rs, ss
		}, func(c Checks) int { return c.Mismatched }, "mismatched: ledger row 3", false},
		{"stuck", func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord) {
			return ps, rs, append(ss, StoreRecord{Key: "k-abandoned", InProgress: true, LeaseUntil: now.Add(-time.Second)})
		}, func(c Checks) int { return c.Stuck }, `stuck: key "k-abandoned" in progress (lease expired 1s ago)`, false},
		{"store never completed", func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord) {
			ss[1] = StoreRecord{Key: "k2", InProgress: true, LeaseUntil: now.Add(-time.Second)}
			return ps, rs, ss
		}, func(c Checks) int { return c.StoreDisagrees }, "store: payment alice/a-2", false},
		{"store replays another answer", func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord) {
			ss[0].AnswerID = 7
			return ps, rs, ss
		}, func(c Checks) int { return c.StoreDisagrees }, "store: payment alice/a-1", false},
		{"unfinished", func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord) {
			ps = append(ps, Payment{User: "bob", Ref: "b-2", Amount: 7, Key: "k8"})
			// It may have been executed: its row is no phantom.
			return ps, append(rs, Row{ID: 8, User: "bob", Key: "k8", Ref: "b-2", Amount: 7}), ss
		}, func(c Checks) int { return c.Unfinished }, "", false},
		{"failed", func(ps []Payment, rs []Row, ss []StoreRecord) ([]Payment, []Row, []StoreRecord) {
			return append(ps, Payment{User: "bob", Ref: "b-2", Amount: 7, Key: "k8", Status: 422}), rs, ss
		}, func(c Checks) int { return c.Failed }, "failed: payment bob/b-2", false},
	}
	ps, rs, ss := base()
	if c := Check(ps, rs, ss, now, nil); !c.OK() || c.Succeeded != 3 || c.Rows != 3 || c.Records != 3 || len(c.Evidence) != 0 {
		t.Fatalf("a clean run: %+v", c)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ps, rs, ss := base()
			ps, rs, ss = tc.change(ps, rs, ss)
			c := Check(ps, rs, ss, now, nil)
			if tc.want(c) != 1 || c.OK() == !tc.judged {
				t.Fatalf("not caught once (OK %v): %+v", c.OK(), c)
			}
			if !strings.Contains(strings.Join(c.Evidence, "\n"), tc.words) {
				t.Errorf("evidence lacks %q:\n%s", tc.words, strings.Join(c.Evidence, "\n"))
			}
		})
	}
}

// TestCheckHeldLost: a key whose answer a killed gateway held is counted as that allowed
// window, neither stuck nor a store disagreement, whether it stayed in progress or was
// taken over and run again; any other is stuck, or a disagreement.
func TestCheckHeldLost(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	r := Row{ID: 1, User: "alice", Key: "k1", Ref: "a-1", Amount: 101}
	ps := []Payment{{User: "alice", Ref: "a-1", Amount: 101, Key: "k1", Status: 201, Answer: r}}
	ss := []StoreRecord{{Key: "k1", InProgress: true, LeaseUntil: now.Add(-time.Minute)}}
	held := func(key string) bool { return key == "k1" }
	if c := Check(ps, []Row{r}, ss, now, held); !c.OK() || c.HeldLost != 1 || c.Stuck != 0 || c.StoreDisagrees != 0 {
		t.Errorf("held and lost: %+v", c)
	}
	if c := Check(ps, []Row{r}, ss, now, nil); c.OK() || c.Stuck != 1 || c.StoreDisagrees != 1 || c.HeldLost != 0 {
		t.Errorf("not held: %+v", c)
	}
	// Taken over after its lease and run again: the record holds the second run's
	// answer (the second row is judged as a duplicate, by its cause).
	again := Row{ID: 2, User: "alice", Key: "k1", Ref: "a-1", Amount: 101}
	done := []StoreRecord{{Key: "k1", Status: 201, AnswerID: 2}}
	if c := Check(ps, []Row{r, again}, done, now, held); !c.OK() || c.HeldLost != 1 || c.StoreDisagrees != 0 || c.Duplicates != 1 {
		t.Errorf("held, lost and run again: %+v", c)
	}
	if c := Check(ps, []Row{r, again}, done, now, nil); c.OK() || c.StoreDisagrees != 1 || c.HeldLost != 0 {
		t.Errorf("run again, not held: %+v", c)
	}
}

// TestHeldAndLost: only a process that logged a held answer for the key and was killed.
func TestHeldAndLost(t *testing.T) {
	t.Parallel()
	ev := Evidence{
		Lines: map[string][]GatewayLine{
			"held":  {{Replica: "r1", PID: 10, Outcome: "stored-later", Status: 201}},
			"alive": {{Replica: "r1", PID: 11, Outcome: "stored-later", Status: 201}},
			"done":  {{Replica: "r1", PID: 10, Outcome: "executed", Status: 201}},
		},
		Processes: []Process{{Replica: "r1", PID: 10, Killed: true}, {Replica: "r1", PID: 11}},
	}
	for key, want := range map[string]bool{"held": true, "alive": false, "done": false, "none": false} {
		if got := ev.HeldAndLost(key); got != want {
			t.Errorf("HeldAndLost(%q) = %v, want %v", key, got, want)
		}
	}
}
