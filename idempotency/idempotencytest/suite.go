// Package idempotencytest holds the conformance checks of retrysafe's idempotency
// contract, for stores and for endpoints.
//
// Stores: Run is the suite every idempotency.Store runs, and RunTx the one of stores
// that complete records in the handler's own transaction (WithTx). It is the only place
// store behaviour is specified by tests: a store's own test file calls Run with a
// Harness and adds only what is specific to its backend (migrations, round trips,
// durability). The suite drives each store's clock (the Harness passes it a Clock the
// suite moves), so expiry and lease cases run instantly; one case runs the store on its
// own clock.
//
// Endpoints: TestHandler and TestEndpoint run, from a Go test, the battery behind
// `retrysafe check` (package endpointcheck) against an http.Handler or a URL: real
// requests to any endpoint — yours, in any language, behind any idempotency layer —
// and a failed test for each required case it does not pass.
package idempotencytest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/idempotency"
)

// Harness tells the suite how to make stores.
type Harness struct {
	// New returns a new, empty store isolated from every other store New returns (its
	// own schema, file or key prefix), whose lease and expiry decisions read the time
	// from clock. A nil clock means the store's own clock (the server's for a shared
	// store). Register cleanup with t.Cleanup.
	New func(t *testing.T, clock func() time.Time) idempotency.Store
	// Down returns a store whose backend is unreachable or closed, so every call fails.
	// Nil skips the outage cases.
	Down func(t *testing.T) idempotency.Store
}

const (
	lease = 30 * time.Second
	ttl   = 24 * time.Hour
)

// Clock is a manual clock: the suite moves it with Advance, and stores read it through
// Now (the Harness's clock). It starts at the real time, to the millisecond (what every
// store keeps).
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock showing the current time, truncated to the millisecond.
func NewClock() *Clock { return &Clock{now: time.Now().Truncate(time.Millisecond)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Run runs the conformance suite against the stores h makes.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("idempotencytest: Harness.New is nil")
	}
	cases := []struct {
		name string
		fn   func(t *testing.T, s idempotency.Store, c *Clock)
	}{
		{"FirstClaim", testFirstClaim},
		{"Replay", testReplay},
		{"ReplayBodyOmitted", testReplayBodyOmitted},
		{"ReplayLargeBinaryBody", testLargeBody},
		{"HeadersByteForByte", testHeaderBytes},
		{"Trailers", testTrailers},
		{"InFlight", testInFlight},
		{"FingerprintMismatch", testMismatch},
		{"ExistingIsLean", testLeanExisting},
		{"ScopeIsolation", testScopeIsolation},
		{"UnusualScopesAndKeys", testUnusualNames},
		{"Expiry", testExpiry},
		{"LeaseExpiryTakeover", testTakeover},
		{"NoTakeover", testNoTakeover},
		{"TakeoverBy", testTakeoverBy},
		{"StaleOwnerRejected", testStaleOwner},
		{"Extend", testExtend},
		{"ExtendOutlivesTTL", testExtendOutlivesTTL},
		{"Abandon", testAbandon},
		{"Release", testRelease},
		{"CompleteTwice", testCompleteTwice},
		{"RecordGone", testRecordGone},
		{"ClaimID", testClaimID},
		{"Delete", testDelete},
		{"GetMissing", testGetMissing},
		{"CanceledContext", testCanceled},
		{"RaceOneKey", testRace},
		{"RaceTakeover", testRaceTakeover},
		{"Janitor", testJanitor},
		{"List", testList},
		{"Route", testRoute},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clock := NewClock()
			c.fn(t, h.New(t, clock.Now), clock)
		})
	}
	t.Run("StoreClock", func(t *testing.T) {
		t.Parallel()
		testStoreClock(t, h.New(t, nil))
	})
	t.Run("WaitAcrossReplicas", func(t *testing.T) {
		t.Parallel()
		testWaitReplicas(t, h.New(t, nil))
	})
	t.Run("StoreDown", func(t *testing.T) {
		if h.Down == nil {
			t.Skip("harness has no Down store")
		}
		t.Parallel()
		testDown(t, h.Down(t))
	})
}

func req(scope, key, fp string) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Scope: scope, Key: key, Fingerprint: fp, Lease: lease, TTL: ttl}
}

func mustClaim(t *testing.T, s idempotency.Store, r idempotency.ClaimRequest) int64 {
	t.Helper()
	res, err := s.Claim(context.Background(), r)
	if err != nil {
		t.Fatalf("Claim(%q, %q): %v", r.Scope, r.Key, err)
	}
	if !res.Claimed {
		t.Fatalf("Claim(%q, %q): not claimed, existing %+v", r.Scope, r.Key, res.Existing)
	}
	if res.Existing != nil {
		t.Errorf("Claim won but Existing = %+v, want nil", res.Existing)
	}
	return res.Token
}

func mustNotClaim(t *testing.T, s idempotency.Store, r idempotency.ClaimRequest) *idempotency.Record {
	t.Helper()
	res, err := s.Claim(context.Background(), r)
	if err != nil {
		t.Fatalf("Claim(%q, %q): %v", r.Scope, r.Key, err)
	}
	if res.Claimed {
		t.Fatalf("Claim(%q, %q) won (token %d), want the existing record", r.Scope, r.Key, res.Token)
	}
	if res.Existing == nil {
		t.Fatal("Claim lost but Existing is nil")
	}
	return res.Existing
}

func complete(s idempotency.Store, scope, key string, token int64, resp idempotency.Response) error {
	return s.Complete(context.Background(), idempotency.Completion{Scope: scope, Key: key, Token: token,
		Response: resp, TTL: ttl})
}

func mustGet(t *testing.T, s idempotency.Store, scope, key string) *idempotency.Record {
	t.Helper()
	r, err := s.Get(context.Background(), scope, key)
	if err != nil {
		t.Fatalf("Get(%q, %q): %v", scope, key, err)
	}
	return r
}

func wantErr(t *testing.T, what string, got, want error) {
	t.Helper()
	if !errors.Is(got, want) {
		t.Errorf("%s: err = %v, want %v", what, got, want)
	}
}

func sampleResponse() idempotency.Response {
	return idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Link":         {"</a>; rel=a", "</b>; rel=b"},
			"X-Empty":      {""},
		},
		Body: []byte(`{"id":"pay_1","amount":100}`),
	}
}

func sameResponse(t *testing.T, got *idempotency.Response, want idempotency.Response) {
	t.Helper()
	if got == nil {
		t.Fatal("stored response is nil")
	}
	if got.Status != want.Status {
		t.Errorf("status = %d, want %d", got.Status, want.Status)
	}
	if !bytes.Equal(got.Body, want.Body) {
		t.Errorf("body = %q (%d bytes), want %q (%d bytes)", trunc(got.Body), len(got.Body), trunc(want.Body), len(want.Body))
	}
	if got.BodyOmitted != want.BodyOmitted {
		t.Errorf("BodyOmitted = %v, want %v", got.BodyOmitted, want.BodyOmitted)
	}
	sameHeader(t, "header", got.Header, want.Header)
	sameHeader(t, "trailer", got.Trailer, want.Trailer)
}

func sameHeader(t *testing.T, what string, got, want http.Header) {
	t.Helper()
	for k, v := range want {
		if !slices.Equal(got[k], v) {
			t.Errorf("%s %s = %q, want %q", what, k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s = %q, want %q", what, got, want)
	}
}

func trunc(b []byte) []byte {
	if len(b) > 40 {
		return b[:40]
	}
	return b
}

func sameTime(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if !got.Equal(want) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func testFirstClaim(t *testing.T, s idempotency.Store, c *Clock) {
	at := c.Now()
	res, err := s.Claim(context.Background(), req("user-1", "key-1", "fp-1"))
	if err != nil || !res.Claimed {
		t.Fatalf("Claim = %+v, %v", res, err)
	}
	if res.Token <= 0 {
		t.Errorf("token = %d, want > 0", res.Token)
	}
	sameTime(t, "ClaimResult.Now", res.Now, at)
	rec := mustGet(t, s, "user-1", "key-1")
	if rec.State != idempotency.StateInProgress || rec.Token != res.Token || rec.Fingerprint != "fp-1" ||
		rec.Scope != "user-1" || rec.Key != "key-1" || rec.Response != nil || rec.Abandoned {
		t.Errorf("record = %+v", rec)
	}
	sameTime(t, "LeaseUntil", rec.LeaseUntil, at.Add(lease))
	sameTime(t, "ExpiresAt", rec.ExpiresAt, at.Add(ttl))
	sameTime(t, "CreatedAt", rec.CreatedAt, at)
}

// testStoreClock runs against a store on its own clock (nil Harness clock): instants
// come from the store, which on this machine is near the process clock.
func testStoreClock(t *testing.T, s idempotency.Store) {
	before := time.Now()
	res, err := s.Claim(context.Background(), req("u", "k", "fp"))
	if err != nil || !res.Claimed {
		t.Fatalf("Claim = %+v, %v", res, err)
	}
	after := time.Now()
	near := func(what string, got, want time.Time) {
		t.Helper()
		if got.Before(want.Add(-time.Second)) || got.After(want.Add(after.Sub(before)+time.Second)) {
			t.Errorf("%s = %v, want about %v", what, got, want)
		}
	}
	near("ClaimResult.Now", res.Now, before)
	rec := mustGet(t, s, "u", "k")
	near("LeaseUntil", rec.LeaseUntil, before.Add(lease))
	near("ExpiresAt", rec.ExpiresAt, before.Add(ttl))
	// The lease runs on the store's clock: no takeover now.
	if again := mustNotClaim(t, s, req("u", "k", "fp")); again.Token != res.Token {
		t.Errorf("existing token %d, want %d", again.Token, res.Token)
	}
	if err := s.Extend(context.Background(), "u", "k", res.Token, time.Hour); err != nil {
		t.Fatal(err)
	}
	near("LeaseUntil after Extend", mustGet(t, s, "u", "k").LeaseUntil, before.Add(time.Hour))
}

func testReplay(t *testing.T, s idempotency.Store, c *Clock) {
	at := c.Now()
	tok := mustClaim(t, s, req("u", "k", "fp"))
	c.Advance(time.Second)
	want := sampleResponse()
	if err := complete(s, "u", "k", tok, want); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	for range 2 { // replay is repeatable and changes nothing
		c.Advance(time.Second)
		rec := mustNotClaim(t, s, req("u", "k", "fp"))
		if rec.State != idempotency.StateDone || rec.Token != tok || rec.Fingerprint != "fp" {
			t.Errorf("replayed record = %+v", rec)
		}
		sameResponse(t, rec.Response, want)
		sameTime(t, "ExpiresAt", rec.ExpiresAt, at.Add(time.Second).Add(ttl))
	}
	sameResponse(t, mustGet(t, s, "u", "k").Response, want)
}

func testReplayBodyOmitted(t *testing.T, s idempotency.Store, _ *Clock) {
	tok := mustClaim(t, s, req("u", "k", "fp"))
	want := idempotency.Response{Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, BodyOmitted: true}
	if err := complete(s, "u", "k", tok, want); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec := mustNotClaim(t, s, req("u", "k", "fp"))
	sameResponse(t, rec.Response, want)
}

func testLargeBody(t *testing.T, s idempotency.Store, _ *Clock) {
	tok := mustClaim(t, s, req("u", "k", "fp"))
	want := idempotency.Response{Status: 500, Header: http.Header{}, Body: binaryBody(2 << 20)}
	if err := complete(s, "u", "k", tok, want); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	sameResponse(t, mustNotClaim(t, s, req("u", "k", "fp")).Response, want)
}

// binaryBody returns n bytes in which every byte value occurs, NULs included.
func binaryBody(n int) []byte {
	body := make([]byte, n)
	for i := range body {
		body[i] = byte(i*7 + i>>11)
	}
	return body
}

// testHeaderBytes stores header values that are not UTF-8, and names as they came:
// replays must give back the same bytes.
func testHeaderBytes(t *testing.T, s idempotency.Store, _ *Clock) {
	tok := mustClaim(t, s, req("u", "k", "fp"))
	want := idempotency.Response{Status: 200, Header: http.Header{
		"X-Latin1":     {"caf\xe9"},
		"X-High":       {"\x80\xff\xfe", "\xc3\x28"},
		"X-Utf8":       {"r\u00e9sum\u00e9"},
		"X-Ctl":        {"a\tb"},
		"Content-Type": {"text/plain; charset=iso-8859-1"},
	}, Body: []byte("caf\xe9")}
	if err := complete(s, "u", "k", tok, want); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	sameResponse(t, mustNotClaim(t, s, req("u", "k", "fp")).Response, want)
	sameResponse(t, mustGet(t, s, "u", "k").Response, want)
}

func testTrailers(t *testing.T, s idempotency.Store, _ *Clock) {
	tok := mustClaim(t, s, req("u", "k", "fp"))
	want := idempotency.Response{Status: 200, Header: http.Header{"Content-Type": {"application/grpc"}},
		Trailer: http.Header{"Grpc-Status": {"0"}, "X-Checksum": {"\xde\xad", "2"}}, Body: []byte("data")}
	if err := complete(s, "u", "k", tok, want); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	sameResponse(t, mustNotClaim(t, s, req("u", "k", "fp")).Response, want)
	// No trailers stays no trailers.
	tok = mustClaim(t, s, req("u", "k2", "fp"))
	if err := complete(s, "u", "k2", tok, sampleResponse()); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, "u", "k2").Response.Trailer; len(got) != 0 {
		t.Errorf("trailer = %q, want none", got)
	}
}

func testInFlight(t *testing.T, s idempotency.Store, c *Clock) {
	at := c.Now()
	tok := mustClaim(t, s, req("u", "k", "fp"))
	c.Advance(lease - time.Millisecond)
	res, err := s.Claim(context.Background(), req("u", "k", "fp"))
	if err != nil || res.Claimed || res.Existing == nil {
		t.Fatalf("Claim in flight = %+v, %v", res, err)
	}
	rec := res.Existing
	if rec.State != idempotency.StateInProgress || rec.Token != tok || rec.Abandoned {
		t.Errorf("existing = %+v, want in progress with token %d", rec, tok)
	}
	sameTime(t, "LeaseUntil", rec.LeaseUntil, at.Add(lease))
	sameTime(t, "ClaimResult.Now", res.Now, at.Add(lease-time.Millisecond))
}

func testMismatch(t *testing.T, s idempotency.Store, c *Clock) {
	tok := mustClaim(t, s, req("u", "k", "fp-a"))
	// In progress, with the lease running and after it ran out: never a takeover by
	// another payload.
	for _, d := range []time.Duration{0, lease + time.Second} {
		c.Advance(d)
		rec := mustNotClaim(t, s, req("u", "k", "fp-b"))
		if rec.Fingerprint != "fp-a" || rec.Token != tok {
			t.Errorf("existing = %+v, want fingerprint fp-a token %d", rec, tok)
		}
	}
	if err := complete(s, "u", "k", tok, sampleResponse()); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec := mustNotClaim(t, s, req("u", "k", "fp-b"))
	if rec.Fingerprint != "fp-a" || rec.State != idempotency.StateDone {
		t.Errorf("existing = %+v", rec)
	}
}

// testLeanExisting: a 409 or a 422 is decided without the stored response, so a store
// must not return (and need not read) a response it will not replay.
func testLeanExisting(t *testing.T, s idempotency.Store, _ *Clock) {
	tok := mustClaim(t, s, req("u", "k", "fp-a"))
	big := idempotency.Response{Status: 201, Header: http.Header{"X": {"y"}}, Body: binaryBody(1 << 20)}
	if err := complete(s, "u", "k", tok, big); err != nil {
		t.Fatal(err)
	}
	if rec := mustNotClaim(t, s, req("u", "k", "fp-b")); rec.Response != nil {
		t.Errorf("a mismatch's Existing carries the stored response (%d body bytes): a 422 needs none", len(rec.Response.Body))
	} else if rec.State != idempotency.StateDone || rec.Fingerprint != "fp-a" {
		t.Errorf("mismatch existing = %+v", rec)
	}
	sameResponse(t, mustNotClaim(t, s, req("u", "k", "fp-a")).Response, big)
}

func testScopeIsolation(t *testing.T, s idempotency.Store, _ *Clock) {
	ta := mustClaim(t, s, req("alice", "k", "fp"))
	tb := mustClaim(t, s, req("bob", "k", "fp"))
	if ta == tb {
		t.Errorf("two scopes share token %d", ta)
	}
	want := sampleResponse()
	if err := complete(s, "alice", "k", ta, want); err != nil {
		t.Fatal(err)
	}
	// Bob's record is untouched by Alice's completion, and Alice's token is useless on it.
	if rec := mustGet(t, s, "bob", "k"); rec.State != idempotency.StateInProgress || rec.Response != nil {
		t.Errorf("bob's record = %+v", rec)
	}
	wantErr(t, "Complete with alice's token on bob's key", complete(s, "bob", "k", ta, want), idempotency.ErrLeaseLost)
	wantErr(t, "Release with alice's token on bob's key", s.Release(context.Background(), "bob", "k", ta), idempotency.ErrLeaseLost)
	wantErr(t, "Abandon with alice's token on bob's key", s.Abandon(context.Background(), "bob", "k", ta), idempotency.ErrLeaseLost)
	if _, err := s.Get(context.Background(), "carol", "k"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get(carol) err = %v, want ErrNotFound", err)
	}
	// Empty scope is a scope like any other.
	mustClaim(t, s, req("", "k", "fp"))
}

func testUnusualNames(t *testing.T, s idempotency.Store, _ *Clock) {
	visible := make([]byte, 0, 94)
	for c := byte(0x21); c <= 0x7e; c++ {
		visible = append(visible, c)
	}
	keys := []string{string(visible), strings.Repeat("k", 255), "a:b", "a", "{x}", `"quoted"`, "*", "%_"}
	scopes := []string{"", "a", "a:b", "{x}", "tenant/\u00fc", "nul\x00byte", "*", "%_", "\xff\xfe"}
	tokens := map[int64]bool{}
	for _, sc := range scopes {
		for _, k := range keys {
			tok := mustClaim(t, s, req(sc, k, "fp"))
			if tokens[tok] {
				t.Fatalf("token %d issued twice", tok)
			}
			tokens[tok] = true
			if rec := mustGet(t, s, sc, k); rec.Scope != sc || rec.Key != k || rec.Token != tok {
				t.Errorf("Get(%q, %q) = scope %q key %q token %d", sc, k, rec.Scope, rec.Key, rec.Token)
			}
		}
	}
	// Wildcards in names must not match other records.
	if err := s.Delete(context.Background(), "*", "*"); err != nil {
		t.Fatal(err)
	}
	if rec := mustGet(t, s, "a", "a"); rec == nil {
		t.Error("deleting (*, *) removed (a, a)")
	}
}

func testExpiry(t *testing.T, s idempotency.Store, c *Clock) {
	tok := mustClaim(t, s, req("u", "k", "fp"))
	if err := complete(s, "u", "k", tok, sampleResponse()); err != nil {
		t.Fatal(err)
	}
	// Just before expiry it replays; at expiry it is gone, for any payload.
	c.Advance(ttl - time.Millisecond)
	mustNotClaim(t, s, req("u", "k", "fp"))
	c.Advance(time.Millisecond)
	res, err := s.Claim(context.Background(), req("u", "k", "other-fp"))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Claimed || res.TookOver {
		t.Fatalf("claim after expiry = %+v, want a fresh claim", res)
	}
	if res.Token == tok {
		t.Errorf("fresh claim after expiry reused token %d", tok)
	}
	rec := mustGet(t, s, "u", "k")
	if rec.State != idempotency.StateInProgress || rec.Fingerprint != "other-fp" || rec.Response != nil {
		t.Errorf("record after expiry claim = %+v", rec)
	}
	// The old owner cannot touch the new record.
	wantErr(t, "old owner Complete", complete(s, "u", "k", tok, sampleResponse()), idempotency.ErrLeaseLost)

	// An in-progress record past retention and past its lease is replaced, by any
	// payload.
	tok2 := mustClaim(t, s, req("u", "k2", "fp"))
	c.Advance(ttl + time.Hour)
	res, err = s.Claim(context.Background(), req("u", "k2", "other-fp"))
	if err != nil || !res.Claimed || res.Token == tok2 {
		t.Errorf("claim of expired in-progress record = %+v, %v", res, err)
	}
}

func testTakeover(t *testing.T, s idempotency.Store, c *Clock) {
	old := mustClaim(t, s, req("u", "k", "fp"))
	c.Advance(lease - time.Millisecond)
	mustNotClaim(t, s, req("u", "k", "fp"))
	c.Advance(time.Millisecond)
	later := c.Now()
	res, err := s.Claim(context.Background(), req("u", "k", "fp"))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Claimed || !res.TookOver {
		t.Fatalf("claim at lease expiry = %+v, want a takeover", res)
	}
	if res.Token <= old {
		t.Errorf("takeover token %d <= old token %d", res.Token, old)
	}
	rec := mustGet(t, s, "u", "k")
	if rec.Token != res.Token || rec.State != idempotency.StateInProgress {
		t.Errorf("record after takeover = %+v", rec)
	}
	sameTime(t, "LeaseUntil", rec.LeaseUntil, later.Add(lease))
	// A second takeover after the new lease ends issues a greater token again.
	c.Advance(lease)
	res2, err := s.Claim(context.Background(), req("u", "k", "fp"))
	if err != nil || !res2.Claimed || !res2.TookOver || res2.Token <= res.Token {
		t.Errorf("second takeover = %+v, %v; want token > %d", res2, err, res.Token)
	}
}

func testNoTakeover(t *testing.T, s idempotency.Store, c *Clock) {
	tok := mustClaim(t, s, req("u", "k", "fp"))
	c.Advance(lease + time.Second)
	r := req("u", "k", "fp")
	r.NoTakeover = true
	rec := mustNotClaim(t, s, r)
	if rec.State != idempotency.StateInProgress || rec.Token != tok {
		t.Errorf("existing = %+v, want the in-progress record with token %d", rec, tok)
	}
	// Even past retention, an in-progress record stays with NoTakeover.
	c.Advance(ttl)
	mustNotClaim(t, s, r)
	// NoTakeover does not stop a fresh claim, nor the replacement of an expired done
	// record.
	mustClaim(t, s, func() idempotency.ClaimRequest { r := req("u", "fresh", "fp"); r.NoTakeover = true; return r }())
	if err := s.Extend(context.Background(), "u", "k", tok, lease); err != nil {
		t.Fatalf("the owner, presumed alive, renews: %v", err)
	}
	if err := complete(s, "u", "k", tok, sampleResponse()); err != nil {
		t.Fatalf("the owner, presumed alive, completes: %v", err)
	}
	c.Advance(ttl)
	if res, err := s.Claim(context.Background(), r); err != nil || !res.Claimed || res.TookOver {
		t.Errorf("claim of an expired done record with NoTakeover = %+v, %v; want a fresh claim", res, err)
	}
}

// testTakeoverBy: a claim that reaches the store after its TakeoverBy takes nothing
// over (its sender decided on old knowledge); before it, it does.
func testTakeoverBy(t *testing.T, s idempotency.Store, c *Clock) {
	tok := mustClaim(t, s, req("u", "k", "fp"))
	c.Advance(lease + time.Second)
	late := req("u", "k", "fp")
	late.TakeoverBy = c.Now().Add(-time.Millisecond)
	if rec := mustNotClaim(t, s, late); rec.Token != tok || rec.State != idempotency.StateInProgress {
		t.Errorf("a late claim: existing %+v, want the record with token %d", rec, tok)
	}
	// Past retention too: the late claim replaces nothing.
	mustClaim(t, s, req("u", "k2", "fp"))
	c.Advance(ttl)
	late.Key, late.TakeoverBy = "k2", c.Now().Add(-time.Millisecond)
	mustNotClaim(t, s, late)
	// In time, it takes over.
	inTime := req("u", "k", "fp")
	inTime.TakeoverBy = c.Now()
	res, err := s.Claim(context.Background(), inTime)
	if err != nil || !res.Claimed || res.Token <= tok {
		t.Errorf("a claim in time = %+v, %v; want a takeover", res, err)
	}
	// A bound does not stop a fresh claim.
	fresh := req("u", "fresh", "fp")
	fresh.TakeoverBy = c.Now().Add(-time.Hour)
	mustClaim(t, s, fresh)
}

func testStaleOwner(t *testing.T, s idempotency.Store, c *Clock) {
	ctx := context.Background()
	stale := mustClaim(t, s, req("u", "k", "fp"))
	c.Advance(lease + time.Second)
	fresh := mustClaim(t, s, req("u", "k", "fp"))
	resp := sampleResponse()
	wantErr(t, "stale Complete", complete(s, "u", "k", stale, resp), idempotency.ErrLeaseLost)
	wantErr(t, "stale Extend", s.Extend(ctx, "u", "k", stale, time.Hour), idempotency.ErrLeaseLost)
	wantErr(t, "stale Abandon", s.Abandon(ctx, "u", "k", stale), idempotency.ErrLeaseLost)
	wantErr(t, "stale Release", s.Release(ctx, "u", "k", stale), idempotency.ErrLeaseLost)
	rec := mustGet(t, s, "u", "k")
	if rec.Token != fresh || rec.State != idempotency.StateInProgress || rec.Abandoned {
		t.Fatalf("stale owner changed the record: %+v", rec)
	}
	if err := complete(s, "u", "k", fresh, resp); err != nil {
		t.Fatalf("new owner Complete: %v", err)
	}
	// After the new owner completed, the stale owner still cannot overwrite.
	wantErr(t, "stale Complete after done", complete(s, "u", "k", stale, idempotency.Response{Status: 500}), idempotency.ErrLeaseLost)
	sameResponse(t, mustGet(t, s, "u", "k").Response, resp)
}

func testExtend(t *testing.T, s idempotency.Store, c *Clock) {
	ctx := context.Background()
	at := c.Now()
	tok := mustClaim(t, s, req("u", "k", "fp"))
	c.Advance(time.Second)
	if err := s.Extend(ctx, "u", "k", tok, 3*lease); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	// Past the first lease but inside the extended one: still in flight, no takeover.
	c.Advance(2 * lease)
	rec := mustNotClaim(t, s, req("u", "k", "fp"))
	sameTime(t, "LeaseUntil", rec.LeaseUntil, at.Add(time.Second+3*lease))
	sameTime(t, "ExpiresAt", rec.ExpiresAt, at.Add(ttl)) // already later than the lease
	if err := complete(s, "u", "k", tok, sampleResponse()); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "Extend of a done record", s.Extend(ctx, "u", "k", tok, time.Hour), idempotency.ErrLeaseLost)
	wantGone(t, "Extend of a missing record", s.Extend(ctx, "u", "nope", tok, lease))
}

// testExtendOutlivesTTL: a record whose owner keeps renewing never expires, however
// short its TTL, so no claim can run the request a second time beside its owner.
func testExtendOutlivesTTL(t *testing.T, s idempotency.Store, c *Clock) {
	ctx := context.Background()
	r := req("u", "k", "fp")
	r.Lease, r.TTL = 2*time.Second, 3*time.Second
	tok := mustClaim(t, s, r)
	for range 10 { // 10 s of renewals, every second: three times the TTL
		c.Advance(time.Second)
		if err := s.Extend(ctx, "u", "k", tok, r.Lease); err != nil {
			t.Fatalf("Extend at %s: %v", c.Now(), err)
		}
		for _, fp := range []string{"fp", "other"} {
			mustNotClaim(t, s, idempotency.ClaimRequest{Scope: "u", Key: "k", Fingerprint: fp, Lease: r.Lease, TTL: r.TTL})
		}
		if j, ok := s.(idempotency.Janitor); ok {
			if _, err := j.DeleteExpired(ctx, 100); err != nil {
				t.Fatal(err)
			}
		}
		if rec := mustGet(t, s, "u", "k"); rec.Token != tok || rec.State != idempotency.StateInProgress {
			t.Fatalf("record = %+v, want in progress with token %d", rec, tok)
		}
	}
	if rec := mustGet(t, s, "u", "k"); rec.ExpiresAt.Before(rec.LeaseUntil) {
		t.Errorf("ExpiresAt %v before LeaseUntil %v", rec.ExpiresAt, rec.LeaseUntil)
	}
	if err := complete(s, "u", "k", tok, sampleResponse()); err != nil {
		t.Fatalf("Complete after outliving the TTL: %v", err)
	}
}

func testAbandon(t *testing.T, s idempotency.Store, c *Clock) {
	ctx := context.Background()
	at := c.Now()
	tok := mustClaim(t, s, req("u", "k", "fp"))
	if err := s.Abandon(ctx, "u", "k", tok); err != nil {
		t.Fatalf("Abandon: %v", err)
	}
	// Still in progress, marked, and the lease is unchanged: a retry waits for it.
	c.Advance(lease / 2)
	rec := mustNotClaim(t, s, req("u", "k", "fp"))
	if rec.State != idempotency.StateInProgress || !rec.Abandoned || rec.Token != tok {
		t.Errorf("existing = %+v, want in progress, abandoned, token %d", rec, tok)
	}
	sameTime(t, "LeaseUntil", rec.LeaseUntil, at.Add(lease))
	if !mustGet(t, s, "u", "k").Abandoned {
		t.Error("Get does not report Abandoned")
	}
	// After the lease a retry takes it over; the new claim is not abandoned.
	c.Advance(lease / 2)
	res, err := s.Claim(ctx, req("u", "k", "fp"))
	if err != nil || !res.Claimed || !res.TookOver {
		t.Fatalf("claim after the abandoned lease = %+v, %v; want a takeover", res, err)
	}
	if rec := mustGet(t, s, "u", "k"); rec.Abandoned {
		t.Errorf("takeover kept Abandoned: %+v", rec)
	}
	wantErr(t, "Abandon by the old owner", s.Abandon(ctx, "u", "k", tok), idempotency.ErrLeaseLost)
	if err := complete(s, "u", "k", res.Token, sampleResponse()); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "Abandon of a done record", s.Abandon(ctx, "u", "k", res.Token), idempotency.ErrLeaseLost)
	wantGone(t, "Abandon of a missing record", s.Abandon(ctx, "u", "nope", res.Token))
}

func testRelease(t *testing.T, s idempotency.Store, _ *Clock) {
	ctx := context.Background()
	tok := mustClaim(t, s, req("u", "k", "fp"))
	if err := s.Release(ctx, "u", "k", tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := s.Get(ctx, "u", "k"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get after Release: err = %v, want ErrNotFound", err)
	}
	wantErr(t, "second Release", s.Release(ctx, "u", "k", tok), idempotency.ErrLeaseLost)
	// A retry executes again, with any payload, under a new token.
	tok2 := mustClaim(t, s, req("u", "k", "fp-2"))
	if tok2 == tok {
		t.Errorf("claim after release reused token %d", tok)
	}
	wantErr(t, "old owner Complete after release", complete(s, "u", "k", tok, sampleResponse()), idempotency.ErrLeaseLost)
	if err := complete(s, "u", "k", tok2, sampleResponse()); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "Release of a done record", s.Release(ctx, "u", "k", tok2), idempotency.ErrLeaseLost)
	if rec := mustGet(t, s, "u", "k"); rec.State != idempotency.StateDone {
		t.Errorf("Release deleted a done record: %+v", rec)
	}
}

// testCompleteTwice: a completion sent again by its owner (its first answer lost, or not
// acknowledged as durable) succeeds — its write confirms the first — and leaves the
// stored response and expiry as they were; another token's completion does not.
func testCompleteTwice(t *testing.T, s idempotency.Store, c *Clock) {
	tok := mustClaim(t, s, req("u", "k", "fp"))
	first := sampleResponse()
	if err := complete(s, "u", "k", tok, first); err != nil {
		t.Fatal(err)
	}
	expires := mustGet(t, s, "u", "k").ExpiresAt
	c.Advance(time.Minute)
	if err := complete(s, "u", "k", tok, first); err != nil {
		t.Errorf("the same completion again: %v, want nil", err)
	}
	if err := complete(s, "u", "k", tok, idempotency.Response{Status: 500, Body: []byte("x")}); err != nil {
		t.Errorf("a completion under the same token again: %v, want nil", err)
	}
	rec := mustGet(t, s, "u", "k")
	sameResponse(t, rec.Response, first)
	sameTime(t, "ExpiresAt after the completion sent again", rec.ExpiresAt, expires)
	if rec.State != idempotency.StateDone || rec.Token != tok {
		t.Errorf("record = %+v, want done under token %d", rec, tok)
	}
	wantErr(t, "Complete under another token", complete(s, "u", "k", tok+1, first), idempotency.ErrLeaseLost)
	wantGone(t, "Complete of a missing record", complete(s, "u", "missing", tok, first))
	// A done record is no longer the owner's to renew, abandon or release.
	ctx := context.Background()
	wantErr(t, "Extend of the done record", s.Extend(ctx, "u", "k", tok, lease), idempotency.ErrLeaseLost)
	wantErr(t, "Release of the done record", s.Release(ctx, "u", "k", tok), idempotency.ErrLeaseLost)
	sameResponse(t, mustGet(t, s, "u", "k").Response, first)
}

// testRecordGone: an owner whose record vanished (deleted, evicted) is told so, apart
// from one whose key another request holds.
func testRecordGone(t *testing.T, s idempotency.Store, c *Clock) {
	ctx := context.Background()
	tok := mustClaim(t, s, req("u", "k", "fp"))
	if err := s.Delete(ctx, "u", "k"); err != nil {
		t.Fatal(err)
	}
	wantGone(t, "Extend", s.Extend(ctx, "u", "k", tok, lease))
	wantGone(t, "Abandon", s.Abandon(ctx, "u", "k", tok))
	wantGone(t, "Complete", complete(s, "u", "k", tok, sampleResponse()))
	wantGone(t, "Release", s.Release(ctx, "u", "k", tok))
	// Held by another claim: lease lost, not gone.
	other := mustClaim(t, s, req("u", "k", "fp"))
	for _, e := range []struct {
		what string
		err  error
	}{
		{"Extend", s.Extend(ctx, "u", "k", tok, lease)},
		{"Abandon", s.Abandon(ctx, "u", "k", tok)},
		{"Complete", complete(s, "u", "k", tok, sampleResponse())},
		{"Release", s.Release(ctx, "u", "k", tok)},
	} {
		if !errors.Is(e.err, idempotency.ErrLeaseLost) || errors.Is(e.err, idempotency.ErrRecordGone) {
			t.Errorf("%s of a key another claim holds: err = %v, want ErrLeaseLost and not ErrRecordGone", e.what, e.err)
		}
	}
	if rec := mustGet(t, s, "u", "k"); rec.Token != other || rec.State != idempotency.StateInProgress {
		t.Errorf("record = %+v, want in progress under %d", rec, other)
	}
}

// testClaimID: a claim sent again with its ID — its first attempt's answer lost — is
// granted its own in-progress record, whatever its lease, and nothing else is.
func testClaimID(t *testing.T, s idempotency.Store, c *Clock) {
	ctx := context.Background()
	r := req("u", "k", "fp")
	r.ID = "claim-1"
	tok := mustClaim(t, s, r)
	again := r
	again.NoTakeover = true
	res, err := s.Claim(ctx, again)
	if err != nil || !res.Claimed || res.Token != tok || res.TookOver || res.Existing != nil {
		t.Fatalf("the claim sent again = %+v, %v; want granted with token %d", res, err, tok)
	}
	// Another ID, or none, is another request in flight.
	other := r
	other.ID = "claim-2"
	if rec := mustNotClaim(t, s, other); rec.Token != tok {
		t.Errorf("another claim found %+v", rec)
	}
	mustNotClaim(t, s, req("u", "k", "fp"))
	// Its own, even past its lease (TakeoverBy and NoTakeover do not apply to it).
	c.Advance(lease + time.Second)
	again.TakeoverBy = c.Now().Add(-time.Hour)
	if res, err := s.Claim(ctx, again); err != nil || !res.Claimed || res.Token != tok {
		t.Errorf("the claim sent again past its lease = %+v, %v; want granted with token %d", res, err, tok)
	}
	// Taken over by another claim: no longer its own.
	taken := mustClaim(t, s, other)
	if rec := mustNotClaim(t, s, again); rec.Token != taken {
		t.Errorf("after the takeover the first claim found %+v", rec)
	}
	// Done: a replay, never a claim.
	if err := complete(s, "u", "k", taken, sampleResponse()); err != nil {
		t.Fatal(err)
	}
	if rec := mustNotClaim(t, s, other); rec.State != idempotency.StateDone || rec.Response == nil {
		t.Errorf("the claim of the completed key found %+v, want the replay", rec)
	}
	// Released: the ID claims afresh, under a new token.
	k2 := req("u", "k2", "fp")
	k2.ID = "claim-3"
	tok2 := mustClaim(t, s, k2)
	if err := s.Release(ctx, "u", "k2", tok2); err != nil {
		t.Fatal(err)
	}
	if tok3 := mustClaim(t, s, k2); tok3 == tok2 {
		t.Errorf("the claim after the release reused token %d", tok2)
	}
}

func wantGone(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, idempotency.ErrRecordGone) || !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("%s: err = %v, want ErrRecordGone (and ErrLeaseLost)", what, err)
	}
}

func testDelete(t *testing.T, s idempotency.Store, _ *Clock) {
	ctx := context.Background()
	tok := mustClaim(t, s, req("u", "k", "fp"))
	if err := s.Delete(ctx, "u", "k"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := s.Delete(ctx, "u", "k"); err != nil {
		t.Errorf("Delete of a missing record: %v", err)
	}
	if _, err := s.Get(ctx, "u", "k"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get after Delete: err = %v, want ErrNotFound", err)
	}
	wantGone(t, "owner Complete after Delete", complete(s, "u", "k", tok, sampleResponse()))
	tok2 := mustClaim(t, s, req("u", "k", "fp"))
	if tok2 == tok {
		t.Fatalf("claim after Delete reused token %d", tok)
	}
	wantErr(t, "old owner Complete on the new record", complete(s, "u", "k", tok, sampleResponse()), idempotency.ErrLeaseLost)
	if rec := mustGet(t, s, "u", "k"); rec.Token != tok2 || rec.State != idempotency.StateInProgress {
		t.Errorf("record = %+v", rec)
	}
	// A done record can be deleted too.
	if err := complete(s, "u", "k", tok2, sampleResponse()); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "u", "k"); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, req("u", "k", "fp"))
}

func testGetMissing(t *testing.T, s idempotency.Store, _ *Clock) {
	if _, err := s.Get(context.Background(), "u", "nothing"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get of a missing key: err = %v, want ErrNotFound", err)
	}
}

func testCanceled(t *testing.T, s idempotency.Store, _ *Clock) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if res, err := s.Claim(ctx, req("u", "k", "fp")); err == nil {
		t.Errorf("Claim with a canceled context succeeded: %+v", res)
	}
	// Nothing was claimed by the failed call.
	mustClaim(t, s, req("u", "k", "fp"))
}

func race(t *testing.T, s idempotency.Store, n int, r idempotency.ClaimRequest) (winners []int64, tookOver int) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		errs  []error
		start = make(chan struct{})
	)
	for range n {
		wg.Go(func() {
			<-start
			res, err := s.Claim(context.Background(), r)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, err)
			case res.Claimed:
				winners = append(winners, res.Token)
				if res.TookOver {
					tookOver++
				}
			case res.Existing == nil:
				errs = append(errs, errors.New("lost claim without an existing record"))
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Errorf("%d of %d concurrent claims failed; first: %v", len(errs), n, errs[0])
	}
	return winners, tookOver
}

func testRace(t *testing.T, s idempotency.Store, _ *Clock) {
	winners, _ := race(t, s, 100, req("u", "k", "fp"))
	if len(winners) != 1 {
		t.Fatalf("%d of 100 concurrent claims won (tokens %v), want exactly 1", len(winners), winners)
	}
	if rec := mustGet(t, s, "u", "k"); rec.Token != winners[0] {
		t.Errorf("record token %d, winner's token %d", rec.Token, winners[0])
	}
}

func testRaceTakeover(t *testing.T, s idempotency.Store, c *Clock) {
	old := mustClaim(t, s, req("u", "k", "fp"))
	c.Advance(lease + time.Second)
	winners, tookOver := race(t, s, 50, req("u", "k", "fp"))
	if len(winners) != 1 || tookOver != 1 {
		t.Fatalf("%d of 50 concurrent takeovers won (%d took over), want exactly 1", len(winners), tookOver)
	}
	if winners[0] <= old {
		t.Errorf("takeover token %d <= old %d", winners[0], old)
	}
}

func testJanitor(t *testing.T, s idempotency.Store, c *Clock) {
	j, ok := s.(idempotency.Janitor)
	if !ok {
		t.Skip("store expires records itself (not a Janitor)")
	}
	ctx := context.Background()
	for i := range 25 {
		r := req("u", fmt.Sprintf("old-%d", i), "fp")
		r.TTL = time.Minute
		tok := mustClaim(t, s, r)
		if i%2 == 0 { // done and in-progress records alike
			if err := s.Complete(ctx, idempotency.Completion{Scope: "u", Key: r.Key, Token: tok, Response: sampleResponse(), TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 5 {
		mustClaim(t, s, req("u", fmt.Sprintf("young-%d", i), "fp"))
	}
	c.Advance(2 * time.Minute)
	var got []int
	for range 5 {
		n, err := j.DeleteExpired(ctx, 10)
		if err != nil {
			t.Fatalf("DeleteExpired: %v", err)
		}
		got = append(got, n)
	}
	if !slices.Equal(got, []int{10, 10, 5, 0, 0}) {
		t.Errorf("DeleteExpired batches = %v, want [10 10 5 0 0]", got)
	}
	for i := range 5 {
		mustGet(t, s, "u", fmt.Sprintf("young-%d", i))
	}
	if _, err := s.Get(ctx, "u", "old-3"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("expired record still there: %v", err)
	}
	if n, err := j.DeleteExpired(ctx, 0); n != 0 || err != nil {
		t.Errorf("DeleteExpired(0) = %d, %v; want 0, nil", n, err)
	}
}

func testList(t *testing.T, s idempotency.Store, _ *Clock) {
	l, ok := s.(idempotency.Lister)
	if !ok {
		t.Skip("store is not a Lister")
	}
	ctx := context.Background()
	want := map[string]bool{}
	for i := range 5 {
		key := fmt.Sprintf("k%d", i)
		tok := mustClaim(t, s, req("scope-a", key, "fp"))
		if i < 2 {
			if err := complete(s, "scope-a", key, tok, sampleResponse()); err != nil {
				t.Fatal(err)
			}
		}
		want["scope-a/"+key] = true
	}
	for i := range 3 {
		key := fmt.Sprintf("k%d", i)
		mustClaim(t, s, req("scope-b", key, "fp"))
		want["scope-b/"+key] = true
	}
	list := func(f idempotency.ListFilter) map[string]idempotency.Record {
		t.Helper()
		got := map[string]idempotency.Record{}
		for pages := 0; ; pages++ {
			if pages > 20 {
				t.Fatal("List does not terminate")
			}
			page, err := l.List(ctx, f)
			if err != nil {
				t.Fatalf("List(%+v): %v", f, err)
			}
			if f.Limit > 0 && len(page.Records) > f.Limit {
				t.Errorf("page of %d records, limit %d", len(page.Records), f.Limit)
			}
			for _, r := range page.Records {
				id := r.Scope + "/" + r.Key
				if _, dup := got[id]; dup {
					t.Errorf("List returned %s twice", id)
				}
				got[id] = r
			}
			if page.Next == "" {
				return got
			}
			f.After = page.Next
		}
	}
	all := list(idempotency.ListFilter{Limit: 3})
	if len(all) != len(want) {
		t.Errorf("List returned %d records, want %d", len(all), len(want))
	}
	for id := range want {
		if _, ok := all[id]; !ok {
			t.Errorf("List missed %s", id)
		}
	}
	if got := list(idempotency.ListFilter{Scope: "scope-a"}); len(got) != 5 {
		t.Errorf("List(scope-a) = %d records, want 5", len(got))
	}
	done := list(idempotency.ListFilter{State: idempotency.StateDone})
	if len(done) != 2 {
		t.Errorf("List(done) = %d records, want 2", len(done))
	}
	for _, r := range done {
		sameResponse(t, r.Response, sampleResponse())
	}
	if got := list(idempotency.ListFilter{Scope: "scope-b", State: idempotency.StateInProgress}); len(got) != 3 {
		t.Errorf("List(scope-b, in progress) = %d records, want 3", len(got))
	}
}

// testRoute: the route a record was claimed under comes back from Get and List, through
// its completion, and a takeover files it under the route of the claim that took it
// over; ListFilter.Route selects by it.
func testRoute(t *testing.T, s idempotency.Store, c *Clock) {
	routed := func(key, route string) idempotency.ClaimRequest {
		r := req("u", key, "fp")
		r.Route = route
		return r
	}
	const payments, refunds = "POST /payments", "POST /refunds/{id}"
	tok := mustClaim(t, s, routed("pay", payments))
	mustClaim(t, s, routed("refund", refunds))
	mustClaim(t, s, routed("none", ""))
	if got := mustGet(t, s, "u", "pay").Route; got != payments {
		t.Errorf("Get: Route = %q, want %q", got, payments)
	}
	if err := complete(s, "u", "pay", tok, sampleResponse()); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"pay": payments, "refund": refunds, "none": ""} {
		if got := mustGet(t, s, "u", key).Route; got != want {
			t.Errorf("Get(%s): Route = %q, want %q", key, got, want)
		}
	}
	if l, ok := s.(idempotency.Lister); ok {
		list := func(f idempotency.ListFilter) map[string]string {
			t.Helper()
			got := map[string]string{}
			for range 20 {
				page, err := l.List(context.Background(), f)
				if err != nil {
					t.Fatalf("List(%+v): %v", f, err)
				}
				for _, r := range page.Records {
					got[r.Key] = r.Route
				}
				if page.Next == "" {
					return got
				}
				f.After = page.Next
			}
			t.Fatal("List does not terminate")
			return nil
		}
		if got, want := list(idempotency.ListFilter{}), map[string]string{"pay": payments, "refund": refunds, "none": ""}; !maps.Equal(got, want) {
			t.Errorf("List: key → route %v, want %v", got, want)
		}
		if got, want := list(idempotency.ListFilter{Route: payments}), map[string]string{"pay": payments}; !maps.Equal(got, want) {
			t.Errorf("List(Route %q): %v, want %v", payments, got, want)
		}
		if got, want := list(idempotency.ListFilter{Route: refunds, State: idempotency.StateInProgress, Limit: 1}), map[string]string{"refund": refunds}; !maps.Equal(got, want) {
			t.Errorf("List(Route %q, in progress): %v, want %v", refunds, got, want)
		}
		if got := list(idempotency.ListFilter{Route: payments, State: idempotency.StateInProgress}); len(got) != 0 {
			t.Errorf("List(Route %q, in progress): %v, want none", payments, got)
		}
		if got := list(idempotency.ListFilter{Route: "POST /payments/"}); len(got) != 0 {
			t.Errorf("List(Route %q) matched %v: the route is an exact match", "POST /payments/", got)
		}
	}
	c.Advance(lease)
	res, err := s.Claim(context.Background(), routed("refund", payments))
	if err != nil || !res.TookOver {
		t.Fatalf("takeover = %+v, %v", res, err)
	}
	if got := mustGet(t, s, "u", "refund").Route; got != payments {
		t.Errorf("after a takeover under %q: Route = %q", payments, got)
	}
}

func testDown(t *testing.T, s idempotency.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s on a down store: no error", what)
		}
		if errors.Is(err, idempotency.ErrNotFound) || errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("%s on a down store: %v, which claims to know the record's state", what, err)
		}
	}
	res, err := s.Claim(ctx, req("u", "k", "fp"))
	check("Claim", err)
	if res.Claimed {
		t.Error("Claim on a down store reports Claimed")
	}
	check("Complete", complete(s, "u", "k", 1, sampleResponse()))
	check("Extend", s.Extend(ctx, "u", "k", 1, lease))
	check("Abandon", s.Abandon(ctx, "u", "k", 1))
	check("Release", s.Release(ctx, "u", "k", 1))
	_, err = s.Get(ctx, "u", "k")
	check("Get", err)
	check("Delete", s.Delete(ctx, "u", "k"))
	if p, ok := s.(idempotency.Pinger); ok {
		check("Ping", p.Ping(ctx))
	}
	testMiddlewareDown(t, s)
}
