package charttest

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// copyDir copies the chart to dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestNotes renders NOTES.txt (through a copy of the chart with a template
// that puts the notes into a ConfigMap, since helm template does not show
// them) and checks it names the objects the values make.
func TestNotes(t *testing.T) {
	needHelm(t)
	notes, err := os.ReadFile(filepath.Join(chartDir, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(notes)) != `{{ include "dedupworker.notes" . }}` {
		t.Fatalf("NOTES.txt is %q: the test renders the dedupworker.notes template it should include", notes)
	}
	dir := filepath.Join(t.TempDir(), "dedupworker")
	copyDir(t, chartDir, dir)
	check := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: {{ include \"dedupworker.notes\" . | quote }}\n"
	if err := os.WriteFile(filepath.Join(dir, "templates", "zz-notes.yaml"), []byte(check), 0o644); err != nil {
		t.Fatal(err)
	}
	for file, wants := range map[string][]string{
		"nats-keda-values.yaml": {"dw-dedupworker", "handler(s) orders", "KEDA scales the Deployment between 1 and 8", "Pods get 75s after SIGTERM; config.shutdown_timeout is 60s",
			"dedupworker records -c /etc/dedupworker/config.yaml", "dedupworker forget -c /etc/dedupworker/config.yaml --handler NAME --state", "dedupworker stats -c /etc/dedupworker/config.yaml",
			"dedupworker redrive -c /etc/dedupworker/config.yaml --handler NAME --dry-run"},
		"monitoring-values.yaml": {"ServiceMonitor scrapes the pods every 15s", "HorizontalPodAutoscaler scales the Deployment between 3 and 12", "Pods get 45s"},
	} {
		out, _, err := helm(t, "template", release, dir, "--namespace", namespace, "--values", filepath.Join(chartDir, "ci", file), "--show-only", "templates/zz-notes.yaml")
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		var cm corev1.ConfigMap
		if err := decodeStrict([]byte(out), &cm); err != nil {
			t.Fatalf("%s: %v\n%s", file, err, out)
		}
		for _, w := range wants {
			if !strings.Contains(cm.Data["notes"], w) {
				t.Errorf("%s: NOTES.txt does not say %q:\n%s", file, w, cm.Data["notes"])
			}
		}
	}
}
