// Package benchutil holds what both benchmark commands (bench/dedupbench
// and bench/dedupbench/relay) read the same way: their list flags and the
// machine's load.
package benchutil

import (
	"os"
	"strings"
)

// SplitList returns the non-empty, trimmed elements of a comma-separated
// flag value.
func SplitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// LoadAvg returns /proc/loadavg's first three fields, or "?".
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
