// Command relay measures the relays users run, in one run against one Redis,
// one Kafka and one NATS JetStream server (issue 15): the
// dedupworker binary's `run` with a forward action (Kafka→Kafka,
// NATS→NATS) and with an http action to a server this benchmark runs,
// beside the same relay written by hand without deduplication (raw) and
// with two Redis calls per message (naive), and Watermill's in-memory
// Deduplicator (bench/watermill, a module of its own).
//
// Every contender is a child process fed the same input: a backlog of -msgs
// messages on an 8-partition Kafka topic or a NATS stream, created fresh
// for each measurement and deleted after it; with -dups N, N of every 100 messages
// repeat the key, payload and partition of one at least 1000 messages
// earlier. For each it reports msgs/s (outputs ÷ time from the first to the
// last output), CPU per input message of Redis (INFO used_cpu_*), of the
// relay process (/proc/<pid>/stat) and of the whole machine (/proc/stat),
// Redis round trips and commands per message, peak RSS, p50/p99 publish →
// output latency at a fixed -rate, and correctness: every distinct key out
// at least once, and the first copies of each input partition's keys in
// input order. Scale-out runs 1, 2 and 4 dedupworker processes on one
// Kafka group or NATS durable. With -soak D it instead runs the dedupworker
// forward relay on each transport for D at -rate and samples it every
// -soak-every (soak.go).
//
//	go run ./dedupbench/relay                       # everything, from the bench folder
//	go run ./dedupbench/relay -json relay.json
//	go run ./dedupbench/relay -transports kafka -contenders raw,dedupworker -dups 0 -scale ""
//	go run ./dedupbench/relay -soak 10m -dups 30 -redis-server redis-server
//
// It reports; it does not judge. A Ctrl-C stops every child process and
// deletes what the run created.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/bench/dedupbench/internal/benchutil"
)

type options struct {
	brokers                []string
	natsURL, redisURL      string
	msgs, partitions       int
	pad                    int // bytes of padding in each backlog message's payload
	dups, scale            []int
	transports, contenders []string
	latency                time.Duration
	rate                   float64
	concurrency            int
	lease                  time.Duration
	workerBin, wmBin       string
	src                    string
	jsonOut                string
	redisServer            string
	rawFlags               []string // more flags of the raw and naive relays' child processes
	kafkaIsolation         string   // dedupworker's source.kafka.isolation; empty: its default
	localCacheEntries      int      // dedupworker's redis.local_cache.entries; 0: its default
	timeout, quiet         time.Duration
	// A soak (soak.go) instead of the measurements: for soak, sampled
	// every soakEvery, compared from soakWarmup on.
	soak, soakEvery, soakWarmup time.Duration
}

func main() {
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	if len(os.Args) > 1 && os.Args[1] == "child" {
		if err := childMain(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
		return
	}
	o, err := parseOptions(os.Args[1:])
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, o, os.Stdout); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

func parseOptions(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	var brokers, dups, scale, transports, contenders string
	fs.StringVar(&brokers, "kafka", "127.0.0.1:9092", "Kafka brokers, comma-separated")
	fs.StringVar(&o.natsURL, "nats", "nats://127.0.0.1:4222", "NATS URL with JetStream")
	fs.StringVar(&o.redisURL, "redis", "redis://127.0.0.1:6379/0", "Redis URL")
	fs.StringVar(&o.redisServer, "redis-server", "", "start a private Redis from this redis-server binary (e.g. redis-server) for the run instead of using -redis, so that no other client's work counts in Redis's CPU and round trips")
	var rawFlags string
	fs.StringVar(&rawFlags, "raw-flags", "", "more flags for the raw and naive relays, space-separated (e.g. \"-msg-id -pull-max 64\": the NATS output carries Nats-Msg-Id, the pull subscription asks for 64 messages; see relays.go)")
	fs.StringVar(&o.kafkaIsolation, "kafka-isolation", "", "dedupworker's source.kafka.isolation (read_committed, read_uncommitted); empty: its default")
	fs.IntVar(&o.localCacheEntries, "local-cache-entries", 0, "dedupworker's redis.local_cache.entries (0: its default): how many completed keys a process answers duplicates of without Redis")
	fs.IntVar(&o.msgs, "msgs", 50000, "backlog messages per measurement")
	fs.IntVar(&o.partitions, "partitions", 8, "partitions of each Kafka topic")
	fs.IntVar(&o.pad, "pad", 0, "bytes of padding in each backlog message's payload (about 100 bytes without), for the relays' memory with large messages; the latency phase's messages stay small")
	fs.StringVar(&dups, "dups", "0,30", "duplicate percentages")
	fs.StringVar(&scale, "scale", "1,2,4", "dedupworker process counts of the scale-out (0 % duplicates, no latency phase); empty: none")
	fs.StringVar(&transports, "transports", "kafka,nats", "transports")
	fs.StringVar(&contenders, "contenders", "raw,naive,watermill,dedupworker,dedupworker-http", "contenders")
	fs.DurationVar(&o.latency, "latency", 5*time.Second, "how long the latency phase publishes at -rate (0: none)")
	fs.Float64Var(&o.rate, "rate", 2000, "publish rate of the latency phase, msgs/s")
	fs.IntVar(&o.concurrency, "concurrency", 64, "dedupworker's concurrency, and the naive relay's Redis calls in flight")
	fs.DurationVar(&o.lease, "lease", 30*time.Second, "dedupworker's lease, and the naive claim's PX")
	fs.StringVar(&o.workerBin, "dedupworker", "", "a dedupworker binary (default: go build ./cmd/dedupworker in -src)")
	fs.StringVar(&o.wmBin, "watermill", "", "a bench/watermill binary (default: go build in -src/bench/watermill)")
	fs.StringVar(&o.src, "src", "..", "the product module's root, which the binaries are built from (the bench module's parent)")
	fs.StringVar(&o.jsonOut, "json", "", "also write the results as JSON to this file")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "how long one backlog may take")
	fs.DurationVar(&o.quiet, "quiet", 2*time.Second, "after every distinct key is out, how long without output ends a backlog that repeats some")
	fs.DurationVar(&o.soak, "soak", 0, "instead of the measurements, soak the dedupworker forward relay (one process) on each of -transports for this long at -rate with the first -dups share of duplicates (0: no soak)")
	fs.DurationVar(&o.soakEvery, "soak-every", 30*time.Second, "how often the soak samples the relay")
	fs.DurationVar(&o.soakWarmup, "soak-warmup", 2*time.Minute, "the soak's flatness compares the first sample from this time on with the last")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.brokers, o.transports, o.contenders = benchutil.SplitList(brokers), benchutil.SplitList(transports), benchutil.SplitList(contenders)
	o.rawFlags = strings.Fields(rawFlags)
	if len(o.rawFlags) > 0 {
		// The child's own parser says which flag is wrong before anything runs.
		if _, err := parseChildFlags(append([]string{"-in", "x", "-out", "x", "-group", "x", "-ns", "x"}, o.rawFlags...)); err != nil {
			return o, fmt.Errorf("-raw-flags %q: %w", rawFlags, err)
		}
	}
	var err error
	if o.dups, err = intList("-dups", dups, 0, 90); err != nil {
		return o, err
	}
	if o.scale, err = intList("-scale", scale, 1, 64); err != nil {
		return o, err
	}
	if o.soak < 0 || o.soakEvery <= 0 || o.soakWarmup < 0 {
		return o, errors.New("-soak, -soak-every, -soak-warmup: durations ≥ 0, and -soak-every > 0")
	}
	if o.soak > 0 {
		if o.soakEvery > o.soak {
			return o, fmt.Errorf("-soak-every %v: at most -soak %v, so that the soak takes a sample", o.soakEvery, o.soak)
		}
		if len(o.dups) == 0 {
			return o, errors.New("-dups: the soak takes its duplicate share from the first value; give one")
		}
		// The soak runs the dedupworker relay alone.
		o.contenders, o.scale = []string{"dedupworker"}, nil
	}
	if o.msgs < 2*minDupDistance {
		return o, fmt.Errorf("-msgs: at least %d, so that duplicates come %d messages after their originals", 2*minDupDistance, minDupDistance)
	}
	if o.partitions < 1 {
		return o, errors.New("-partitions: at least 1")
	}
	if o.localCacheEntries < 0 {
		return o, errors.New("-local-cache-entries: 0 (the default) or more")
	}
	if o.pad < 0 {
		return o, errors.New("-pad: 0 or more bytes")
	}
	if o.rate <= 0 {
		return o, errors.New("-rate: a positive rate")
	}
	return o, nil
}

func intList(flagName, s string, lo, hi int) ([]int, error) {
	var out []int
	for _, f := range benchutil.SplitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < lo || n > hi {
			return nil, fmt.Errorf("%s: %q is not a number from %d to %d", flagName, f, lo, hi)
		}
		out = append(out, n)
	}
	return out, nil
}

// report is the JSON document.
type report struct {
	Started   time.Time      `json:"started"`
	GoVersion string         `json:"go_version"`
	CPUs      int            `json:"cpus"`
	Commit    string         `json:"commit,omitempty"`
	Options   map[string]any `json:"options"`
	Results   []result       `json:"results,omitempty"`
	Soaks     []soakResult   `json:"soaks,omitempty"`
}

// run measures every planned scenario, writes the report to w and returns
// it.
func run(ctx context.Context, o options, w io.Writer) (report, error) {
	b := &bench{o: o, run: fmt.Sprintf("%06x", rand.Uint32()&0xffffff), kafka: kafkaAdmin{brokers: o.brokers}}
	b.logProgress = log.Printf
	var err error
	if b.self, err = os.Executable(); err != nil {
		return report{}, err
	}
	if b.tmp, err = os.MkdirTemp("", "dedupbench-relay-"); err != nil {
		return report{}, err
	}
	defer func() { _ = os.RemoveAll(b.tmp) }()
	if err := b.buildBinaries(ctx); err != nil {
		return report{}, err
	}
	if o.redisServer != "" {
		url, stop, err := startRedis(ctx, o.redisServer, b.tmp)
		if err != nil {
			return report{}, err
		}
		defer func() {
			if err := stop(); err != nil {
				log.Printf("private redis-server: %v", err)
			}
		}()
		o.redisURL, b.o.redisURL = url, url
	}
	opt, err := redis.ParseURL(o.redisURL)
	if err != nil {
		return report{}, fmt.Errorf("-redis: %w", err)
	}
	opt.PoolSize, opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 2, 3*time.Second, 10*time.Second, 10*time.Second
	b.stats = redis.NewClient(opt)
	defer func() { _ = b.stats.Close() }()
	if _, err := readRedisStats(ctx, b.stats); err != nil {
		return report{}, fmt.Errorf("-redis %s: %w", o.redisURL, err)
	}
	if has(o.transports, "nats") {
		if b.nats, err = newNATSAdmin(o.natsURL); err != nil {
			return report{}, err
		}
		defer b.nats.close()
	}
	rep := report{
		Started: time.Now().UTC(), GoVersion: runtime.Version(), CPUs: runtime.NumCPU(), Commit: gitCommit(o.src),
		Options: map[string]any{
			"msgs": o.msgs, "partitions": o.partitions, "latency": o.latency.String(), "rate": o.rate,
			"concurrency": o.concurrency, "lease": o.lease.String(), "raw_flags": strings.Join(o.rawFlags, " "), "kafka_isolation": o.kafkaIsolation, "local_cache_entries": o.localCacheEntries, "kafka": o.brokers, "nats": o.natsURL, "redis": o.redisURL, "private_redis": o.redisServer != "",
		},
	}
	if o.soak > 0 {
		rep.Options["soak"], rep.Options["soak_every"], rep.Options["soak_warmup"], rep.Options["dups"] = o.soak.String(), o.soakEvery.String(), o.soakWarmup.String(), o.dups[0]
		log.Printf("relay soak %s at %s: load average %s", b.run, orDefault(rep.Commit, "?"), benchutil.LoadAvg())
		for _, t := range o.transports {
			if ctx.Err() != nil {
				break
			}
			r := b.runSoak(ctx, t)
			if r.Err != "" {
				log.Printf("soak %s FAILED: %s", t, r.Err)
			}
			rep.Soaks = append(rep.Soaks, r)
		}
		printSoakReport(w, rep)
		return rep, writeJSON(o.jsonOut, rep, ctx.Err())
	}
	log.Printf("relay benchmark %s at %s: %d messages per measurement, load average %s", b.run, orDefault(rep.Commit, "?"), o.msgs, benchutil.LoadAvg())
	for _, sc := range plannedScenarios(o) {
		if ctx.Err() != nil {
			break
		}
		r := b.runScenario(ctx, sc)
		if r.Err != "" {
			log.Printf("%s %s dup=%d%% x%d FAILED: %s", sc.Transport, sc.Contender, sc.DupPct, sc.Procs, r.Err)
		}
		rep.Results = append(rep.Results, r)
	}
	printReport(w, rep)
	return rep, writeJSON(o.jsonOut, rep, ctx.Err())
}

// writeJSON writes rep to path unless path is empty, and returns err or the
// write's error.
func writeJSON(path string, rep report, err error) error {
	if path == "" {
		return err
	}
	js, jerr := json.MarshalIndent(rep, "", "  ")
	if jerr == nil {
		jerr = os.WriteFile(path, append(js, '\n'), 0o644)
	}
	if jerr != nil {
		return errors.Join(err, fmt.Errorf("-json %s: %w", path, jerr))
	}
	return err
}

// plannedScenarios lists the measurements in run order: per duplicate
// share, per transport, every contender; then the scale-out.
func plannedScenarios(o options) []scenario {
	var out []scenario
	for _, d := range o.dups {
		for _, t := range o.transports {
			for _, c := range o.contenders {
				out = append(out, scenario{Transport: t, Contender: c, DupPct: d, Procs: 1, Latency: true})
			}
		}
	}
	for _, t := range o.transports {
		for _, n := range o.scale {
			out = append(out, scenario{Transport: t, Contender: "dedupworker", DupPct: 0, Procs: n, ScaleOut: true})
		}
	}
	return out
}

func has(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func (b *bench) buildBinaries(ctx context.Context) error {
	needWorker := has(b.o.contenders, "dedupworker") || has(b.o.contenders, "dedupworker-http") || len(b.o.scale) > 0
	if b.o.workerBin == "" && needWorker {
		p, err := buildBinary(ctx, b.o.src, "./cmd/dedupworker", b.tmp, "dedupworker")
		if err != nil {
			return fmt.Errorf("-dedupworker: %w", err)
		}
		b.workerBin = p
	} else {
		b.workerBin = b.o.workerBin
	}
	if b.o.wmBin == "" && has(b.o.contenders, "watermill") {
		p, err := buildBinary(ctx, filepath.Join(b.o.src, "bench", "watermill"), ".", b.tmp, "watermill-relay")
		if err != nil {
			return fmt.Errorf("-watermill: %w", err)
		}
		b.wmBin = p
	} else {
		b.wmBin = b.o.wmBin
	}
	return nil
}

// gitCommit returns the commit the sources in dir are at, or "".
func gitCommit(dir string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := execOutput(ctx, dir, "git", "rev-parse", "--short=12", "HEAD")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}
