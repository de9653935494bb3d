package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/idemkit/dedupworker/internal/app"
)

// Exit codes.
const (
	exitOK      = 0
	exitRuntime = 1
	exitUsage   = 2
)

// usageError makes a command exit 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"run", "run the handlers of a config until SIGTERM/SIGINT", cmdRun},
		{"demo", "run a self-contained demo: embedded NATS and Kafka, duplicates on both", cmdDemo},
		{"validate", "check a config file; --print shows it with defaults", cmdValidate},
		{"setup", "create the NATS streams or Kafka topics a config reads and writes, if missing", cmdSetup},
		{"publish", "publish a test message, with headers and a key, to a handler's source", cmdPublish},
		{"inspect", "show the stored record of a key", cmdInspect},
		{"forget", "delete the record of a key, or of every key in a state (--state), so it is processed again", cmdForget},
		{"records", "list the records of a handler, by state and age", cmdRecords},
		{"redrive", "send a handler's dead letters back to its source: forget each dead-lettered record, republish, ack or commit", cmdRedrive},
		{"stats", "records by state (sampled), bytes per record, memory, and what a rate's retention needs", cmdStats},
		{"version", "print the version and commit", cmdVersion},
	}
}

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

func runMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printUsage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help":
		printUsage(stdout)
		return exitOK
	case "help":
		if len(args) == 1 {
			printUsage(stdout)
			return exitOK
		}
		// help CMD is CMD -h.
		args = []string{args[1], "-h"}
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		// What go-redis logs on its own (a Sentinel that does not answer)
		// reads as one of the command's warnings; run sends it to the
		// worker's logger instead.
		app.RedisWarnings(stderr)
		err := c.run(args[1:], stdout, stderr)
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, flag.ErrHelp):
			return exitOK
		case errors.As(err, new(usageError)):
			fmt.Fprintf(stderr, "dedupworker %s: %v\n", c.name, err)
			return exitUsage
		default:
			fmt.Fprintf(stderr, "dedupworker %s: %v\n", c.name, err)
			return exitRuntime
		}
	}
	fmt.Fprintf(stderr, "dedupworker: unknown command %q\n\n", args[0])
	printUsage(stderr)
	return exitUsage
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, "dedupworker makes Kafka and NATS JetStream consumers effectively once.\n\nUsage: dedupworker <command> [flags]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'dedupworker <command> -h' for a command's flags and examples.\n")
}

// newFlagSet returns a FlagSet whose -h (or -help, --help) prints the usage
// line, the flags and examples to stdout; a flag it does not know prints
// the error and the same text to stderr.
func newFlagSet(name, usage, examples string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	help := &helpFlag{out: stdout}
	fs.Var(help, "h", "show this help and exit")
	fs.Var(help, "help", "show this help and exit")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: dedupworker %s\n\nFlags:\n", usage)
		fs.PrintDefaults()
		if examples != "" {
			fmt.Fprintf(w, "\nExamples:\n%s", examples)
		}
	}
	return fs
}

// helpFlag is the -h and -help flag of every command: asked for, the
// command prints its usage to out and exits 0.
type helpFlag struct {
	asked bool
	out   io.Writer
}

func (h *helpFlag) String() string   { return "" }
func (h *helpFlag) IsBoolFlag() bool { return true }
func (h *helpFlag) Set(v string) error {
	h.asked = v == "true"
	return nil
}

// parseFlags parses args; bad flags are usage errors. With -h, the usage
// goes to stdout and the error is flag.ErrHelp (exit 0).
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if h, ok := fs.Lookup("h").Value.(*helpFlag); ok && h.asked && err == nil {
		stderr := fs.Output()
		fs.SetOutput(h.out)
		fs.Usage()
		fs.SetOutput(stderr)
		return flag.ErrHelp
	}
	if err != nil {
		return usageError{err}
	}
	return nil
}
