package chart

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// routesA and routesB are two routes files; the tests give them as an object (A) and
// as text (B), the two forms values.routes takes.
var routesA = map[string]any{
	"upstreams": map[string]any{"api": "http://api.payments:3000", "hooks": "http://hooks.payments:3001"},
	"defaults":  map[string]any{"upstream": "api", "ttl": "24h"},
	"routes": []any{
		map[string]any{"match": "POST /payments", "conflict": "wait", "wait_timeout": "20s"},
		map[string]any{"match": "POST /webhooks/", "upstream": "hooks", "key": map[string]any{"pointer": "/id"}, "scope": "none"},
	},
}

const routesB = `upstreams:
  api: http://api.payments:3000
defaults:
  upstream: api
routes:
  - match: POST /payments
  - match: POST /refunds
  - match: PATCH /orders/{id}
`

// TestLint: helm lint finds nothing to fix, with the default values and with each
// feature on.
func TestLint(t *testing.T) {
	for name, vals := range map[string]map[string]any{
		"defaults": nil,
		"everything on": {
			"routes":         routesB,
			"tls":            map[string]any{"enabled": true, "secretName": "pay-tls"},
			"serviceMonitor": map[string]any{"enabled": true},
		},
	} {
		t.Run(name, func(t *testing.T) {
			l := lint.AllWithKubeVersion(chartDir, vals, namespace, &kubeVersion)
			for _, m := range l.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("lint: %s", m)
				} else {
					t.Logf("lint: %s", m)
				}
			}
		})
	}
}

// TestDefaults: the default values render two replicas of the image at the chart's
// appVersion, on a PostgreSQL store whose DSN and admin token come from the release's
// Secret, probed on the admin port, hardened, with a grace period that outlasts the
// gateway's shutdown, a PodDisruptionBudget and a Service naming both ports.
func TestDefaults(t *testing.T) {
	m := render(t, nil)
	d := m.deployment
	pod := d.Spec.Template.Spec
	c := container(t, pod, "gateway")

	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", d.Spec.Replicas)
	}
	if c.Image != "ghcr.io/retrysafe/retrysafe:0.1.0" {
		t.Errorf("image %q", c.Image)
	}
	if c.Args[0] != "gateway" {
		t.Errorf("args %q: want the gateway command first", c.Args)
	}
	for _, a := range []string{"--listen=:8080", "--admin=:9090", "--upstream=http://app:3000", "--upstream-timeout=30s", "--shutdown-timeout=35s", "--max-body-memory=64MiB"} {
		if !hasArg(c.Args, a) {
			t.Errorf("args %q lack %s", c.Args, a)
		}
	}
	if _, ok := argValue(c.Args, "config"); ok || m.configMap != nil {
		t.Errorf("a routes file without routes: args %q, ConfigMap %v", c.Args, m.configMap)
	}

	// The secrets: from the release's Secret, never in the pod spec.
	secretName := release + "-retrysafe"
	if s, k := envRef(c, "RETRYSAFE_STORE"); s != secretName || k != "store-dsn" {
		t.Errorf("RETRYSAFE_STORE from %s/%s", s, k)
	}
	if s, k := envRef(c, "RETRYSAFE_ADMIN_TOKEN"); s != secretName || k != "admin-token" {
		t.Errorf("RETRYSAFE_ADMIN_TOKEN from %s/%s", s, k)
	}
	if m.secret == nil || m.secret.Name != secretName {
		t.Fatalf("Secret %v, want %s", m.secret, secretName)
	}
	if got := secretValue(t, m.secret, "store-dsn"); !strings.HasPrefix(got, "postgres://") {
		t.Errorf("store-dsn %q", got)
	}
	if got := secretValue(t, m.secret, "admin-token"); len(got) < 32 {
		t.Errorf("generated admin token %q: want at least 32 characters", got)
	}
	if again := render(t, nil); secretValue(t, again.secret, "admin-token") == secretValue(t, m.secret, "admin-token") {
		t.Errorf("two installs got the same generated token")
	}

	// Probes on the admin port, by name.
	for name, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != name || p.HTTPGet.Port.String() != "admin" || p.HTTPGet.Scheme != corev1.URISchemeHTTP {
			t.Errorf("probe %s: %+v", name, p)
		}
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["proxy"] != 8080 || ports["admin"] != 9090 {
		t.Errorf("container ports %v", ports)
	}

	checkHardened(t, pod, c)
	checkGrace(t, pod, c, 5, 30, 35)

	// Memory: the limit holds the soft limit the gateway sets itself from
	// --max-body-memory (1.25 × it + 64MiB).
	limit := c.Resources.Limits[corev1.ResourceMemory]
	soft := resource.MustParse("144Mi") // 1.25 × 64MiB + 64MiB
	if limit.IsZero() || limit.Cmp(soft) <= 0 {
		t.Errorf("memory limit %s: want above the gateway's soft limit %s", limit.String(), soft.String())
	}
	if req := c.Resources.Requests[corev1.ResourceMemory]; req.Cmp(soft) < 0 {
		t.Errorf("memory request %s: want at least the soft limit %s", req.String(), soft.String())
	}

	// The PodDisruptionBudget and the Service select the pods.
	podLabels := d.Spec.Template.Labels
	if m.pdb == nil || m.pdb.Spec.MinAvailable == nil || m.pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Fatalf("PodDisruptionBudget %+v: want minAvailable 1", m.pdb)
	}
	for k, v := range m.pdb.Spec.Selector.MatchLabels {
		if podLabels[k] != v {
			t.Errorf("the PodDisruptionBudget selects %s=%s, the pods have %q", k, v, podLabels[k])
		}
	}
	for k, v := range m.service.Spec.Selector {
		if podLabels[k] != v {
			t.Errorf("the Service selects %s=%s, the pods have %q", k, v, podLabels[k])
		}
	}
	svcPorts := map[string]string{}
	for _, p := range m.service.Spec.Ports {
		svcPorts[p.Name] = strconv.Itoa(int(p.Port)) + "->" + p.TargetPort.String()
	}
	if svcPorts["proxy"] != "8080->proxy" || svcPorts["admin"] != "9090->admin" {
		t.Errorf("Service ports %v", svcPorts)
	}
	if m.serviceMonitor != nil {
		t.Errorf("a ServiceMonitor by default")
	}
	if m.serviceAccount == nil || pod.ServiceAccountName != m.serviceAccount.Name {
		t.Errorf("service account %q, rendered %v", pod.ServiceAccountName, m.serviceAccount)
	}
	if !strings.Contains(m.notes, "admin-token") {
		t.Errorf("NOTES do not say where the admin token is:\n%s", m.notes)
	}

	// What the pod runs passes the gateway's own check.
	r := runCheck(t, pod, c, releaseSecrets(t, m, nil), releaseFiles(m, nil))
	if r.code != 0 || !strings.Contains(r.stdout, "store     postgres") || !strings.Contains(r.stdout, "admin     :9090 (console on, token set)") {
		t.Errorf("gateway --check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// checkHardened: non-root as 65532, read-only root file system, no privilege
// escalation, no capability, the runtime's seccomp profile.
func checkHardened(t *testing.T, pod corev1.PodSpec, c corev1.Container) {
	t.Helper()
	ps, cs := pod.SecurityContext, c.SecurityContext
	if ps == nil || cs == nil {
		t.Fatalf("no security context: pod %v, container %v", ps, cs)
	}
	if ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser != 65532 {
		t.Errorf("pod security context %+v", ps)
	}
	if ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccomp %+v", ps.SeccompProfile)
	}
	if cs.RunAsNonRoot == nil || !*cs.RunAsNonRoot || cs.RunAsUser == nil || *cs.RunAsUser != 65532 {
		t.Errorf("container runs as %+v", cs)
	}
	if cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem {
		t.Errorf("root file system writable")
	}
	if cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation {
		t.Errorf("privilege escalation allowed")
	}
	if cs.Capabilities == nil || len(cs.Capabilities.Drop) != 1 || cs.Capabilities.Drop[0] != "ALL" || len(cs.Capabilities.Add) != 0 {
		t.Errorf("capabilities %+v", cs.Capabilities)
	}
	if cs.SeccompProfile == nil || cs.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container seccomp %+v", cs.SeccompProfile)
	}
}

// checkGrace: the preStop hook is a sleep action of preStop seconds (the image has no
// shell), the arguments carry the upstream and shutdown timeouts, and the grace period
// outlasts the three together.
func checkGrace(t *testing.T, pod corev1.PodSpec, c corev1.Container, preStop, upstream, shutdown int64) {
	t.Helper()
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Exec != nil {
		t.Fatalf("preStop %+v: want a sleep action", c.Lifecycle)
	}
	if got := c.Lifecycle.PreStop.Sleep.Seconds; got != preStop {
		t.Errorf("preStop sleeps %ds, want %d", got, preStop)
	}
	seconds := func(flag string) int64 {
		v, ok := argValue(c.Args, flag)
		d, err := time.ParseDuration(v)
		if !ok || err != nil {
			t.Fatalf("--%s %q in %q", flag, v, c.Args)
		}
		return int64(d / time.Second)
	}
	if got := seconds("upstream-timeout"); got != upstream {
		t.Errorf("--upstream-timeout %ds, want %d", got, upstream)
	}
	if got := seconds("shutdown-timeout"); got != shutdown {
		t.Errorf("--shutdown-timeout %ds, want %d", got, shutdown)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g <= preStop+upstream+shutdown {
		got := "unset"
		if g != nil {
			got = strconv.FormatInt(*g, 10)
		}
		t.Errorf("terminationGracePeriodSeconds %s: want more than %d + %d + %d", got, preStop, upstream, shutdown)
	}
}

// TestGrace: the grace period follows the timeouts and the preStop sleep of the values.
func TestGrace(t *testing.T) {
	m := render(t, map[string]any{
		"preStopSleepSeconds": 12,
		"gateway":             map[string]any{"upstreamTimeoutSeconds": 90, "shutdownTimeoutSeconds": 120},
	})
	pod := m.deployment.Spec.Template.Spec
	checkGrace(t, pod, container(t, pod, "gateway"), 12, 90, 120)
	// Without a shutdown timeout, the gateway's default: the upstream timeout + 5s.
	m = render(t, map[string]any{"gateway": map[string]any{"upstreamTimeoutSeconds": 60}})
	pod = m.deployment.Spec.Template.Spec
	checkGrace(t, pod, container(t, pod, "gateway"), 5, 60, 65)
}

// TestRedisExistingSecrets: a Redis DSN and a token from Secrets of the operator's; the
// release's Secret then holds neither, and the gateway checks out with them.
func TestRedisExistingSecrets(t *testing.T) {
	m := render(t, map[string]any{
		"store": map[string]any{"existingSecret": "cache-dsn", "key": "url", "kind": "redis"},
		"admin": map[string]any{"existingSecret": "ops-token", "key": "token"},
	})
	c := container(t, m.deployment.Spec.Template.Spec, "gateway")
	if s, k := envRef(c, "RETRYSAFE_STORE"); s != "cache-dsn" || k != "url" {
		t.Errorf("RETRYSAFE_STORE from %s/%s", s, k)
	}
	if s, k := envRef(c, "RETRYSAFE_ADMIN_TOKEN"); s != "ops-token" || k != "token" {
		t.Errorf("RETRYSAFE_ADMIN_TOKEN from %s/%s", s, k)
	}
	if m.secret != nil {
		t.Errorf("a Secret rendered though both are the operator's: %v", m.secret.Data)
	}
	// A Redis nothing listens on: the check connects to nothing.
	secrets := map[string]map[string]string{"cache-dsn": {"url": "redis://:pw@127.0.0.1:1/0"}, "ops-token": {"token": "t0ken"}}
	r := runCheck(t, m.deployment.Spec.Template.Spec, c, releaseSecrets(t, m, secrets), releaseFiles(m, nil))
	if r.code != 0 || !strings.Contains(r.stdout, "store     redis") {
		t.Errorf("gateway --check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestSingleProcessStores: SQLite and memory: hold one process's records, so more than
// one replica is refused at render; one replica renders, without a
// PodDisruptionBudget (minAvailable 1 of 1 would block every drain).
func TestSingleProcessStores(t *testing.T) {
	for _, dsn := range []string{"sqlite:/data/retrysafe.db", "memory:"} {
		_, err := renderErr(t, map[string]any{"store": map[string]any{"dsn": dsn}})
		if err == nil || !strings.Contains(err.Error(), "replicaCount 2") {
			t.Errorf("%s with 2 replicas: %v, want a refusal", dsn, err)
		}
	}
	_, err := renderErr(t, map[string]any{"store": map[string]any{"existingSecret": "s", "kind": "sqlite"}, "replicaCount": 3})
	if err == nil || !strings.Contains(err.Error(), "replicaCount 3") {
		t.Errorf("an existing sqlite Secret with 3 replicas: %v, want a refusal", err)
	}
	if _, err := renderErr(t, map[string]any{"store": map[string]any{"existingSecret": "s"}}); err == nil || !strings.Contains(err.Error(), "store.kind") {
		t.Errorf("an existing Secret without store.kind: %v, want a refusal", err)
	}
	m := render(t, map[string]any{"replicaCount": 1, "store": map[string]any{"dsn": "sqlite:/data/retrysafe.db"}})
	if m.pdb != nil {
		t.Errorf("a PodDisruptionBudget for one replica")
	}
	pod := m.deployment.Spec.Template.Spec
	c := container(t, pod, "gateway")
	mounted := false
	for _, vm := range c.VolumeMounts {
		mounted = mounted || vm.MountPath == "/data" && !vm.ReadOnly
	}
	if !mounted {
		t.Errorf("no writable /data for the SQLite file: %+v", c.VolumeMounts)
	}
	r := runCheck(t, pod, c, releaseSecrets(t, m, nil), releaseFiles(m, nil))
	if r.code != 0 || !strings.Contains(r.stdout, "store     sqlite (sqlite:/data/retrysafe.db)") {
		t.Errorf("gateway --check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestRoutes: routes become a ConfigMap mounted read-only, named by --config; the
// pod template's checksum changes with the routes and with nothing else; and the
// rendered file passes the gateway's check with its routes counted.
func TestRoutes(t *testing.T) {
	checksum := func(m *manifests) string {
		t.Helper()
		sum := m.deployment.Spec.Template.Annotations["checksum/config"]
		if len(sum) != 64 {
			t.Fatalf("checksum/config %q", sum)
		}
		return sum
	}
	a := render(t, map[string]any{"routes": routesA, "upstream": ""})
	b := render(t, map[string]any{"routes": routesB})
	none := render(t, nil)
	aAgain := render(t, map[string]any{"routes": routesA, "upstream": "", "replicaCount": 5, "image": map[string]any{"tag": "0.1.1"}, "gateway": map[string]any{"logLevel": "debug"}})
	if checksum(a) == checksum(b) || checksum(a) == checksum(none) || checksum(b) == checksum(none) {
		t.Errorf("the checksum does not follow the routes: %s %s %s", checksum(a), checksum(b), checksum(none))
	}
	if checksum(a) != checksum(aAgain) {
		t.Errorf("the checksum changed with other values than the routes")
	}
	if checksum(b) != checksum(render(t, map[string]any{"routes": routesB})) {
		t.Errorf("the checksum of the same routes differs between two renders")
	}

	if off := render(t, map[string]any{"routes": routesA, "rollOnRoutesChange": false}); off.deployment.Spec.Template.Annotations["checksum/config"] != "" {
		t.Errorf("a checksum with rollOnRoutesChange false")
	}

	for name, m := range map[string]*manifests{"object": a, "text": b} {
		pod := m.deployment.Spec.Template.Spec
		c := container(t, pod, "gateway")
		path, ok := argValue(c.Args, "config")
		if !ok || m.configMap == nil {
			t.Fatalf("%s: --config %q, ConfigMap %v", name, path, m.configMap)
		}
		var mount *corev1.VolumeMount
		for i, vm := range c.VolumeMounts {
			if strings.HasPrefix(path, vm.MountPath+"/") {
				mount = &c.VolumeMounts[i]
			}
		}
		if mount == nil || !mount.ReadOnly || mount.SubPath != "" {
			t.Fatalf("%s: %s is not on a read-only directory mount: %+v", name, path, c.VolumeMounts)
		}
		var vol *corev1.Volume
		for i, v := range pod.Volumes {
			if v.Name == mount.Name {
				vol = &pod.Volumes[i]
			}
		}
		if vol == nil || vol.ConfigMap == nil || vol.ConfigMap.Name != m.configMap.Name {
			t.Fatalf("%s: volume %+v, want the ConfigMap %s", name, vol, m.configMap.Name)
		}
		if _, ok := m.configMap.Data[strings.TrimPrefix(path, mount.MountPath+"/")]; !ok {
			t.Fatalf("%s: the ConfigMap has no file for %s: %v", name, path, m.configMap.Data)
		}
	}
	// The object is the file, as YAML.
	var got map[string]any
	if err := yaml.Unmarshal([]byte(a.configMap.Data["routes.yaml"]), &got); err != nil {
		t.Fatal(err)
	}
	if routes, _ := got["routes"].([]any); len(routes) != 2 {
		t.Errorf("routes.yaml of the object: %v", got)
	}
	if b.configMap.Data["routes.yaml"] != routesB {
		t.Errorf("routes.yaml of the text:\n%q\nwant\n%q", b.configMap.Data["routes.yaml"], routesB)
	}
	if hasArg(container(t, a.deployment.Spec.Template.Spec, "gateway").Args, "--upstream=") {
		t.Errorf("an empty upstream passed as a flag")
	}

	for name, c := range map[string]struct {
		m    *manifests
		want []string
	}{
		"object": {a, []string{"routes    2 (", "http://api.payments:3000, http://hooks.payments:3001"}},
		"text":   {b, []string{"routes    3 (", "upstream  http://app:3000"}},
	} {
		pod := c.m.deployment.Spec.Template.Spec
		r := runCheck(t, pod, container(t, pod, "gateway"), releaseSecrets(t, c.m, nil), releaseFiles(c.m, nil))
		if r.code != 0 {
			t.Errorf("%s: gateway --check: exit %d\n%s%s", name, r.code, r.stdout, r.stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("%s: the summary has no %q:\n%s", name, w, r.stdout)
			}
		}
	}
}

// TestRefusedByTheBinary: values the chart renders but the gateway refuses (its rules
// between options, a route naming no upstream) fail the check, exit 2, one line each.
func TestRefusedByTheBinary(t *testing.T) {
	for name, c := range map[string]struct {
		vals map[string]any
		want []string
	}{
		"ttl under the lease":  {map[string]any{"gateway": map[string]any{"extraArgs": []any{"--ttl=10s", "--lease=30s"}}}, []string{"--ttl"}},
		"bad size":             {map[string]any{"gateway": map[string]any{"maxBodyMemory": "lots"}}, []string{"lots"}},
		"route to no upstream": {map[string]any{"routes": "routes:\n  - match: POST /payments\n    upstream: nowhere\n"}, []string{"nowhere"}},
		"bad store DSN":        {map[string]any{"store": map[string]any{"dsn": "postgres:db"}}, []string{"--store"}},
	} {
		t.Run(name, func(t *testing.T) {
			m := render(t, c.vals)
			pod := m.deployment.Spec.Template.Spec
			r := runCheck(t, pod, container(t, pod, "gateway"), releaseSecrets(t, m, nil), releaseFiles(m, nil))
			lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
			if r.code != 2 || r.stdout != "" || len(lines) != len(c.want) {
				t.Fatalf("gateway --check: exit %d, want 2 with %d line(s)\n%s%s", r.code, len(c.want), r.stdout, r.stderr)
			}
			for i, w := range c.want {
				if !strings.Contains(lines[i], w) {
					t.Errorf("line %q, want %q", lines[i], w)
				}
			}
		})
	}
}

// TestTLS: a kubernetes.io/tls Secret mounted read-only, its files passed as
// --tls-cert and --tls-key, the probes in HTTPS; the ServiceMonitor scrapes in HTTPS.
func TestTLS(t *testing.T) {
	if _, err := renderErr(t, map[string]any{"tls": map[string]any{"enabled": true}}); err == nil || !strings.Contains(err.Error(), "tls.secretName") {
		t.Errorf("tls without a Secret: %v, want a refusal", err)
	}
	m := render(t, map[string]any{
		"tls":            map[string]any{"enabled": true, "secretName": "pay-tls"},
		"serviceMonitor": map[string]any{"enabled": true, "tlsConfig": map[string]any{"serverName": "pay-retrysafe.payments.svc"}},
	})
	pod := m.deployment.Spec.Template.Spec
	c := container(t, pod, "gateway")
	cert, certOK := argValue(c.Args, "tls-cert")
	key, keyOK := argValue(c.Args, "tls-key")
	if !certOK || !keyOK {
		t.Fatalf("args %q lack --tls-cert or --tls-key", c.Args)
	}
	var tlsVol string
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "pay-tls" {
			tlsVol = v.Name
		}
	}
	var mount *corev1.VolumeMount
	for i, vm := range c.VolumeMounts {
		if vm.Name == tlsVol {
			mount = &c.VolumeMounts[i]
		}
	}
	if tlsVol == "" || mount == nil || !mount.ReadOnly || cert != mount.MountPath+"/tls.crt" || key != mount.MountPath+"/tls.key" {
		t.Fatalf("the Secret pay-tls is not mounted read-only where --tls-cert %s and --tls-key %s point: %+v", cert, key, c.VolumeMounts)
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("probe %s in %s", p.HTTPGet.Path, p.HTTPGet.Scheme)
		}
	}
	ep := serviceMonitorEndpoint(t, m.serviceMonitor)
	if ep["scheme"] != "https" {
		t.Errorf("ServiceMonitor scheme %v", ep["scheme"])
	}
	if sn, _, _ := unstructured.NestedString(ep, "tlsConfig", "serverName"); sn != "pay-retrysafe.payments.svc" {
		t.Errorf("ServiceMonitor tlsConfig %v", ep["tlsConfig"])
	}

}

// TestTLSCheck: the rendered TLS arguments and the mounted pair pass the gateway's
// check, which reads the pair.
func TestTLSCheck(t *testing.T) {
	m := render(t, map[string]any{"tls": map[string]any{"enabled": true, "secretName": "pay-tls"}})
	pod := m.deployment.Spec.Template.Spec
	c := container(t, pod, "gateway")
	var tlsVol string
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "pay-tls" {
			tlsVol = v.Name
		}
	}
	crt, k := selfSigned(t)
	r := runCheck(t, pod, c, releaseSecrets(t, m, nil), releaseFiles(m, podFiles{tlsVol: {"tls.crt": crt, "tls.key": k}}))
	if r.code != 0 {
		t.Errorf("gateway --check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestServiceMonitor: off by default (TestDefaults); on, it scrapes /metrics on the
// admin port with the admin token as bearer, from the Secret the pod reads it from.
func TestServiceMonitor(t *testing.T) {
	for name, c := range map[string]struct {
		vals            map[string]any
		secret, key     string
		wantSchemeEmpty bool
	}{
		"generated token": {map[string]any{"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}}}, release + "-retrysafe", "admin-token", true},
		"existing token":  {map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "admin": map[string]any{"existingSecret": "ops", "key": "tok"}}, "ops", "tok", true},
	} {
		t.Run(name, func(t *testing.T) {
			m := render(t, c.vals)
			sm := m.serviceMonitor
			if sm == nil || sm.GetAPIVersion() != "monitoring.coreos.com/v1" || sm.GetKind() != "ServiceMonitor" {
				t.Fatalf("ServiceMonitor %v", sm)
			}
			sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
			if len(sel) == 0 {
				t.Errorf("no selector")
			}
			for k, v := range sel {
				if m.service.Labels[k] != v {
					t.Errorf("selects %s=%s; the Service has %q", k, v, m.service.Labels[k])
				}
			}
			ep := serviceMonitorEndpoint(t, sm)
			if ep["port"] != "admin" || ep["path"] != "/metrics" {
				t.Errorf("endpoint %v", ep)
			}
			typ, _, _ := unstructured.NestedString(ep, "authorization", "type")
			name, _, _ := unstructured.NestedString(ep, "authorization", "credentials", "name")
			key, _, _ := unstructured.NestedString(ep, "authorization", "credentials", "key")
			if typ != "Bearer" || name != c.secret || key != c.key {
				t.Errorf("authorization %s from %s/%s, want Bearer from %s/%s", typ, name, key, c.secret, c.key)
			}
			pod := m.deployment.Spec.Template.Spec
			if s, k := envRef(container(t, pod, "gateway"), "RETRYSAFE_ADMIN_TOKEN"); s != name || k != key {
				t.Errorf("the pod reads its token from %s/%s, the scrape from %s/%s", s, k, name, key)
			}
			if _, has := ep["scheme"]; has == c.wantSchemeEmpty {
				t.Errorf("scheme %v without TLS", ep["scheme"])
			}
		})
	}
}

func serviceMonitorEndpoint(t *testing.T, sm *unstructured.Unstructured) map[string]any {
	t.Helper()
	if sm == nil {
		t.Fatal("no ServiceMonitor rendered")
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("endpoints %v", eps)
	}
	ep, ok := eps[0].(map[string]any)
	if !ok {
		t.Fatalf("endpoint %v", eps[0])
	}
	return ep
}

// TestSidecarExample: deploy/examples/sidecar.yaml decodes strictly; its Service
// reaches the gateway's port and no other; the gateway forwards to the application
// over loopback, hardened, with a grace period that outlasts its shutdown; and its
// container passes the gateway's check with the manifest's own Secret.
func TestSidecarExample(t *testing.T) {
	text, err := os.ReadFile("../examples/sidecar.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := &manifests{}
	for _, doc := range splitDocs(string(text)) {
		decodeInto(t, "sidecar.yaml", doc, m)
	}
	if m.deployment == nil || m.service == nil || m.secret == nil {
		t.Fatalf("want a Deployment, a Service and a Secret")
	}
	pod := m.deployment.Spec.Template.Spec
	if len(pod.Containers) != 2 {
		t.Fatalf("%d containers, want the application and the gateway", len(pod.Containers))
	}
	gw := container(t, pod, "retrysafe")
	app := container(t, pod, "app")
	if !hasArg(gw.Args, "--upstream=http://127.0.0.1:3000") || !hasArg(gw.Args, "--listen=:8080") {
		t.Errorf("gateway args %q", gw.Args)
	}
	if len(app.Ports) != 0 {
		t.Errorf("the application exposes %v: keyed requests could bypass the gateway", app.Ports)
	}
	gwPorts := map[string]int32{}
	for _, p := range gw.Ports {
		gwPorts[p.Name] = p.ContainerPort
	}
	if len(m.service.Spec.Ports) != 1 {
		t.Fatalf("Service ports %v", m.service.Spec.Ports)
	}
	if tp := m.service.Spec.Ports[0].TargetPort.String(); gwPorts[tp] != 8080 {
		t.Errorf("the Service targets %s, not the gateway's 8080 (%v)", tp, gwPorts)
	}
	for k, v := range m.service.Spec.Selector {
		if m.deployment.Spec.Template.Labels[k] != v {
			t.Errorf("the Service selects %s=%s", k, v)
		}
	}
	checkHardened(t, pod, gw)
	checkGrace(t, pod, gw, 5, 30, 35)
	for name, p := range map[string]*corev1.Probe{"/healthz": gw.LivenessProbe, "/readyz": gw.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != name || gwPorts[p.HTTPGet.Port.String()] != 9090 {
			t.Errorf("probe %s: %+v", name, p)
		}
	}
	r := runCheck(t, pod, gw, releaseSecrets(t, m, nil), nil)
	if r.code != 0 || !strings.Contains(r.stdout, "upstream  http://127.0.0.1:3000") || !strings.Contains(r.stdout, "listen    :8080") {
		t.Errorf("gateway --check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// selfSigned returns a PEM certificate and key for the Service's name.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "pay-retrysafe.payments.svc"},
		DNSNames:     []string{"pay-retrysafe.payments.svc"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}
