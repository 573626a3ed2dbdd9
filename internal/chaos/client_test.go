//go:build linux

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/retrysafe/retrysafe/internal/payclient"
)

// client makes logical payments one after the other through a payclient.Client, whose
// Observer sends each attempt to the next fault proxy in turn (a round-robin load
// balancer in front of the replicas). The payclient.Client sends a payment again itself,
// with the same key, when retry.Transport gives up, when the body breaks off once the
// response was returned, or when the answer is not final (a 5xx or a 409 Transport
// stopped retrying: payclient.FinalStatus), until a final answer, the payment's
// patience or ctx's end.
type client struct {
	pc  *payclient.Client // URL: any of the proxies, the Observer picks the host per attempt
	rng *rand.Rand
}

// pay makes one logical payment, named ref, and returns what the client saw of it.
func (c *client) pay(ctx context.Context, ref string) Payment {
	p := Payment{User: c.pc.User, Ref: ref, Amount: 100 + c.rng.Int64N(99900)}
	o := c.pc.Pay(ctx, fmt.Sprintf(`{"ref":%q,"amount":%d}`, ref, p.Amount))
	p.Key, p.Status = o.Key, o.Status
	if p.Succeeded() {
		if err := json.Unmarshal(o.Body, &p.Answer); err != nil {
			p.Answer = Row{} // a 2xx that names no payment: Check reports it mismatched
		}
	}
	return p
}
