package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/redisbackend"
)

// statsView is stats -o json.
type statsView struct {
	Namespace string `json:"namespace"`
	// Sampled is false when the scan read every key of the namespace.
	Sampled     bool           `json:"sampled"`
	KeysScanned int            `json:"keys_scanned"`
	Records     int            `json:"records"`
	Handlers    []handlerStats `json:"handlers"`
	// BytesPerRecord is the mean MEMORY USAGE of MemorySampled records.
	BytesPerRecord float64                   `json:"bytes_per_record"`
	MemorySampled  int                       `json:"memory_sampled"`
	UsedMemory     int64                     `json:"used_memory"`
	MaxMemory      int64                     `json:"maxmemory"` // 0: no limit
	Policies       []string                  `json:"maxmemory_policies"`
	Nodes          []redisbackend.NodeMemory `json:"nodes"`
	Projection     *projection               `json:"projection,omitempty"`
}

// handlerStats is one handler's part of the sample.
type handlerStats struct {
	Name      string         `json:"name"`
	Retention string         `json:"retention,omitempty"` // "" for records of no handler of the file
	ByState   map[string]int `json:"by_state"`
	// BytesPerCompleted is the mean MEMORY USAGE of CompletedSampled of
	// the handler's completed records.
	BytesPerCompleted float64 `json:"bytes_per_completed"`
	CompletedSampled  int     `json:"completed_sampled"`
}

// projection is what --rate predicts: every handler's completed records
// for its retention, at rate new keys per second each.
type projection struct {
	RatePerSecond float64          `json:"rate_per_second"`
	Bytes         int64            `json:"bytes"`
	PerHandler    map[string]int64 `json:"per_handler"`
	// Fits is Bytes < MaxMemory; absent when there is no maxmemory.
	Fits *bool  `json:"fits,omitempty"`
	Note string `json:"note"`
}

// memSample is how many records per handler (and overall) stats measures
// with MEMORY USAGE.
const memSample = 200

func cmdStats(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("stats", "stats -c FILE [--rate R/s] [--sample N] [-o table|json]", `  dedupworker stats -c config.yaml
  dedupworker stats -c config.yaml --rate 500/s        # will a day of retention at 500 new keys/s fit?
`, stdout, stderr)
	file := fs.String("c", "", "the config `file`: its redis section and its handlers' retention")
	rateS := fs.String("rate", "", "new keys per second of each handler (`R/s`, or R/m, R/h): project the memory its retention holds")
	sample := fs.Int("sample", 10000, "read at most `N` keys (SCAN) for the counts by state")
	output := fs.String("o", "table", "output `format`: table or json")
	if err := parseInterspersed(fs, args); err != nil {
		return err
	}
	if *file == "" || fs.NArg() != 0 {
		fs.Usage()
		return usagef("-c FILE is required (the retention of its handlers is what --rate projects), and stats takes no arguments")
	}
	if *output != "table" && *output != "json" {
		return usagef("-o %q: want table or json", *output)
	}
	if *sample < 1 {
		return usagef("--sample %d: want at least 1", *sample)
	}
	var rate float64
	if *rateS != "" {
		var err error
		if rate, err = parseRate(*rateS); err != nil {
			return err
		}
	}
	empty := ""
	sf := storeFlags{file: file, redisURL: &empty, namespace: &empty, handler: &empty}
	store, cfg, closeStore, err := sf.connect(fs)
	if err != nil {
		return err
	}
	defer closeStore()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	v, err := gatherStats(ctx, store, cfg, *sample, rate, stderr)
	if err != nil {
		return err
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	printStats(stdout, v)
	return nil
}

// parseRate reads "R/s", "R/m", "R/h" or "R" (per second).
func parseRate(s string) (float64, error) {
	num, unit, _ := strings.Cut(s, "/")
	per := map[string]float64{"": 1, "s": 1, "m": 60, "h": 3600}[unit]
	r, err := strconv.ParseFloat(num, 64)
	if err != nil || per == 0 || r <= 0 {
		return 0, usagef("--rate %q: want new keys per second as R/s (or R/m, R/h), e.g. 500/s", s)
	}
	return r / per, nil
}

func gatherStats(ctx context.Context, store *redisbackend.Store, cfg *config.Config, sample int, rate float64, stderr io.Writer) (*statsView, error) {
	v := &statsView{Namespace: store.Namespace()}
	byName := map[string]*handlerStats{}
	var order []string
	handlerOf := func(key string) *handlerStats {
		name := "(no handler of the file)"
		best := -1
		for _, h := range cfg.Handlers {
			if strings.HasPrefix(key, h.Name+":") && len(h.Name) > best {
				name, best = h.Name, len(h.Name)
			}
		}
		hs, ok := byName[name]
		if !ok {
			hs = &handlerStats{Name: name, ByState: map[string]int{}}
			byName[name], order = hs, append(order, name)
		}
		return hs
	}
	for _, h := range cfg.Handlers {
		handlerOf(h.Name + ":").Retention = h.Retention.D().String()
	}
	completed := map[string][]string{} // handler → sampled completed keys
	var some []string
	p := newProgress(stderr)
	var st redisbackend.ScanStats
	err := store.Scan(ctx, "", 0, func(page []redisbackend.ScannedRecord, s redisbackend.ScanStats) (bool, error) {
		st = s
		for _, r := range page {
			hs := handlerOf(r.Key)
			c := redisbackend.ClassOf(r.Record)
			hs.ByState[string(c)]++
			if c == redisbackend.ClassCompleted && len(completed[hs.Name]) < memSample {
				completed[hs.Name] = append(completed[hs.Name], r.Key)
			}
			if len(some) < memSample {
				some = append(some, r.Key)
			}
		}
		p.update(s, s.Records)
		if s.Keys >= sample {
			v.Sampled = true
			return false, nil
		}
		return true, nil
	})
	p.done()
	if err != nil {
		return nil, err
	}
	v.KeysScanned, v.Records = st.Keys, st.Records
	mean := func(keys []string) (float64, int, error) {
		if len(keys) == 0 {
			return 0, 0, nil
		}
		sizes, err := store.MemoryUsage(ctx, keys)
		if err != nil {
			return 0, 0, err
		}
		var sum, n int64
		for _, s := range sizes {
			if s > 0 {
				sum, n = sum+s, n+1
			}
		}
		if n == 0 {
			return 0, 0, nil
		}
		return float64(sum) / float64(n), int(n), nil
	}
	if v.BytesPerRecord, v.MemorySampled, err = mean(some); err != nil {
		return nil, err
	}
	for _, name := range order {
		hs := byName[name]
		if hs.BytesPerCompleted, hs.CompletedSampled, err = mean(completed[name]); err != nil {
			return nil, err
		}
		v.Handlers = append(v.Handlers, *hs)
	}
	nodes, err := store.Memory(ctx)
	if err != nil {
		return nil, err
	}
	v.Nodes = nodes
	seen := map[string]bool{}
	for _, n := range nodes {
		v.UsedMemory += n.UsedMemory
		v.MaxMemory += n.MaxMemory
		if !seen[n.Policy] {
			seen[n.Policy] = true
			v.Policies = append(v.Policies, n.Policy)
		}
	}
	for _, n := range nodes {
		if n.MaxMemory == 0 {
			v.MaxMemory = 0 // one unlimited primary: no limit to compare with
		}
	}
	if rate > 0 {
		v.Projection = project(v, cfg, rate)
	}
	return v, nil
}

// project is rate × retention × bytes per completed record, for each
// handler of cfg: the handler's own measure, else the mean of all records
// sampled.
func project(v *statsView, cfg *config.Config, rate float64) *projection {
	pr := &projection{RatePerSecond: rate, PerHandler: map[string]int64{}}
	var guessed []string
	for _, h := range cfg.Handlers {
		per, own := v.BytesPerRecord, false
		for _, hs := range v.Handlers {
			if hs.Name == h.Name && hs.CompletedSampled > 0 {
				per, own = hs.BytesPerCompleted, true
			}
		}
		if !own {
			guessed = append(guessed, h.Name)
		}
		b := int64(rate * h.Retention.D().Seconds() * per)
		pr.PerHandler[h.Name] = b
		pr.Bytes += b
	}
	switch {
	case v.BytesPerRecord == 0:
		pr.Note = "no records to measure: write some (run the worker) and ask again"
	case len(guessed) > 0:
		pr.Note = fmt.Sprintf("no completed records of %s sampled: their size is the mean of all records", strings.Join(guessed, ", "))
	default:
		pr.Note = "each handler's completed records, measured by MEMORY USAGE"
	}
	if v.MaxMemory > 0 {
		fits := pr.Bytes < v.MaxMemory
		pr.Fits = &fits
	}
	return pr
}

func printStats(w io.Writer, v *statsView) {
	how := fmt.Sprintf("all %d keys of namespace %q", v.KeysScanned, v.Namespace)
	if v.Sampled {
		how = fmt.Sprintf("a SAMPLE of %d keys of namespace %q (SCAN stopped at --sample; counts are of the sample, not totals)", v.KeysScanned, v.Namespace)
	}
	fmt.Fprintf(w, "Records by state, from %s:\n", how)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HANDLER\tRETENTION\tCLAIMED\tRELEASED\tCOMPLETED\tDEAD_LETTERED\tBYTES/COMPLETED")
	for _, h := range v.Handlers {
		ret := h.Retention
		if ret == "" {
			ret = "-"
		}
		size := "-"
		if h.CompletedSampled > 0 {
			size = fmt.Sprintf("%.0f (of %d)", h.BytesPerCompleted, h.CompletedSampled)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\n", h.Name, ret, h.ByState["claimed"], h.ByState["released"], h.ByState["completed"], h.ByState["dead_lettered"], size)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nbytes per record: %.0f (MEMORY USAGE of %d records)\n", v.BytesPerRecord, v.MemorySampled)
	maxS := "none (no limit: the host's memory is)"
	if v.MaxMemory > 0 {
		maxS = humanBytes(v.MaxMemory)
	}
	fmt.Fprintf(w, "used_memory: %s   maxmemory: %s   maxmemory-policy: %s", humanBytes(v.UsedMemory), maxS, strings.Join(v.Policies, ", "))
	if len(v.Nodes) > 1 {
		fmt.Fprintf(w, "   (sum over %d primaries)", len(v.Nodes))
	}
	fmt.Fprintln(w)
	for _, p := range v.Policies {
		if p != "noeviction" && p != "" {
			fmt.Fprintf(w, "warning: maxmemory-policy %s may evict records (every record has a TTL), and an evicted record lets a duplicate run again; set noeviction\n", p)
		}
	}
	if pr := v.Projection; pr != nil {
		fmt.Fprintf(w, "\nAt %g new keys/s per handler, retention holds:\n", pr.RatePerSecond)
		for _, name := range slices.Sorted(maps.Keys(pr.PerHandler)) {
			fmt.Fprintf(w, "  %s: %s\n", name, humanBytes(pr.PerHandler[name]))
		}
		fmt.Fprintf(w, "  total: %s (%s)\n", humanBytes(pr.Bytes), pr.Note)
		switch {
		case pr.Fits == nil:
			fmt.Fprintln(w, "  no maxmemory to compare with")
		case *pr.Fits:
			fmt.Fprintf(w, "  fits under maxmemory %s (%.0f%%)\n", humanBytes(v.MaxMemory), 100*float64(pr.Bytes)/float64(v.MaxMemory))
		default:
			fmt.Fprintf(w, "  does NOT fit under maxmemory %s (%.0f%%): raise maxmemory, shorten retention, or add primaries\n", humanBytes(v.MaxMemory), 100*float64(pr.Bytes)/float64(v.MaxMemory))
		}
	}
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
