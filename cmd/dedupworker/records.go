package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/redisbackend"
)

// selectFlags choose records by class and age: records and the bulk forget
// share them.
type selectFlags struct {
	state, olderThan *string
}

func addSelectFlags(fs *flag.FlagSet, defaultState string) selectFlags {
	return selectFlags{
		state:     fs.String("state", defaultState, "the records' `state`: claimed, completed, dead_lettered, released or all"),
		olderThan: fs.String("older-than", "", "only records claimed (CLAIMED) or completed (COMPLETED) longer than this `duration` ago (30m, 24h, 7d)"),
	}
}

// selection is what selectFlags chose.
type selection struct {
	class     redisbackend.Class
	olderThan time.Duration
}

func (f selectFlags) parse() (selection, error) {
	sel := selection{class: redisbackend.Class(*f.state)}
	valid := false
	names := make([]string, len(redisbackend.Classes))
	for i, c := range redisbackend.Classes {
		valid = valid || c == sel.class
		names[i] = string(c)
	}
	if !valid {
		return sel, usagef("--state %q: want one of %s", *f.state, strings.Join(names, ", "))
	}
	if *f.olderThan != "" {
		d, err := config.ParseDuration(*f.olderThan)
		if err != nil || d <= 0 {
			return sel, usagef("--older-than %q: want a positive duration such as 30m, 24h or 7d", *f.olderThan)
		}
		sel.olderThan = d
	}
	return sel, nil
}

// matches reports whether r is selected at time now.
func (sel selection) matches(r redisbackend.ScannedRecord, now time.Time) bool {
	if !sel.class.Matches(r.Record) {
		return false
	}
	if sel.olderThan == 0 {
		return true
	}
	at := redisbackend.Since(r.Record)
	return !at.IsZero() && now.Sub(at) > sel.olderThan
}

// progress writes "scanned N keys" to a terminal, rewriting its line, and
// nothing to anything else (a pipe, a file, a test's buffer).
type progress struct {
	w    io.Writer
	last time.Time
}

func newProgress(stderr io.Writer) *progress {
	if f, ok := stderr.(*os.File); ok && isTerminal(f) {
		return &progress{w: f}
	}
	return &progress{}
}

func (p *progress) update(st redisbackend.ScanStats, matched int) {
	if p.w == nil || time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "\rscanned %d keys, %d records, %d selected", st.Keys, st.Records, matched)
}

func (p *progress) done() {
	if p.w != nil && !p.last.IsZero() {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

// scanSelected scans the records of handler and calls fn with each one sel
// selects, until fn returns false. Ages are on the Redis server's clock, as
// the records' times are and as forget_if.lua measures them, so that the
// scan and the script agree on what is older than --older-than; now is the
// server's time when the scan started.
func scanSelected(ctx context.Context, store *redisbackend.Store, handler string, sel selection, stderr io.Writer, fn func(redisbackend.ScannedRecord) bool) (_ redisbackend.ScanStats, now time.Time, _ error) {
	now, err := store.Time(ctx)
	if err != nil {
		return redisbackend.ScanStats{}, now, err
	}
	p := newProgress(stderr)
	defer p.done()
	var last redisbackend.ScanStats
	matched := 0
	err = store.Scan(ctx, handler, 0, func(page []redisbackend.ScannedRecord, st redisbackend.ScanStats) (bool, error) {
		last = st
		for _, r := range page {
			if sel.matches(r, now) {
				matched++
				if !fn(r) {
					return false, nil
				}
			}
		}
		p.update(st, matched)
		return true, nil
	})
	return last, now, err
}

// scanTimeout bounds a whole scan: SCAN of millions of keys takes seconds
// per million, and each call within it has the client's read timeout.
const scanTimeout = 30 * time.Minute

func cmdRecords(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("records", "records (-c FILE | --redis URL [--namespace NS]) --handler NAME [--state S] [--older-than D] [--limit N] [-o table|json]", `  dedupworker records -c config.yaml --handler orders                        # 100 records, any state
  dedupworker records -c config.yaml --handler orders --state claimed --older-than 10m
  dedupworker records -c config.yaml --handler orders --state dead_lettered --limit 0 -o json > dlq.json
`, stdout, stderr)
	sf := addStoreFlags(fs)
	selF := addSelectFlags(fs, string(redisbackend.ClassAll))
	limit := fs.Int("limit", 100, "stop after `N` records (0: no limit); the scan stops there too")
	output := fs.String("o", "table", "output `format`: table or json (an array of inspect -o json objects)")
	if err := parseInterspersed(fs, args); err != nil {
		return err
	}
	if *sf.handler == "" || fs.NArg() != 0 {
		fs.Usage()
		return usagef("--handler NAME is required, and records takes no KEY (for one key use inspect)")
	}
	if *output != "table" && *output != "json" {
		return usagef("-o %q: want table or json", *output)
	}
	if *limit < 0 {
		return usagef("--limit %d: want 0 (no limit) or more", *limit)
	}
	sel, err := selF.parse()
	if err != nil {
		return err
	}
	store, _, closeStore, err := sf.connect(fs)
	if err != nil {
		return err
	}
	defer closeStore()
	ctx, cancel := context.WithTimeout(context.Background(), scanTimeout)
	defer cancel()
	handler := *sf.handler
	var found []redisbackend.ScannedRecord
	st, now, err := scanSelected(ctx, store, handler, sel, stderr, func(r redisbackend.ScannedRecord) bool {
		found = append(found, r)
		return *limit == 0 || len(found) < *limit
	})
	if err != nil {
		return err
	}
	slices.SortFunc(found, func(a, b redisbackend.ScannedRecord) int { return strings.Compare(a.Key, b.Key) })
	views := make([]recordView, len(found))
	for i, r := range found {
		views[i] = viewOf(handler, strings.TrimPrefix(r.Key, handler+":"), r.Key, r.Record)
		views[i].TTLLeftMS = r.TTL.Milliseconds()
		if redisbackend.ClassOf(r.Record) == redisbackend.ClassClaimed { // on the server's clock, as the lease is
			views[i].LeaseLeftMS = max(r.Record.LeaseUntil.Sub(now).Milliseconds(), 0)
		}
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(views)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tOUTCOME\tFENCE\tATTEMPTS\tAGE\tLEASE LEFT\tTTL LEFT")
	for i, v := range views {
		rec := found[i].Record
		lease := "-"
		if v.State == "CLAIMED" && !v.Released {
			lease = roundDur(time.Duration(v.LeaseLeftMS) * time.Millisecond)
		}
		age := "-"
		if at := redisbackend.Since(rec); !at.IsZero() {
			age = roundDur(now.Sub(at))
		}
		ttl := "none"
		if found[i].TTL > 0 {
			ttl = roundDur(found[i].TTL)
		}
		outcome := v.Outcome
		if outcome == "" {
			outcome = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", v.Key, redisbackend.ClassOf(rec), outcome, v.Fence, v.Attempts, age, lease, ttl)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	more := ""
	if *limit > 0 && len(found) == *limit {
		more = fmt.Sprintf(" (--limit %d reached; there may be more)", *limit)
	}
	fmt.Fprintf(stderr, "%d records of handler %q in state %s%s; %d keys scanned\n", len(found), handler, sel.class, more, st.Keys)
	return nil
}

// roundDur rounds d for a table: to the second, or to the millisecond
// under a second.
func roundDur(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
