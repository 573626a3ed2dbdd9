// Package idempotencytest is the conformance suite every idempotency.Store runs.
//
// It is the only place store behaviour is specified by tests: a store's own test file
// calls Run with a Harness and adds only what is specific to its backend (migrations,
// round trips, durability). The suite drives stores with an explicit clock (the Now
// fields of the requests), so expiry and lease cases run instantly.
package idempotencytest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	// own schema, file or key prefix). Register cleanup with t.Cleanup.
	New func(t *testing.T) idempotency.Store
	// Down returns a store whose backend is unreachable or closed, so every call fails.
	// Nil skips the outage cases.
	Down func(t *testing.T) idempotency.Store
}

const (
	lease = 30 * time.Second
	ttl   = 24 * time.Hour
)

// Run runs the conformance suite against the stores h makes.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("idempotencytest: Harness.New is nil")
	}
	cases := []struct {
		name string
		fn   func(t *testing.T, s idempotency.Store)
	}{
		{"FirstClaim", testFirstClaim},
		{"Replay", testReplay},
		{"ReplayBodyOmitted", testReplayBodyOmitted},
		{"ReplayLargeBinaryBody", testLargeBody},
		{"InFlight", testInFlight},
		{"FingerprintMismatch", testMismatch},
		{"ScopeIsolation", testScopeIsolation},
		{"UnusualScopesAndKeys", testUnusualNames},
		{"Expiry", testExpiry},
		{"LeaseExpiryTakeover", testTakeover},
		{"StaleOwnerRejected", testStaleOwner},
		{"Extend", testExtend},
		{"Release", testRelease},
		{"CompleteTwice", testCompleteTwice},
		{"Delete", testDelete},
		{"GetMissing", testGetMissing},
		{"CanceledContext", testCanceled},
		{"RaceOneKey", testRace},
		{"RaceTakeover", testRaceTakeover},
		{"Janitor", testJanitor},
		{"List", testList},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, h.New(t))
		})
	}
	t.Run("StoreDown", func(t *testing.T) {
		if h.Down == nil {
			t.Skip("harness has no Down store")
		}
		t.Parallel()
		testDown(t, h.Down(t))
	})
}

// now is a base time with millisecond precision (what every store keeps).
func now() time.Time { return time.Now().Truncate(time.Millisecond) }

func req(scope, key, fp string, at time.Time) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Scope: scope, Key: key, Fingerprint: fp, Now: at,
		LeaseUntil: at.Add(lease), ExpiresAt: at.Add(ttl)}
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

func complete(s idempotency.Store, scope, key string, token int64, at time.Time, resp idempotency.Response) error {
	return s.Complete(context.Background(), idempotency.Completion{Scope: scope, Key: key, Token: token,
		Response: resp, Now: at, ExpiresAt: at.Add(ttl)})
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
	for k, v := range want.Header {
		if !slices.Equal(got.Header[k], v) {
			t.Errorf("header %s = %q, want %q", k, got.Header[k], v)
		}
	}
	if len(got.Header) != len(want.Header) {
		t.Errorf("header = %v, want %v", got.Header, want.Header)
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

func testFirstClaim(t *testing.T, s idempotency.Store) {
	at := now()
	r := req("user-1", "key-1", "fp-1", at)
	tok := mustClaim(t, s, r)
	if tok <= 0 {
		t.Errorf("token = %d, want > 0", tok)
	}
	rec := mustGet(t, s, "user-1", "key-1")
	if rec.State != idempotency.StateInProgress || rec.Token != tok || rec.Fingerprint != "fp-1" ||
		rec.Scope != "user-1" || rec.Key != "key-1" || rec.Response != nil {
		t.Errorf("record = %+v", rec)
	}
	sameTime(t, "LeaseUntil", rec.LeaseUntil, r.LeaseUntil)
	sameTime(t, "ExpiresAt", rec.ExpiresAt, r.ExpiresAt)
	sameTime(t, "CreatedAt", rec.CreatedAt, at)
}

func testReplay(t *testing.T, s idempotency.Store) {
	at := now()
	tok := mustClaim(t, s, req("u", "k", "fp", at))
	want := sampleResponse()
	if err := complete(s, "u", "k", tok, at.Add(time.Second), want); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	for i := range 2 { // replay is repeatable and changes nothing
		rec := mustNotClaim(t, s, req("u", "k", "fp", at.Add(time.Duration(i+2)*time.Second)))
		if rec.State != idempotency.StateDone || rec.Token != tok || rec.Fingerprint != "fp" {
			t.Errorf("replayed record = %+v", rec)
		}
		sameResponse(t, rec.Response, want)
		sameTime(t, "ExpiresAt", rec.ExpiresAt, at.Add(time.Second).Add(ttl))
	}
	sameResponse(t, mustGet(t, s, "u", "k").Response, want)
}

func testReplayBodyOmitted(t *testing.T, s idempotency.Store) {
	at := now()
	tok := mustClaim(t, s, req("u", "k", "fp", at))
	want := idempotency.Response{Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, BodyOmitted: true}
	if err := complete(s, "u", "k", tok, at, want); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec := mustNotClaim(t, s, req("u", "k", "fp", at))
	sameResponse(t, rec.Response, want)
}

func testLargeBody(t *testing.T, s idempotency.Store) {
	at := now()
	tok := mustClaim(t, s, req("u", "k", "fp", at))
	body := make([]byte, 2<<20)
	for i := range body {
		body[i] = byte(i*7 + i>>11) // every byte value, NULs included
	}
	want := idempotency.Response{Status: 500, Header: http.Header{}, Body: body}
	if err := complete(s, "u", "k", tok, at, want); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	sameResponse(t, mustNotClaim(t, s, req("u", "k", "fp", at)).Response, want)
}

func testInFlight(t *testing.T, s idempotency.Store) {
	at := now()
	tok := mustClaim(t, s, req("u", "k", "fp", at))
	rec := mustNotClaim(t, s, req("u", "k", "fp", at.Add(lease-time.Millisecond)))
	if rec.State != idempotency.StateInProgress || rec.Token != tok {
		t.Errorf("existing = %+v, want in progress with token %d", rec, tok)
	}
	sameTime(t, "LeaseUntil", rec.LeaseUntil, at.Add(lease))
}

func testMismatch(t *testing.T, s idempotency.Store) {
	at := now()
	tok := mustClaim(t, s, req("u", "k", "fp-a", at))
	// In progress, with the lease running and after it ran out: never a takeover by
	// another payload.
	for _, when := range []time.Time{at, at.Add(lease + time.Second)} {
		rec := mustNotClaim(t, s, req("u", "k", "fp-b", when))
		if rec.Fingerprint != "fp-a" || rec.Token != tok {
			t.Errorf("existing = %+v, want fingerprint fp-a token %d", rec, tok)
		}
	}
	if err := complete(s, "u", "k", tok, at, sampleResponse()); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec := mustNotClaim(t, s, req("u", "k", "fp-b", at))
	if rec.Fingerprint != "fp-a" || rec.State != idempotency.StateDone {
		t.Errorf("existing = %+v", rec)
	}
}

func testScopeIsolation(t *testing.T, s idempotency.Store) {
	at := now()
	ta := mustClaim(t, s, req("alice", "k", "fp", at))
	tb := mustClaim(t, s, req("bob", "k", "fp", at))
	if ta == tb {
		t.Errorf("two scopes share token %d", ta)
	}
	want := sampleResponse()
	if err := complete(s, "alice", "k", ta, at, want); err != nil {
		t.Fatal(err)
	}
	// Bob's record is untouched by Alice's completion, and Alice's token is useless on it.
	if rec := mustGet(t, s, "bob", "k"); rec.State != idempotency.StateInProgress || rec.Response != nil {
		t.Errorf("bob's record = %+v", rec)
	}
	wantErr(t, "Complete with alice's token on bob's key", complete(s, "bob", "k", ta, at, want), idempotency.ErrLeaseLost)
	wantErr(t, "Release with alice's token on bob's key", s.Release(context.Background(), "bob", "k", ta), idempotency.ErrLeaseLost)
	if _, err := s.Get(context.Background(), "carol", "k"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get(carol) err = %v, want ErrNotFound", err)
	}
	// Empty scope is a scope like any other.
	mustClaim(t, s, req("", "k", "fp", at))
}

func testUnusualNames(t *testing.T, s idempotency.Store) {
	at := now()
	visible := make([]byte, 0, 94)
	for c := byte(0x21); c <= 0x7e; c++ {
		visible = append(visible, c)
	}
	keys := []string{string(visible), strings.Repeat("k", 255), "a:b", "a", "{x}", `"quoted"`, "*", "%_"}
	scopes := []string{"", "a", "a:b", "{x}", "tenant/ü", "nul\x00byte", "*", "%_"}
	tokens := map[int64]bool{}
	for _, sc := range scopes {
		for _, k := range keys {
			tok := mustClaim(t, s, req(sc, k, "fp", at))
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

func testExpiry(t *testing.T, s idempotency.Store) {
	at := now()
	tok := mustClaim(t, s, req("u", "k", "fp", at))
	if err := complete(s, "u", "k", tok, at, sampleResponse()); err != nil {
		t.Fatal(err)
	}
	// Just before expiry it replays; at expiry it is gone, for any payload.
	mustNotClaim(t, s, req("u", "k", "fp", at.Add(ttl-time.Millisecond)))
	res, err := s.Claim(context.Background(), req("u", "k", "other-fp", at.Add(ttl)))
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
	wantErr(t, "old owner Complete", complete(s, "u", "k", tok, at, sampleResponse()), idempotency.ErrLeaseLost)

	// An in-progress record past retention is replaced too.
	tok2 := mustClaim(t, s, req("u", "k2", "fp", at))
	res, err = s.Claim(context.Background(), req("u", "k2", "fp", at.Add(ttl+time.Hour)))
	if err != nil || !res.Claimed || res.Token == tok2 {
		t.Errorf("claim of expired in-progress record = %+v, %v", res, err)
	}
}

func testTakeover(t *testing.T, s idempotency.Store) {
	at := now()
	old := mustClaim(t, s, req("u", "k", "fp", at))
	mustNotClaim(t, s, req("u", "k", "fp", at.Add(lease-time.Millisecond)))
	later := at.Add(lease)
	res, err := s.Claim(context.Background(), req("u", "k", "fp", later))
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
	res2, err := s.Claim(context.Background(), req("u", "k", "fp", later.Add(lease)))
	if err != nil || !res2.Claimed || !res2.TookOver || res2.Token <= res.Token {
		t.Errorf("second takeover = %+v, %v; want token > %d", res2, err, res.Token)
	}
}

func testStaleOwner(t *testing.T, s idempotency.Store) {
	ctx := context.Background()
	at := now()
	stale := mustClaim(t, s, req("u", "k", "fp", at))
	fresh := mustClaim(t, s, req("u", "k", "fp", at.Add(lease+time.Second)))
	resp := sampleResponse()
	wantErr(t, "stale Complete", complete(s, "u", "k", stale, at, resp), idempotency.ErrLeaseLost)
	wantErr(t, "stale Extend", s.Extend(ctx, "u", "k", stale, at.Add(time.Hour)), idempotency.ErrLeaseLost)
	wantErr(t, "stale Release", s.Release(ctx, "u", "k", stale), idempotency.ErrLeaseLost)
	rec := mustGet(t, s, "u", "k")
	if rec.Token != fresh || rec.State != idempotency.StateInProgress {
		t.Fatalf("stale owner changed the record: %+v", rec)
	}
	if err := complete(s, "u", "k", fresh, at, resp); err != nil {
		t.Fatalf("new owner Complete: %v", err)
	}
	// After the new owner completed, the stale owner still cannot overwrite.
	wantErr(t, "stale Complete after done", complete(s, "u", "k", stale, at, idempotency.Response{Status: 500}), idempotency.ErrLeaseLost)
	sameResponse(t, mustGet(t, s, "u", "k").Response, resp)
}

func testExtend(t *testing.T, s idempotency.Store) {
	ctx := context.Background()
	at := now()
	tok := mustClaim(t, s, req("u", "k", "fp", at))
	if err := s.Extend(ctx, "u", "k", tok, at.Add(3*lease)); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	// Past the first lease but inside the extended one: still in flight, no takeover.
	rec := mustNotClaim(t, s, req("u", "k", "fp", at.Add(2*lease)))
	sameTime(t, "LeaseUntil", rec.LeaseUntil, at.Add(3*lease))
	if err := complete(s, "u", "k", tok, at, sampleResponse()); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "Extend of a done record", s.Extend(ctx, "u", "k", tok, at.Add(time.Hour)), idempotency.ErrLeaseLost)
	wantErr(t, "Extend of a missing record", s.Extend(ctx, "u", "nope", tok, at), idempotency.ErrLeaseLost)
}

func testRelease(t *testing.T, s idempotency.Store) {
	ctx := context.Background()
	at := now()
	tok := mustClaim(t, s, req("u", "k", "fp", at))
	if err := s.Release(ctx, "u", "k", tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := s.Get(ctx, "u", "k"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get after Release: err = %v, want ErrNotFound", err)
	}
	wantErr(t, "second Release", s.Release(ctx, "u", "k", tok), idempotency.ErrLeaseLost)
	// A retry executes again, with any payload, under a new token.
	tok2 := mustClaim(t, s, req("u", "k", "fp-2", at))
	if tok2 == tok {
		t.Errorf("claim after release reused token %d", tok)
	}
	wantErr(t, "old owner Complete after release", complete(s, "u", "k", tok, at, sampleResponse()), idempotency.ErrLeaseLost)
	if err := complete(s, "u", "k", tok2, at, sampleResponse()); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "Release of a done record", s.Release(ctx, "u", "k", tok2), idempotency.ErrLeaseLost)
	if rec := mustGet(t, s, "u", "k"); rec.State != idempotency.StateDone {
		t.Errorf("Release deleted a done record: %+v", rec)
	}
}

func testCompleteTwice(t *testing.T, s idempotency.Store) {
	at := now()
	tok := mustClaim(t, s, req("u", "k", "fp", at))
	first := sampleResponse()
	if err := complete(s, "u", "k", tok, at, first); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "second Complete", complete(s, "u", "k", tok, at, idempotency.Response{Status: 500, Body: []byte("x")}), idempotency.ErrLeaseLost)
	sameResponse(t, mustGet(t, s, "u", "k").Response, first)
	wantErr(t, "Complete of a missing record", complete(s, "u", "missing", tok, at, first), idempotency.ErrLeaseLost)
}

func testDelete(t *testing.T, s idempotency.Store) {
	ctx := context.Background()
	at := now()
	tok := mustClaim(t, s, req("u", "k", "fp", at))
	if err := s.Delete(ctx, "u", "k"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := s.Delete(ctx, "u", "k"); err != nil {
		t.Errorf("Delete of a missing record: %v", err)
	}
	if _, err := s.Get(ctx, "u", "k"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get after Delete: err = %v, want ErrNotFound", err)
	}
	wantErr(t, "owner Complete after Delete", complete(s, "u", "k", tok, at, sampleResponse()), idempotency.ErrLeaseLost)
	tok2 := mustClaim(t, s, req("u", "k", "fp", at))
	if tok2 == tok {
		t.Fatalf("claim after Delete reused token %d", tok)
	}
	wantErr(t, "old owner Complete on the new record", complete(s, "u", "k", tok, at, sampleResponse()), idempotency.ErrLeaseLost)
	if rec := mustGet(t, s, "u", "k"); rec.Token != tok2 || rec.State != idempotency.StateInProgress {
		t.Errorf("record = %+v", rec)
	}
	// A done record can be deleted too.
	if err := complete(s, "u", "k", tok2, at, sampleResponse()); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "u", "k"); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, req("u", "k", "fp", at))
}

func testGetMissing(t *testing.T, s idempotency.Store) {
	if _, err := s.Get(context.Background(), "u", "nothing"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get of a missing key: err = %v, want ErrNotFound", err)
	}
}

func testCanceled(t *testing.T, s idempotency.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if res, err := s.Claim(ctx, req("u", "k", "fp", now())); err == nil {
		t.Errorf("Claim with a canceled context succeeded: %+v", res)
	}
	// Nothing was claimed by the failed call.
	mustClaim(t, s, req("u", "k", "fp", now()))
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

func testRace(t *testing.T, s idempotency.Store) {
	at := now()
	winners, _ := race(t, s, 100, req("u", "k", "fp", at))
	if len(winners) != 1 {
		t.Fatalf("%d of 100 concurrent claims won (tokens %v), want exactly 1", len(winners), winners)
	}
	if rec := mustGet(t, s, "u", "k"); rec.Token != winners[0] {
		t.Errorf("record token %d, winner's token %d", rec.Token, winners[0])
	}
}

func testRaceTakeover(t *testing.T, s idempotency.Store) {
	at := now()
	old := mustClaim(t, s, req("u", "k", "fp", at))
	winners, tookOver := race(t, s, 50, req("u", "k", "fp", at.Add(lease+time.Second)))
	if len(winners) != 1 || tookOver != 1 {
		t.Fatalf("%d of 50 concurrent takeovers won (%d took over), want exactly 1", len(winners), tookOver)
	}
	if winners[0] <= old {
		t.Errorf("takeover token %d <= old %d", winners[0], old)
	}
}

func testJanitor(t *testing.T, s idempotency.Store) {
	j, ok := s.(idempotency.Janitor)
	if !ok {
		t.Skip("store expires records itself (not a Janitor)")
	}
	ctx := context.Background()
	at := now()
	for i := range 25 {
		r := req("u", fmt.Sprintf("old-%d", i), "fp", at)
		r.ExpiresAt = at.Add(time.Minute)
		tok := mustClaim(t, s, r)
		if i%2 == 0 { // done and in-progress records alike
			if err := s.Complete(ctx, idempotency.Completion{Scope: "u", Key: r.Key, Token: tok, Response: sampleResponse(), Now: at, ExpiresAt: at.Add(time.Minute)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 5 {
		mustClaim(t, s, req("u", fmt.Sprintf("young-%d", i), "fp", at))
	}
	var got []int
	for range 5 {
		n, err := j.DeleteExpired(ctx, at.Add(2*time.Minute), 10)
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
}

func testList(t *testing.T, s idempotency.Store) {
	l, ok := s.(idempotency.Lister)
	if !ok {
		t.Skip("store is not a Lister")
	}
	ctx := context.Background()
	at := now()
	want := map[string]bool{}
	for i := range 5 {
		key := fmt.Sprintf("k%d", i)
		tok := mustClaim(t, s, req("scope-a", key, "fp", at))
		if i < 2 {
			if err := complete(s, "scope-a", key, tok, at, sampleResponse()); err != nil {
				t.Fatal(err)
			}
		}
		want["scope-a/"+key] = true
	}
	for i := range 3 {
		key := fmt.Sprintf("k%d", i)
		mustClaim(t, s, req("scope-b", key, "fp", at))
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

func testDown(t *testing.T, s idempotency.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	at := now()
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s on a down store: no error", what)
		}
		if errors.Is(err, idempotency.ErrNotFound) || errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("%s on a down store: %v, which claims to know the record's state", what, err)
		}
	}
	res, err := s.Claim(ctx, req("u", "k", "fp", at))
	check("Claim", err)
	if res.Claimed {
		t.Error("Claim on a down store reports Claimed")
	}
	check("Complete", complete(s, "u", "k", 1, at, sampleResponse()))
	check("Extend", s.Extend(ctx, "u", "k", 1, at))
	check("Release", s.Release(ctx, "u", "k", 1))
	_, err = s.Get(ctx, "u", "k")
	check("Get", err)
	check("Delete", s.Delete(ctx, "u", "k"))
	if p, ok := s.(idempotency.Pinger); ok {
		check("Ping", p.Ping(ctx))
	}
	testMiddlewareDown(t, s)
}
