package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/retrysafe/retrysafe/deploy/image"
)

// deadline bounds each wait on the gateway (its start, its drain): generous, as the
// machine may be busy; a wait ends as soon as what it waits for happens.
const deadline = 2 * time.Minute

// repoRoot is the repository: the build context, two levels up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "Dockerfile")); err != nil {
		t.Fatalf("no Dockerfile at the repository's root: %v", err)
	}
	return root
}

// layerFile is one entry of the image's layer, and a regular file's content.
type layerFile struct {
	hdr     *tar.Header
	content []byte
}

// TestImage builds the image of the repository's Dockerfile, writes it as a tarball
// for docker load, reads that back, and checks its config and its layer; then it runs
// the binary of the layer as the image's config says, against a real upstream.
func TestImage(t *testing.T) {
	const version = "v0.1.0-imagetest"
	plan, err := image.Load(image.Options{Root: repoRoot(t), Version: version, GOARCH: runtime.GOARCH})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	built, err := plan.Build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "retrysafe-image.tar")
	const ref = "ghcr.io/retrysafe/retrysafe:" + version
	if err := image.Write(built, ref, out); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatalf("reading the written tarball back: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	files := layerFiles(t, img)
	checkMediaTypes(t, built)

	t.Run("config", func(t *testing.T) { checkConfig(t, cf, version) })
	t.Run("layer", func(t *testing.T) { checkLayer(t, files) })
	t.Run("layout", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "oci")
		if err := image.Write(built, ref, dir); err != nil {
			t.Fatal(err)
		}
		idx, err := layout.ImageIndexFromPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		want, err := built.Digest()
		if err != nil {
			t.Fatal(err)
		}
		fromLayout, err := idx.Image(want)
		if err != nil {
			t.Fatal(err)
		}
		checkMediaTypes(t, fromLayout)
		if len(im.Manifests) != 1 || im.Manifests[0].Digest != want || im.Manifests[0].MediaType != types.OCIManifestSchema1 ||
			im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != ref {
			t.Fatalf("OCI layout index: %+v, want one OCI manifest %s named %s", im.Manifests, want, ref)
		}
	})
	t.Run("run", func(t *testing.T) { runAsImage(t, cf, files) })
}

// checkMediaTypes: the image is an OCI one, manifest, config and layer.
func checkMediaTypes(t *testing.T, img v1.Image) {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON || len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("manifest %s, config %s, layers %+v: want OCI media types and one layer", m.MediaType, m.Config.MediaType, m.Layers)
	}
}

func checkConfig(t *testing.T, cf *v1.ConfigFile, version string) {
	c := cf.Config
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	// The user is numeric (an empty base has no /etc/passwd) and not root.
	m := regexp.MustCompile(`^(\d+):(\d+)$`).FindStringSubmatch(c.User)
	if m == nil || m[1] == "0" || m[2] == "0" || c.User != "65532:65532" {
		t.Errorf("User %q, want 65532:65532 (numeric, not root)", c.User)
	}
	if fmt.Sprint(c.Entrypoint) != "[/retrysafe]" || fmt.Sprint(c.Cmd) != "[gateway]" {
		t.Errorf("Entrypoint %q Cmd %q, want [/retrysafe] [gateway]", c.Entrypoint, c.Cmd)
	}
	if len(c.ExposedPorts) != 2 || !has(c.ExposedPorts, "8080/tcp") || !has(c.ExposedPorts, "9090/tcp") {
		t.Errorf("ExposedPorts %v, want 8080/tcp 9090/tcp", c.ExposedPorts)
	}
	if len(c.Volumes) != 1 || !has(c.Volumes, "/data") {
		t.Errorf("Volumes %v, want /data", c.Volumes)
	}
	if c.StopSignal != "SIGTERM" {
		t.Errorf("StopSignal %q, want SIGTERM", c.StopSignal)
	}
	if c.WorkingDir != "/data" {
		t.Errorf("WorkingDir %q, want /data", c.WorkingDir)
	}
	wantEnv := []string{"RETRYSAFE_LISTEN=:8080", "RETRYSAFE_ADMIN=:9090", "RETRYSAFE_STORE=sqlite:/data/retrysafe.db", "RETRYSAFE_CONSOLE=off"}
	if fmt.Sprint(c.Env) != fmt.Sprint(wantEnv) {
		t.Errorf("Env %q, want %q", c.Env, wantEnv)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.title":       "retrysafe",
		"org.opencontainers.image.source":      "https://github.com/retrysafe/retrysafe",
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.description": c.Labels["org.opencontainers.image.description"],
	}
	if !strings.Contains(c.Labels["org.opencontainers.image.description"], "Idempotency-Key") {
		t.Errorf("description label %q says nothing of Idempotency-Key", c.Labels["org.opencontainers.image.description"])
	}
	if fmt.Sprint(c.Labels) != fmt.Sprint(wantLabels) {
		t.Errorf("Labels %v, want %v", c.Labels, wantLabels)
	}
}

func has(m map[string]struct{}, k string) bool { _, ok := m[k]; return ok }

// layerFiles reads the image's one layer.
func layerFiles(t *testing.T, img v1.Image) map[string]layerFile {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	size, err := layers[0].Size()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]layerFile{}
	var total int64
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		total += int64(len(b))
		files["/"+strings.TrimSuffix(h.Name, "/")] = layerFile{hdr: h, content: b}
	}
	t.Logf("layer: %d entries, %.1f MiB of files, %.1f MiB compressed", len(files), float64(total)/(1<<20), float64(size)/(1<<20))
	return files
}

func checkLayer(t *testing.T, files map[string]layerFile) {
	names := slices.Sorted(maps.Keys(files))
	want := []string{"/data", "/etc", "/etc/ssl", "/etc/ssl/certs", "/etc/ssl/certs/ca-certificates.crt", "/retrysafe", "/tmp"}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Errorf("layer holds %v, want %v", names, want)
	}
	entry := func(p string, typ byte, mode int64, uid, gid int) layerFile {
		t.Helper()
		f, ok := files[p]
		if !ok {
			t.Errorf("%s: not in the layer", p)
			return f
		}
		if h := f.hdr; h.Typeflag != typ || h.Mode != mode || h.Uid != uid || h.Gid != gid {
			t.Errorf("%s: type %c mode %o owner %d:%d, want type %c mode %o owner %d:%d", p, h.Typeflag, h.Mode, h.Uid, h.Gid, typ, mode, uid, gid)
		}
		return f
	}
	entry("/data", tar.TypeDir, 0o755, 65532, 65532)
	entry("/tmp", tar.TypeDir, 0o1777, 0, 0)
	entry("/retrysafe", tar.TypeReg, 0o755, 0, 0)
	ca := entry("/etc/ssl/certs/ca-certificates.crt", tar.TypeReg, 0o644, 0, 0)
	if n := bytes.Count(ca.content, []byte("-----BEGIN CERTIFICATE-----")); n < 10 {
		t.Errorf("the CA bundle holds %d certificates", n)
	}
	for _, f := range files {
		if !f.hdr.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: time %s, want the epoch (a reproducible layer)", f.hdr.Name, f.hdr.ModTime)
		}
	}
}

// runAsImage runs the layer's binary as a container engine would run the image: its
// Entrypoint and Cmd, its Env and nothing else, its WORKDIR, and — when the test runs
// as root — its USER, in a directory that stands for the volume /data with the owner
// and mode /data has in the layer. Only the addresses' ports (0: any free one), the
// volume's place and the upstream differ.
func runAsImage(t *testing.T, cf *v1.ConfigFile, files map[string]layerFile) {
	c := cf.Config
	// A directory the image's user can reach: the binary, and the volume in it.
	root, err := os.MkdirTemp("", "retrysafe-image-run-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "retrysafe")
	f := files[c.Entrypoint[0]]
	if err := os.WriteFile(bin, f.content, os.FileMode(f.hdr.Mode&0o777)); err != nil {
		t.Fatal(err)
	}
	vol := "/data"
	volDir := filepath.Join(root, "data")
	vh := files[vol].hdr
	if err := os.Mkdir(volDir, os.FileMode(vh.Mode&0o777)); err != nil {
		t.Fatal(err)
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		if err := os.Chown(volDir, vh.Uid, vh.Gid); err != nil {
			t.Fatal(err)
		}
		var uid, gid uint32
		if _, err := fmt.Sscanf(c.User, "%d:%d", &uid, &gid); err != nil {
			t.Fatalf("User %q: %v", c.User, err)
		}
		cred = &syscall.Credential{Uid: uid, Gid: gid, NoSetGroups: true}
	} else {
		t.Logf("not root: the binary runs as %d, not as the image's user %s", os.Geteuid(), c.User)
	}
	inImage := func(p string) string { // a path of the image, on this machine
		if rel, ok := strings.CutPrefix(p, vol); ok && (rel == "" || rel[0] == '/') {
			return volDir + rel
		}
		t.Fatalf("%s: no stand-in for this path of the image", p)
		return ""
	}
	cmdline := append(append([]string(nil), c.Entrypoint[1:]...), c.Cmd...)
	run := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env, cmd.Dir = c.Env, inImage(c.WorkingDir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	t.Run("version", func(t *testing.T) {
		out, code := run("version")
		if code != 0 || !strings.HasPrefix(out, "retrysafe ") || !strings.Contains(out, "linux/"+runtime.GOARCH) {
			t.Fatalf("retrysafe version: exit %d\n%s", code, out)
		}
	})
	t.Run("gateway --help", func(t *testing.T) {
		out, code := run(append(cmdline, "--help")...)
		if code != 0 || !strings.Contains(out, "usage: retrysafe gateway") {
			t.Fatalf("retrysafe gateway --help: exit %d\n%s", code, out)
		}
	})

	t.Run("gateway", func(t *testing.T) {
		var calls atomic.Int64
		upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := calls.Add(1)
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"charge":%d,"request":%s}`, n, body)
		}))
		defer upstream.Close()

		env := []string{"RETRYSAFE_UPSTREAM=" + upstream.URL}
		storeFile := ""
		for _, kv := range c.Env {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "RETRYSAFE_LISTEN", "RETRYSAFE_ADMIN": // the image's host, any free port
				host, _, err := net.SplitHostPort(v)
				if err != nil {
					t.Fatalf("%s: %v", kv, err)
				}
				v = net.JoinHostPort(host, "0")
			case "RETRYSAFE_STORE":
				p, ok := strings.CutPrefix(v, "sqlite:")
				if !ok {
					t.Fatalf("%s: want a SQLite store in the volume", kv)
				}
				storeFile = inImage(p)
				v = "sqlite:" + storeFile
			}
			env = append(env, k+"="+v)
		}
		cmd := exec.Command(bin, cmdline...)
		cmd.Env, cmd.Dir = env, inImage(c.WorkingDir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		logs := newLogWatch(`msg="retrysafe gateway listening" addr=(\S+) admin=(\S+)`)
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		defer func() {
			if cmd.ProcessState == nil {
				_ = cmd.Process.Kill()
				<-exited
			}
		}()

		var addrs []string
		select {
		case addrs = <-logs.match:
		case err := <-exited:
			t.Fatalf("the gateway exited before listening: %v\n%s", err, logs)
		case <-time.After(deadline):
			t.Fatalf("the gateway did not listen within %s\n%s", deadline, logs)
		}
		proxy, admin := local(t, addrs[0]), local(t, addrs[1])

		// Ready once /readyz says 200 (the store answers).
		ready := time.NewTimer(deadline)
		defer ready.Stop()
		poll := time.NewTicker(20 * time.Millisecond)
		defer poll.Stop()
		for !readyz(admin) {
			select {
			case <-poll.C:
			case err := <-exited:
				t.Fatalf("the gateway exited before /readyz said 200: %v\n%s", err, logs)
			case <-ready.C:
				t.Fatalf("/readyz did not say 200 within %s\n%s", deadline, logs)
			}
		}

		post := func() (*http.Response, string) {
			req, err := http.NewRequest(http.MethodPost, "http://"+proxy+"/payments", strings.NewReader(`{"amount":100}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Idempotency-Key", "image-test-7c0e")
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("POST through the gateway: %v\n%s", err, logs)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			return resp, string(b)
		}
		first, firstBody := post()
		second, secondBody := post()
		const want = `{"charge":1,"request":{"amount":100}}`
		if first.StatusCode != http.StatusCreated || firstBody != want || first.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("first POST: %d %q replayed %q, want 201 %s from the upstream", first.StatusCode, firstBody, first.Header.Get("Idempotent-Replayed"), want)
		}
		if second.StatusCode != http.StatusCreated || secondBody != want || second.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("second POST: %d %q replayed %q, want the first's answer replayed", second.StatusCode, secondBody, second.Header.Get("Idempotent-Replayed"))
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("the upstream ran the keyed POST %d times, want once", n)
		}
		// The store is a file of the volume, written by the image's user.
		st, err := os.Stat(storeFile)
		if err != nil {
			t.Fatalf("the store: %v\n%s", err, logs)
		}
		if cred != nil {
			if s := st.Sys().(*syscall.Stat_t); s.Uid != cred.Uid || s.Gid != cred.Gid {
				t.Errorf("%s is owned by %d:%d, want the image's user %s", path.Base(storeFile), s.Uid, s.Gid, c.User)
			}
		}

		// The image's stop signal drains the gateway, which exits 0.
		sig := map[string]syscall.Signal{"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT}[c.StopSignal]
		if sig == 0 {
			t.Fatalf("StopSignal %q", c.StopSignal)
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("after %s: %v, want exit 0\n%s", c.StopSignal, err, logs)
			}
		case <-time.After(deadline):
			t.Fatalf("the gateway did not exit within %s of %s\n%s", deadline, c.StopSignal, logs)
		}
		t.Logf("the gateway's log:\n%s", logs)
		if !strings.Contains(logs.String(), "retrysafe gateway stopped") {
			t.Errorf("no stop line in the log:\n%s", logs)
		}
	})
}

// local is the loopback address of a listener bound to addr (:0 binds all addresses).
func local(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("listening address %q: %v", addr, err)
	}
	return net.JoinHostPort("127.0.0.1", port)
}

func readyz(admin string) bool {
	resp, err := http.Get("http://" + admin + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// logWatch keeps a process's output and sends the submatches of the first line that
// matches its pattern.
type logWatch struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	partial []byte
	re      *regexp.Regexp
	match   chan []string
	sent    bool
}

func newLogWatch(pattern string) *logWatch {
	return &logWatch{re: regexp.MustCompile(pattern), match: make(chan []string, 1)}
}

func (w *logWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		line := string(w.partial[:i])
		w.partial = w.partial[i+1:]
		if m := w.re.FindStringSubmatch(line); m != nil && !w.sent {
			w.sent = true
			w.match <- m[1:]
		}
	}
	return len(p), nil
}

func (w *logWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
