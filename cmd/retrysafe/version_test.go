package main

import (
	"bytes"
	"context"
	"runtime/debug"
	"strings"
	"testing"
)

// buildInfo is the build information of a linux/arm64 binary built from a checkout of
// github.com/retrysafe/retrysafe at revision rev, with the given main module version and
// extra settings (which replace the defaults of the same key; an empty value drops it).
func buildInfo(mainVersion string, extra ...debug.BuildSetting) *debug.BuildInfo {
	settings := []debug.BuildSetting{
		{Key: "-buildmode", Value: "exe"},
		{Key: "CGO_ENABLED", Value: "0"},
		{Key: "GOARCH", Value: "arm64"},
		{Key: "GOOS", Value: "linux"},
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
		{Key: "vcs.time", Value: "2026-12-02T09:30:00Z"},
		{Key: "vcs.modified", Value: "false"},
	}
	for _, e := range extra {
		kept := settings[:0]
		for _, s := range settings {
			if s.Key != e.Key {
				kept = append(kept, s)
			}
		}
		settings = kept
		if e.Value != "" {
			settings = append(settings, e)
		}
	}
	return &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Path:      "github.com/retrysafe/retrysafe/cmd/retrysafe",
		Main:      debug.Module{Path: "github.com/retrysafe/retrysafe", Version: mainVersion},
		Settings:  settings,
	}
}

func TestVersionText(t *testing.T) {
	noVCS := []debug.BuildSetting{{Key: "vcs"}, {Key: "vcs.revision"}, {Key: "vcs.time"}, {Key: "vcs.modified"}}
	for _, c := range []struct {
		name    string
		info    *debug.BuildInfo
		release string
		want    string
	}{{
		name:    "release build from a checkout with no tag",
		info:    buildInfo("v0.0.0-20261202093000-0123456789ab"),
		release: "v0.1.0",
		want: `retrysafe v0.1.0
  module    github.com/retrysafe/retrysafe v0.0.0-20261202093000-0123456789ab
  revision  0123456789abcdef0123456789abcdef01234567
  time      2026-12-02T09:30:00Z
  modified  false
  go        go1.26.8
  platform  linux/arm64
`,
	}, {
		name: "build of a tagged checkout: the tag is the version",
		info: buildInfo("v0.1.0"),
		want: "retrysafe v0.1.0\n  module    github.com/retrysafe/retrysafe v0.1.0\n",
	}, {
		name: "pseudo-version of a modified work tree",
		info: buildInfo("v0.1.1-0.20261203100000-0123456789ab+dirty", debug.BuildSetting{Key: "vcs.modified", Value: "true"}),
		want: "retrysafe v0.1.1-0.20261203100000-0123456789ab+dirty\n",
	}, {
		name: "work tree build the go command stamped no version for",
		info: buildInfo("(devel)", debug.BuildSetting{Key: "vcs.modified", Value: "true"}),
		want: "retrysafe dev (0123456789ab, modified)\n  module    github.com/retrysafe/retrysafe (devel)\n  revision  0123456789abcdef0123456789abcdef01234567\n  time      2026-12-02T09:30:00Z\n  modified  true\n",
	}, {
		name: "built with -buildvcs=false",
		info: buildInfo("(devel)", noVCS...),
		want: `retrysafe dev
  module    github.com/retrysafe/retrysafe (devel)
  revision  unknown
  time      unknown
  modified  unknown
  go        go1.26.8
  platform  linux/arm64
`,
	}, {
		name:    "release build with -buildvcs=false",
		info:    buildInfo("(devel)", noVCS...),
		release: "v0.2.0-rc.1",
		want:    "retrysafe v0.2.0-rc.1\n  module    github.com/retrysafe/retrysafe (devel)\n  revision  unknown\n",
	}, {
		name:    "no build information",
		info:    nil,
		release: "v0.1.0",
		want: `retrysafe v0.1.0
  module    unknown (devel)
  revision  unknown
  time      unknown
  modified  unknown
  go        unknown
  platform  unknown
`,
	}} {
		t.Run(c.name, func(t *testing.T) {
			got := versionText(c.info, c.release)
			if !strings.HasPrefix(got, c.want) {
				t.Errorf("got\n%s\nwant it to begin with\n%s", got, c.want)
			}
		})
	}
}

func TestShortVersion(t *testing.T) {
	for _, c := range []struct {
		info    *debug.BuildInfo
		release string
		want    string
	}{
		{buildInfo("v0.0.0-20261202093000-0123456789ab"), "v0.1.0", "v0.1.0"},
		{buildInfo("v0.1.0"), "", "v0.1.0"},
		{buildInfo(""), "", "dev (0123456789ab)"},
		{buildInfo("(devel)", debug.BuildSetting{Key: "vcs.revision"}), "", "dev"},
		{nil, "", "dev"},
		{nil, "v0.1.0", "v0.1.0"},
	} {
		if got := shortVersion(c.info, c.release); got != c.want {
			t.Errorf("shortVersion(%v, %q) = %q, want %q", c.info, c.release, got, c.want)
		}
	}
}

// TestRunVersion: version, --version and -v print the same text, the one versionText
// makes of this binary's build information; an argument is a usage error.
func TestRunVersion(t *testing.T) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("the test binary carries no build information")
	}
	want := versionText(info, releaseVersion)
	for _, arg := range []string{"version", "--version", "-version", "-v"} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), []string{arg}, &stdout, &stderr); code != exitOK || stdout.String() != want || stderr.Len() != 0 {
			t.Errorf("retrysafe %s: exit %d, stdout %q, stderr %q; want exit 0 and %q", arg, code, stdout.String(), stderr.String(), want)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"version", "extra"}, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), `unexpected argument "extra"`) {
		t.Errorf("retrysafe version extra: exit %d, stderr %q", code, stderr.String())
	}
}
