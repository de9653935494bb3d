package main

import (
	"fmt"
	"io"
	"runtime/debug"
)

func versionString() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		return fmt.Sprintf("%s (commit %s%s, %s)", v, rev, modified, bi.GoVersion)
	}
	return fmt.Sprintf("%s (%s)", v, bi.GoVersion)
}

func cmdVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", "version", "", stdout, stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "dedupworker %s\n", versionString())
	return nil
}
