package model

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/testenv"
)

// The model and the Go files it is mapped to, relative to this package.
const (
	modelFile = "protocol.pml"
	goRoot    = ".." // package idempotency; the header's paths are relative to it
)

// variant is one run of spin on the model: the correct model (want "") or a broken one,
// for which spin must find a counterexample of the invariant want.
type variant struct {
	name    string
	defines []string
	want    string
	big     bool   // a search of millions of states: optimise pan, a larger hash table
	plain   bool   // states stored uncompressed (no COLLAPSE): faster, twice the memory
	story   string // an event the counterexample must hold (a window's)
}

// noFailover leaves the store's failover out of a search: with synchronous replication
// it adds no window, and it multiplies the states by five at the CI bound.
const noFailover = "-DMAXFAILOVER=0"

// The correct model at the bound CI verifies: 2 replicas, 2 client attempts and the
// final retry, 1 owner crash, 2 link outages, 1 store call held by the network, 1
// replica restart, no failover: about 7.9 million states.
var correct = variant{name: "correct", defines: []string{"-DNATT=2", noFailover}, big: true, plain: true}

// The correct model with a failover of the store, at a smaller bound CI verifies: the
// bound above with 1 link outage: about 3 million states.
var failover = variant{name: "failover", defines: []string{"-DNATT=2", "-DMAXOUT=1", "-DMAXFAILOVER=1"}, big: true, plain: true}

// The long bounds (RETRYSAFE_LONG=1), each a few minutes and a few GB (30 to 46
// million states): more faults (2 crashes, 3 outages, 2 held calls), and a third
// attempt (with 1 outage), both with the restart and no failover; and the CI bound with
// the failover (states compressed).
var long = []variant{
	{name: "long-faults", defines: []string{"-DNATT=2", "-DMAXCRASH=2", "-DMAXOUT=3", "-DMAXHELD=2", noFailover}, big: true},
	{name: "long-attempts", defines: []string{"-DNATT=3", "-DMAXOUT=1", noFailover}, big: true},
	{name: "long-failover", defines: []string{"-DNATT=2", "-DMAXFAILOVER=1"}, big: true},
}

// noFaults takes every fault away but the ones a variant's counterexample needs, so
// that the counterexample shows the variant's mistake alone.
var noFaults = []string{"-DMAXCRASH=0", "-DMAXOUT=0", "-DMAXHELD=0", "-DMAXRESTART=0", noFailover}

// outageAndFailover are the faults a variant of the acknowledged-write rules needs: one
// link outage (an unknown outcome) and one failover (what the outcome was lost to).
var outageAndFailover = []string{"-DMAXCRASH=0", "-DMAXOUT=1", "-DMAXHELD=0", "-DMAXRESTART=0", "-DMAXFAILOVER=1"}

// Each broken variant keeps only the invariant it breaks (-DONLY), so that the
// counterexample spin finds is one of that invariant. Two need a third attempt: a
// takeover that races another takeover, and a replay after two completions.
var broken = []variant{
	breaks("TAKEOVER_SAME_TOKEN", "inv_token", "-DMAXOUT=0", "-DMAXHELD=0", noFailover),
	breaks("NO_TOKEN_CHECK", "inv_stale", noFailover),
	breaks("CLAIM_LIVE_LEASE", "inv_once", "-DNATT=3", noFailover),
	breaks("EXTEND_NOOP", "inv_takeover", noFaults...),
	breaks("NO_TAKEOVERBY", "inv_once", noFailover),
	breaks("NO_HEALTH_HOLD", "inv_final", noFailover),
	breaks("LOCAL_CLOCK", "inv_takeover", noFaults...),
	breaks("SEND_BEFORE_STORE", "inv_final", "-DMAXOUT=0", "-DMAXHELD=0", noFailover),
	breaks("RELEASE_NO_CHECK", "inv_once", noFailover),
	breaks("CLAIM_REPLACES_DONE", "inv_replay", "-DNATT=3", noFailover),
	breaks("NO_TAKEOVER", "inv_progress", "-DMAXOUT=0", "-DMAXHELD=0", noFailover),
	// A process restarted after an outage it never saw takes a live owner's key over
	// (inv_takeover at the takeover, inv_once at the second execution: the duplicate).
	breaks("START_HEALTHY", "inv_once", "-DMAXCRASH=0", "-DMAXHELD=0", noFailover).with("restarts"),
	// An owner whose completion's outcome is unknown resends it, the store refuses the
	// record already done, and a read of the primary finds it stored: the owner drops
	// its answer, a failover loses the completion, and a retry runs the request again.
	breaks("CONFIRM_BY_READ", "inv_once", outageAndFailover...).with("failover"),
	// An unclaim's resent claim is granted its own record, applied on the primary only,
	// by a read; a failover loses the record and its token, which the store issues to
	// another attempt; the unclaim's release deletes that attempt's record as it runs,
	// and a retry runs the request again.
	breaks("REGRANT_READ", "inv_once", outageAndFailover...).with("failover"),
	// A claim whose answer was lost is resent and refused by its own record (409): the
	// unclaim ends and leaves the record to block the key for a lease.
	breaks("CLAIM_ID_IGNORED", "inv_unclaim", "-DMAXCRASH=0", "-DMAXOUT=1", "-DMAXHELD=0", "-DMAXRESTART=0", "-DNO_ABANDON", noFailover).with("store_error"),
}

// breaks is the broken variant BROKEN_name, which spin must refute with a
// counterexample of the invariant want.
func breaks(name, want string, defines ...string) variant {
	return variant{name: name, want: want, defines: append([]string{"-DBROKEN_" + name}, defines...)}
}

// with is v whose counterexample must hold the event story.
func (v variant) with(story string) variant {
	v.story = story
	return v
}

// The documented windows are real: with STRICT no second execution is allowed, and
// spin must find one in each window alone, and none without a fault and an unknown
// outcome, so the exceptions of inv_once excuse what happens and nothing more.
var windows = []variant{
	{name: "window-crash", want: "inv_once", story: "crashed", defines: []string{"-DSTRICT", "-DMAXOUT=0", "-DMAXHELD=0", "-DMAXRESTART=0", "-DNO_ABANDON", noFailover}},
	{name: "window-abandon", want: "inv_once", story: " abandoned", defines: []string{"-DSTRICT", "-DMAXCRASH=0", "-DMAXOUT=0", "-DMAXHELD=0", "-DMAXRESTART=0", noFailover}},
	{name: "window-cut-off", want: "inv_once", story: "takeover=1", defines: []string{"-DSTRICT", "-DMAXCRASH=0", "-DMAXRESTART=0", "-DNO_ABANDON", noFailover}},
	// A restart crashes the attempts of its replica as an owner crash does, and opens
	// the same window (winCrash), with no other fault.
	{name: "window-restart", want: "inv_once", story: "restarts", defines: []string{"-DSTRICT", "-DMAXCRASH=0", "-DMAXOUT=0", "-DMAXHELD=0", "-DNO_ABANDON", noFailover}},
	{name: "once-without-faults", defines: []string{"-DSTRICT", "-DMAXCRASH=0", "-DMAXOUT=0", "-DMAXHELD=0", "-DMAXRESTART=0", "-DNO_ABANDON", noFailover}},
	// With expiry and the janitor, an outage of every replica that outlasts a record's
	// TTL lets the janitor delete a live owner's record before it stores its answer (the
	// janitor is not held back as takeovers are), and a retry runs the request again:
	// with that window not excused (STRICT_TTL), spin must find it.
	{name: "window-ttl-outage", want: "inv_once", story: "the janitor deletes the expired record (in_progress)", defines: []string{"-DEXPIRY", "-DSTRICT_TTL", noFailover}},
	// With an asynchronous standby, a failover loses an acknowledged completion, with no
	// other fault, and a retry runs the request again; with a synchronous one, the same
	// bound has no second execution.
	{name: "window-async", want: "inv_once", story: "the failover loses acknowledged writes", defines: []string{"-DASYNC", "-DSTRICT", "-DMAXCRASH=0", "-DMAXOUT=0", "-DMAXHELD=0", "-DMAXRESTART=0", "-DNO_ABANDON", "-DMAXFAILOVER=1"}},
	{name: "once-with-failover", defines: []string{"-DSTRICT", "-DMAXCRASH=0", "-DMAXOUT=0", "-DMAXHELD=0", "-DMAXRESTART=0", "-DNO_ABANDON", "-DMAXFAILOVER=1"}},
}

// Expiry and the janitor (RETRYSAFE_LONG=1; with the restart, tens of millions of
// states, a few minutes and a few GB each): the model verifies with its windows, and
// two janitors that close the outage window verify without it: one that deletes an
// in-progress record only from a replica that could take it over, one that leaves
// in-progress records to claims.
var expiry = []variant{
	{name: "expiry", defines: []string{"-DEXPIRY", noFailover}, big: true},
	{name: "janitor-held-back", defines: []string{"-DEXPIRY", "-DSTRICT_TTL", "-DJANITOR_HELD_BACK", noFailover}, big: true},
	{name: "janitor-done-only", defines: []string{"-DEXPIRY", "-DSTRICT_TTL", "-DJANITOR_DONE_ONLY", noFailover}, big: true},
}

func (v variant) flags() []string {
	fl := slices.Clone(v.defines)
	if v.want != "" {
		fl = append(fl, "-DONLY="+v.want)
	}
	if !slices.ContainsFunc(fl, func(d string) bool { return strings.HasPrefix(d, "-DNATT=") }) {
		fl = append(fl, "-DNATT=2")
	}
	return fl
}

// TestModel verifies the model with spin, exhaustively at its bounds, and shows that
// each broken variant is refuted with a counterexample of the invariant it breaks.
func TestModel(t *testing.T) {
	spin, gcc := tools(t)
	runs := append(append([]variant{correct, failover}, broken...), windows...)
	if os.Getenv("RETRYSAFE_LONG") == "1" {
		runs = append(append(long, expiry...), runs...)
	}
	for _, v := range runs {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel() // each run is one process: spin, gcc, then pan
			verify(t, spin, gcc, v)
		})
	}
}

// TestBrokenVariantsDefined checks that every BROKEN_ flag the model reads is run by
// TestModel, and every variant TestModel runs is one the model reads, so that a variant
// added to the model is also shown to fail.
func TestBrokenVariantsDefined(t *testing.T) {
	src, err := os.ReadFile(modelFile)
	if err != nil {
		t.Fatal(err)
	}
	inModel := map[string]bool{}
	for _, m := range regexp.MustCompile(`#ifn?def BROKEN_([A-Z_]+)`).FindAllStringSubmatch(string(src), -1) {
		inModel[m[1]] = true
	}
	tested := map[string]bool{}
	for _, v := range broken {
		tested[v.name] = true
		if !inModel[v.name] {
			t.Errorf("variant %s is not read by %s", v.name, modelFile)
		}
		row := regexp.MustCompile(`(?m)^ \* BROKEN_` + v.name + ` .*\((inv_[a-z]+)\)$`).FindStringSubmatch(string(src))
		switch {
		case row == nil:
			t.Errorf("variant %s is not described in the header of %s", v.name, modelFile)
		case row[1] != v.want:
			t.Errorf("the header of %s says variant %s breaks %s; TestModel expects %s", modelFile, v.name, row[1], v.want)
		}
	}
	for name := range inModel {
		if !tested[name] {
			t.Errorf("%s reads BROKEN_%s, which TestModel does not run", modelFile, name)
		}
	}
}

// tools returns the paths of spin and gcc, or skips the test (fails it under
// RETRYSAFE_REQUIRE_SERVICES=1) when one is missing.
func tools(t *testing.T) (spin, gcc string) {
	t.Helper()
	var missing []string
	spin, err := exec.LookPath("spin")
	if err != nil {
		missing = append(missing, "spin (Debian: apt-get install spin)")
	}
	gcc, err = exec.LookPath("gcc")
	if err != nil {
		missing = append(missing, "gcc")
	}
	if len(missing) > 0 {
		msg := "the model checker needs " + strings.Join(missing, " and ")
		if testenv.Required() {
			t.Fatal(msg + " [RETRYSAFE_REQUIRE_SERVICES=1]")
		}
		t.Skip(msg)
	}
	return spin, gcc
}

// result is what pan reports of one search.
type result struct {
	errors   int
	stored   int64
	depth    int64
	memoryMB float64
	elapsed  string
	complete bool
	out      string
}

var (
	reErrors  = regexp.MustCompile(`depth reached (\d+), errors: (\d+)`)
	reStored  = regexp.MustCompile(`(?m)^\s*(\d+) states, stored`)
	reMemory  = regexp.MustCompile(`(?m)^\s*([0-9.]+)\s+total actual memory usage`)
	reElapsed = regexp.MustCompile(`pan: elapsed time ([0-9.e+]+) seconds`)
)

func parsePan(out string) (result, error) {
	r := result{out: out, complete: !strings.Contains(out, "Search not completed")}
	m := reErrors.FindStringSubmatch(out)
	if m == nil {
		return r, errors.New("no 'errors:' line in pan's output")
	}
	r.depth, _ = strconv.ParseInt(m[1], 10, 64)
	r.errors, _ = strconv.Atoi(m[2])
	if m := reStored.FindStringSubmatch(out); m != nil {
		r.stored, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reMemory.FindStringSubmatch(out); m != nil {
		r.memoryMB, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := reElapsed.FindStringSubmatch(out); m != nil {
		r.elapsed = m[1] + " s"
	}
	return r, nil
}

// verify compiles the model with v's flags and searches it. The correct model must
// have no error and a complete search; a broken one must have an error whose trail
// reports the violation of v.want.
func verify(t *testing.T, spin, gcc string, v variant) {
	dir := t.TempDir()
	src, err := os.ReadFile(modelFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, modelFile), src, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Minute)
	defer cancel()
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	start := time.Now()
	run(spin, append(append([]string{"-a"}, v.flags()...), modelFile)...)
	// -O0 but for the big searches: gcc takes longer to optimise pan.c than the
	// optimised search of a few million states would save. COLLAPSE compresses the
	// stored states, losing none, at some cost in time: a plain variant, whose states
	// fit in memory as they are, does without. -m bounds the depth of the search (it
	// must not be reached), -w sizes the hash table (2^w slots; a smaller one only costs
	// time).
	opt, hash := "-O0", "-w24"
	if v.big {
		opt, hash = "-O2", "-w26"
	}
	cc := []string{opt, "-DSAFETY"}
	if !v.plain {
		cc = append(cc, "-DCOLLAPSE")
	}
	run(gcc, append(cc, "-o", "pan", "pan.c")...)
	// pan exits 0 whether or not it found an error: the verdict is in its report.
	out := run(filepath.Join(dir, "pan"), "-m1000000", hash)
	res, err := parsePan(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if strings.Contains(out, "max search depth too small") {
		t.Fatalf("the search was cut at pan's depth limit (-m): raise it\n%s", out)
	}
	t.Logf("%s %s: %d states stored, depth %d, %.0f MB, %s (%s with the build)",
		v.name, strings.Join(v.flags(), " "), res.stored, res.depth, res.memoryMB, res.elapsed, time.Since(start).Round(time.Millisecond))
	if v.want == "" {
		if res.errors != 0 || !res.complete {
			trail := ""
			if res.errors != 0 {
				trail = run(spin, append(append([]string{"-t"}, v.flags()...), modelFile)...)
			}
			t.Fatalf("the model does not verify (errors: %d, complete search: %v)\n%s\n%s\n%s", res.errors, res.complete, out, events(trail), tail(trail, 60))
		}
		return
	}
	if res.errors == 0 {
		t.Fatalf("spin found no counterexample of %s in the variant %s\n%s", v.want, v.name, out)
	}
	trail := run(spin, append(append([]string{"-t"}, v.flags()...), modelFile)...)
	if !strings.Contains(trail, "MODEL-VIOLATION "+v.want) {
		t.Fatalf("the counterexample of %s does not report %s:\n%s", v.name, v.want, tail(trail, 60))
	}
	var outcomes []string
	for line := range strings.Lines(events(trail)) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "OUTCOME" {
			outcomes = append(outcomes, strings.TrimPrefix(f[1], "attempt=")+":"+f[2])
		}
	}
	if v.story != "" && !strings.Contains(events(trail), v.story) {
		t.Fatalf("the counterexample of %s does not show %q:\n%s", v.name, v.story, events(trail))
	}
	t.Logf("counterexample: %s, after the outcomes %s", v.want, strings.Join(outcomes, " "))
}

// events returns the lines of a trail that say what happened: the model's events, the
// outcomes of the attempts and the invariant violated.
func events(trail string) string {
	var b strings.Builder
	for line := range strings.Lines(trail) {
		if f := strings.TrimSpace(line); strings.HasPrefix(f, "OUTCOME ") || strings.HasPrefix(f, "EVENT ") || strings.HasPrefix(f, "MODEL-VIOLATION ") {
			b.WriteString(f + "\n")
		}
	}
	return b.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestMapping checks the model's header against the Go code: every State and Outcome
// constant has a row (modelled, or why not), every mtype of the model's states and
// outcomes is a Go constant, and every function the transition table names exists.
func TestMapping(t *testing.T) {
	src, err := os.ReadFile(modelFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range checkMapping(filepath.Join(goRoot, "store.go"), filepath.Join(goRoot, "middleware.go"), string(src)) {
		t.Error(err)
	}
	for _, err := range checkFunctions(goRoot, string(src)) {
		t.Error(err)
	}
}

// TestMappingCatchesChanges shows that TestMapping fails when a State or an Outcome is
// added to the Go code without the model, when the model has an outcome Go does not,
// and when the transition table names a function that does not exist.
func TestMappingCatchesChanges(t *testing.T) {
	src, err := os.ReadFile(modelFile)
	if err != nil {
		t.Fatal(err)
	}
	model := string(src)
	storeGo := filepath.Join(goRoot, "store.go")
	middlewareGo := filepath.Join(goRoot, "middleware.go")
	scratch := func(name, path, extra string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, append(b, extra...), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name            string
		store, mw, pml  string
		wantErrorNaming string
	}{
		{"a new Outcome", storeGo, scratch("middleware.go", middlewareGo, "\nconst OutcomeRetried Outcome = \"retried\"\n"), model, "OutcomeRetried"},
		{"a new State", scratch("store.go", storeGo, "\nconst StateExpired State = \"expired\"\n"), middlewareGo, model, "StateExpired"},
		{"an outcome only in the model", storeGo, middlewareGo,
			strings.Replace(model, "mtype:outcome = { executed,", "mtype:outcome = { executed, retried,", 1), "retried"},
		{"a row for a removed constant", storeGo, middlewareGo,
			strings.Replace(model, " * OutcomeExecuted ", " * OutcomeRetried       outcome executed\n * OutcomeExecuted ", 1), "OutcomeRetried"},
	}
	for _, c := range cases {
		errs := checkMapping(c.store, c.mw, c.pml)
		if !slices.ContainsFunc(errs, func(err error) bool { return strings.Contains(err.Error(), c.wantErrorNaming) }) {
			t.Errorf("%s: no error naming %s (errors: %v)", c.name, c.wantErrorNaming, errs)
		}
	}
	renamed := strings.Replace(model, "heartbeat.go: execution.startHeartbeat", "heartbeat.go: execution.beginHeartbeat", 1)
	if errs := checkFunctions(goRoot, renamed); !slices.ContainsFunc(errs, func(err error) bool { return strings.Contains(err.Error(), "beginHeartbeat") }) {
		t.Errorf("a function missing from the Go code: no error (errors: %v)", errs)
	}
}

// goConsts returns the constants of type typ declared in the Go file at path, by name,
// with their string values.
func goConsts(path, typ string) (map[string]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return nil, err
	}
	consts := map[string]string{}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			id, ok := vs.Type.(*ast.Ident)
			if !ok || id.Name != typ {
				continue
			}
			for i, name := range vs.Names {
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return nil, fmt.Errorf("%s: %s is not a string literal", path, name.Name)
				}
				v, err := strconv.Unquote(lit.Value)
				if err != nil {
					return nil, err
				}
				consts[name.Name] = v
			}
		}
	}
	if len(consts) == 0 {
		return nil, fmt.Errorf("%s: no constant of type %s", path, typ)
	}
	return consts, nil
}

// mtypeName is the model's name for a Go constant's value: Promela names have no '-'.
func mtypeName(v string) string { return strings.ReplaceAll(v, "-", "_") }

// modelMtypes returns the members of the model's mtype:name declaration.
func modelMtypes(pml, name string) ([]string, error) {
	m := regexp.MustCompile(`mtype:` + name + `\s*=\s*\{([^}]*)\}`).FindStringSubmatch(pml)
	if m == nil {
		return nil, fmt.Errorf("%s: no mtype:%s", modelFile, name)
	}
	var members []string
	for _, f := range strings.Split(m[1], ",") {
		members = append(members, strings.TrimSpace(f))
	}
	return members, nil
}

// headerRows returns the rows of the header table whose first column starts with
// prefix (State, Outcome): the constant's name and the rest of the row.
func headerRows(pml, prefix string) map[string]string {
	rows := map[string]string{}
	header, _, _ := strings.Cut(pml, "*/")
	re := regexp.MustCompile(`(?m)^ \* (` + prefix + `[A-Za-z]+)\s+(.*)$`)
	for _, m := range re.FindAllStringSubmatch(header, -1) {
		rows[m[1]] = strings.TrimSpace(m[2])
	}
	return rows
}

// checkMapping checks the State constants of storeGo and the Outcome constants of
// middlewareGo against the model pml.
func checkMapping(storeGo, middlewareGo, pml string) []error {
	var errs []error
	for _, k := range []struct{ typ, file, mtype string }{
		{"State", storeGo, "state"},
		{"Outcome", middlewareGo, "outcome"},
	} {
		consts, err := goConsts(k.file, k.typ)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		members, err := modelMtypes(pml, k.mtype)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rows := headerRows(pml, k.typ)
		values := map[string]bool{}
		for name, v := range consts {
			values[mtypeName(v)] = true
			row, ok := rows[name]
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("%s %s (%q) has no row in the header of %s: model it (mtype:%s %s) or say why not (\"not modelled: ...\")",
					k.typ, name, v, modelFile, k.mtype, mtypeName(v)))
			case strings.HasPrefix(row, "not modelled:"):
			case row != k.mtype+" "+mtypeName(v):
				errs = append(errs, fmt.Errorf("%s: the row of %s says %q, want %q or \"not modelled: ...\"", modelFile, name, row, k.mtype+" "+mtypeName(v)))
			case !slices.Contains(members, mtypeName(v)):
				errs = append(errs, fmt.Errorf("%s: %s is mapped to %s, which is not in mtype:%s", modelFile, name, mtypeName(v), k.mtype))
			}
		}
		for name := range rows {
			if _, ok := consts[name]; !ok {
				errs = append(errs, fmt.Errorf("%s: the header maps %s, which is not a %s of %s", modelFile, name, k.typ, filepath.Base(k.file)))
			}
		}
		for _, m := range members {
			if values[m] || k.mtype == "state" && m == "absent" {
				continue
			}
			errs = append(errs, fmt.Errorf("%s: mtype:%s has %s, which is no %s of %s", modelFile, k.mtype, m, k.typ, filepath.Base(k.file)))
		}
	}
	return errs
}

// checkFunctions checks that every "file.go: Func, Type.Method" the header's transition
// table names exists, the files relative to root.
func checkFunctions(root, pml string) []error {
	header, _, _ := strings.Cut(pml, "*/")
	start := strings.Index(header, "Transition (model)")
	end := strings.Index(header, "State (store.go)")
	if start < 0 || end < start {
		return []error{fmt.Errorf("%s: no transition table in the header", modelFile)}
	}
	table := header[start:end]
	re := regexp.MustCompile(`([a-z]+(?:/[a-z]+)*\.go): ([A-Za-z.]+(?:, [A-Za-z.]+)*)`)
	var errs []error
	found := 0
	for _, m := range re.FindAllStringSubmatch(table, -1) {
		decls, err := funcDecls(filepath.Join(root, m[1]))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, name := range strings.Split(m[2], ", ") {
			found++
			if !decls[name] {
				errs = append(errs, fmt.Errorf("%s: the transition table names %s in %s, which does not declare it", modelFile, name, m[1]))
			}
		}
	}
	if found == 0 {
		errs = append(errs, fmt.Errorf("%s: the transition table names no function", modelFile))
	}
	return errs
}

// funcDecls returns the functions (Name) and methods (Type.Name) declared in a Go file.
func funcDecls(path string) (map[string]bool, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return nil, err
	}
	decls := map[string]bool{}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		name := fd.Name.Name
		if fd.Recv != nil && len(fd.Recv.List) == 1 {
			typ := fd.Recv.List[0].Type
			if star, ok := typ.(*ast.StarExpr); ok {
				typ = star.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				name = id.Name + "." + name
			}
		}
		decls[name] = true
	}
	return decls, nil
}
