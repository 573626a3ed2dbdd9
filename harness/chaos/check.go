package chaos

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

// Payment is what a client saw of one logical payment.
type Payment struct {
	User   string // the principal ("Authorization: Bearer <user>")
	Ref    string // the client's own name for the logical payment, sent in the body
	Amount int64
	// Key is the Idempotency-Key every attempt of the payment carried (retry.Transport's
	// AutoKey gave it to the first); "" when no attempt was ever sent.
	Key string
	// Status is the final answer's status: a 2xx, or a 4xx that no retry can change;
	// 0 when the payment got no final answer (unfinished).
	Status int
	// Answer is the payment a final 2xx named (its decoded body).
	Answer Row
	// Pad is the padding the payment asked the upstream for (a large answer); 0: none.
	Pad int
	// SlowReader: the client read its answers slowly.
	SlowReader bool
}

// Succeeded reports whether the client saw the payment succeed.
func (p Payment) Succeeded() bool { return p.Status >= 200 && p.Status < 300 }

// Row is one ledger row, and the body of the upstream's 201.
type Row struct {
	ID     int64  `json:"id"`
	User   string `json:"user"`
	Key    string `json:"key"`
	Ref    string `json:"ref"`
	Amount int64  `json:"amount"`
}

// StoreRecord is what the idempotency store holds for one key when the run is over.
type StoreRecord struct {
	Key        string
	InProgress bool
	LeaseUntil time.Time // in progress only
	Status     int       // the stored response's status; 0 when none
	AnswerID   int64     // the payment id in the stored response's body; 0 when none
}

// Checks is the verdict of Check.
type Checks struct {
	Payments   int // logical payments the clients made
	Succeeded  int // ... whose final answer was a 2xx
	Failed     int // ... whose final answer was a final 4xx
	Unfinished int // ... with no final answer by the end of the run
	Rows       int // ledger rows
	Records    int // idempotency records left in the store

	// Duplicates: logical payments with more than one ledger row, whether the rows share
	// the payment's key or not (a row is the payment's when it carries its key, or its
	// user and ref). OK does not judge them: against an upstream that executes every
	// request some are expected (a replica killed at the wrong moment, an answer lost on
	// its way back), and Attribute decides which are allowed. A second row under another
	// key is also a phantom.
	Duplicates int
	// Lost: payments a client saw succeed with no ledger row under their key.
	Lost int
	// Phantoms: ledger rows whose (user, key) is no key any client used for a payment.
	Phantoms int
	// Mismatched: final 2xx answers naming no ledger row of their key (id, user, key,
	// ref or amount), and rows whose ref or amount is not their payment's.
	Mismatched int
	// Stuck: keys still in progress in the store after the lease (nothing in flight).
	Stuck int
	// HeldLost: keys whose answer a gateway held, because the store could not take it,
	// when that gateway was killed: the client got the answer and the store never did.
	// Allowed: the documented window of a process that dies between forwarding and
	// storing. Such a key is left in progress until its lease ends, and then a later
	// request may take it over and run it again, so its record holds that run's answer:
	// either way it is counted here, not as stuck or as a store disagreement (the run
	// again is judged with the duplicates, by its cause).
	HeldLost int
	// StoreDisagrees: succeeded payments whose key is not done in the store with the
	// response the client saw (status and payment id), so a retry would not replay it.
	StoreDisagrees int

	// Evidence holds up to a few examples of each failure, for the report.
	Evidence []string
}

// OK reports whether the run finished and no payment was lost, invented or garbled:
// every count that must be zero, whatever the upstream does with a second delivery, is
// zero. Duplicates are judged apart (see Checks.Duplicates).
func (c Checks) OK() bool {
	return c.Lost == 0 && c.Phantoms == 0 && c.Mismatched == 0 &&
		c.Stuck == 0 && c.StoreDisagrees == 0 && c.Unfinished == 0 && c.Failed == 0
}

// maxEvidence is how many examples of each failure Check keeps.
const maxEvidence = 5

// Check compares what the clients saw (payments) with the ledger (rows) and the
// idempotency store (records, listed once the gateways have stopped and the lease has
// run out). now is the time the records were listed. heldLost reports the keys whose
// answer a killed gateway held (see Checks.HeldLost); nil: none.
func Check(payments []Payment, rows []Row, records []StoreRecord, now time.Time, heldLost func(key string) bool) Checks {
	if heldLost == nil {
		heldLost = func(string) bool { return false }
	}
	c := Checks{Payments: len(payments), Rows: len(rows), Records: len(records)}
	shown := map[string]int{}
	evidence := func(kind, format string, args ...any) {
		if shown[kind] < maxEvidence {
			c.Evidence = append(c.Evidence, kind+": "+fmt.Sprintf(format, args...))
		}
		shown[kind]++
	}

	type userKey struct{ user, key string }
	type userRef struct{ user, ref string }
	byKey := map[userKey]int{}   // payment index by the key the system saw
	byRef := map[userRef]int{}   // payment index by the client's own name for it
	keyIndex := map[string]int{} // payment index by key alone (the store's records)
	for i, p := range payments {
		switch {
		case p.Status == 0:
			c.Unfinished++
			evidence("unfinished", "payment %s/%s key %q (pad %d, slow reader %v): no final answer", p.User, p.Ref, p.Key, p.Pad, p.SlowReader)
		case p.Succeeded():
			c.Succeeded++
		default:
			c.Failed++
			evidence("failed", "payment %s/%s key %q: final status %d", p.User, p.Ref, p.Key, p.Status)
		}
		byRef[userRef{p.User, p.Ref}] = i
		if p.Key != "" {
			byKey[userKey{p.User, p.Key}] = i
			keyIndex[p.Key] = i
		}
	}

	rowsOfKey := map[userKey][]Row{}
	rowsOfPayment := make([][]Row, len(payments))
	for _, r := range rows {
		rowsOfKey[userKey{r.User, r.Key}] = append(rowsOfKey[userKey{r.User, r.Key}], r)
		i, known := byKey[userKey{r.User, r.Key}]
		if !known {
			c.Phantoms++
			evidence("phantom", "ledger row %d (user %s, key %q, ref %s) belongs to no payment's key", r.ID, r.User, r.Key, r.Ref)
			// Still the payment's if it names it: a key changed between resends would make
			// a second row for one logical payment.
			if j, ok := byRef[userRef{r.User, r.Ref}]; ok {
				rowsOfPayment[j] = append(rowsOfPayment[j], r)
			}
			continue
		}
		rowsOfPayment[i] = append(rowsOfPayment[i], r)
		if p := payments[i]; r.Ref != p.Ref || r.Amount != p.Amount {
			c.Mismatched++
			evidence("mismatched", "ledger row %d under key %q holds ref %s amount %d; the payment is ref %s amount %d", r.ID, r.Key, r.Ref, r.Amount, p.Ref, p.Amount)
		}
	}
	for i, rs := range rowsOfPayment {
		if len(rs) > 1 {
			c.Duplicates++
			ids := make([]int64, len(rs))
			for j, r := range rs {
				ids[j] = r.ID
			}
			evidence("duplicate", "payment %s/%s (key %q) has %d ledger rows: ids %v", payments[i].User, payments[i].Ref, payments[i].Key, len(rs), ids)
		}
	}

	recs := map[string]StoreRecord{}
	var stuck []StoreRecord
	for _, r := range records {
		recs[r.Key] = r
		switch {
		case r.InProgress && heldLost(r.Key):
			c.HeldLost++
		case r.InProgress:
			stuck = append(stuck, r)
		}
	}
	sort.Slice(stuck, func(i, j int) bool { return stuck[i].Key < stuck[j].Key })
	for _, r := range stuck {
		c.Stuck++
		state := "lease expired " + now.Sub(r.LeaseUntil).Round(time.Millisecond).String() + " ago"
		if r.LeaseUntil.After(now) {
			state = "lease still running for " + r.LeaseUntil.Sub(now).Round(time.Millisecond).String()
		}
		client := "no client used it"
		if i, ok := keyIndex[r.Key]; ok {
			p := payments[i]
			client = fmt.Sprintf("its payment %s/%s got final status %d", p.User, p.Ref, p.Status)
		}
		evidence("stuck", "key %q in progress (%s); %s", r.Key, state, client)
	}

	for _, p := range payments {
		if !p.Succeeded() {
			continue
		}
		rs := rowsOfKey[userKey{p.User, p.Key}]
		if len(rs) == 0 {
			c.Lost++
			evidence("lost", "payment %s/%s (key %q) succeeded with id %d; no ledger row has its key", p.User, p.Ref, p.Key, p.Answer.ID)
		} else if a := p.Answer; !slices.Contains(rs, a) {
			// With an upstream that executes every delivery a key may have several rows
			// (Duplicates judges that); the answer must be one of them.
			c.Mismatched++
			evidence("mismatched", "payment %s/%s (key %q) was answered %+v; the ledger rows of the key are %+v", p.User, p.Ref, p.Key, a, rs)
		}
		rec, ok := recs[p.Key]
		switch {
		case ok && rec.InProgress && heldLost(p.Key): // counted as HeldLost
		case ok && heldLost(p.Key) && (rec.Status != p.Status || rec.AnswerID != p.Answer.ID):
			// The held answer was lost with its gateway, and the key was taken over and
			// run again after its lease: the record holds that run's answer.
			c.HeldLost++
			evidence("held", "payment %s/%s was answered id %d by a gateway killed holding it; key %q was run again, its record: status %d, id %d",
				p.User, p.Ref, p.Answer.ID, p.Key, rec.Status, rec.AnswerID)
		case !ok:
			c.StoreDisagrees++
			evidence("store", "payment %s/%s succeeded; key %q has no record", p.User, p.Ref, p.Key)
		case rec.InProgress || rec.Status != p.Status || rec.AnswerID != p.Answer.ID:
			c.StoreDisagrees++
			evidence("store", "payment %s/%s succeeded with %d id %d; key %q's record: in progress %v, status %d, id %d",
				p.User, p.Ref, p.Status, p.Answer.ID, p.Key, rec.InProgress, rec.Status, rec.AnswerID)
		}
	}
	for kind, n := range shown {
		if n > maxEvidence {
			c.Evidence = append(c.Evidence, fmt.Sprintf("%s: … %d more", kind, n-maxEvidence))
		}
	}
	sort.Strings(c.Evidence)
	return c
}
