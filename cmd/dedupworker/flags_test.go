package main

import (
	"flag"
	"io"
	"slices"
	"testing"
)

func TestInterspersedMovesFlagsAheadOfPositionals(t *testing.T) {
	for _, c := range []struct {
		in, flags, args []string
	}{
		{[]string{"-c", "f", "--handler", "h", "KEY", "-o", "json"}, []string{"f", "h", "json", "false"}, []string{"KEY"}},
		{[]string{"KEY", "--yes", "-c=f", "--handler=h"}, []string{"f", "h", "table", "true"}, []string{"KEY"}},
		{[]string{"-c", "f", "--", "-o", "--yes"}, []string{"f", "", "table", "false"}, []string{"-o", "--yes"}},
		{[]string{"--yes", "KEY", "-"}, []string{"", "", "table", "true"}, []string{"KEY", "-"}},
		{[]string{"-c", "-o"}, []string{"-o", "", "table", "false"}, nil}, // a value that looks like a flag is the value
		{[]string{"KEY", "-o"}, nil, nil}, // a flag missing its value: Parse refuses it
		{[]string{"KEY", "--nope"}, nil, nil},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		file, handler, o := fs.String("c", "", ""), fs.String("handler", "", ""), fs.String("o", "table", "")
		yes := fs.Bool("yes", false, "")
		err := fs.Parse(interspersed(fs, c.in))
		if c.flags == nil {
			if err == nil {
				t.Errorf("%q: accepted, want an error", c.in)
			}
			continue
		}
		got := []string{*file, *handler, *o, map[bool]string{true: "true", false: "false"}[*yes]}
		if err != nil || !slices.Equal(got, c.flags) || !slices.Equal(fs.Args(), c.args) {
			t.Errorf("%q: flags %q args %q err %v; want flags %q args %q", c.in, got, fs.Args(), err, c.flags, c.args)
		}
	}
}
