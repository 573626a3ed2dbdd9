package faultproxy

import (
	"math/rand/v2"
	"sync"
	"time"
)

// stream names one of the two decision streams; it is the second PCG seed word.
type stream uint64

const (
	streamConn    stream = 0x636f6e6e65637421 // "connect!"
	streamRequest stream = 0x7265717565737421 // "request!"
)

// decision is what happens to one connection or one request. kind 0 is no fault.
type decision struct {
	kind  Kind
	delay time.Duration // requests only: added latency
	cut   float64       // requests only: where a Reset cuts the response, in [0, 1)
}

// decider draws decisions from one seeded stream. Every decision consumes the same
// number of draws, so the n-th decision depends only on the seed, the stream and the
// Config.
type decider struct {
	mu     sync.Mutex
	rng    *rand.Rand
	kinds  []Kind
	rates  []float64
	conn   bool
	lat    time.Duration
	jitter time.Duration
}

func newDecider(cfg Config, s stream) *decider {
	d := &decider{rng: rand.New(rand.NewPCG(cfg.Seed, uint64(s))), conn: s == streamConn}
	if d.conn {
		d.kinds = []Kind{Refuse, BlackHole}
		d.rates = []float64{cfg.Refuse, cfg.BlackHole}
	} else {
		d.kinds = []Kind{ReadTimeout, Reset, ResponseLost, ResponseReset}
		d.rates = []float64{cfg.ReadTimeout, cfg.Reset, cfg.ResponseLost, cfg.ResponseReset}
		d.lat, d.jitter = cfg.Latency, cfg.Jitter
	}
	return d
}

// next returns the next decision. A connection decision draws one number; a request
// decision draws three (kind, jitter, cut), used or not.
func (d *decider) next() decision {
	d.mu.Lock()
	u := d.rng.Float64()
	var j, cut float64
	if !d.conn {
		j, cut = d.rng.Float64(), d.rng.Float64()
	}
	d.mu.Unlock()

	var out decision
	acc := 0.0
	for i, r := range d.rates {
		acc += r
		if u < acc {
			out.kind = d.kinds[i]
			break
		}
	}
	if !d.conn {
		out.delay = d.lat + time.Duration(j*float64(d.jitter))
		out.cut = cut
	}
	return out
}
