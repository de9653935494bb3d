package alertrules

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"
)

// RelPath is the rules file's path from the module root.
const RelPath = "deploy/prometheus/dedupworker-rules.yaml"

// File is a Prometheus rules file.
type File struct {
	Groups []Group `yaml:"groups"`
}

// Group is one rule group.
type Group struct {
	Name  string `yaml:"name"`
	Rules []Rule `yaml:"rules"`
}

// Rule is one alerting rule (recording rules have Record set instead of
// Alert).
type Rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// Path returns the rules file's path: RelPath under the nearest parent of
// the working directory (a test's package directory) that holds go.mod.
func Path() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, filepath.FromSlash(RelPath)), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("alertrules: no go.mod above %s", dir)
		}
		dir = parent
	}
}

// Read returns the rules file's path ([Path]) and its bytes.
func Read() (path string, data []byte, err error) {
	if path, err = Path(); err != nil {
		return "", nil, err
	}
	data, err = os.ReadFile(path)
	return path, data, err
}

// Parse decodes a rules file, refusing fields it does not know.
func Parse(data []byte) (*File, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("alertrules: %w", err)
	}
	return &f, nil
}

// Alerts returns the alerting rules of every group, in file order.
func (f *File) Alerts() []Rule {
	var out []Rule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return out
}

// durationRE is one Prometheus duration of a single unit, as the rules
// write them (5m, 30s, 1h).
var durationRE = regexp.MustCompile(`^([0-9]+)(ms|s|m|h|d|w|y)$`)

// rangeRE is a range selector or subquery: [10m] or [10m:1m].
var rangeRE = regexp.MustCompile(`\[([0-9]+(?:ms|s|m|h|d|w|y))(?::([0-9]+(?:ms|s|m|h|d|w|y))?)?\]`)

var units = map[string]time.Duration{
	"ms": time.Millisecond, "s": time.Second, "m": time.Minute, "h": time.Hour,
	"d": 24 * time.Hour, "w": 7 * 24 * time.Hour, "y": 365 * 24 * time.Hour,
}

// ParseDuration reads a single-unit Prometheus duration.
func ParseDuration(s string) (time.Duration, error) {
	m := durationRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("alertrules: %q is not a duration of one unit such as 5m", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("alertrules: %q: %w", s, err)
	}
	return time.Duration(n) * units[m[2]], nil
}

// FormatDuration writes d as Prometheus reads it, in whole milliseconds.
func FormatDuration(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
}

// Scale is how Shorten rewrites durations: For maps each rule's for:, Range
// each range selector's window (and a subquery's resolution).
type Scale struct {
	For   func(time.Duration) time.Duration
	Range func(time.Duration) time.Duration
}

// Shorten rewrites the for: of every rule and every range window in every
// expr of a rules file through s, and leaves the rest (labels, annotations,
// thresholds) as it is. It returns the file re-encoded.
func Shorten(data []byte, s Scale) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("alertrules: %w", err)
	}
	if _, err := Parse(data); err != nil {
		return nil, err
	}
	var walkErr error
	eachRule(&doc, func(rule *yaml.Node) {
		for i := 0; i+1 < len(rule.Content); i += 2 {
			key, val := rule.Content[i].Value, rule.Content[i+1]
			switch key {
			case "for":
				d, err := ParseDuration(val.Value)
				if err != nil {
					walkErr = err
					return
				}
				val.Value = FormatDuration(s.For(d))
			case "expr":
				val.Value = rangeRE.ReplaceAllStringFunc(val.Value, func(sel string) string {
					m := rangeRE.FindStringSubmatch(sel)
					w, err := ParseDuration(m[1])
					if err != nil {
						walkErr = err
						return sel
					}
					out := "[" + FormatDuration(s.Range(w))
					if m[2] != "" {
						r, err := ParseDuration(m[2])
						if err != nil {
							walkErr = err
							return sel
						}
						out += ":" + FormatDuration(s.Range(r))
					} else if sel != "["+m[1]+"]" {
						out += ":"
					}
					return out + "]"
				})
				val.Style = yaml.LiteralStyle
			}
		}
	})
	if walkErr != nil {
		return nil, walkErr
	}
	return yaml.Marshal(&doc)
}

// eachRule calls f with the mapping node of every rule under groups[].rules.
func eachRule(doc *yaml.Node, f func(*yaml.Node)) {
	root := doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	groups := mapValue(root, "groups")
	if groups == nil {
		return
	}
	for _, g := range groups.Content {
		rules := mapValue(g, "rules")
		if rules == nil {
			continue
		}
		for _, r := range rules.Content {
			if r.Kind == yaml.MappingNode {
				f(r)
			}
		}
	}
}

func mapValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}
