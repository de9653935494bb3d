package charttest

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/idemkit/dedupworker/internal/alertrules"
)

// prometheusRule is a monitoring.coreos.com/v1 PrometheusRule, with the
// fields the chart sets; decodeStrict refuses any other.
type prometheusRule struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

const runbookBase = "https://github.com/idemkit/dedupworker/blob/main/docs/ALERTS.md"

// checkPrometheusRule: a PrometheusRule exactly when prometheusRule.enabled,
// carrying the values' labels and the alerts of the plain rules file with
// the release's job and the runbook base.
func checkPrometheusRule(t *testing.T, m manifests, vals map[string]any) {
	t.Helper()
	pr, _ := vals["prometheusRule"].(map[string]any)
	enabled, _ := pr["enabled"].(bool)
	if got := len(m.prometheusRules); got != map[bool]int{true: 1, false: 0}[enabled] {
		t.Fatalf("%d PrometheusRules, want enabled=%v", got, enabled)
	}
	if !enabled {
		return
	}
	r := m.prometheusRules[0]
	if r.Metadata.Name != fullname || r.Metadata.Namespace != namespace {
		t.Errorf("PrometheusRule %s/%s, want %s/%s", r.Metadata.Namespace, r.Metadata.Name, namespace, fullname)
	}
	labels, _ := pr["labels"].(map[string]any)
	for k, v := range labels {
		if r.Metadata.Labels[k] != v {
			t.Errorf("PrometheusRule label %s=%q, want %v (prometheusRule.labels, for the operator's ruleSelector)", k, r.Metadata.Labels[k], v)
		}
	}
	checkRulesMatchFile(t, r, fullname, runbookBase)
}

// checkRulesMatchFile: the rendered groups are those of the plain rules
// file, with job="dedupworker" made the release's and runbook_url under base.
func checkRulesMatchFile(t *testing.T, r *prometheusRule, job, base string) {
	t.Helper()
	_, data, err := alertrules.Read()
	if err != nil {
		t.Fatal(err)
	}
	want, err := alertrules.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Spec.Groups) != len(want.Groups) {
		t.Fatalf("PrometheusRule has %d groups, the rules file %d", len(r.Spec.Groups), len(want.Groups))
	}
	n := 0
	for i, g := range want.Groups {
		got := r.Spec.Groups[i]
		if got.Name != g.Name || len(got.Rules) != len(g.Rules) {
			t.Fatalf("group %d: %s with %d rules, want %s with %d", i, got.Name, len(got.Rules), g.Name, len(g.Rules))
		}
		for j, w := range g.Rules {
			gr := got.Rules[j]
			wantExpr := strings.ReplaceAll(w.Expr, `job="dedupworker"`, `job="`+job+`"`)
			wantAnn := map[string]string{}
			for k, v := range w.Annotations {
				wantAnn[k] = v
			}
			wantAnn["runbook_url"] = strings.Replace(w.Annotations["runbook_url"], "docs/ALERTS.md#", base+"#", 1)
			if gr.Alert != w.Alert || gr.Expr != wantExpr || gr.For != w.For ||
				!reflect.DeepEqual(gr.Labels, w.Labels) || !reflect.DeepEqual(gr.Annotations, wantAnn) {
				t.Errorf("rule %s differs from the rules file:\n got  %+v\n want %s %q for %s %v %v", w.Alert, gr, w.Alert, wantExpr, w.For, w.Labels, wantAnn)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatal("no rule compared")
	}
}

// TestRulesFileCopy: the chart's files/dedupworker-rules.yaml, which
// .Files.Get reads (a chart holds only its own files), is the repository's
// rules file byte for byte.
func TestRulesFileCopy(t *testing.T) {
	src, err := alertrules.Path()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(chartDir, "files", "dedupworker-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("deploy/helm/dedupworker/files/dedupworker-rules.yaml differs from %s: run cp %s deploy/helm/dedupworker/files/", alertrules.RelPath, alertrules.RelPath)
	}
}

// TestPrometheusRuleValues: off by default; on, with another namespace and
// runbook base, the rendered rule follows them.
func TestPrometheusRuleValues(t *testing.T) {
	needHelm(t)
	minimal := filepath.Join(chartDir, "ci", "kafka-minimal-values.yaml")
	out, err := render(t, []string{minimal})
	if err != nil {
		t.Fatal(err)
	}
	if m := decodeAll(t, out); len(m.prometheusRules) != 0 {
		t.Fatalf("%d PrometheusRules by default, want none", len(m.prometheusRules))
	}
	out, err = render(t, []string{minimal}, "prometheusRule.enabled=true", "prometheusRule.namespace=monitoring",
		"prometheusRule.labels.team=payments", "prometheusRule.runbookBaseURL=https://wiki.example/ALERTS")
	if err != nil {
		t.Fatal(err)
	}
	m := decodeAll(t, out)
	if len(m.prometheusRules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(m.prometheusRules))
	}
	r := m.prometheusRules[0]
	if r.Metadata.Namespace != "monitoring" || r.Metadata.Labels["team"] != "payments" {
		t.Errorf("PrometheusRule namespace %q labels %v: want monitoring and team=payments", r.Metadata.Namespace, r.Metadata.Labels)
	}
	checkRulesMatchFile(t, r, fullname, "https://wiki.example/ALERTS")
}
