// Command ociimage builds the retrysafe container image from the repository's
// Dockerfile without a container engine (see package image), and writes it as a
// tarball for `docker load` or as an OCI image layout directory.
//
//	cd deploy && go run ./cmd/ociimage -o dist/retrysafe-image.tar -version v0.1.0
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/retrysafe/retrysafe/deploy/image"
)

const usage = `usage: ociimage -o OUT [-version VERSION] [-arch GOARCH] [-root DIR] [-tag REF]

Builds the retrysafe image of DIR/Dockerfile (its final stage, and the stages it copies
from) for linux/GOARCH with this machine's Go toolchain, without a container engine.
An instruction of the Dockerfile it does not interpret is an error, exit 2.

OUT ending in .tar is a tarball for docker load (tagged REF); anything else is an OCI
image layout directory.

flags:
  -o OUT           where to write the image (required)
  -version V       the build argument VERSION: the release, reported by the binary and
                   in the org.opencontainers.image.version label (default empty)
  -arch GOARCH     the target architecture (default this machine's, %s)
  -root DIR        the repository: the build context and its Dockerfile (default ..)
  -tag REF         the image's name (default ghcr.io/retrysafe/retrysafe:VERSION, or
                   :dev without a version)

example:
  cd deploy && go run ./cmd/ociimage -o dist/retrysafe-image.tar -version v0.1.0
  docker load -i dist/retrysafe-image.tar
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ociimage", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.String("o", "", "")
	version := fs.String("version", "", "")
	arch := fs.String("arch", runtime.GOARCH, "")
	root := fs.String("root", "..", "")
	tag := fs.String("tag", "", "")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			fmt.Fprintf(stdout, usage, runtime.GOARCH)
			return 0
		}
		fmt.Fprintf(stderr, "ociimage: %v (see ociimage --help)\n", err)
		return 2
	}
	if *out == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "ociimage: -o OUT is required, and nothing else (see ociimage --help)")
		return 2
	}
	if *tag == "" {
		*tag = "ghcr.io/retrysafe/retrysafe:" + *version
		if *version == "" {
			*tag += "dev"
		}
	}
	abs, err := filepath.Abs(*root)
	if err != nil {
		fmt.Fprintf(stderr, "ociimage: %v\n", err)
		return 2
	}
	plan, err := image.Load(image.Options{Root: abs, Version: *version, GOARCH: *arch})
	if err != nil {
		fmt.Fprintf(stderr, "ociimage: %v\n", err)
		return 2
	}
	img, err := plan.Build(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "ociimage: %v\n", err)
		return 1
	}
	if err := image.Write(img, *tag, *out); err != nil {
		fmt.Fprintf(stderr, "ociimage: %v\n", err)
		return 1
	}
	digest, err := img.Digest()
	if err != nil {
		fmt.Fprintf(stderr, "ociimage: %v\n", err)
		return 1
	}
	layers, err := img.Layers()
	if err != nil {
		fmt.Fprintf(stderr, "ociimage: %v\n", err)
		return 1
	}
	var size int64
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			fmt.Fprintf(stderr, "ociimage: %v\n", err)
			return 1
		}
		size += n
	}
	fmt.Fprintf(stdout, "%s linux/%s %s (layers %.1f MiB compressed) -> %s\n", *tag, *arch, digest, float64(size)/(1<<20), *out)
	return 0
}
