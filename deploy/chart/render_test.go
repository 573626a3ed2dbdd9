// Package chart tests the Helm chart deploy/helm/retrysafe and the sidecar example
// deploy/examples/sidecar.yaml without a cluster: no cluster runs here, so the tests
// lint the chart, render it with Helm's own engine under several sets of values, decode
// every rendered document strictly into the Kubernetes API types (a field the API does
// not know is an error), check the properties the chart promises, and run the rendered
// gateway container's command, arguments, environment and mounted files through the
// real binary's `retrysafe gateway --check`. They apply nothing.
package chart

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "../helm/retrysafe"
	release   = "pay"
	namespace = "payments"
)

// kubeVersion is the cluster the chart is rendered for: the oldest it supports
// (lifecycle sleep actions are on by default from 1.30).
var kubeVersion = chartutil.KubeVersion{Version: "v1.30.0", Major: "1", Minor: "30"}

// loadChart loads the chart from its directory, as helm install does.
func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	return ch
}

// renderErr renders the chart with vals (coalesced with values.yaml, checked against
// values.schema.json) as helm install does, and returns each template's output.
func renderErr(t *testing.T, vals map[string]any) (map[string]string, error) {
	t.Helper()
	ch := loadChart(t)
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = kubeVersion
	top, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, top)
}

// manifests is a rendered release, decoded.
type manifests struct {
	deployment     *appsv1.Deployment
	service        *corev1.Service
	configMap      *corev1.ConfigMap
	secret         *corev1.Secret
	pdb            *policyv1.PodDisruptionBudget
	serviceAccount *corev1.ServiceAccount
	serviceMonitor *unstructured.Unstructured
	notes          string
}

// render renders the chart with vals and decodes every document strictly.
func render(t *testing.T, vals map[string]any) *manifests {
	t.Helper()
	out, err := renderErr(t, vals)
	if err != nil {
		t.Fatalf("rendering with %v: %v", vals, err)
	}
	m := &manifests{}
	for name, text := range out {
		if strings.HasSuffix(name, "NOTES.txt") {
			m.notes = text
			continue
		}
		for _, doc := range splitDocs(text) {
			decodeInto(t, name, doc, m)
		}
	}
	if m.deployment == nil || m.service == nil {
		t.Fatalf("no Deployment or Service rendered: %v", out)
	}
	return m
}

// splitDocs splits a YAML stream into its non-empty documents.
func splitDocs(text string) []string {
	var out []string
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(text, -1) {
		if strings.TrimSpace(stripComments(doc)) != "" {
			out = append(out, doc)
		}
	}
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// strict decodes doc into v, refusing fields v's type does not have (through JSON's
// DisallowUnknownFields) and duplicate keys.
func strict(t *testing.T, where, doc string, v any) {
	t.Helper()
	if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
		t.Fatalf("%s: %v\n%s", where, err, doc)
	}
}

func decodeInto(t *testing.T, where, doc string, m *manifests) {
	t.Helper()
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	set := func(dst any, have bool) {
		if have {
			t.Fatalf("%s: a second %s", where, tm.Kind)
		}
		strict(t, where, doc, dst)
	}
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 Deployment":
		set(&m.deployment, m.deployment != nil)
	case "v1 Service":
		set(&m.service, m.service != nil)
	case "v1 ConfigMap":
		set(&m.configMap, m.configMap != nil)
	case "v1 Secret":
		set(&m.secret, m.secret != nil)
	case "policy/v1 PodDisruptionBudget":
		set(&m.pdb, m.pdb != nil)
	case "v1 ServiceAccount":
		set(&m.serviceAccount, m.serviceAccount != nil)
	case "monitoring.coreos.com/v1 ServiceMonitor":
		u := &unstructured.Unstructured{}
		strict(t, where, doc, &u.Object)
		m.serviceMonitor = u
	default:
		t.Fatalf("%s: unexpected %s %s", where, tm.APIVersion, tm.Kind)
	}
}

// gateway is the pod's container named name.
func container(t *testing.T, pod corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range pod.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

// envRef is the secret a container's variable is read from ("" when it is not).
func envRef(c corev1.Container, name string) (secret, key string) {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key
		}
	}
	return "", ""
}

// hasArg reports whether args hold arg.
func hasArg(args []string, arg string) bool {
	for _, a := range args {
		if a == arg {
			return true
		}
	}
	return false
}

// argValue is the value of --name=VALUE in args, and whether it is there.
func argValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// secretValue reads key of the rendered Secret (data or stringData).
func secretValue(t *testing.T, s *corev1.Secret, key string) string {
	t.Helper()
	if s == nil {
		t.Fatalf("no Secret rendered")
	}
	if v, ok := s.StringData[key]; ok {
		return v
	}
	v, ok := s.Data[key]
	if !ok {
		t.Fatalf("Secret %s has no key %s", s.Name, key)
	}
	return string(v)
}

// ---- the binary ----

// binary is the retrysafe binary TestMain built from the repository.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "retrysafe-chart-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "retrysafe")
	build := exec.Command("go", "build", "-o", binary, "./cmd/retrysafe")
	build.Dir = filepath.Join("..", "..") // the repository's root module
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building retrysafe:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// podFiles are the files a check needs at the paths the pod mounts them: the data of
// ConfigMaps and Secrets by volume name (the rendered ones, or the test's for a Secret
// the release does not create).
type podFiles map[string]map[string][]byte

// checkResult is what `gateway --check` printed and its status.
type checkResult struct {
	stdout, stderr string
	code           int
}

// runCheck runs container c of pod as the kubelet would, but through `--check` and on
// this machine: its command with /retrysafe as the built binary, its arguments with
// every mount path moved under a temporary root, its environment with each secretKeyRef
// read from secrets (name → key → value), and the files of its volumes written there.
func runCheck(t *testing.T, pod corev1.PodSpec, c corev1.Container, secrets map[string]map[string]string, files podFiles) checkResult {
	t.Helper()
	root := t.TempDir()
	if len(c.Command) == 0 || c.Command[0] != "/retrysafe" {
		t.Fatalf("command %q: want /retrysafe (the image's binary)", c.Command)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	var mounts []string
	for _, vm := range c.VolumeMounts {
		v, ok := volumes[vm.Name]
		if !ok {
			t.Fatalf("mount %s of no volume", vm.Name)
		}
		dir := filepath.Join(root, vm.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		mounts = append(mounts, vm.MountPath)
		var data map[string][]byte
		switch {
		case v.ConfigMap != nil, v.Secret != nil:
			data = files[vm.Name]
			if data == nil {
				t.Fatalf("volume %s: the test has no files for it", vm.Name)
			}
		case v.EmptyDir != nil, v.PersistentVolumeClaim != nil:
		default:
			t.Fatalf("volume %s of an unexpected kind", vm.Name)
		}
		for name, b := range data {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	args := make([]string, 0, len(c.Args)+1)
	for _, a := range append(c.Command[1:], c.Args...) {
		for _, mp := range mounts {
			a = strings.ReplaceAll(a, mp+"/", filepath.Join(root, mp)+"/")
		}
		args = append(args, a)
	}
	args = append(args, "--check")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RETRYSAFE_") {
			env = append(env, kv)
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := secrets[ref.Name][ref.Key]
			if !ok {
				t.Fatalf("%s: no value for secret %s key %s", e.Name, ref.Name, ref.Key)
			}
			env = append(env, e.Name+"="+v)
		default:
			t.Fatalf("%s: an unexpected valueFrom", e.Name)
		}
	}
	return runBinary(t, env, args...)
}

// runBinary runs the built binary with args in env (nil: this process's, without
// RETRYSAFE_ variables).
func runBinary(t *testing.T, env []string, args ...string) checkResult {
	t.Helper()
	if env == nil {
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "RETRYSAFE_") {
				env = append(env, kv)
			}
		}
	}
	cmd := exec.Command(binary, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatal(err)
	}
	return checkResult{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}

// releaseSecrets are the Secrets a rendered release's pod reads: the one it renders,
// plus extra (existing Secrets the values name).
func releaseSecrets(t *testing.T, m *manifests, extra map[string]map[string]string) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for k, v := range extra {
		out[k] = v
	}
	if m.secret != nil {
		vals := map[string]string{}
		for k := range m.secret.Data {
			vals[k] = secretValue(t, m.secret, k)
		}
		for k := range m.secret.StringData {
			vals[k] = secretValue(t, m.secret, k)
		}
		out[m.secret.Name] = vals
	}
	return out
}

// releaseFiles are the files of a rendered release's volumes: its ConfigMap's, and
// extra (Secrets it mounts but does not create).
func releaseFiles(m *manifests, extra podFiles) podFiles {
	out := podFiles{}
	for k, v := range extra {
		out[k] = v
	}
	for _, v := range m.deployment.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && m.configMap != nil && v.ConfigMap.Name == m.configMap.Name {
			data := map[string][]byte{}
			for k, s := range m.configMap.Data {
				data[k] = []byte(s)
			}
			out[v.Name] = data
		}
	}
	return out
}
