// Package charttest tests the Helm chart in deploy/helm/dedupworker without
// a cluster: helm lint and helm template over the values files in the
// chart's ci/ folder, every rendered manifest decoded strictly into the
// Kubernetes API types, and the rendered config run through
// `dedupworker validate`.
//
// helm is found from $HELM, then the repo's .ci/bin/helm (bash .ci/helm.sh
// builds it), then PATH. Without it the helm tests are skipped, or failed
// under DEDUP_REQUIRE_SERVICES=1.
package charttest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/idemkit/dedupworker/deploy/internal/deploytest"
	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/internal/testenv"
)

const (
	release   = "dw"
	namespace = "work"
	fullname  = "dw-dedupworker"
)

var (
	repoRoot string
	chartDir string
	helmPath string // "" when helm was not found
	helmWhy  string
	binPath  string
)

func TestMain(m *testing.M) {
	code, err := setup(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "charttest:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func setup(m *testing.M) (int, error) {
	var err error
	if repoRoot, err = deploytest.RepoRoot(); err != nil {
		return 0, err
	}
	chartDir = filepath.Join(repoRoot, "deploy", "helm", "dedupworker")
	helmPath, helmWhy = findHelm()
	dir, err := os.MkdirTemp("", "charttest-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	if binPath, err = deploytest.BuildBinary(dir); err != nil {
		return 0, err
	}
	return m.Run(), nil
}

// findHelm looks in $HELM, <repo>/.ci/bin/helm, then PATH.
func findHelm() (path, why string) {
	if h := os.Getenv("HELM"); h != "" {
		if _, err := exec.LookPath(h); err != nil {
			return "", "HELM=" + h + " is not an executable: " + err.Error()
		}
		return h, ""
	}
	if h := filepath.Join(repoRoot, ".ci", "bin", "helm"); isExecutable(h) {
		return h, ""
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h, ""
	}
	return "", "no $HELM, no .ci/bin/helm and no helm on PATH; run `bash .ci/helm.sh` to build it"
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

func needHelm(t *testing.T) {
	t.Helper()
	if helmPath == "" {
		testenv.Unavailable(t, "helm", helmWhy)
	}
}

// helm runs helm and returns its stdout, stderr and error.
func helm(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, helmPath, args...)
	// Keep helm away from the user's repositories, plugins and cache.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// render runs helm template with the values files and --set flags.
func render(t *testing.T, valuesFiles []string, sets ...string) (string, error) {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", namespace}
	for _, f := range valuesFiles {
		args = append(args, "--values", f)
	}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, stderr, err := helm(t, args...)
	if err != nil {
		return out, fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return out, nil
}

func ciValuesFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 4 {
		t.Fatalf("%d values files in %s/ci: want at least 4 (minimal Kafka, NATS with KEDA, Redis Cluster with TLS and existing Secrets, ServiceMonitor+HPA+PDB)", len(files), chartDir)
	}
	return files
}

func TestHelmLint(t *testing.T) {
	needHelm(t)
	for _, f := range ciValuesFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			out, stderr, err := helm(t, "lint", "--strict", chartDir, "--namespace", namespace, "--values", f)
			if err != nil {
				t.Fatalf("helm lint: %v\n%s%s", err, out, stderr)
			}
		})
	}
}

// manifests is one render, decoded.
type manifests struct {
	deployment      *appsv1.Deployment
	configMaps      []*corev1.ConfigMap
	secrets         []*corev1.Secret
	services        []*corev1.Service
	serviceAccounts []*corev1.ServiceAccount
	pdbs            []*policyv1.PodDisruptionBudget
	hpas            []*autoscalingv2.HorizontalPodAutoscaler
	serviceMonitors []map[string]any
	scaledObjects   []map[string]any
	prometheusRules []*prometheusRule
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeStrict converts one YAML document to JSON, rejecting duplicate keys,
// and decodes it into out rejecting any field out's type does not have.
func decodeStrict(doc []byte, out any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the object")
	}
	return nil
}

// decodeAll splits helm template output and decodes every document into
// its Kubernetes API type; a kind the chart should not make fails.
func decodeAll(t *testing.T, out string) manifests {
	t.Helper()
	var m manifests
	n := 0
	for _, doc := range docSep.Split(out, -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		n++
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("not YAML: %v\n%s", err, doc)
		}
		var target any
		switch head.APIVersion + "/" + head.Kind {
		case "v1/ConfigMap":
			v := &corev1.ConfigMap{}
			m.configMaps, target = append(m.configMaps, v), v
		case "v1/Secret":
			v := &corev1.Secret{}
			m.secrets, target = append(m.secrets, v), v
		case "v1/Service":
			v := &corev1.Service{}
			m.services, target = append(m.services, v), v
		case "v1/ServiceAccount":
			v := &corev1.ServiceAccount{}
			m.serviceAccounts, target = append(m.serviceAccounts, v), v
		case "apps/v1/Deployment":
			if m.deployment != nil {
				t.Fatal("two Deployments")
			}
			m.deployment = &appsv1.Deployment{}
			target = m.deployment
		case "policy/v1/PodDisruptionBudget":
			v := &policyv1.PodDisruptionBudget{}
			m.pdbs, target = append(m.pdbs, v), v
		case "autoscaling/v2/HorizontalPodAutoscaler":
			v := &autoscalingv2.HorizontalPodAutoscaler{}
			m.hpas, target = append(m.hpas, v), v
		case "monitoring.coreos.com/v1/ServiceMonitor":
			v := map[string]any{} // decoding fills this very map
			m.serviceMonitors, target = append(m.serviceMonitors, v), &v
		case "monitoring.coreos.com/v1/PrometheusRule":
			v := &prometheusRule{}
			m.prometheusRules, target = append(m.prometheusRules, v), v
		case "keda.sh/v1alpha1/ScaledObject":
			v := map[string]any{}
			m.scaledObjects, target = append(m.scaledObjects, v), &v
		default:
			t.Fatalf("unexpected object %s %s:\n%s", head.APIVersion, head.Kind, doc)
		}
		if err := decodeStrict([]byte(doc), target); err != nil {
			t.Fatalf("%s %s does not decode strictly into its API type: %v\n%s", head.APIVersion, head.Kind, err, doc)
		}
	}
	if n == 0 {
		t.Fatal("helm template rendered nothing")
	}
	if m.deployment == nil {
		t.Fatal("no Deployment rendered")
	}
	return m
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

// TestStrictDecodeRejectsMisspeltField: the decoding the render tests rely
// on fails on a field the API type does not have.
func TestStrictDecodeRejectsMisspeltField(t *testing.T) {
	good := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicas: 2\n  template:\n    spec:\n      terminationGracePeriodSeconds: 45\n"
	if err := decodeStrict([]byte(good), &appsv1.Deployment{}); err != nil {
		t.Fatalf("a valid Deployment: %v", err)
	}
	for _, bad := range []string{
		strings.Replace(good, "replicas:", "replica:", 1),
		strings.Replace(good, "terminationGracePeriodSeconds", "terminationGracePeriod", 1),
		good + "  replicas: 3\n", // duplicate key
	} {
		if err := decodeStrict([]byte(bad), &appsv1.Deployment{}); err == nil {
			t.Errorf("decoded without error:\n%s", bad)
		}
	}
}

// valuesFile reads a values file as a generic map.
func valuesFile(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v := map[string]any{}
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func dig(m map[string]any, path ...string) any {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[p]
	}
	return cur
}

// TestTemplate renders each ci values file and checks the objects.
func TestTemplate(t *testing.T) {
	needHelm(t)
	for _, f := range ciValuesFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			out, err := render(t, []string{f})
			if err != nil {
				t.Fatal(err)
			}
			m := decodeAll(t, out)
			vals := valuesFile(t, f)
			checkDeployment(t, m, vals)
			env := containerEnv(t, m.deployment)
			cfgText := renderedConfig(t, m)
			cfg, err := config.Parse([]byte(cfgText), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
			if err != nil {
				t.Fatalf("the rendered config does not load with the pod's environment: %v\n%s", err, cfgText)
			}
			checkGrace(t, m.deployment, cfg)
			checkPort(t, m.deployment, cfg)
			checkSecretFiles(t, m.deployment, cfg)
			checkNoSecretInConfigMaps(t, m, vals)
			checkService(t, m)
			checkScaling(t, m, vals)
			checkPrometheusRule(t, m, vals)
			validate(t, cfgText, env)
		})
	}
}

func checkDeployment(t *testing.T, m manifests, vals map[string]any) {
	t.Helper()
	d := m.deployment
	if d.Name != fullname {
		t.Errorf("Deployment name %q, want %q", d.Name, fullname)
	}
	pod := d.Spec.Template.Spec
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("pod securityContext: runAsNonRoot not true: %+v", psc)
	}
	if psc == nil || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Error("pod securityContext: runAsUser is root or unset")
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("pod securityContext: seccompProfile is not RuntimeDefault")
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the pod mounts a service account token; the worker uses no Kubernetes API")
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("container has no securityContext")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("container: readOnlyRootFilesystem is not true")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("container: allowPrivilegeEscalation is not false")
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
		t.Error("container: runAsNonRoot is not true")
	case sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0:
		t.Errorf("container capabilities %+v: want drop [ALL] and nothing added", sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Error("container: seccompProfile is not RuntimeDefault")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}
	if got, want := strings.Join(c.Args, " "), "run -c /etc/dedupworker/config.yaml"; got != want {
		t.Errorf("args %q, want %q", got, want)
	}
	probe := func(name string, p *corev1.Probe, path string) {
		switch {
		case p == nil || p.HTTPGet == nil:
			t.Errorf("%s: want an httpGet probe", name)
		case p.HTTPGet.Path != path || p.HTTPGet.Port.String() != "metrics":
			t.Errorf("%s: GET %s on port %s, want %s on metrics", name, p.HTTPGet.Path, p.HTTPGet.Port.String(), path)
		case p.TimeoutSeconds < 1 || p.PeriodSeconds < 1:
			t.Errorf("%s: timeout %ds period %ds", name, p.TimeoutSeconds, p.PeriodSeconds)
		}
	}
	probe("livenessProbe", c.LivenessProbe, "/healthz")
	probe("readinessProbe", c.ReadinessProbe, "/readyz")
	if rp := c.ReadinessProbe; rp != nil && rp.TimeoutSeconds < 3 {
		t.Errorf("readinessProbe timeout %ds: /readyz may take 2s per check", rp.TimeoutSeconds)
	}

	sum := d.Spec.Template.Annotations["checksum/config"]
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(sum) {
		t.Errorf("pod annotation checksum/config = %q, want a sha256", sum)
	}
	// The config file is the ConfigMap's config.yaml.
	var cfgVolume string
	for _, vm := range c.VolumeMounts {
		if vm.MountPath == "/etc/dedupworker/config.yaml" {
			cfgVolume = vm.Name
			if vm.SubPath != "config.yaml" || !vm.ReadOnly {
				t.Errorf("config mount %+v: want subPath config.yaml, read-only", vm)
			}
		}
	}
	if v := volume(pod, cfgVolume); v == nil || v.ConfigMap == nil || v.ConfigMap.Name != fullname {
		t.Errorf("/etc/dedupworker/config.yaml is not mounted from ConfigMap %s", fullname)
	}
	// Pod labels select the pods of the Deployment and only them.
	for k, v := range d.Spec.Selector.MatchLabels {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod template labels", k, v)
		}
	}
	scaled := dig(vals, "autoscaling", "enabled") == true || dig(vals, "keda", "enabled") == true
	if scaled && d.Spec.Replicas != nil {
		t.Errorf("replicas %d set although an autoscaler owns the count", *d.Spec.Replicas)
	}
	if !scaled && d.Spec.Replicas == nil {
		t.Error("no replicas without an autoscaler")
	}
}

func volume(pod corev1.PodSpec, name string) *corev1.Volume {
	for i := range pod.Volumes {
		if pod.Volumes[i].Name == name {
			return &pod.Volumes[i]
		}
	}
	return nil
}

// containerEnv is the container's environment as the config sees it:
// literal values, and a stand-in for each value taken from a Secret.
func containerEnv(t *testing.T, d *appsv1.Deployment) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "from-secret-" + e.ValueFrom.SecretKeyRef.Name + "-" + e.ValueFrom.SecretKeyRef.Key
		case e.ValueFrom != nil:
			env[e.Name] = "from-" + e.Name
		default:
			env[e.Name] = e.Value
		}
	}
	return env
}

func renderedConfig(t *testing.T, m manifests) string {
	t.Helper()
	for _, cm := range m.configMaps {
		if cm.Name == fullname {
			text, ok := cm.Data["config.yaml"]
			if !ok {
				t.Fatalf("ConfigMap %s has no config.yaml", cm.Name)
			}
			return text
		}
	}
	t.Fatalf("no ConfigMap %s", fullname)
	return ""
}

func checkGrace(t *testing.T, d *appsv1.Deployment, cfg *config.Config) {
	t.Helper()
	g := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if g == nil {
		t.Fatal("no terminationGracePeriodSeconds")
	}
	if grace := time.Duration(*g) * time.Second; grace <= cfg.ShutdownTimeout.D() {
		t.Errorf("terminationGracePeriodSeconds %s is not above shutdown_timeout %s", grace, cfg.ShutdownTimeout)
	}
}

func checkPort(t *testing.T, d *appsv1.Deployment, cfg *config.Config) {
	t.Helper()
	addr := *cfg.HTTP.Addr
	host, port, ok := strings.Cut(addr, ":")
	if !ok || (host != "0.0.0.0" && host != "" && host != "[::]") {
		t.Errorf("config http.addr %q does not listen on the pod's address", addr)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if len(c.Ports) != 1 || c.Ports[0].Name != "metrics" || fmt.Sprint(c.Ports[0].ContainerPort) != port {
		t.Errorf("container ports %+v: want one named metrics on %s (http.addr %s)", c.Ports, port, addr)
	}
}

// checkSecretFiles: every password_file and creds_file of the config is a
// file mounted from a Secret.
func checkSecretFiles(t *testing.T, d *appsv1.Deployment, cfg *config.Config) {
	t.Helper()
	var files []string
	add := func(f string) {
		if f != "" {
			files = append(files, f)
		}
	}
	add(cfg.Redis.PasswordFile)
	if s := cfg.Redis.Sentinel; s != nil {
		add(s.PasswordFile)
	}
	for _, h := range cfg.Handlers {
		if k := h.Source.Kafka; k != nil && k.SASL != nil {
			add(k.SASL.PasswordFile)
		}
		if n := h.Source.NATS; n != nil {
			add(n.CredsFile)
		}
		if f := h.Action.Forward; f != nil && f.Kafka != nil && f.Kafka.SASL != nil {
			add(f.Kafka.SASL.PasswordFile)
		}
		if dl := h.DeadLetter; dl != nil && dl.Kafka != nil && dl.Kafka.SASL != nil {
			add(dl.Kafka.SASL.PasswordFile)
		}
	}
	pod := d.Spec.Template.Spec
	for _, f := range files {
		found := false
		for _, vm := range pod.Containers[0].VolumeMounts {
			rel, err := filepath.Rel(vm.MountPath, f)
			if err != nil || strings.HasPrefix(rel, "..") {
				continue
			}
			v := volume(pod, vm.Name)
			if v == nil || v.Secret == nil {
				t.Errorf("%s is under mount %s, which is not a Secret", f, vm.MountPath)
				continue
			}
			for _, it := range v.Secret.Items {
				found = found || it.Path == rel
			}
		}
		if !found {
			t.Errorf("the config reads %s, which no Secret volume provides", f)
		}
	}
}

// checkNoSecretInConfigMaps: no value of a Secret the chart renders, and no
// secret given in the values, appears in any ConfigMap.
func checkNoSecretInConfigMaps(t *testing.T, m manifests, vals map[string]any) {
	t.Helper()
	var secrets []string
	for _, s := range m.secrets {
		for _, v := range s.Data {
			secrets = append(secrets, string(v))
		}
		for _, v := range s.StringData {
			secrets = append(secrets, v)
		}
	}
	for _, which := range []string{"redis", "kafkaSasl", "nats"} {
		for _, k := range []string{"password", "value"} {
			if s, ok := dig(vals, "secrets", which, k).(string); ok && s != "" {
				secrets = append(secrets, s)
			}
		}
	}
	for _, cm := range m.configMaps {
		for key, data := range cm.Data {
			for _, s := range secrets {
				for line := range strings.SplitSeq(s, "\n") {
					if line = strings.TrimSpace(line); len(line) >= 6 && strings.Contains(data, line) {
						t.Errorf("ConfigMap %s key %s holds secret text %q", cm.Name, key, line)
					}
				}
				if b64 := base64.StdEncoding.EncodeToString([]byte(s)); strings.Contains(data, b64) {
					t.Errorf("ConfigMap %s key %s holds a base64 secret", cm.Name, key)
				}
			}
		}
	}
}

func checkService(t *testing.T, m manifests) {
	t.Helper()
	if len(m.services) != 1 {
		t.Fatalf("%d Services, want 1", len(m.services))
	}
	s := m.services[0]
	if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Name != "metrics" || s.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("Service ports %+v: want one named metrics targeting metrics", s.Spec.Ports)
	}
	podLabels := m.deployment.Spec.Template.Labels
	for k, v := range s.Spec.Selector {
		if podLabels[k] != v {
			t.Errorf("Service selector %s=%s matches no pod label", k, v)
		}
	}
	for _, sm := range m.serviceMonitors {
		checkUnstructured(t, sm, "metadata.name", "spec.selector.matchLabels", "spec.endpoints")
		eps, _ := dig(sm, "spec", "endpoints").([]any)
		if len(eps) == 0 {
			t.Fatal("ServiceMonitor has no endpoints")
		}
		ep, _ := eps[0].(map[string]any)
		if ep["port"] != "metrics" || ep["path"] != "/metrics" {
			t.Errorf("ServiceMonitor endpoint %v: want port metrics, path /metrics", ep)
		}
		sel, _ := dig(sm, "spec", "selector", "matchLabels").(map[string]any)
		for k, v := range sel {
			if s.Labels[k] != v {
				t.Errorf("ServiceMonitor selector %s=%v does not match the Service's labels", k, v)
			}
		}
		ns, _ := dig(sm, "spec", "namespaceSelector", "matchNames").([]any)
		if len(ns) != 1 || ns[0] != namespace {
			t.Errorf("ServiceMonitor namespaceSelector %v, want [%s]", ns, namespace)
		}
	}
}

// checkUnstructured: a non-empty value at each dotted path.
func checkUnstructured(t *testing.T, obj map[string]any, paths ...string) {
	t.Helper()
	for _, p := range paths {
		v := dig(obj, strings.Split(p, ".")...)
		if v == nil || v == "" || fmt.Sprint(v) == "[]" || fmt.Sprint(v) == "map[]" {
			t.Errorf("%v %v: %s is missing or empty", obj["apiVersion"], obj["kind"], p)
		}
	}
}

func checkScaling(t *testing.T, m manifests, vals map[string]any) {
	t.Helper()
	podLabels := m.deployment.Spec.Template.Labels
	for _, p := range m.pdbs {
		if p.Spec.MinAvailable == nil && p.Spec.MaxUnavailable == nil {
			t.Error("PodDisruptionBudget has neither minAvailable nor maxUnavailable")
		}
		for k, v := range p.Spec.Selector.MatchLabels {
			if podLabels[k] != v {
				t.Errorf("PodDisruptionBudget selector %s=%s matches no pod label", k, v)
			}
		}
	}
	if want := dig(vals, "podDisruptionBudget", "enabled") != false; want != (len(m.pdbs) == 1) {
		t.Errorf("%d PodDisruptionBudgets, want enabled=%v", len(m.pdbs), want)
	}
	if want := dig(vals, "autoscaling", "enabled") == true; want != (len(m.hpas) == 1) {
		t.Errorf("%d HorizontalPodAutoscalers, want enabled=%v", len(m.hpas), want)
	}
	for _, h := range m.hpas {
		if h.Spec.ScaleTargetRef.Kind != "Deployment" || h.Spec.ScaleTargetRef.Name != fullname || h.Spec.ScaleTargetRef.APIVersion != "apps/v1" {
			t.Errorf("HPA targets %+v, want apps/v1 Deployment %s", h.Spec.ScaleTargetRef, fullname)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas > h.Spec.MaxReplicas || len(h.Spec.Metrics) == 0 {
			t.Errorf("HPA spec %+v: want min <= max and a metric", h.Spec)
		}
	}
	if want := dig(vals, "serviceMonitor", "enabled") == true; want != (len(m.serviceMonitors) == 1) {
		t.Errorf("%d ServiceMonitors, want enabled=%v", len(m.serviceMonitors), want)
	}
	if want := dig(vals, "keda", "enabled") == true; want != (len(m.scaledObjects) == 1) {
		t.Errorf("%d ScaledObjects, want enabled=%v", len(m.scaledObjects), want)
	}
	required := map[string][]string{
		"kafka":          {"bootstrapServers", "consumerGroup", "topic", "lagThreshold"},
		"nats-jetstream": {"natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold"},
	}
	for _, so := range m.scaledObjects {
		checkUnstructured(t, so, "metadata.name", "spec.scaleTargetRef.name", "spec.triggers")
		if n := dig(so, "spec", "scaleTargetRef", "name"); n != fullname {
			t.Errorf("ScaledObject targets %v, want %s", n, fullname)
		}
		triggers, _ := dig(so, "spec", "triggers").([]any)
		for _, tr := range triggers {
			tm, _ := tr.(map[string]any)
			typ, _ := tm["type"].(string)
			keys, ok := required[typ]
			if !ok {
				t.Errorf("ScaledObject trigger type %q: want kafka or nats-jetstream", typ)
				continue
			}
			meta, _ := tm["metadata"].(map[string]any)
			for _, k := range keys {
				if s, ok := meta[k].(string); !ok || s == "" {
					t.Errorf("%s trigger: metadata.%s = %v, want a non-empty string", typ, k, meta[k])
				}
			}
			for k, v := range meta {
				if _, ok := v.(string); !ok {
					t.Errorf("%s trigger: metadata.%s is %T; KEDA metadata values are strings", typ, k, v)
				}
			}
		}
	}
}

// validate runs `dedupworker validate -c` on the rendered config with only
// the pod's environment (plus PATH), expecting exit 0.
func validate(t *testing.T, cfgText string, env map[string]string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, "validate", "-c", path)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dedupworker validate -c (rendered config.yaml): %v\n%s\nconfig:\n%s", err, out, cfgText)
	}
}

// TestChecksumFollowsConfig: the pod annotation changes when the config
// does (so pods restart) and not otherwise.
func TestChecksumFollowsConfig(t *testing.T) {
	needHelm(t)
	f := filepath.Join(chartDir, "ci", "kafka-minimal-values.yaml")
	sum := func(sets ...string) string {
		out, err := render(t, []string{f}, sets...)
		if err != nil {
			t.Fatal(err)
		}
		return decodeAll(t, out).deployment.Spec.Template.Annotations["checksum/config"]
	}
	a, b := sum(), sum()
	if a == "" || a != b {
		t.Fatalf("checksum/config %q then %q for the same values", a, b)
	}
	if c := sum("config.log.level=debug"); c == a {
		t.Error("checksum/config unchanged after config.log.level changed")
	}
	if c := sum("replicaCount=5"); c != a {
		t.Error("checksum/config changed although the config did not")
	}
}

// TestChartRefuses: values that would make a broken or leaky deployment
// fail to render, naming the problem.
func TestChartRefuses(t *testing.T) {
	needHelm(t)
	kafka := filepath.Join(chartDir, "ci", "kafka-minimal-values.yaml")
	nats := filepath.Join(chartDir, "ci", "nats-keda-values.yaml")
	saslHandler := `config:
  handlers:
    - name: payments
      source:
        kafka:
          brokers: [kafka:9092]
          topic: payments
          sasl: {mechanism: plain, username: u, password: %s}
      action: {http: {url: "http://svc/hook"}}
`
	for _, tc := range []struct {
		name   string
		values string
		extra  string // a further values file
		sets   []string
		want   string
	}{
		{"literal redis password", kafka, "", []string{"config.redis.password=hunter2"}, "config.redis.password holds a literal secret"},
		{"password in redis url", kafka, "", []string{"config.redis.url=redis://:hunter2@redis:6379/0"}, "config.redis.url holds a password"},
		{"literal sentinel password", kafka, "config: {redis: {url: null, sentinel: {master: m, addrs: [\"s:26379\"], password: hunter2}}}\n", nil, "config.redis.sentinel.password holds a literal secret"},
		{"redis.master_name", kafka, "config: {redis: {url: null, addrs: [\"s:26379\"], master_name: m}}\n", nil, "master_name"},
		{"literal sasl password", kafka, fmt.Sprintf(saslHandler, "hunter2"), nil, "config.handlers[0].source.kafka.sasl.password holds a literal secret"},
		{"literal nats token", nats, "config: {handlers: [{name: o, source: {nats: {url: \"nats://n:4222\", stream: S, token: hunter2}}, action: {exec: {command: [/bin/true]}}}]}\n", nil, "config.handlers[0].source.nats.token holds a literal secret"},
		{"loopback http.addr", kafka, "", []string{"config.http.addr=127.0.0.1:9464"}, "listens on loopback only"},
		{"no http.addr", kafka, "", []string{"config.http.addr="}, "config.http.addr must be set"},
		{"grace not above shutdown", kafka, "", []string{"terminationGracePeriodSeconds=30"}, "must be above config.shutdown_timeout (30s)"},
		{"grace not above a longer shutdown", kafka, "", []string{"config.shutdown_timeout=1m30s", "terminationGracePeriodSeconds=60"}, "must be above config.shutdown_timeout (90s)"},
		{"hpa and keda", nats, "", []string{"autoscaling.enabled=true"}, "choose one"},
		{"keda nats without monitoring endpoint", nats, "", []string{"keda.nats.monitoringEndpoint="}, "keda.nats.monitoringEndpoint is required"},
		{"misspelt config field", kafka, "config: {handlers: [{name: p, source: {kafka: {brokers: [k:9092], topic: p}}, leese: 30s, action: {exec: {command: [/bin/true]}}}]}\n", nil, "leese"},
		{"misspelt top-level value", kafka, "", []string{"replicas=3"}, "replicas"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := []string{tc.values}
			if tc.extra != "" {
				f := filepath.Join(t.TempDir(), "extra-values.yaml")
				if err := os.WriteFile(f, []byte(tc.extra), 0o600); err != nil {
					t.Fatal(err)
				}
				files = append(files, f)
			}
			out, err := render(t, files, tc.sets...)
			if err == nil {
				t.Fatalf("rendered without error:\n%s", out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error does not say %q:\n%v", tc.want, err)
			}
		})
	}
}

// TestDefaultGracePeriod: with terminationGracePeriodSeconds unset the pod
// gets shutdown_timeout + 15 s.
func TestDefaultGracePeriod(t *testing.T) {
	needHelm(t)
	kafka := filepath.Join(chartDir, "ci", "kafka-minimal-values.yaml")
	for sets, want := range map[string]int64{
		"":                                 45,
		"config.shutdown_timeout=1m30s":    105,
		"config.shutdown_timeout=2500ms":   18,
		"config.shutdown_timeout=1h":       3615,
		"config.shutdown_timeout=1d":       86415,
		"config.shutdown_timeout=${GRACE}": 45, // unreadable: the binary's default 30s
	} {
		var args []string
		if sets != "" {
			args = append(args, sets)
		}
		out, err := render(t, []string{kafka}, args...)
		if err != nil {
			t.Fatal(err)
		}
		g := decodeAll(t, out).deployment.Spec.Template.Spec.TerminationGracePeriodSeconds
		if g == nil || *g != want {
			t.Errorf("--set %q: terminationGracePeriodSeconds %v, want %d", sets, g, want)
		}
	}
}

// TestNATSMaxAckPending: every pod binds to one durable, so the
// chart sets its max_ack_pending to the most pods there can be times each
// pod's window, unless the config sets it. A pod's window is its concurrency,
// or for a forward action (a batch handler, whose slots are runs of up to
// max(concurrency, 128) messages) concurrency × max(concurrency, 128), at
// most 4096.
func TestNATSMaxAckPending(t *testing.T) {
	needHelm(t)
	keda := filepath.Join(chartDir, "ci", "nats-keda-values.yaml") // forward, concurrency 32, keda max 8, replicaCount 1
	// The same handler with an http action, which takes a message per call;
	// a case starting with http uses it.
	httpValues := filepath.Join(t.TempDir(), "http-values.yaml")
	if err := os.WriteFile(httpValues, []byte(`config:
  handlers:
    - name: orders
      source:
        nats:
          url: nats://nats.messaging.svc:4222
          stream: ORDERS
          consumer: orders-dedup
          subject: orders.new
      key: [header:Idempotency-Key, json:id]
      concurrency: 32
      action:
        http: {url: "http://svc.example/hook"}
      dead_letter: {nats: {subject: dlq.orders}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	const http = "http:"
	for sets, want := range map[string]int{
		"":                                  8 * 32 * 128,
		"keda.maxReplicaCount=3":            3 * 32 * 128,
		"keda.enabled=false":                1 * 32 * 128,
		"keda.enabled=false,replicaCount=4": 4 * 32 * 128,
		"keda.enabled=false,autoscaling.enabled=true,autoscaling.maxReplicas=5": 5 * 32 * 128,
		"config.handlers[0].concurrency=100":                                    8 * 4096,
		"config.handlers[0].concurrency=8":                                      8 * 8 * 128,
		"config.handlers[0].source.nats.max_ack_pending=7":                      7,
		http:                        8 * 32,
		http + "keda.enabled=false": 1 * 32,
	} {
		values := []string{keda}
		if rest, ok := strings.CutPrefix(sets, http); ok {
			values, sets = append(values, httpValues), rest
		}
		var args []string
		if sets != "" {
			args = append(args, sets)
		}
		out, err := render(t, values, args...)
		if err != nil {
			t.Fatal(err)
		}
		env := containerEnv(t, decodeAll(t, out).deployment)
		cfg, err := config.Parse([]byte(renderedConfig(t, decodeAll(t, out))), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err != nil {
			t.Fatalf("--set %q: %v", sets, err)
		}
		if got := cfg.Handlers[0].Source.NATS.MaxAckPending; got != want {
			t.Errorf("--set %q: max_ack_pending %d, want %d", sets, got, want)
		}
	}
}
