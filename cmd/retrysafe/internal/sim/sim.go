package sim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/retrysafe/retrysafe/retry"
)

// ErrConfig is returned, wrapped, for a Config or LayersConfig that cannot be run.
var ErrConfig = errors.New("sim: invalid configuration")

// Strategy is how a client waits before retrying.
type Strategy int

// The strategies of the blog's study.
const (
	NoBackoff          Strategy = iota // retry at once
	Exponential                        // min(cap, base·2ⁿ): retry.JitterNone
	FullJitter                         // rand(0, min(cap, base·2ⁿ)): retry.JitterFull
	EqualJitter                        // v/2 + rand(0, v/2): retry.JitterEqual
	DecorrelatedJitter                 // min(cap, rand(base, 3·previous)): retry.JitterDecorrelated
)

// Strategies returns the five strategies, in the order the table shows them.
func Strategies() []Strategy {
	return []Strategy{NoBackoff, Exponential, FullJitter, EqualJitter, DecorrelatedJitter}
}

func (s Strategy) String() string {
	switch s {
	case NoBackoff:
		return "none"
	case Exponential:
		return "exponential"
	case FullJitter:
		return "full"
	case EqualJitter:
		return "equal"
	case DecorrelatedJitter:
		return "decorrelated"
	}
	return "strategy(" + strconv.Itoa(int(s)) + ")"
}

// ParseStrategy returns the strategy String names.
func ParseStrategy(name string) (Strategy, error) {
	for _, s := range Strategies() {
		if s.String() == name {
			return s, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown strategy %q (none, exponential, full, equal, decorrelated)", ErrConfig, name)
}

// jitter is the retry package's jitter for a backing-off strategy.
func (s Strategy) jitter() retry.Jitter {
	switch s {
	case Exponential:
		return retry.JitterNone
	case EqualJitter:
		return retry.JitterEqual
	case DecorrelatedJitter:
		return retry.JitterDecorrelated
	}
	return retry.JitterFull
}

// Config configures Run. The zero value of each field means the default documented on
// it: the blog's study.
type Config struct {
	// Clients are the numbers of clients simulated. Default 10, 20, …, 100.
	Clients []int
	// Runs is how many simulations are averaged for each point. Default 100.
	Runs int
	// Base and Cap are the backoff's base and cap. Default 5ms and 2s.
	Base, Cap time.Duration
	// Delay and DelayStdDev are the mean and standard deviation of the network delay of
	// each message (the absolute value of a normal variate). Default 10ms and 2ms.
	Delay, DelayStdDev time.Duration
	// Strategies are the strategies simulated. Default all five (Strategies()).
	Strategies []Strategy
	// Seed seeds every random choice. The same Config gives the same Result.
	Seed uint64
	// Workers is how many points are simulated at once. Default GOMAXPROCS. The result
	// does not depend on it.
	Workers int
}

func (cfg Config) withDefaults() (Config, error) {
	if len(cfg.Clients) == 0 {
		for n := 10; n <= 100; n += 10 {
			cfg.Clients = append(cfg.Clients, n)
		}
	}
	cfg.Clients = append([]int(nil), cfg.Clients...)
	for _, n := range cfg.Clients {
		if n < 1 || n > 100_000 {
			return cfg, fmt.Errorf("%w: %d clients: want 1 to 100000", ErrConfig, n)
		}
	}
	if cfg.Runs == 0 {
		cfg.Runs = 100
	}
	if cfg.Base == 0 {
		cfg.Base = 5 * time.Millisecond
	}
	if cfg.Cap == 0 {
		cfg.Cap = 2 * time.Second
	}
	if cfg.Delay == 0 {
		cfg.Delay = 10 * time.Millisecond
	}
	if cfg.DelayStdDev == 0 {
		cfg.DelayStdDev = 2 * time.Millisecond
	}
	switch {
	case cfg.Runs < 1 || cfg.Runs > 1_000_000:
		return cfg, fmt.Errorf("%w: %d runs: want 1 to 1000000", ErrConfig, cfg.Runs)
	case cfg.Base < 0 || cfg.Cap < cfg.Base:
		return cfg, fmt.Errorf("%w: want 0 < base ≤ cap (base %s, cap %s)", ErrConfig, cfg.Base, cfg.Cap)
	case cfg.Delay < 0 || cfg.DelayStdDev < 0:
		return cfg, fmt.Errorf("%w: negative network delay", ErrConfig)
	}
	if len(cfg.Strategies) == 0 {
		cfg.Strategies = Strategies()
	}
	cfg.Strategies = append([]Strategy(nil), cfg.Strategies...)
	for _, s := range cfg.Strategies {
		if s < NoBackoff || s > DecorrelatedJitter {
			return cfg, fmt.Errorf("%w: unknown %v", ErrConfig, s)
		}
	}
	if cfg.Workers <= 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	return cfg, nil
}

// Point is the mean of Config.Runs simulations of one strategy with one number of
// clients.
type Point struct {
	Clients  int
	Strategy Strategy
	Calls    float64       // writes per run: the work
	Time     time.Duration // until the last client succeeded
}

// Result is what Run found: one Point per number of clients and strategy, ordered by
// clients, then by strategy in Config order.
type Result struct {
	Config Config // with its defaults set
	Points []Point
}

// Point returns the point for clients and s.
func (r *Result) Point(clients int, s Strategy) (Point, bool) {
	for _, p := range r.Points {
		if p.Clients == clients && p.Strategy == s {
			return p, true
		}
	}
	return Point{}, false
}

// Run runs the study. It stops early, returning ctx's error, when ctx ends.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	res := &Result{Config: cfg, Points: make([]Point, len(cfg.Clients)*len(cfg.Strategies))}
	jobs := make(chan int)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range min(cfg.Workers, len(res.Points)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				n := cfg.Clients[i/len(cfg.Strategies)]
				s := cfg.Strategies[i%len(cfg.Strategies)]
				p, err := cfg.point(ctx, n, s)
				if err != nil {
					cancel()
					continue
				}
				res.Points[i] = p
			}
		}()
	}
feed:
	for i := range res.Points {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	return res, nil
}

// point averages cfg.Runs simulations. Each run has its own random source, seeded from
// the seed, the strategy, the clients and the run, so the figures do not depend on the
// order the points are computed in.
func (cfg Config) point(ctx context.Context, clients int, s Strategy) (Point, error) {
	var calls, total float64
	for run := range cfg.Runs {
		if err := ctx.Err(); err != nil {
			return Point{}, err
		}
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(s)<<56|uint64(clients)<<28|uint64(run)))
		c, t := cfg.occ(clients, s, rng)
		calls += float64(c)
		total += float64(t)
	}
	return Point{Clients: clients, Strategy: s, Calls: calls / float64(cfg.Runs),
		Time: time.Duration(total / float64(cfg.Runs))}, nil
}

// The messages of the OCC model, named by where they arrive.
type msgKind uint8

const (
	readAtServer  msgKind = iota // a client asks for the row's version
	readAtClient                 // the version comes back
	writeAtServer                // the client writes with that version
	writeAtClient                // the write's outcome comes back
)

type message struct {
	at      time.Duration
	seq     uint64 // ties are broken in send order, so the run is deterministic
	client  int32
	kind    msgKind
	version int // readAtClient, writeAtServer: the version read; writeAtClient: 1 if it succeeded
}

type queue []message

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(message)) }
func (q *queue) Pop() any {
	old := *q
	m := old[len(old)-1]
	*q = old[:len(old)-1]
	return m
}

// client is one OCC client's retry state.
type client struct {
	failures int           // failed writes so far
	prev     time.Duration // the previous wait (decorrelated jitter)
}

// occ simulates one run: clients clients each update the row once. It returns the
// writes made and the time the last one succeeded.
func (cfg Config) occ(clients int, s Strategy, rng *rand.Rand) (writes int, end time.Duration) {
	policy := retry.Policy{Base: cfg.Base, Cap: cfg.Cap, Jitter: s.jitter(), Rand: rng.Float64}
	delay := func() time.Duration {
		return time.Duration(math.Abs(float64(cfg.Delay) + float64(cfg.DelayStdDev)*rng.NormFloat64()))
	}
	cs := make([]client, clients)
	q := make(queue, 0, 2*clients)
	var seq uint64
	send := func(at time.Duration, c int32, kind msgKind, version int) {
		seq++
		heap.Push(&q, message{at: at, seq: seq, client: c, kind: kind, version: version})
	}
	for i := range cs {
		send(delay(), int32(i), readAtServer, 0)
	}
	version := 0 // the row's
	var now time.Duration
	for q.Len() > 0 {
		m := heap.Pop(&q).(message)
		now = m.at
		switch m.kind {
		case readAtServer:
			send(now+delay(), m.client, readAtClient, version)
		case readAtClient:
			send(now+delay(), m.client, writeAtServer, m.version)
		case writeAtServer:
			writes++
			ok := 0
			if m.version == version {
				version++
				ok = 1
			}
			send(now+delay(), m.client, writeAtClient, ok)
		case writeAtClient:
			if m.version == 1 {
				continue // done: this client has updated the row
			}
			c := &cs[m.client]
			c.failures++
			var wait time.Duration
			if s != NoBackoff {
				// The blog's simulator counts from the first failure, n = 1: its first
				// wait is min(cap, 2·base). Backoff's n is that exponent.
				wait = policy.Backoff(c.failures, c.prev)
				c.prev = wait
			}
			send(now+delay()+wait, m.client, readAtServer, 0)
		}
	}
	return writes, now
}

// WriteTable writes the result as a table: one row per number of clients, and for each
// strategy the mean writes and the mean completion time in milliseconds.
func (r *Result) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "clients\t")
	for _, s := range r.Config.Strategies {
		fmt.Fprintf(tw, "%s calls\t%s ms\t", s, s)
	}
	fmt.Fprintln(tw)
	for _, n := range r.Config.Clients {
		fmt.Fprintf(tw, "%d\t", n)
		for _, s := range r.Config.Strategies {
			p, _ := r.Point(n, s)
			fmt.Fprintf(tw, "%.0f\t%.0f\t", p.Calls, ms(p.Time))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
