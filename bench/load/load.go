// Package load is a closed-loop HTTP load generator: N clients, each sending its next
// request as soon as the previous one is answered, for a duration or a number of
// requests. It is the engine of bench/cmd/loadgen and of bench/run.sh.
//
// Every request can carry an Idempotency-Key: a new one per request (KeyUnique, first
// executions), one key shared by every request (KeyShared: a duplicate storm, or replays
// once the first one is done), or none. Clients can each send their own Authorization
// header (Config.Users), so that keys live in per-user scopes.
//
// A Result reports throughput, latency quantiles (a shared log-linear histogram: memory
// bounded whatever the number of requests, at most 0.8% of error on a quantile), counts
// by status code, with replays (Idempotent-Replayed: true) apart, and errors. Latency is
// measured from just before the request is sent until its body is read to the end.
package load

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/retrysafe/retrysafe/internal/httpname"
	"github.com/retrysafe/retrysafe/retry"
)

// KeyMode says which Idempotency-Key the requests carry.
type KeyMode int

const (
	// KeyUnique gives every request a key of its own: every request is a first execution.
	KeyUnique KeyMode = iota
	// KeyShared gives every request the same key, Config.Key: concurrent requests are a
	// duplicate storm; once the first one is done, the others are replays.
	KeyShared
	// KeyNone sends no Idempotency-Key header.
	KeyNone
)

// String returns "unique", "shared" or "none".
func (m KeyMode) String() string {
	switch m {
	case KeyUnique:
		return "unique"
	case KeyShared:
		return "shared"
	case KeyNone:
		return "none"
	}
	return "KeyMode(" + strconv.Itoa(int(m)) + ")"
}

// ParseKeyMode parses "unique", "shared" or "none".
func ParseKeyMode(s string) (KeyMode, error) {
	for _, m := range []KeyMode{KeyUnique, KeyShared, KeyNone} {
		if strings.EqualFold(s, m.String()) {
			return m, nil
		}
	}
	return 0, fmt.Errorf("load: unknown key mode %q (want unique, shared or none)", s)
}

// Limits of a Config.
const (
	MaxClients  = 100000
	maxSamples  = 8 // distinct error messages kept in a Result
	keyHeader   = "Idempotency-Key"
	replayedHdr = "Idempotent-Replayed"
)

// Config configures a run. The zero value of each field but URL means its default.
type Config struct {
	// URL is the target: an absolute http or https URL. Required.
	URL string
	// Method is the request method. Default POST.
	Method string
	// Body is sent with every request (nil: no body).
	Body []byte
	// Header is added to every request (Content-Type, for example). Its Idempotency-Key
	// and Authorization are overridden when Keys and Users set them.
	Header http.Header

	// Clients is the number of concurrent clients, each with one request in flight.
	// Default 1; at most MaxClients.
	Clients int
	// Duration is how long requests are measured, after Warmup. Default 10s when
	// Requests is 0 too; 0 with Requests set: until Requests are done.
	Duration time.Duration
	// Requests, when positive, stops the run after this many measured requests (over all
	// clients), or at the end of Duration if that comes first.
	Requests int64
	// Warmup runs the clients for this long before measuring: connections are opened,
	// caches and JIT compilers warmed, and nothing is counted. Default 0.
	Warmup time.Duration
	// Timeout bounds each request, its body included. Default 30s.
	Timeout time.Duration
	// Rate, when positive, paces the run: requests are due at Rate a second over all
	// clients, evenly spaced from the start (warm-up included), and each client sends
	// the next one due once it is free, at its due time or, when the clients have
	// fallen behind, at once. A request's latency counts from its due time, so that a
	// server that falls behind shows it. Two servers compared at one Rate both serve
	// it, as long as each keeps up: CPU per request is then compared at one load, where
	// a closed loop (Rate 0, each client sending as soon as it is answered) gives the
	// faster server more requests per wake-up. Default 0: as fast as the clients go.
	Rate float64

	// Keys selects the Idempotency-Key of each request. Default KeyUnique.
	Keys KeyMode
	// Key is the shared key of KeyShared. Default: a random key, the same for the run.
	Key string
	// KeyPrefix starts every unique key, followed by the client and a sequence number.
	// Default: 16 random hex digits, new for each run.
	KeyPrefix string

	// Users, when positive, makes client i send Authorization: fmt.Sprintf(AuthFormat,
	// i % Users). Default 0: no Authorization header beyond Header's.
	Users int
	// AuthFormat formats the Authorization header of a user number; it must contain
	// exactly one %d. Default "Bearer user%d".
	AuthFormat string

	// Preconnect, when set, is an http or https URL that every client GETs once (on its
	// own connection) before all clients start together. Use it for a storm, so that the
	// requests race on the idempotency key rather than on the TCP accept queue.
	Preconnect string

	// Client sends the requests. Default: a keep-alive client of its own, keeping an
	// idle connection per client (closed at the end of the run), whose http.Transport
	// is wrapped in retry.SendOnce: it never resends a keyed request by itself when a
	// reused connection closes after the request was read, which would hide that
	// failure and fold two executions into one measured request.
	Client *http.Client

	// Tags are copied into the Result, to label it in reports.
	Tags map[string]string

	// CPU, when set, is the processes whose processor time (each with its descendants)
	// is read from /proc at the start and at the end of the measured window, and
	// reported per process in Result.CPU: seconds, and microseconds per response. The
	// window starts when the warm-up ends and ends when the last measured request is
	// answered. Linux only.
	CPU []Process
	// ClockTicks is the unit of /proc's CPU times (`getconf CLK_TCK`). Default
	// DefaultClockTicks.
	ClockTicks int
	// ProcRoot is where the proc file system is mounted. Default /proc.
	ProcRoot string
}

// The rates a paced run takes: one request every 10⁶ s at the least, so that the due
// times stay within time.Duration's range, and one a nanosecond at the most.
const (
	minRate = 1e-6
	maxRate = 1e9
)

// Result is what a run measured. Latencies are in milliseconds.
type Result struct {
	Tags     map[string]string `json:"tags,omitempty"`
	Method   string            `json:"method"`
	URL      string            `json:"url"`
	Clients  int               `json:"clients"`
	Keys     string            `json:"keys"`
	Users    int               `json:"users,omitempty"`
	Start    time.Time         `json:"start"`
	WarmupS  float64           `json:"warmup_s"`
	ElapsedS float64           `json:"elapsed_s"` // of the measured phase
	// Rate is Config.Rate: the requests a second the run was paced at (0: not paced).
	Rate float64 `json:"rate,omitempty"`

	// Requests is the measured requests: Responses + Errors.
	Requests  int64 `json:"requests"`
	Responses int64 `json:"responses"`
	Errors    int64 `json:"errors"`
	// Replayed is the responses that said Idempotent-Replayed: true.
	Replayed int64 `json:"replayed"`

	// Throughput is responses per second (any status); OKThroughput the 2xx ones.
	Throughput   float64 `json:"throughput"`
	OKThroughput float64 `json:"ok_throughput"`

	// Latency is every response's.
	Latency Summary `json:"latency"`
	// Status counts the responses by class: the status code, with " replayed" added for
	// replays ("201", "201 replayed", "409").
	Status map[string]int64 `json:"status"`
	// ByStatus is the latency of each class of Status.
	ByStatus map[string]Summary `json:"by_status"`
	// ErrorSamples counts the first few distinct error messages.
	ErrorSamples map[string]int64 `json:"error_samples,omitempty"`

	// CPU is the processor time of each of Config.CPU's process trees in the measured
	// window, by name; CPUWindowS is that window's length in seconds (it starts and
	// ends with the reads of /proc, within a millisecond or so of the measured phase).
	CPU        map[string]CPU `json:"cpu,omitempty"`
	CPUWindowS float64        `json:"cpu_window_s,omitempty"`
	// CPUError says why CPU is missing when a process could not be read at the end
	// of the window (it exited, for one).
	CPUError string `json:"cpu_error,omitempty"`
}

// Validate reports what is wrong with cfg, as Run would, without doing anything.
func (cfg Config) Validate() error {
	_, err := cfg.withDefaults()
	return err
}

// withDefaults checks cfg and fills in its defaults.
func (cfg Config) withDefaults() (Config, error) {
	if err := checkURL(cfg.URL); err != nil {
		return cfg, fmt.Errorf("load: URL: %w", err)
	}
	if cfg.Preconnect != "" {
		if err := checkURL(cfg.Preconnect); err != nil {
			return cfg, fmt.Errorf("load: Preconnect: %w", err)
		}
	}
	if cfg.Method == "" {
		cfg.Method = http.MethodPost
	}
	if !httpname.Valid(cfg.Method) {
		return cfg, fmt.Errorf("load: invalid method %q", cfg.Method)
	}
	switch {
	case cfg.Clients < 0 || cfg.Clients > MaxClients:
		return cfg, fmt.Errorf("load: Clients %d: want 1 to %d", cfg.Clients, MaxClients)
	case cfg.Duration < 0 || cfg.Warmup < 0 || cfg.Timeout < 0:
		return cfg, errors.New("load: negative Duration, Warmup or Timeout")
	case cfg.Rate != 0 && !(cfg.Rate >= minRate && cfg.Rate <= maxRate): // NaN too
		return cfg, fmt.Errorf("load: Rate %v: want %g to %g requests a second, or 0", cfg.Rate, minRate, maxRate)
	case cfg.Requests < 0:
		return cfg, errors.New("load: negative Requests")
	case cfg.Users < 0:
		return cfg, errors.New("load: negative Users")
	case cfg.Keys < KeyUnique || cfg.Keys > KeyNone:
		return cfg, fmt.Errorf("load: unknown key mode %d", int(cfg.Keys))
	case cfg.ClockTicks < 0:
		return cfg, errors.New("load: negative ClockTicks")
	}
	if err := checkProcesses(cfg.CPU); err != nil {
		return cfg, err
	}
	if cfg.ClockTicks == 0 {
		cfg.ClockTicks = DefaultClockTicks
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.Clients == 0 {
		cfg.Clients = 1
	}
	if cfg.Duration == 0 && cfg.Requests == 0 {
		cfg.Duration = 10 * time.Second
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.AuthFormat == "" {
		cfg.AuthFormat = "Bearer user%d"
	}
	if cfg.Users > 0 {
		if strings.Count(cfg.AuthFormat, "%d") != 1 || strings.Count(cfg.AuthFormat, "%") != 1 {
			return cfg, fmt.Errorf("load: AuthFormat %q must hold exactly one %%d and no other verb", cfg.AuthFormat)
		}
		if !validValue(cfg.AuthFormat) {
			return cfg, fmt.Errorf("load: AuthFormat %q holds characters a header cannot", cfg.AuthFormat)
		}
	}
	if cfg.KeyPrefix == "" || (cfg.Keys == KeyShared && cfg.Key == "") {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return cfg, fmt.Errorf("load: random key: %w", err)
		}
		if cfg.KeyPrefix == "" {
			cfg.KeyPrefix = hex.EncodeToString(b[:])
		}
		if cfg.Key == "" {
			cfg.Key = "shared-" + hex.EncodeToString(b[:])
		}
	}
	if !validValue(cfg.KeyPrefix) || (cfg.Keys == KeyShared && !validValue(cfg.Key)) {
		return cfg, errors.New("load: Key and KeyPrefix must be visible ASCII")
	}
	for name, vs := range cfg.Header {
		if !httpname.Valid(name) {
			return cfg, fmt.Errorf("load: invalid header name %q", name)
		}
		for _, v := range vs {
			if !validValue(v) {
				return cfg, fmt.Errorf("load: header %s: invalid value %q", name, v)
			}
		}
	}
	return cfg, nil
}

func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q: want an absolute http or https URL", s)
	}
	return nil
}

// validValue reports whether s is printable ASCII (spaces and tabs allowed).
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c > '~' {
			return false
		}
	}
	return true
}

// recorder collects the measurements of a run; all clients share it.
type recorder struct {
	all      *Histogram
	classes  [2000]atomic.Pointer[Histogram] // status*2 + replayed, status < 1000
	mu       sync.Mutex                      // guards errs
	errs     map[string]int64
	nErrs    atomic.Int64
	replayed atomic.Int64
}

func (r *recorder) class(status int, replayed bool) *Histogram {
	if status < 0 || status >= 1000 {
		status = 0
	}
	i := status * 2
	if replayed {
		i++
	}
	if h := r.classes[i].Load(); h != nil {
		return h
	}
	h := NewHistogram()
	if r.classes[i].CompareAndSwap(nil, h) {
		return h
	}
	return r.classes[i].Load()
}

func (r *recorder) response(status int, replayed bool, d time.Duration) {
	r.all.Record(d)
	r.class(status, replayed).Record(d)
	if replayed {
		r.replayed.Add(1)
	}
}

func (r *recorder) failure(err error) {
	r.nErrs.Add(1)
	msg := err.Error()
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.errs[msg]; ok || len(r.errs) < maxSamples {
		r.errs[msg]++
	} else {
		r.errs["(other errors)"]++
	}
}

// client is the state of one closed-loop client.
type client struct {
	id     int
	cfg    *Config
	hc     *http.Client
	auth   string
	seq    int64
	header http.Header // the next request's, rebuilt every time
}

func (c *client) newRequest(ctx context.Context) (*http.Request, error) {
	var body io.Reader
	if c.cfg.Body != nil {
		body = bytes.NewReader(c.cfg.Body)
	}
	req, err := http.NewRequestWithContext(ctx, c.cfg.Method, c.cfg.URL, body)
	if err != nil {
		return nil, fmt.Errorf("load: request: %w", err)
	}
	h := make(http.Header, len(c.cfg.Header)+2)
	for k, v := range c.cfg.Header {
		h[k] = v // read-only, shared
	}
	switch c.cfg.Keys {
	case KeyUnique:
		c.seq++
		h[keyHeader] = []string{c.cfg.KeyPrefix + "-" + strconv.Itoa(c.id) + "-" + strconv.FormatInt(c.seq, 10)}
	case KeyShared:
		h[keyHeader] = []string{c.cfg.Key}
	}
	if c.auth != "" {
		h["Authorization"] = []string{c.auth}
	}
	req.Header = h
	return req, nil
}

// do sends one request and reads its answer to the end.
func (c *client) do(ctx context.Context) (status int, replayed bool, err error) {
	req, err := c.newRequest(ctx)
	if err != nil {
		return 0, false, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, false, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	cerr := resp.Body.Close()
	if err == nil {
		err = cerr
	}
	if err != nil {
		return 0, false, fmt.Errorf("load: reading the response: %w", err)
	}
	return resp.StatusCode, strings.EqualFold(resp.Header.Get(replayedHdr), "true"), nil
}

func (c *client) preconnect(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.cfg.Preconnect, nil)
	if err != nil {
		return fmt.Errorf("load: preconnect: %w", err)
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("load: preconnect: %w", err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("load: preconnect: %w", err)
	}
	return nil
}

// Run runs the load cfg describes and returns what it measured. It returns early, with
// what was measured so far, when ctx ends; requests cut off by ctx are not counted.
// Failed requests (no HTTP answer) are counted as errors, not as a failure of Run.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	hc := cfg.Client
	if hc == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = cfg.Clients + 16
		t.MaxIdleConnsPerHost = cfg.Clients + 16
		t.DisableCompression = true
		t.ForceAttemptHTTP2 = false
		defer t.CloseIdleConnections()
		hc = &http.Client{Transport: retry.SendOnce(t), Timeout: cfg.Timeout}
	}
	rec := &recorder{all: NewHistogram(), errs: map[string]int64{}}
	if len(cfg.CPU) > 0 {
		// Every process must be there at the start: a run that cannot be attributed
		// is not made.
		if _, err := sampleCPU(cfg.ProcRoot, cfg.CPU); err != nil {
			return nil, err
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	clients := make([]*client, cfg.Clients)
	for i := range clients {
		c := &client{id: i, cfg: &cfg, hc: hc}
		if cfg.Users > 0 {
			c.auth = fmt.Sprintf(cfg.AuthFormat, i%cfg.Users)
		}
		clients[i] = c
	}

	// Every client gets ready (and preconnects), then all start at once.
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	var prepErr error
	var prepOnce sync.Once
	var stop atomic.Bool
	var issued atomic.Int64
	var slots atomic.Int64                     // paced: the next request's number
	var began, measureFrom, deadline time.Time // written before start is closed
	ready.Add(len(clients))
	done.Add(len(clients))
	for _, c := range clients {
		go func() {
			defer done.Done()
			if cfg.Preconnect != "" {
				if err := c.preconnect(ctx); err != nil {
					prepOnce.Do(func() { prepErr = err })
				}
			}
			ready.Done()
			select {
			case <-start:
			case <-ctx.Done():
				return
			}
			for !stop.Load() {
				t0 := time.Now()
				if cfg.Rate > 0 {
					// The next request due, and its time: sent then, or now if it is late.
					due := began.Add(time.Duration(float64(slots.Add(1)-1) * float64(time.Second) / cfg.Rate))
					if wait := due.Sub(t0); wait > 0 {
						select {
						case <-time.After(wait):
						case <-ctx.Done():
							return
						}
					}
					t0 = due
				}
				measured := !t0.Before(measureFrom)
				if measured && !deadline.IsZero() && !t0.Before(deadline) {
					stop.Store(true)
					return
				}
				if measured && cfg.Requests > 0 && issued.Add(1) > cfg.Requests {
					stop.Store(true)
					return
				}
				status, replayed, err := c.do(ctx)
				d := time.Since(t0)
				switch {
				case ctx.Err() != nil:
					return // cut off: not counted
				case !measured:
				case err != nil:
					rec.failure(err)
				default:
					rec.response(status, replayed, d)
				}
			}
		}()
	}
	ready.Wait()
	if prepErr != nil {
		cancel()
		done.Wait()
		return nil, prepErr
	}
	began = time.Now()
	measureFrom = began.Add(cfg.Warmup)
	if cfg.Duration > 0 {
		deadline = measureFrom.Add(cfg.Duration)
	}
	cpu := startCPU(&cfg, measureFrom)
	close(start)
	stopWatch := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			stop.Store(true)
		case <-stopWatch:
		}
	}()
	done.Wait()
	close(stopWatch)
	end := time.Now()

	res := &Result{
		Tags: cfg.Tags, Method: cfg.Method, URL: cfg.URL, Clients: cfg.Clients, Keys: cfg.Keys.String(),
		Users: cfg.Users, Start: began.UTC(), WarmupS: cfg.Warmup.Seconds(), Rate: cfg.Rate,
		Status: map[string]int64{}, ByStatus: map[string]Summary{},
	}
	if el := end.Sub(measureFrom); el > 0 {
		res.ElapsedS = el.Seconds()
	}
	rec.fill(res)
	cpu.finish(res)
	return res, nil
}

// cpuWindow reads the CPU of Config.CPU when the measured window starts and ends.
type cpuWindow struct {
	cfg     *Config
	timer   *time.Timer   // fires at the window's start; nil without a warm-up
	started chan struct{} // closed once the first sample is taken
	from    time.Time
	before  cpuSample
	err     error
}

// startCPU takes the first sample at from: now when there is no warm-up, else from a
// timer, so that the warm-up's requests are not counted.
func startCPU(cfg *Config, from time.Time) *cpuWindow {
	w := &cpuWindow{cfg: cfg, started: make(chan struct{})}
	if len(cfg.CPU) == 0 {
		return w
	}
	take := func() {
		w.from = time.Now()
		w.before, w.err = sampleCPU(cfg.ProcRoot, cfg.CPU)
		close(w.started)
	}
	if d := time.Until(from); d > 0 {
		w.timer = time.AfterFunc(d, take)
	} else {
		take()
	}
	return w
}

// finish takes the second sample and fills res.CPU, or res.CPUError.
func (w *cpuWindow) finish(res *Result) {
	if len(w.cfg.CPU) == 0 {
		return
	}
	if w.timer != nil && w.timer.Stop() {
		res.CPUError = "the run ended before its measured window began"
		return
	}
	<-w.started
	after, err := sampleCPU(w.cfg.ProcRoot, w.cfg.CPU)
	end := time.Now()
	switch {
	case w.err != nil:
		res.CPUError = w.err.Error()
	case err != nil:
		res.CPUError = err.Error()
	default:
		res.CPU = cpuDelta(w.cfg.CPU, w.before, after, w.cfg.ClockTicks, res.Responses)
		res.CPUWindowS = end.Sub(w.from).Seconds()
	}
}

// fill copies the recorder's figures into res.
func (r *recorder) fill(res *Result) {
	res.Responses = r.all.Count()
	res.Errors = r.nErrs.Load()
	res.Requests = res.Responses + res.Errors
	res.Replayed = r.replayed.Load()
	res.Latency = r.all.Summary()
	var ok int64
	for i := range r.classes {
		h := r.classes[i].Load()
		if h == nil || h.Count() == 0 {
			continue
		}
		status := i / 2
		name := strconv.Itoa(status)
		if i%2 == 1 {
			name += " replayed"
		}
		res.Status[name] = h.Count()
		res.ByStatus[name] = h.Summary()
		if status >= 200 && status < 300 {
			ok += h.Count()
		}
	}
	if res.ElapsedS > 0 {
		res.Throughput = float64(res.Responses) / res.ElapsedS
		res.OKThroughput = float64(ok) / res.ElapsedS
	}
	r.mu.Lock()
	if len(r.errs) > 0 {
		res.ErrorSamples = make(map[string]int64, len(r.errs))
		for k, v := range r.errs {
			res.ErrorSamples[k] = v
		}
	}
	r.mu.Unlock()
}

// WriteText writes res for a human: a few lines.
func (res *Result) WriteText(w io.Writer) error {
	var b strings.Builder
	if len(res.Tags) > 0 {
		keys := make([]string, 0, len(res.Tags))
		for k := range res.Tags {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString("[")
		for i, k := range keys {
			if i > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "%s=%s", k, res.Tags[k])
		}
		b.WriteString("] ")
	}
	fmt.Fprintf(&b, "%s %s: %d clients, %s keys, %.2f s measured (after %.2f s warm-up)\n",
		res.Method, res.URL, res.Clients, res.Keys, res.ElapsedS, res.WarmupS)
	fmt.Fprintf(&b, "  %d requests: %d responses (%d replayed), %d errors; %.1f req/s (2xx %.1f/s)\n",
		res.Requests, res.Responses, res.Replayed, res.Errors, res.Throughput, res.OKThroughput)
	writeSummary(&b, "latency", res.Latency)
	classes := make([]string, 0, len(res.Status))
	for k := range res.Status {
		classes = append(classes, k)
	}
	sort.Strings(classes)
	for _, k := range classes {
		writeSummary(&b, "  "+k, res.ByStatus[k])
	}
	names := make([]string, 0, len(res.CPU))
	for k := range res.CPU {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		c := res.CPU[k]
		fmt.Fprintf(&b, "  cpu %-12s %.3f s, %.1f µs/response (%d processes)\n", k, c.Seconds, c.USPerRequest, c.Processes)
	}
	if res.CPUError != "" {
		fmt.Fprintf(&b, "  cpu: %s\n", res.CPUError)
	}
	msgs := make([]string, 0, len(res.ErrorSamples))
	for k := range res.ErrorSamples {
		msgs = append(msgs, k)
	}
	sort.Strings(msgs)
	for _, m := range msgs {
		fmt.Fprintf(&b, "  error ×%d: %s\n", res.ErrorSamples[m], m)
	}
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("load: writing the result: %w", err)
	}
	return nil
}

func writeSummary(b *strings.Builder, name string, s Summary) {
	fmt.Fprintf(b, "  %-16s n=%-8d p50 %.3f  p90 %.3f  p99 %.3f  max %.3f  mean %.3f ms\n",
		name, s.Count, s.P50MS, s.P90MS, s.P99MS, s.MaxMS, s.MeanMS)
}
