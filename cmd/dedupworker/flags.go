package main

import (
	"flag"
	"strings"
)

// interspersed returns args with every flag of fs moved ahead of the
// positional arguments, in their order, followed by "--" and the
// positionals, so that fs.Parse reads flags written after a positional
// (inspect KEY -o json), which Go's flag package stops at. A flag that takes
// a value keeps the argument after it ("-o json"); a boolean flag, or one
// written "-name=value", stands alone. Everything after a "--" is
// positional. A lone "-" is positional; an unknown flag, or a last one
// missing its value, stays for fs.Parse to refuse.
func interspersed(fs *flag.FlagSet, args []string) []string {
	flags := make([]string, 0, len(args)+1)
	var positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			positional = append(positional, args[i+1:]...)
			i = len(args)
		case len(a) < 2 || a[0] != '-':
			positional = append(positional, a)
		default:
			flags = append(flags, a)
			name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
			if strings.Contains(name, "=") {
				continue
			}
			if f := fs.Lookup(name); f != nil && !isBoolFlag(f) {
				if i+1 == len(args) {
					return flags // its value is missing: fs.Parse says so
				}
				i++
				flags = append(flags, args[i])
			}
		}
	}
	return append(append(flags, "--"), positional...)
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// parseInterspersed is parseFlags for commands whose flags may come before
// and after their positional arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) error {
	return parseFlags(fs, interspersed(fs, args))
}
