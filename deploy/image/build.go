package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// epoch is the time of every file of the layer and of the image: a build of the same
// sources with the same toolchain gives the same image, digest included.
var epoch = time.Unix(0, 0).UTC()

// Build builds the plan's image for linux/GOARCH: it runs the go builds the layer
// needs, then assembles the layer and the config, with OCI media types.
func (p *Plan) Build(ctx context.Context) (v1.Image, error) {
	tmp, err := os.MkdirTemp("", "retrysafe-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	built := map[*goBuild]string{}
	for _, pth := range p.sortedPaths() {
		e := p.Files[pth]
		if e.Build == nil || built[e.Build] != "" {
			continue
		}
		out := filepath.Join(tmp, fmt.Sprintf("bin%d", len(built)))
		if err := p.goBuild(ctx, e.Build, out); err != nil {
			return nil, err
		}
		built[e.Build] = out
	}
	layerTar, err := p.layer(built)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer, History: v1.History{
		Created: v1.Time{Time: epoch}, CreatedBy: "deploy/image: the final stage of the Dockerfile",
	}})
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", p.opts.GOARCH
	if p.opts.GOARCH == "arm64" {
		cf.Variant = "v8"
	}
	cf.Created = v1.Time{Time: epoch}
	cf.Config = p.Config
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return img, nil
}

// goBuild runs one go build of the Dockerfile for linux/GOARCH, writing the binary to
// out.
func (p *Plan) goBuild(ctx context.Context, b *goBuild, out string) error {
	args := append([]string{"build", "-o", out}, b.args...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Join(p.opts.Root, filepath.FromSlash(b.dir))
	cmd.Env = append(os.Environ(), b.env...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("image: %s go %s: %w\n%s", strings.Join(b.env, " "), strings.Join(args, " "), err, stderr.String())
	}
	return nil
}

// layer writes the plan's files as an uncompressed tar, parents first, with their
// owners and modes, and every time the epoch.
func (p *Plan) layer(built map[*goBuild]string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, pth := range p.sortedPaths() {
		if pth == "/" {
			continue
		}
		e := p.Files[pth]
		h := &tar.Header{Name: strings.TrimPrefix(pth, "/"), Mode: e.Mode, Uid: e.UID, Gid: e.GID,
			ModTime: epoch, Format: tar.FormatPAX}
		var content []byte
		if e.Dir {
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		} else {
			src := e.HostPath
			if e.Build != nil {
				src = built[e.Build]
			}
			var err error
			if content, err = os.ReadFile(src); err != nil {
				return nil, fmt.Errorf("image: %s: %w", pth, err)
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(content))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(content); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Write writes img, tagged ref, to out: a file ending in .tar is a tarball that
// `docker load` reads; anything else is an OCI image layout directory (the tag in the
// index's org.opencontainers.image.ref.name annotation).
func Write(img v1.Image, ref string, out string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if strings.HasSuffix(out, ".tar") {
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		return tarball.WriteToFile(out, tag, img)
	}
	lp, err := layout.Write(out, empty.Index)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.String(),
	}))
}
