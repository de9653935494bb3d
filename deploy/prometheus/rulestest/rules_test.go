// Package rulestest checks deploy/prometheus/dedupworker-rules.yaml: promtool
// accepts it and passes its unit tests (dedupworker-rules.test.yaml), every
// alert has a firing and a quiet case there, and every alert carries the
// severity, summary, description and runbook link an operator needs.
//
// promtool comes from Debian's prometheus package (.ci/services.sh installs
// it). Without it the promtool tests are skipped, or failed under
// DEDUP_REQUIRE_SERVICES=1.
package rulestest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idemkit/dedupworker/internal/alertrules"
	"github.com/idemkit/dedupworker/internal/testenv"
)

func rulesFile(t *testing.T) (string, *alertrules.File) {
	t.Helper()
	path, data, err := alertrules.Read()
	if err != nil {
		t.Fatal(err)
	}
	f, err := alertrules.Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(f.Alerts()) == 0 {
		t.Fatalf("%s has no alert", path)
	}
	return path, f
}

func promtool(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		testenv.Unavailable(t, "promtool (Debian package prometheus)", err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = filepath.Join("..")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// TestPromtoolCheckRules: the file is valid Prometheus rules.
func TestPromtoolCheckRules(t *testing.T) {
	t.Log(promtool(t, "check", "rules", "dedupworker-rules.yaml"))
}

// TestPromtoolTestRules runs the rules' unit tests: series for each alert,
// firing and not firing.
func TestPromtoolTestRules(t *testing.T) {
	t.Log(promtool(t, "test", "rules", "dedupworker-rules.test.yaml"))
}

// ruleTests is the part of a promtool test file read here.
type ruleTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			EvalTime  string `yaml:"eval_time"`
			Alertname string `yaml:"alertname"`
			ExpAlerts []struct {
				ExpLabels map[string]string `yaml:"exp_labels"`
			} `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// TestEveryAlertFiresAndStaysQuiet: the unit tests hold, for each alert, a
// case where it fires and one where it does not, and name no alert the
// rules lack.
func TestEveryAlertFiresAndStaysQuiet(t *testing.T) {
	_, f := rulesFile(t)
	data, err := os.ReadFile(filepath.Join("..", "dedupworker-rules.test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rt ruleTests
	if err := yaml.Unmarshal(data, &rt); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rt.RuleFiles, []string{"dedupworker-rules.yaml"}) {
		t.Errorf("rule_files %v: want [dedupworker-rules.yaml]", rt.RuleFiles)
	}
	fires, quiet := map[string]int{}, map[string]int{}
	for _, tc := range rt.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname]++
			} else {
				quiet[a.Alertname]++
			}
		}
	}
	known := map[string]bool{}
	for _, r := range f.Alerts() {
		known[r.Alert] = true
		if fires[r.Alert] == 0 {
			t.Errorf("%s: no promtool case where it fires", r.Alert)
		}
		if quiet[r.Alert] == 0 {
			t.Errorf("%s: no promtool case where it does not fire", r.Alert)
		}
	}
	for name := range fires {
		if !known[name] {
			t.Errorf("the promtool tests expect alert %s, which the rules do not have", name)
		}
	}
}

var byClause = regexp.MustCompile(`by \(([^)]*)\)`)

// TestAlertsShape: each alert has a severity, a for:, a summary, a
// description naming the labels it keeps among handler, instance and pod,
// and a runbook_url to its own section of docs/ALERTS.md.
func TestAlertsShape(t *testing.T) {
	path, f := rulesFile(t)
	doc, err := os.ReadFile(filepath.Join(filepath.Dir(path), "..", "..", "docs", "ALERTS.md"))
	if err != nil {
		t.Fatalf("the runbook the alerts link to: %v", err)
	}
	headings := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			headings[strings.ToLower(strings.TrimSpace(h))] = true
		}
	}
	seen := map[string]bool{}
	for _, r := range f.Alerts() {
		if seen[r.Alert] {
			t.Errorf("%s: defined twice", r.Alert)
		}
		seen[r.Alert] = true
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
		}
		if _, err := alertrules.ParseDuration(r.For); err != nil {
			t.Errorf("%s: for: %v", r.Alert, err)
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		text := r.Annotations["summary"] + r.Annotations["description"]
		for _, m := range byClause.FindAllStringSubmatch(r.Expr, -1) {
			for _, l := range strings.Split(m[1], ",") {
				l = strings.TrimSpace(l)
				if (l == "handler" || l == "instance" || l == "pod") && !strings.Contains(text, "$labels."+l) {
					t.Errorf("%s: keeps label %s but its summary and description do not name it ($labels.%s)", r.Alert, l, l)
				}
			}
		}
		anchor := strings.ToLower(r.Alert)
		if want := "docs/ALERTS.md#" + anchor; r.Annotations["runbook_url"] != want {
			t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
		}
		if !headings[anchor] {
			t.Errorf("%s: docs/ALERTS.md has no section \"## %s\" for its runbook_url", r.Alert, r.Alert)
		}
	}
}
