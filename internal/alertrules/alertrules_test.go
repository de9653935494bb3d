package alertrules

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestShorten rewrites every for: and range window of the real rules file
// and leaves nothing of the old durations behind.
func TestShorten(t *testing.T) {
	path, err := Path()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	orig, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	div := func(d time.Duration) time.Duration { return d / 60 }
	out, err := Shorten(data, Scale{For: div, Range: div})
	if err != nil {
		t.Fatal(err)
	}
	short, err := Parse(out)
	if err != nil {
		t.Fatalf("shortened file does not parse: %v\n%s", err, out)
	}
	a, b := orig.Alerts(), short.Alerts()
	if len(a) != len(b) || len(a) == 0 {
		t.Fatalf("%d alerts before, %d after", len(a), len(b))
	}
	for i := range a {
		if a[i].Alert != b[i].Alert || a[i].Annotations["description"] != b[i].Annotations["description"] {
			t.Errorf("alert %d: %s became %s, or its annotations changed", i, a[i].Alert, b[i].Alert)
		}
		wantFor, err := ParseDuration(a[i].For)
		if err != nil {
			t.Fatalf("%s: for %q: %v", a[i].Alert, a[i].For, err)
		}
		if got := b[i].For; got != FormatDuration(wantFor/60) {
			t.Errorf("%s: for %s shortened to %s, want %s", a[i].Alert, a[i].For, got, FormatDuration(wantFor/60))
		}
		wins := rangeRE.FindAllStringSubmatch(a[i].Expr, -1)
		got := rangeRE.FindAllStringSubmatch(b[i].Expr, -1)
		if len(wins) != len(got) {
			t.Fatalf("%s: %d windows before, %d after", a[i].Alert, len(wins), len(got))
		}
		for j := range wins {
			w, _ := ParseDuration(wins[j][1])
			if got[j][1] != FormatDuration(w/60) {
				t.Errorf("%s: window [%s] became [%s], want [%s]", a[i].Alert, wins[j][1], got[j][1], FormatDuration(w/60))
			}
		}
		rest := rangeRE.ReplaceAllString(b[i].Expr, "")
		if strings.Contains(rest, "[") {
			t.Errorf("%s: a window was left unrewritten: %s", a[i].Alert, b[i].Expr)
		}
	}
}

func TestShortenSubquery(t *testing.T) {
	in := []byte("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: max_over_time(x[10m:1m]) > 0 and rate(y[2m]) > 0\n    for: 90s\n")
	out, err := Shorten(in, Scale{For: func(d time.Duration) time.Duration { return d / 3 }, Range: func(d time.Duration) time.Duration { return d / 2 }})
	if err != nil {
		t.Fatal(err)
	}
	f, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	r := f.Alerts()[0]
	if want := "max_over_time(x[300s:30s]) > 0 and rate(y[60s]) > 0"; strings.TrimSpace(r.Expr) != want {
		t.Errorf("expr %q, want %q", r.Expr, want)
	}
	if r.For != "30s" {
		t.Errorf("for %q, want 30s", r.For)
	}
}

func TestParseDurationRefuses(t *testing.T) {
	for _, s := range []string{"", "5", "1h30m", "m"} {
		if _, err := ParseDuration(s); err == nil {
			t.Errorf("ParseDuration(%q): no error", s)
		}
	}
}
