package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/idemkit/dedupworker/redisbackend"
)

// bulkFlags are forget's flags for deleting every record in a state.
type bulkFlags struct {
	sel    selectFlags
	dryRun *bool
}

func addBulkFlags(fs *flag.FlagSet) bulkFlags {
	return bulkFlags{
		sel:    addSelectFlags(fs, ""),
		dryRun: fs.Bool("dry-run", false, "with --state: count and list what would be deleted, delete nothing"),
	}
}

// forgetBatch is how many keys go into one forget_if script call (per hash
// slot on a Cluster, so fewer there).
const forgetBatch = 1000

// afterScan, when set (by tests), runs between the scan and the deletes
// with the keys about to be deleted: the window in which a record may
// change and must then be kept.
var afterScan func(keys []string)

// bulkForget is forget --state: it scans the handler's records, keeps the
// keys of those in the state (and older than --older-than), and deletes
// each one with a script that checks the state (and age) again, so that a
// record that changed since the scan is kept.
func bulkForget(fs *flag.FlagSet, sf storeFlags, bf bulkFlags, yes bool, stdout, stderr io.Writer) error {
	if *sf.handler == "" || fs.NArg() != 0 {
		fs.Usage()
		return usagef("--handler NAME is required, and forget --state takes no KEY")
	}
	sel, err := bf.sel.parse()
	if err != nil {
		return err
	}
	switch {
	case *bf.dryRun && yes:
		return usagef("give --dry-run (delete nothing) or --yes (delete without asking), not both")
	case !*bf.dryRun && !yes && !isTerminal(os.Stdin):
		return usagef("refusing to delete the %s records of handler %q without --yes (stdin is not a terminal to confirm on); --dry-run shows what would go", sel.class, *sf.handler)
	}
	store, _, closeStore, err := sf.connect(fs)
	if err != nil {
		return err
	}
	defer closeStore()
	ctx, cancel := context.WithTimeout(context.Background(), scanTimeout)
	defer cancel()
	handler := *sf.handler
	var keys []string
	st, _, err := scanSelected(ctx, store, handler, sel, stderr, func(r redisbackend.ScannedRecord) bool {
		keys = append(keys, r.Key)
		return true
	})
	if err != nil {
		return err
	}
	what := fmt.Sprintf("%s records of handler %q", sel.class, handler)
	if sel.olderThan > 0 {
		what += " older than " + sel.olderThan.String()
	}
	if *bf.dryRun {
		for _, k := range keys {
			fmt.Fprintf(stdout, "would delete %s\n", k)
		}
		fmt.Fprintf(stdout, "dry run: matched %d %s (%d keys scanned); deleted 0\n", len(keys), what, st.Keys)
		return nil
	}
	if len(keys) == 0 {
		fmt.Fprintf(stdout, "matched 0 %s (%d keys scanned); nothing to delete\n", what, st.Keys)
		return nil
	}
	if !yes {
		fmt.Fprintf(stderr, "Delete %d %s? Their next deliveries will run the handler again. [y/N] ", len(keys), what)
		answer, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			return usagef("not confirmed; nothing deleted")
		}
	}
	if afterScan != nil {
		afterScan(keys)
	}
	var total redisbackend.ForgetResult
	for start := 0; start < len(keys); start += forgetBatch {
		r, err := store.ForgetIf(ctx, keys[start:min(start+forgetBatch, len(keys))], sel.class, sel.olderThan)
		total.Deleted, total.Kept, total.Gone = total.Deleted+r.Deleted, total.Kept+r.Kept, total.Gone+r.Gone
		if err != nil {
			fmt.Fprintf(stdout, "matched %d, deleted %d before the error\n", len(keys), total.Deleted)
			return err
		}
	}
	fmt.Fprintf(stdout, "matched %d %s; deleted %d, kept %d (changed since the scan), gone %d (expired or deleted since the scan)\n",
		len(keys), what, total.Deleted, total.Kept, total.Gone)
	return nil
}
