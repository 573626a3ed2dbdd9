// Package endpointcheck checks, from the outside, whether an HTTP endpoint honours
// Idempotency-Key: Check sends it a battery of real requests and reports a verdict per
// case. It is what `retrysafe check` runs; TestEndpoint and TestHandler in package
// idempotencytest run it from a Go test. It links no testing code, so that a program
// (the command line) can use it.
package endpointcheck

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/retrysafe/retrysafe/internal/httpname"
	"github.com/retrysafe/retrysafe/retry"
)

// Errors Check returns, wrapped; match them with errors.Is.
var (
	// ErrConfig: the Config cannot be used (no URL, a bad method …).
	ErrConfig = errors.New("idempotencytest: invalid configuration")
	// ErrUnreachable: the endpoint did not answer the first request at all.
	ErrUnreachable = errors.New("idempotencytest: the endpoint did not answer")
)

// Defaults of Config.
const (
	DefaultMethod      = http.MethodPost
	DefaultConcurrency = 20
	DefaultTimeout     = 10 * time.Second
	// SiblingSuffix is appended to the URL's path to make the default other route.
	SiblingSuffix = "/__retrysafe_check"
	// maxBody is how much of a response body is read and compared.
	maxBody = 1 << 20
	// maxSettle is how many times a sequential request answered 409 is sent again.
	maxSettle = 3
	// maxSettleWait caps the wait a 409's Retry-After asks for before that resend.
	maxSettleWait = 5 * time.Second
)

// Config says what Check checks. The zero value of each field but URL
// means the default documented on it.
type Config struct {
	// URL is the endpoint: an absolute http or https URL. Required (TestHandler takes
	// a path on its test server instead, default "/").
	URL string
	// Method is the request method. Default POST.
	Method string
	// Body is the request body sent by every case. Default empty.
	Body []byte
	// Header is sent with every request (Content-Type, an API version, a token header
	// …). An Idempotency-Key in it is ignored: each case sets its own. Default: none, and
	// Content-Type application/json when Body is JSON (application/octet-stream when it
	// is not).
	Header http.Header
	// Auth are Authorization header values. The first is sent with every request (it
	// overrides an Authorization in Header); the second is the other credential of the
	// two-credentials case, which is not applicable with fewer than two. Default none.
	Auth []string
	// OtherRoute is the route of the other-route case: an absolute URL, or a path on
	// URL's host (TestHandler: a path only). Default URL's path with SiblingSuffix
	// appended.
	OtherRoute string
	// Concurrency is how many requests the concurrent case sends at once. Default 20.
	Concurrency int
	// Timeout bounds each request, the response body included. Default 10s.
	Timeout time.Duration
	// QuotedKeys sends keys in the IETF draft's structured-field string form ("abc")
	// instead of the bare form (abc) most APIs (Stripe's among them) take. Default false.
	QuotedKeys bool
	// Transport sends the requests. Default: a clone of http.DefaultTransport, closed
	// when Check returns. Either way Check sends through
	// retry.SendOnce(Transport), so that an http.Transport never resends a keyed
	// request by itself (which the endpoint would count as one more execution than the
	// battery asked for); a RoundTripper of the caller's sees the key under the
	// lower-case map key "idempotency-key".
	Transport http.RoundTripper
	// Rand is where the keys' randomness comes from. Default crypto/rand.Reader.
	Rand io.Reader
	// Sleep waits before a 409 answered to a sequential request is sent again (the
	// 409's Retry-After, at most 5s). Default: a timer that ends early with ctx.
	Sleep func(ctx context.Context, d time.Duration) error
}

// plan is an Config checked and with its defaults set.
type plan struct {
	Config
	target, other *url.URL
	contentType   string
	client        *http.Client
}

func (cfg Config) plan() (*plan, error) {
	p := &plan{Config: cfg}
	if strings.TrimSpace(cfg.URL) == "" {
		return nil, fmt.Errorf("%w: no URL", ErrConfig)
	}
	u, err := parseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	p.target = u
	if p.Method == "" {
		p.Method = DefaultMethod
	}
	p.Method = strings.ToUpper(p.Method)
	if !httpname.Valid(p.Method) {
		return nil, fmt.Errorf("%w: %q is not an HTTP method", ErrConfig, cfg.Method)
	}
	if p.Concurrency == 0 {
		p.Concurrency = DefaultConcurrency
	}
	if p.Concurrency < 2 || p.Concurrency > 1000 {
		return nil, fmt.Errorf("%w: the concurrency must be between 2 and 1000", ErrConfig)
	}
	if p.Timeout < 0 {
		return nil, fmt.Errorf("%w: the timeout is negative", ErrConfig)
	}
	if p.Timeout == 0 {
		p.Timeout = DefaultTimeout
	}
	if len(p.Auth) > 2 {
		return nil, fmt.Errorf("%w: at most two credentials (Auth, --auth), got %d", ErrConfig, len(p.Auth))
	}
	for i, a := range p.Auth {
		if strings.TrimSpace(a) == "" || strings.ContainsAny(a, "\r\n\x00") {
			return nil, fmt.Errorf("%w: credential %d is empty or spans lines", ErrConfig, i+1)
		}
	}
	if len(p.Auth) == 2 && p.Auth[0] == p.Auth[1] {
		return nil, fmt.Errorf("%w: the two credentials are the same", ErrConfig)
	}
	p.other, err = siblingURL(u, cfg.OtherRoute)
	if err != nil {
		return nil, err
	}
	p.Header = cfg.Header.Clone()
	if p.Header == nil {
		p.Header = http.Header{}
	}
	p.Header.Del("Idempotency-Key")
	if len(p.Auth) > 0 {
		p.Header.Set("Authorization", p.Auth[0])
	}
	for k, vs := range p.Header {
		for _, v := range vs {
			if !httpname.Valid(k) || strings.ContainsAny(v, "\r\n\x00") {
				return nil, fmt.Errorf("%w: header %q is not a valid header", ErrConfig, k)
			}
		}
	}
	p.contentType = p.Header.Get("Content-Type")
	if p.contentType == "" && len(p.Body) > 0 {
		p.contentType = "application/octet-stream"
		if json.Valid(p.Body) {
			p.contentType = "application/json"
		}
		p.Header.Set("Content-Type", p.contentType)
	}
	if p.Rand == nil {
		p.Rand = rand.Reader
	}
	if p.Sleep == nil {
		p.Sleep = sleep
	}
	return p, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func parseURL(s string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%w: URL: %w", ErrConfig, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w: URL %q: the scheme must be http or https", ErrConfig, u.Redacted())
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%w: URL %q has no host", ErrConfig, u.Redacted())
	}
	u.Fragment, u.RawFragment = "", ""
	return u, nil
}

// siblingURL is the other route: other resolved against u, or u's path with
// SiblingSuffix.
func siblingURL(u *url.URL, other string) (*url.URL, error) {
	if strings.TrimSpace(other) == "" {
		s := *u
		s.Path = strings.TrimSuffix(u.Path, "/") + SiblingSuffix
		s.RawPath = ""
		return &s, nil
	}
	ref, err := url.Parse(strings.TrimSpace(other))
	if err != nil {
		return nil, fmt.Errorf("%w: other route %q: %w", ErrConfig, other, err)
	}
	o := u.ResolveReference(ref)
	if o.Scheme != "http" && o.Scheme != "https" || o.Host == "" {
		return nil, fmt.Errorf("%w: other route %q is not an http(s) URL or a path", ErrConfig, other)
	}
	if o.Path == u.Path && o.RawQuery == u.RawQuery && o.Host == u.Host {
		return nil, fmt.Errorf("%w: the other route is the URL itself", ErrConfig)
	}
	return o, nil
}

// Requests returns how many requests Check sends with cfg, not counting
// the few resends of a sequential request answered 409 (at most three each), or an
// error when cfg is unusable.
func Requests(cfg Config) (int, error) {
	p, err := cfg.plan()
	if err != nil {
		return 0, err
	}
	return p.requests(), nil
}

func (p *plan) requests() int {
	n := 1 + 2 + p.Concurrency + 1 + 1 + 3 // missing, replay, concurrent, other body, other route, malformed
	if len(p.Auth) == 2 {
		n += 2
	}
	return n
}

// Loopback reports whether rawURL's host is a loopback address or a name for one
// (localhost, *.localhost). Other names are not resolved: they are not loopback.
func Loopback(rawURL string) bool {
	u, err := url.Parse(strings.TrimSpace(rawURL))
	if err != nil {
		return false
	}
	h := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// response is what one request got back.
type response struct {
	status    int
	header    http.Header
	body      []byte
	truncated bool
	err       error
}

func (r *response) ok() bool { return r.err == nil }

// replayed reports whether the response carries the replay marker.
func (r *response) replayed() bool {
	return r.err == nil && strings.EqualFold(strings.TrimSpace(r.header.Get("Idempotent-Replayed")), "true")
}

// same reports whether two answered responses have the same status and body.
func (r *response) same(o *response) bool {
	return r.err == nil && o.err == nil && r.status == o.status && bytes.Equal(r.body, o.body)
}

func (r *response) mediaType() string {
	ct := r.header.Get("Content-Type")
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.ToLower(strings.TrimSpace(ct))
}

func (r *response) problem() bool { return r.mediaType() == "application/problem+json" }

// String describes the response briefly: "201", "400 application/problem+json", or
// the error.
func (r *response) String() string {
	if r.err != nil {
		return "error: " + oneLine(r.err.Error())
	}
	return strconv.Itoa(r.status)
}

// describe is the status with the media type, for error responses.
func (r *response) describe() string {
	if r.err != nil {
		return r.String()
	}
	if mt := r.mediaType(); mt != "" {
		return strconv.Itoa(r.status) + " " + mt
	}
	return strconv.Itoa(r.status)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// runner sends the requests of one Check.
type runner struct {
	p      *plan
	client *http.Client
	mu     sync.Mutex
	sent   int
}

// send sends one request to u with key (nil: no header) and body under auth (the
// Authorization value; "" keeps the plan's).
func (r *runner) send(ctx context.Context, u *url.URL, key *string, body []byte, auth string) *response {
	r.mu.Lock()
	r.sent++
	r.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, r.p.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return &response{err: err}
	}
	if len(body) == 0 {
		req.Body, req.GetBody, req.ContentLength = http.NoBody, nil, 0
	}
	req.Header = r.p.Header.Clone()
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if key != nil {
		req.Header["Idempotency-Key"] = []string{*key} // as is: the empty value too
	}
	res, err := r.client.Do(req)
	if err != nil {
		return &response{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxBody+1))
	out := &response{status: res.StatusCode, header: res.Header, body: b}
	if err != nil {
		return &response{err: fmt.Errorf("reading the response: %w", err)}
	}
	if len(b) > maxBody {
		out.body, out.truncated = b[:maxBody], true
	}
	return out
}

// sendSettled sends a request after another one with the same key has finished: a 409
// there means the server has not yet recorded the first one's result, so it waits for
// the 409's Retry-After (at most 5s) and sends again, up to three times. It returns the
// last response and the 409s it got.
func (r *runner) sendSettled(ctx context.Context, u *url.URL, key *string, body []byte, auth string) (*response, []*response) {
	var conflicts []*response
	for i := 0; ; i++ {
		res := r.send(ctx, u, key, body, auth)
		if !res.ok() || res.status != http.StatusConflict || i == maxSettle {
			return res, conflicts
		}
		conflicts = append(conflicts, res)
		d, ok := retryAfter(res.header, time.Now())
		if !ok {
			d = time.Second
		}
		if r.p.Sleep(ctx, min(d, maxSettleWait)) != nil {
			return res, conflicts
		}
	}
}

// retryAfter parses a Retry-After header: delta-seconds or an HTTP-date.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil && secs >= 0 {
		return time.Duration(min(secs, 1<<30)) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now)), true
	}
	return 0, false
}

// newKey returns a fresh random key: "retrysafe-check-" and 32 hex digits.
func (p *plan) newKey() (string, error) {
	var b [16]byte
	if _, err := io.ReadFull(p.Rand, b[:]); err != nil {
		return "", fmt.Errorf("idempotencytest: reading random key bytes: %w", err)
	}
	return "retrysafe-check-" + hex.EncodeToString(b[:]), nil
}

// wire is the header value a valid key is sent as.
func (p *plan) wire(key string) *string {
	if p.QuotedKeys {
		key = `"` + key + `"`
	}
	return &key
}

// otherBody returns a body that differs from body: a JSON object gets one more member,
// anything else a trailing byte; an empty body becomes a small JSON object.
func otherBody(body []byte) []byte {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return []byte(`{"retrysafe_check":"other body"}`)
	}
	var obj map[string]json.RawMessage
	if trimmed[0] == '{' && json.Unmarshal(trimmed, &obj) == nil {
		obj["retrysafe_check"] = json.RawMessage(`"other body"`)
		if b, err := json.Marshal(obj); err == nil && !bytes.Equal(b, trimmed) {
			return b
		}
	}
	return append(bytes.Clone(body), '\n')
}

// observations are the responses of one Check, for the verdicts.
type observations struct {
	missing     *response
	first       *response   // key 1, the first time
	second      *response   // key 1 again, sequentially (after any 409s)
	secondWait  []*response // 409s answered to the second before it settled
	concurrent  []*response // key 2, all at once
	otherBody   *response   // key 1, another body
	otherRoute  *response   // key 1, the sibling route
	scopeA      *response   // key 3 under the first credential (nil: not applicable)
	scopeB      *response   // key 3 under the second
	scopeBWait  []*response
	keyEmpty    *response
	keyLong     *response
	keyControl  *response
	twoAuths    bool
	quotedKeys  bool
	concurrency int
}

// Check checks whether an HTTP endpoint honours Idempotency-Key, from the
// outside: it sends a battery of real requests to cfg.URL
// with fresh random keys and compares what comes back with what the IETF draft
// (draft-ietf-httpapi-idempotency-key-header) and Stripe's behaviour say should. It
// returns one Result per case; idempotencytest.TestEndpoint and
// idempotencytest.TestHandler run it from a Go test.
//
// The cases, in the order they are sent (and reported):
//
//	missing key        no Idempotency-Key: 400 when keys are required. An endpoint that
//	                   executes the request reports "keys optional" (advisory).
//	replay             the same key and body twice, one after the other: the same status
//	                   and body (required); Idempotent-Replayed: true on the second
//	                   (advisory, Stripe's marker).
//	concurrent         the same key and body 20 times at once: one execution, that is
//	                   identical responses, or 409s and one result (required).
//	other body         the first key with another body: 422, or at least a 4xx that is
//	                   not a replay (required).
//	other route        the first key on a sibling route: not the first route's response
//	                   (required).
//	two credentials    one key under two Authorization values: two independent
//	                   executions (required; not applicable without two credentials).
//	malformed keys     empty, 256 characters, a control character: 400 (the 256-character
//	                   case is advisory: the draft sets no length, Stripe stops at 255).
//	409 Retry-After    every 409 says when to retry (required: without it a careful
//	                   client does not retry a 409 at all).
//	problem+json       the idempotency errors are application/problem+json (advisory).
//
// A response can only prove "one execution" when two executions would look different.
// Check compares the responses to two different keys: when they are identical, and
// the API sends no replay marker, the cases that count executions say "not applicable"
// rather than guess.
//
// Every request but the missing-key and malformed-key ones is a valid request, and any
// of them may execute on the server: run it against a test deployment or a test
// handler. Requests says how many will be sent.
//
// It returns an error (wrapping ErrConfig) when cfg is unusable, and one
// wrapping ErrUnreachable when the endpoint does not answer the first request;
// a later request that fails is a case's observation, not an error.
func Check(ctx context.Context, cfg Config) (*Report, error) {
	p, err := cfg.plan()
	if err != nil {
		return nil, err
	}
	transport := p.Transport
	if transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = p.Concurrency
		defer t.CloseIdleConnections()
		transport = t
	}
	r := &runner{p: p, client: &http.Client{
		Transport:     retry.SendOnce(transport),
		Timeout:       p.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	keys := make([]string, 3)
	for i := range keys {
		if keys[i], err = p.newKey(); err != nil {
			return nil, err
		}
	}
	o := &observations{twoAuths: len(p.Auth) == 2, quotedKeys: p.QuotedKeys, concurrency: p.Concurrency}

	o.missing = r.send(ctx, p.target, nil, p.Body, "") // no Idempotency-Key header
	if !o.missing.ok() {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("idempotencytest: %w", context.Cause(ctx))
		}
		err := o.missing.err
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the message without the method and URL again
		}
		return nil, fmt.Errorf("%w: %s %s: %w", ErrUnreachable, p.Method, p.target.Redacted(), err)
	}
	k1, k2, k3 := p.wire(keys[0]), p.wire(keys[1]), p.wire(keys[2])
	o.first = r.send(ctx, p.target, k1, p.Body, "")
	o.second, o.secondWait = r.sendSettled(ctx, p.target, k1, p.Body, "")
	o.concurrent = r.burst(ctx, k2)
	o.otherBody = r.send(ctx, p.target, k1, otherBody(p.Body), "")
	o.otherRoute = r.send(ctx, p.other, k1, p.Body, "")
	if o.twoAuths {
		o.scopeA = r.send(ctx, p.target, k3, p.Body, "")
		o.scopeB, o.scopeBWait = r.sendSettled(ctx, p.target, k3, p.Body, p.Auth[1])
	}
	empty := ""
	// 256 visible characters, one more than Stripe (and this project) accept.
	long := p.wire(strings.Repeat("k", 256-len(keys[0])) + keys[0])
	// A tab inside the key: the one control character an HTTP/1.1 client can send in a
	// header value.
	control := p.wire("retrysafe-check\t" + keys[0])
	o.keyEmpty = r.send(ctx, p.target, &empty, p.Body, "")
	o.keyLong = r.send(ctx, p.target, long, p.Body, "")
	o.keyControl = r.send(ctx, p.target, control, p.Body, "")
	if err := context.Cause(ctx); err != nil {
		return nil, fmt.Errorf("idempotencytest: %w", err)
	}

	rep := &Report{Method: p.Method, URL: p.target.Redacted(), OtherRoute: p.other.Redacted(), Requests: r.sent}
	rep.Results = o.verdicts()
	rep.Notes = o.notes()
	return rep, nil
}

// burst sends Concurrency requests with key at once and returns their responses.
func (r *runner) burst(ctx context.Context, key *string) []*response {
	out := make([]*response, r.p.Concurrency)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = r.send(ctx, r.p.target, key, r.p.Body, "")
		}()
	}
	close(start)
	wg.Wait()
	return out
}
