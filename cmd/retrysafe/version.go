package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

// releaseVersion is the version a release build states, set only by the linker:
//
//	go build -ldflags "-X main.releaseVersion=v0.1.0" ./cmd/retrysafe
//
// (scripts/release does this). No code assigns it. The linker can set only a package
// string variable, hence a variable; a build without the flag leaves it empty and the
// version comes from the build information the go command stamps (the module version, or
// the VCS tag or pseudo-version of the checkout).
var releaseVersion string

const versionHelp = `usage: retrysafe version     (or retrysafe --version, retrysafe -v)

Prints the version the binary was built as: a release build's version, else the module
version the go command stamped (a VCS tag or pseudo-version, "dev" for a build without
one); then the module, the VCS revision, its commit time, whether the work tree had
uncommitted changes, the Go version and the platform the binary was built for.

examples:
  retrysafe version
`

// runVersion is "retrysafe version".
func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
			fmt.Fprint(stdout, versionHelp)
			return exitOK
		}
		fmt.Fprintf(stderr, "retrysafe version: unexpected argument %q\n", args[0])
		return exitUsage
	}
	info, _ := debug.ReadBuildInfo() // nil when the binary carries none
	fmt.Fprint(stdout, versionText(info, releaseVersion))
	return exitOK
}

// version is the one-word version the logs and the traces carry (see shortVersion).
func version() string {
	info, _ := debug.ReadBuildInfo()
	return shortVersion(info, releaseVersion)
}

// shortVersion is release when it is set, else the module version the go command stamped
// (a tag, or a pseudo-version that names the revision and "+dirty"), else "dev" with the
// revision's first 12 digits when the build recorded one. info may be nil.
func shortVersion(info *debug.BuildInfo, release string) string {
	if release != "" {
		return release
	}
	if info == nil {
		return "dev"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	s := settings(info)
	rev := s["vcs.revision"]
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if s["vcs.modified"] == "true" {
		rev += ", modified"
	}
	return "dev (" + rev + ")"
}

// versionText is what "retrysafe version" prints for the build information info (nil
// when the binary carries none) and the release version release (empty unless set by
// the linker): the version on the first line, then one "name value" line per fact.
// Facts the build did not record read "unknown": a build outside a VCS checkout, or
// with -buildvcs=false, records no revision.
func versionText(info *debug.BuildInfo, release string) string {
	if info == nil {
		info = &debug.BuildInfo{}
	}
	s := settings(info)
	or := func(v, dflt string) string {
		if v == "" {
			return dflt
		}
		return v
	}
	module := or(info.Main.Path, "unknown") + " " + or(info.Main.Version, "(devel)")
	revision, modified := "unknown", "unknown"
	if r := s["vcs.revision"]; r != "" {
		revision = r
		if v := s["vcs"]; v != "" && v != "git" {
			revision += " (" + v + ")"
		}
		modified = or(s["vcs.modified"], "unknown")
	}
	platform := "unknown"
	if s["GOOS"] != "" && s["GOARCH"] != "" {
		platform = s["GOOS"] + "/" + s["GOARCH"]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "retrysafe %s\n", shortVersion(info, release))
	for _, kv := range [][2]string{
		{"module", module},
		{"revision", revision},
		{"time", or(s["vcs.time"], "unknown")},
		{"modified", modified},
		{"go", or(info.GoVersion, "unknown")},
		{"platform", platform},
	} {
		fmt.Fprintf(&b, "  %-9s %s\n", kv[0], kv[1])
	}
	return b.String()
}

// settings is info's build settings by key.
func settings(info *debug.BuildInfo) map[string]string {
	m := make(map[string]string, len(info.Settings))
	for _, s := range info.Settings {
		m[s.Key] = s.Value
	}
	return m
}
