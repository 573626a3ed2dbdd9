package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/retrysafe/retrysafe/harness/payclient"
)

// record is what a client saw of one logical payment.
type record struct {
	user, key string
	status    int   // the final answer's status; 0 when there was none
	id        int64 // the payment id the final 2xx named
	bodyKey   string
}

func (r record) succeeded() bool { return r.status >= 200 && r.status < 300 }

// client makes the demo's logical payments through a payclient.Client, which sends a
// payment again with the same key when its outcome is unknown (retry.Transport gave up,
// or the body broke off once the response was returned) and keeps any answer it reads
// whole.
type client struct {
	pc  *payclient.Client
	rng *rand.Rand
}

// pay makes one logical payment and returns what the client saw of it.
func (c *client) pay(ctx context.Context) record {
	o := c.pc.Pay(ctx, fmt.Sprintf(`{"amount": %d}`, 100+c.rng.IntN(99900)))
	rec := record{user: c.pc.User, key: o.Key, status: o.Status}
	if rec.succeeded() {
		var p payment
		if json.Unmarshal(o.Body, &p) == nil {
			rec.id, rec.bodyKey = p.ID, p.Key
		}
	}
	return rec
}

// check compares the ledger with what the clients saw, and fills res's counts.
func check(res *Result, records []record, rows []payment) {
	type id struct{ user, key string }
	byKey := map[id][]payment{}
	for _, p := range rows {
		byKey[id{p.User, p.Key}] = append(byKey[id{p.User, p.Key}], p)
	}
	known := map[id]bool{}
	for _, r := range records {
		res.LogicalPayments++
		switch {
		case r.status == 0:
			res.Unfinished++
		case r.succeeded():
			res.Succeeded++
		default:
			res.Failed++
		}
		if r.key == "" {
			continue // never sent
		}
		k := id{r.user, r.key}
		known[k] = true
		if !r.succeeded() {
			continue
		}
		ps := byKey[k]
		if len(ps) == 0 {
			res.Lost++
			continue
		}
		named := false
		for _, p := range ps {
			named = named || p.ID == r.id
		}
		if !named || r.bodyKey != r.key {
			res.Mismatched++
		}
	}
	res.PaymentsRecorded = len(rows)
	for k, ps := range byKey {
		if len(ps) > 1 {
			res.Duplicates++
		}
		if !known[k] {
			res.Phantoms += len(ps)
		}
	}
}
