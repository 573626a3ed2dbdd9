package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"slices"
	"strings"
	"testing"
)

var updateReference = flag.Bool("update", false, "rewrite docs/configuration.md from the code")

const referencePath = "../../docs/configuration.md"

// TestConfigReference: docs/configuration.md is what `retrysafe help config-reference`
// writes from the code's tables, so a flag, a config-file key or a DSN parameter added
// to the code without regenerating it fails here (-update rewrites it).
func TestConfigReference(t *testing.T) {
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"help", referenceTopic}, &out, &errs); code != exitOK {
		t.Fatalf("retrysafe help %s: exit %d: %s", referenceTopic, code, errs.String())
	}
	got := out.String()
	if *updateReference {
		if err := os.WriteFile(referencePath, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(referencePath)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gl), len(wl)) {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("docs/configuration.md differs from the code's tables at line %d:\n the file: %s\n the code: %s\nrun: go test ./cmd/retrysafe -run TestConfigReference -update", i+1, w, g)
			}
		}
	}
	// Every flag, key and parameter is in it.
	fs, _, _ := newGatewayFlags()
	fs.VisitAll(func(f *flag.Flag) {
		fromEnv := !slices.Contains(notFromEnv(), f.Name)
		if !strings.Contains(got, "`--"+f.Name) || strings.Contains(got, envName(f.Name)) != fromEnv {
			t.Errorf("the reference lacks --%s, or names %s where it is read (%v)", f.Name, envName(f.Name), fromEnv)
		}
	})
}
