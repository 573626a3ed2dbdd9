package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHelpAndUsage(t *testing.T) {
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &out, &errs); code != 0 || !strings.Contains(out.String(), "usage: ociimage -o OUT") {
		t.Errorf("--help: exit %d\n%s%s", code, out.String(), errs.String())
	}
	out.Reset()
	if code := run(context.Background(), nil, &out, &errs); code != 2 || !strings.Contains(errs.String(), "-o OUT is required") {
		t.Errorf("no -o: exit %d, stderr %q", code, errs.String())
	}
}

// TestRefusedDockerfile: a Dockerfile the builder does not interpret is exit 2, one
// line naming the instruction, and nothing written.
func TestRefusedDockerfile(t *testing.T) {
	root := t.TempDir()
	src := "FROM scratch\nRUN echo hi\nENTRYPOINT [\"/retrysafe\"]\n"
	if err := os.WriteFile(filepath.Join(root, "Dockerfile"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "image.tar")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-o", out, "-root", root}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "line 2: RUN: not interpreted") {
		t.Errorf("exit %d, stderr %q; want 2 and the RUN of line 2 refused", code, stderr.String())
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("%s was written: %v", out, err)
	}
}
