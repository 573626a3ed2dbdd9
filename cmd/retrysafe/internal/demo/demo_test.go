package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/retrysafe/retrysafe/harness/faultproxy"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRunShort runs the demo for 1.5s with a fixed seed and checks exactly-once held
// while every kind of fault was injected.
func TestRunShort(t *testing.T) {
	var out bytes.Buffer
	// Seed 2 makes payments 10, 14, 65, 66, 72 and 90 to reach the upstream slow: each
	// gives its client's retry a 409, unless that retry meets a fault of its own.
	res, err := Run(t.Context(), Config{Duration: 1500 * time.Millisecond, Seed: 2, FaultRate: 0.3, SlowRate: 0.05}, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK() {
		t.Errorf("not OK: %+v", res)
	}
	if res.Succeeded == 0 || res.Succeeded != res.LogicalPayments || res.Failed != 0 || res.Unfinished != 0 {
		t.Errorf("every payment should succeed: %+v", res)
	}
	if res.PaymentsRecorded != res.LogicalPayments {
		t.Errorf("%d payments recorded for %d logical payments", res.PaymentsRecorded, res.LogicalPayments)
	}
	if res.HTTPAttempts <= res.LogicalPayments {
		t.Errorf("%d attempts for %d payments: no retries", res.HTTPAttempts, res.LogicalPayments)
	}
	if res.Replays == 0 {
		t.Error("no replays")
	}
	if res.Conflicts == 0 {
		t.Error("no 409s")
	}
	for _, k := range faultproxy.Kinds() {
		if res.Faults.Count(k) == 0 {
			t.Errorf("no %v fault injected: %+v", k, res.Faults)
		}
	}
	s := out.String()
	for _, want := range []string{"seed 2", "\r", "logical payments", "HTTP attempts", "replays", "409s",
		"faults injected", "response-lost", "payments recorded", "duplicates", "lost", "OK —"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// TestRunUnprotected: the same run without the idempotency layer pays twice, and the
// checker says so.
func TestRunUnprotected(t *testing.T) {
	var out bytes.Buffer
	res, err := Run(t.Context(), Config{Duration: time.Second, Seed: 2, FaultRate: 0.3, Unprotected: true}, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if res.Duplicates == 0 {
		t.Errorf("no duplicates without the idempotency layer: %+v", res)
	}
	if res.OK() {
		t.Error("OK() is true with duplicates")
	}
	if res.Replays != 0 {
		t.Errorf("%d replays without the idempotency layer", res.Replays)
	}
	if !strings.Contains(out.String(), "FAILED") {
		t.Error("the report does not say FAILED")
	}
}

func TestRunInterrupted(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	var out bytes.Buffer
	res, err := Run(ctx, Config{Duration: time.Minute, Seed: 3}, &out)
	if err == nil {
		t.Fatal("no error after the context ended")
	}
	if !res.OK() {
		t.Errorf("not OK after an interruption: %+v", res)
	}
	if !strings.Contains(out.String(), "payments recorded") {
		t.Errorf("no table after an interruption:\n%s", out.String())
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{{FaultRate: 1.5}, {Clients: -1}, {Duration: -time.Second}} {
		if _, err := Run(t.Context(), cfg, &bytes.Buffer{}); err == nil {
			t.Errorf("Run(%+v) succeeded", cfg)
		}
	}
}

// TestCheck: the checker counts each kind of violation.
func TestCheck(t *testing.T) {
	rows := []payment{
		{ID: 1, User: "a", Key: "k1", Amount: 1},
		{ID: 2, User: "a", Key: "k2", Amount: 1},
		{ID: 3, User: "a", Key: "k2", Amount: 1}, // k2 paid twice
		{ID: 4, User: "a", Key: "k3", Amount: 1},
		{ID: 5, User: "b", Key: "zz", Amount: 1}, // nobody asked
	}
	records := []record{
		{user: "a", key: "k1", status: 201, id: 1, bodyKey: "k1"},
		{user: "a", key: "k2", status: 201, id: 2, bodyKey: "k2"},
		{user: "a", key: "k3", status: 201, id: 9, bodyKey: "k3"}, // names another payment
		{user: "a", key: "k4", status: 201, id: 7, bodyKey: "k4"}, // not recorded
		{user: "a", key: "k5", status: 500},
		{user: "a", key: "k6"}, // unfinished
	}
	var r Result
	check(&r, records, rows)
	want := Result{LogicalPayments: 6, Succeeded: 4, Failed: 1, Unfinished: 1, PaymentsRecorded: 5,
		Duplicates: 1, Lost: 1, Mismatched: 1, Phantoms: 1}
	if r != want {
		t.Errorf("got  %+v\nwant %+v", r, want)
	}
	if r.OK() {
		t.Error("OK")
	}
}
