package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/app"
	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/redisbackend"
)

// storeFlags are the flags inspect and forget share: a config file, or a
// Redis URL and namespace.
type storeFlags struct {
	file, redisURL, namespace, handler *string
}

func addStoreFlags(fs *flag.FlagSet) storeFlags {
	return storeFlags{
		file:      fs.String("c", "", "the config `file`: its redis section (url, addrs or sentinel, credentials, tls, namespace)"),
		redisURL:  fs.String("redis", "", "Redis `URL`, instead of -c (a Cluster node's URL reaches the whole Cluster)"),
		namespace: fs.String("namespace", redisbackend.DefaultNamespace, "key namespace, with --redis"),
		handler:   fs.String("handler", "", "the handler `name` (the key's scope; required)"),
	}
}

// open returns the store and the raw key named by the arguments, and the
// function that closes the store.
func (f storeFlags) open(fs *flag.FlagSet) (*redisbackend.Store, string, func() error, error) {
	if *f.handler == "" || fs.NArg() != 1 {
		fs.Usage()
		return nil, "", nil, usagef("--handler NAME and exactly one KEY are required")
	}
	s, _, closeStore, err := f.connect(fs)
	if err != nil {
		return nil, "", nil, err
	}
	return s, fs.Arg(0), closeStore, nil
}

// connect returns the store the flags name, the config file's contents (nil
// with --redis), and the function that closes the store. It connects
// through app.OpenStore, as run and validate --online do, so -c FILE
// reaches Redis exactly as the worker of that file does.
func (f storeFlags) connect(fs *flag.FlagSet) (*redisbackend.Store, *config.Config, func() error, error) {
	var rc *config.Redis
	var cfg *config.Config
	switch {
	case *f.file != "" && *f.redisURL != "":
		return nil, nil, nil, usagef("give -c FILE or --redis URL, not both")
	case *f.file != "":
		if flagSet(fs, "namespace") {
			return nil, nil, nil, usagef("--namespace goes with --redis; with -c FILE the namespace is the file's redis.namespace")
		}
		var err error
		if cfg, err = loadConfig(*f.file); err != nil {
			return nil, nil, nil, err
		}
		rc = &cfg.Redis
		if *f.handler != "" {
			warnUnknownHandler(fs.Output(), *f.handler, *f.file, cfg)
		}
	case *f.redisURL == "":
		return nil, nil, nil, usagef("give -c FILE or --redis URL")
	default:
		rc = &config.Redis{URL: *f.redisURL, Namespace: *f.namespace, Grace: config.Duration(redisbackend.DefaultGrace),
			ConnectTimeout: config.Duration(redisbackend.DefaultDialTimeout)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), rc.ConnectTimeout.D()+2*time.Second)
	defer cancel()
	s, closeStore, err := app.OpenStore(ctx, rc, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, nil, nil, err
	}
	return s, cfg, closeStore, nil
}

// warnUnknownHandler says when name is no handler of cfg: a misspelt
// handler reads every key as absent. It is not an error, since the records
// of a handler removed from the file may still be worth reading or
// deleting.
func warnUnknownHandler(w io.Writer, name, file string, cfg *config.Config) {
	names := make([]string, len(cfg.Handlers))
	for i, h := range cfg.Handlers {
		if h.Name == name {
			return
		}
		names[i] = h.Name
	}
	fmt.Fprintf(w, "warning: --handler %q is not a handler of %s (it has %s); reading the store anyway\n", name, file, strings.Join(names, ", "))
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// recordView is inspect's JSON shape.
type recordView struct {
	Handler      string            `json:"handler"`
	Key          string            `json:"key"`
	EffectiveKey string            `json:"effective_key"`
	Found        bool              `json:"found"`
	State        string            `json:"state,omitempty"`
	Released     bool              `json:"released,omitempty"`
	Outcome      string            `json:"outcome,omitempty"`
	Fence        int64             `json:"fence,omitempty"`
	Attempts     int               `json:"attempts,omitempty"`
	ClaimedAt    time.Time         `json:"claimed_at,omitzero"`
	LeaseLeftMS  int64             `json:"lease_left_ms,omitempty"`
	CompletedAt  time.Time         `json:"completed_at,omitzero"`
	ResultBytes  int               `json:"result_bytes"`
	TTLLeftMS    int64             `json:"ttl_left_ms,omitempty"` // records only: the key's time to live
	Steps        []string          `json:"steps,omitempty"`
	Meta         map[string]string `json:"meta,omitempty"`
}

// viewOf is the view of rec, the record of key (stored as ekey) of
// handler, or of its absence when rec is nil.
func viewOf(handler, key, ekey string, rec *idempotency.Record) recordView {
	v := recordView{Handler: handler, Key: key, EffectiveKey: ekey, Found: rec != nil}
	if rec != nil {
		v.State, v.Released, v.Outcome, v.Fence, v.Attempts = string(rec.State), rec.Released, rec.Outcome, rec.Fence, rec.Attempts
		v.ClaimedAt, v.CompletedAt, v.ResultBytes, v.Meta = rec.ClaimedAt, rec.CompletedAt, len(rec.Result), rec.Meta
		if rec.State == idempotency.StateClaimed && !rec.Released {
			v.LeaseLeftMS = max(time.Until(rec.LeaseUntil).Milliseconds(), 0)
		}
		for s := range rec.Steps {
			v.Steps = append(v.Steps, s)
		}
		sort.Strings(v.Steps)
	}
	return v
}

func cmdInspect(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("inspect", "inspect (-c FILE | --redis URL [--namespace NS]) --handler NAME [-o table|json] KEY", `  dedupworker inspect -c config.yaml --handler orders order-1042
  dedupworker inspect --redis redis://127.0.0.1:6379/0 --namespace dedup --handler orders -o json order-1042
  dedupworker inspect -c config.yaml --handler orders order-1042 -o json   # flags may also follow KEY
`, stdout, stderr)
	sf := addStoreFlags(fs)
	output := fs.String("o", "table", "output `format`: table or json")
	if err := parseInterspersed(fs, args); err != nil {
		return err
	}
	if *output != "table" && *output != "json" {
		return usagef("-o %q: want table or json", *output)
	}
	store, key, closeStore, err := sf.open(fs)
	if err != nil {
		return err
	}
	defer closeStore()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ekey := idempotency.EffectiveKey(*sf.handler, key)
	rec, err := store.Get(ctx, ekey)
	if err != nil {
		return err
	}
	v := viewOf(*sf.handler, key, ekey, rec)
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("handler", v.Handler)
	row("key", v.Key)
	row("stored as", ekey)
	if !v.Found {
		row("state", "absent (never seen, expired, or not a valid record)")
		return tw.Flush()
	}
	state := v.State
	if v.Released {
		state += " (released for retry)"
	}
	row("state", state)
	if v.Outcome != "" {
		row("outcome", v.Outcome)
	}
	row("fence", fmt.Sprint(v.Fence))
	row("attempts", fmt.Sprint(v.Attempts))
	if !v.ClaimedAt.IsZero() {
		row("claimed at", v.ClaimedAt.UTC().Format(time.RFC3339Nano))
	}
	if v.State == string(idempotency.StateClaimed) && !v.Released {
		row("lease left", (time.Duration(v.LeaseLeftMS) * time.Millisecond).String())
	}
	if !v.CompletedAt.IsZero() {
		row("completed at", v.CompletedAt.UTC().Format(time.RFC3339Nano))
	}
	row("result", fmt.Sprintf("%d bytes", v.ResultBytes))
	if len(v.Steps) > 0 {
		row("steps", strings.Join(v.Steps, ", "))
	}
	for k, val := range v.Meta {
		row("meta."+k, val)
	}
	return tw.Flush()
}

func cmdForget(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("forget", "forget (-c FILE | --redis URL [--namespace NS]) --handler NAME ([--yes] KEY | --state S [--older-than D] (--dry-run|--yes))", `  dedupworker forget -c config.yaml --handler orders order-1042          # asks for confirmation
  dedupworker forget -c config.yaml --handler orders --yes order-1042    # in scripts
  dedupworker forget -c config.yaml --handler orders --state dead_lettered --dry-run
  dedupworker forget -c config.yaml --handler orders --state claimed --older-than 1h --yes
`, stdout, stderr)
	sf := addStoreFlags(fs)
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	bf := addBulkFlags(fs)
	if err := parseInterspersed(fs, args); err != nil {
		return err
	}
	if flagSet(fs, "state") {
		return bulkForget(fs, sf, bf, *yes, stdout, stderr)
	}
	if flagSet(fs, "older-than") || *bf.dryRun {
		return usagef("--older-than and --dry-run go with --state S (a bulk forget)")
	}
	store, key, closeStore, err := sf.open(fs)
	if err != nil {
		return err
	}
	defer closeStore()
	ekey := idempotency.EffectiveKey(*sf.handler, key)
	if !*yes {
		if !isTerminal(os.Stdin) {
			return usagef("refusing to delete %q without --yes (stdin is not a terminal to confirm on)", ekey)
		}
		fmt.Fprintf(stderr, "Delete the record of %q? The next delivery of this key will run the handler again. [y/N] ", ekey)
		answer, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			return usagef("not confirmed; nothing deleted")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	existed, err := store.Delete(ctx, ekey)
	if err != nil {
		return err
	}
	if existed {
		fmt.Fprintf(stdout, "deleted %s\n", ekey)
	} else {
		fmt.Fprintf(stdout, "no record for %s (nothing to delete)\n", ekey)
	}
	return nil
}

func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }
