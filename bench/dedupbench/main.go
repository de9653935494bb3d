// Command dedupbench measures what deduplication costs on this machine, in
// one run against one Redis, one NATS JetStream server and one
// Kafka-protocol broker (issue 7).
//
// For each transport, without duplicates and with 3 in 10 messages
// repeating a key, with a no-op handler, it runs:
//
//   - raw: consume and ack (NATS) or commit (Kafka) only: the broker's
//     ceiling;
//   - naive: one-key Claim and Complete calls of the project's redisbackend
//     from concurrent goroutines, as a team would write by hand;
//   - dedupworker: the real consumer.Worker with the idempotency engine on
//     redisbackend;
//
// and, without a broker, redis-limit: the store's batch claim and complete
// scripts driven directly with several batches in flight (Redis's ceiling).
//
// Each broker scenario consumes a backlog of --msgs messages (throughput,
// Redis round trips and commands, CPU, peak RSS), then messages published at
// half that throughput for --latency (publish timestamp header → ack).
//
//	go run ./dedupbench                       # everything, a few minutes
//	go run ./dedupbench --json bench.json
//	go run ./dedupbench --transports nats --modes dedupworker --dups 0 --cpuprofile cpu.out
//	go run ./dedupbench --soak 10m            # RSS and goroutines every 10s
//
// By default NATS is embedded (nats-server/v2) and Kafka is franz-go's kfake,
// both in this process: their CPU and memory count in the process figures.
// Pass --nats and --kafka to measure against servers of their own.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/bench/dedupbench/internal/benchutil"
)

type options struct {
	redisURL        string
	natsURL         string
	kafka           string
	msgs            int
	latency         time.Duration
	concurrency     int
	batch           int
	flights         int
	transports      []string
	modes           []string
	dups            []int
	jsonOut         string
	cpuProfile      string
	memProfile      string
	kafkaUnfinished int
	kafkaFetchBytes int
	soak            time.Duration
	latencyRate     float64
	serveKfake      string
	kafkaOrdering   string
	soakRate        float64
}

func main() {
	var o options
	var transports, modes, dups string
	flag.StringVar(&o.redisURL, "redis", "redis://127.0.0.1:6379/0", "Redis URL")
	flag.StringVar(&o.natsURL, "nats", "", "NATS URL with JetStream (default: an embedded nats-server)")
	flag.StringVar(&o.kafka, "kafka", "", "Kafka brokers, comma-separated (default: an in-process kfake broker)")
	flag.IntVar(&o.msgs, "msgs", 20000, "messages per throughput measurement")
	flag.DurationVar(&o.latency, "latency", 3*time.Second, "how long messages are published at half the measured throughput for the latency measurement (0: skip)")
	flag.Float64Var(&o.latencyRate, "latency-rate", 0, "publish rate of the latency measurement (default: half the scenario's measured throughput)")
	flag.StringVar(&o.serveKfake, "serve-kfake", "", "only run an in-memory kfake broker on this loopback address (e.g. 127.0.0.1:9092) until interrupted, for --kafka from another process")
	flag.IntVar(&o.concurrency, "concurrency", 256, "handler concurrency of the worker, and goroutines of the naive consumer")
	flag.IntVar(&o.batch, "batch", 100, "redis-limit batch size, and the Kafka source's BatchSize")
	flag.IntVar(&o.kafkaUnfinished, "kafka-unfinished", 0, "the Kafka source's MaxUnfinished per partition (0: its default)")
	flag.IntVar(&o.kafkaFetchBytes, "kafka-fetch-bytes", 0, "the Kafka source's FetchMaxBytes (0: its default)")
	flag.StringVar(&o.kafkaOrdering, "kafka-ordering", "key", "the Kafka source's Ordering: key (the benchmark's messages have no Kafka key, so they are not ordered) or partition (offset order per partition: at most one message per partition in flight)")
	flag.IntVar(&o.flights, "flights", 4, "redis-limit batches in flight")
	flag.StringVar(&transports, "transports", "nats,kafka", "transports to measure")
	flag.StringVar(&modes, "modes", "raw,naive,dedupworker,redis-limit", "scenarios to run")
	flag.StringVar(&dups, "dups", "0,30", "duplicate percentages")
	flag.StringVar(&o.jsonOut, "json", "", "write the results as JSON to this file")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.StringVar(&o.memProfile, "memprofile", "", "write an allocation profile at the end of the run to this file, and the in-use heap at the end of each backlog to FILE.<scenario>.inuse")
	flag.DurationVar(&o.soak, "soak", 0, "instead of the table: run the worker on loopback servers for this long (at most 1h), printing RSS and goroutines every 10s")
	flag.Float64Var(&o.soakRate, "soak-rate", 4000, "messages per second per transport during --soak")
	flag.Parse()
	o.transports = benchutil.SplitList(transports)
	o.modes = benchutil.SplitList(modes)
	for _, d := range benchutil.SplitList(dups) {
		n, err := strconv.Atoi(d)
		if err != nil || n < 0 || n > 90 {
			log.Fatalf("--dups: %q is not a percentage between 0 and 90", d)
		}
		o.dups = append(o.dups, n)
	}
	if o.msgs < 2000 {
		log.Fatal("--msgs: at least 2000")
	}
	log.SetFlags(log.Ltime | log.Lmicroseconds)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	var err error
	if o.serveKfake != "" {
		err = serveKfake(ctx, o.serveKfake)
	} else if o.soak > 0 {
		err = soak(ctx, o)
	} else {
		err = run(ctx, o)
	}
	if o.memProfile != "" {
		if f, ferr := os.Create(o.memProfile); ferr == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			_ = f.Close()
		}
	}
	if err != nil {
		log.Print(err)
		if o.cpuProfile != "" {
			pprof.StopCPUProfile()
		}
		os.Exit(1)
	}
}

// result is one row of the table.
type result struct {
	Transport  string  `json:"transport"`
	Mode       string  `json:"mode"`
	DupPct     int     `json:"dup_pct"`
	Msgs       int     `json:"msgs"`
	Seconds    float64 `json:"seconds"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	// TripsPerMsg counts round trips to Redis (a pipeline is one);
	// CallsPerMsg every top-level command (EVALSHA/EVAL included), both
	// from a go-redis hook.
	TripsPerMsg float64 `json:"redis_round_trips_per_msg"`
	CallsPerMsg float64 `json:"redis_top_level_calls_per_msg"`
	// ScriptCmdsPerMsg is what Redis ran inside scripts per message: the
	// INFO commandstats delta less the top-level calls.
	ScriptCmdsPerMsg float64            `json:"redis_script_cmds_per_msg"`
	RedisCmdsByName  map[string]float64 `json:"redis_cmds_per_msg_by_name"`
	RedisCPUPerMsgUs float64            `json:"redis_cpu_us_per_msg"`
	// The engine's store calls per message (dedupworker only).
	ClaimCallsPerMsg    float64 `json:"engine_claim_calls_per_msg,omitempty"`
	CompleteCallsPerMsg float64 `json:"engine_complete_calls_per_msg,omitempty"`
	OtherCallsPerMsg    float64 `json:"engine_other_store_calls_per_msg,omitempty"`
	LatencyRate         float64 `json:"latency_rate_msgs_per_sec,omitempty"`
	LatencyN            int     `json:"latency_samples,omitempty"`
	P50Ms               float64 `json:"latency_p50_ms,omitempty"`
	P99Ms               float64 `json:"latency_p99_ms,omitempty"`
	// Stages splits the worker's latency: p50 and p99 in ms per stage
	// (fetch, claim, queue, adopt, settle; see stageTrace).
	Stages       map[string][2]float64 `json:"latency_stages_ms,omitempty"`
	CPUSecPer10k float64               `json:"cpu_sec_per_10k_msgs"`
	// The whole machine over the throughput window (first to last settled
	// message), from /proc/stat: how busy its CPUs were, the busy CPU time
	// per message of every process (Redis and the brokers included), and
	// the share the hypervisor took. A run with the machine fully busy is
	// bound by the machine's CPUs, not by the worker's pipeline.
	MachineBusyPct     float64 `json:"machine_busy_pct,omitempty"`
	MachineCPUPerMsgUs float64 `json:"machine_cpu_us_per_msg,omitempty"`
	StealPct           float64 `json:"machine_steal_pct,omitempty"`
	// Heap allocations of the whole process (embedded brokers included).
	AllocsPerMsg     float64 `json:"allocs_per_msg"`
	AllocBytesPerMsg float64 `json:"alloc_bytes_per_msg"`
	PeakRSSMB        float64 `json:"peak_rss_mb"`
	// PeakRSSBacklogMB is the peak while the backlog ran at full speed,
	// before the latency phase's publisher ran in the same process.
	PeakRSSBacklogMB float64 `json:"peak_rss_backlog_mb"`
	LoadBefore       string  `json:"loadavg_before"`
	LoadAfter        string  `json:"loadavg_after"`
	Err              string  `json:"error,omitempty"`
}

// report is the JSON document.
type report struct {
	Started    time.Time          `json:"started"`
	GoVersion  string             `json:"go_version"`
	CPUs       int                `json:"cpus"`
	Options    map[string]any     `json:"options"`
	Results    []result           `json:"results"`
	Ratios     map[string]float64 `json:"ratios"`
	LoadAtEnd  string             `json:"loadavg_end"`
	PeakRSSMax float64            `json:"peak_rss_mb_max"`
}

// bench holds what every scenario shares.
type bench struct {
	o      options
	rdb    *redis.Client // counted: the stores use it
	stats  *redis.Client // uncounted: INFO, cleanup
	hook   *countHook
	ops    *storeCalls // the engine's store calls
	run    string      // unique per run, so keys and names never collide
	fixups []func()
}

func newBench(ctx context.Context, o options) (*bench, error) {
	opt, err := redis.ParseURL(o.redisURL)
	if err != nil {
		return nil, fmt.Errorf("--redis: %w", err)
	}
	// Every call has a deadline: go-redis's own timeouts bound each one.
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 3*time.Second, 5*time.Second, 5*time.Second
	// A pool as large as the naive consumer's goroutines, so that one is
	// not starved by the pool (go-redis's default is 10 per CPU).
	opt.PoolSize = max(o.concurrency, 10*runtime.GOMAXPROCS(0))
	b := &bench{o: o, hook: &countHook{}, ops: &storeCalls{}, run: fmt.Sprintf("%x", rand.Uint32())}
	b.rdb = redis.NewClient(opt)
	b.rdb.AddHook(b.hook)
	sopt := *opt
	sopt.PoolSize = 2
	b.stats = redis.NewClient(&sopt)
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := b.stats.Ping(pctx).Err(); err != nil {
		_ = b.close()
		return nil, fmt.Errorf("redis at %s: %w", o.redisURL, err)
	}
	return b, nil
}

func (b *bench) close() error {
	for _, f := range slices.Backward(b.fixups) {
		f()
	}
	return errors.Join(b.rdb.Close(), b.stats.Close())
}

// dropNamespace deletes a scenario's keys (SCAN + UNLINK, uncounted).
func (b *bench) dropNamespace(ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	it := b.stats.Scan(ctx, 0, ns+":*", 1000).Iterator()
	var batch []string
	for it.Next(ctx) {
		batch = append(batch, it.Val())
		if len(batch) == 1000 {
			b.stats.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		b.stats.Unlink(ctx, batch...)
	}
}

// plan returns n idempotency keys of which dupPct % repeat a key at least
// minDistance messages earlier (a redelivery or a producer retry, after the
// first copy finished), in a fixed pseudo-random order.
func plan(n, dupPct int, prefix string) []string {
	const minDistance = 1000
	rnd := rand.New(rand.NewPCG(uint64(n), uint64(dupPct)))
	keys := make([]string, n)
	dups := n * dupPct / 100
	isDup := make([]bool, n)
	if n > minDistance {
		for _, i := range rnd.Perm(n - minDistance)[:min(dups, n-minDistance)] {
			isDup[minDistance+i] = true
		}
	}
	u := 0
	for i := range keys {
		if isDup[i] {
			keys[i] = keys[rnd.IntN(i-minDistance+1)]
			continue
		}
		keys[i] = prefix + "-" + strconv.Itoa(u)
		u++
	}
	return keys
}

// payload is the message body for key: a small JSON document.
func payload(key string) []byte {
	return []byte(`{"id":"` + key + `","amount":1234,"currency":"EUR","note":"dedupbench"}`)
}

func run(ctx context.Context, o options) error {
	b, err := newBench(ctx, o)
	if err != nil {
		return err
	}
	defer func() { _ = b.close() }()
	rep := report{
		Started: time.Now().UTC(), GoVersion: runtime.Version(), CPUs: runtime.NumCPU(),
		Options: map[string]any{
			"msgs": o.msgs, "latency": o.latency.String(), "concurrency": o.concurrency, "batch": o.batch,
			"flights": o.flights, "kafka_ordering": o.kafkaOrdering, "redis": o.redisURL, "nats": orDefault(o.natsURL, "embedded"), "kafka": orDefault(o.kafka, "kfake"),
		},
		Ratios: map[string]float64{},
	}
	log.Printf("dedupbench: load average %s; %d messages per scenario", benchutil.LoadAvg(), o.msgs)

	var trs []transport
	for _, name := range o.transports {
		t, err := newTransport(ctx, b, name)
		if err != nil {
			return err
		}
		trs = append(trs, t)
	}
	has := func(m string) bool { return slices.Contains(o.modes, m) }
	for _, d := range o.dups {
		if has("redis-limit") {
			r := b.redisLimit(ctx, d)
			rep.Results = append(rep.Results, r)
			printRow(r)
		}
		for _, t := range trs {
			for _, m := range []string{"raw", "naive", "dedupworker"} {
				if !has(m) {
					continue
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
				r := b.runBroker(ctx, t, m, d)
				rep.Results = append(rep.Results, r)
				printRow(r)
			}
		}
	}
	rep.LoadAtEnd = benchutil.LoadAvg()
	find := func(t, m string, d int) *result {
		for i := range rep.Results {
			r := &rep.Results[i]
			if r.Transport == t && r.Mode == m && r.DupPct == d && r.Err == "" {
				return r
			}
		}
		return nil
	}
	for _, r := range rep.Results {
		rep.PeakRSSMax = max(rep.PeakRSSMax, r.PeakRSSMB)
		if r.Mode != "dedupworker" || r.Err != "" {
			continue
		}
		if l := find("-", "redis-limit", r.DupPct); l != nil {
			rep.Ratios[fmt.Sprintf("%s/dup%d/dedupworker÷redis-limit", r.Transport, r.DupPct)] = r.MsgsPerSec / l.MsgsPerSec
		}
		if n := find(r.Transport, "naive", r.DupPct); n != nil {
			rep.Ratios[fmt.Sprintf("%s/dup%d/dedupworker÷naive", r.Transport, r.DupPct)] = r.MsgsPerSec / n.MsgsPerSec
		}
		if raw := find(r.Transport, "raw", r.DupPct); raw != nil {
			rep.Ratios[fmt.Sprintf("%s/dup%d/dedupworker÷raw", r.Transport, r.DupPct)] = r.MsgsPerSec / raw.MsgsPerSec
		}
	}
	fmt.Println()
	printTable(os.Stdout, rep)
	if o.jsonOut != "" {
		js, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(o.jsonOut, append(js, '\n'), 0o644); err != nil {
			return err
		}
		log.Printf("wrote %s", o.jsonOut)
	}
	return nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func printRow(r result) {
	if r.Err != "" {
		log.Printf("%-5s dup=%2d%% %-11s FAILED: %s", r.Transport, r.DupPct, r.Mode, r.Err)
		return
	}
	log.Printf("%-5s dup=%2d%% %-11s %8.0f msgs/s  trips/msg %.4f (claim %.4f complete %.4f other %.4f)  script cmds/msg %.2f  p50 %.2fms p99 %.2fms  cpu %.2fs/10k  machine %.0f%% busy %.1fµs/msg steal %.1f%%  allocs/msg %.0f (%.0f B)  rss %.0fMB  load %s",
		r.Transport, r.DupPct, r.Mode, r.MsgsPerSec, r.TripsPerMsg, r.ClaimCallsPerMsg, r.CompleteCallsPerMsg, r.OtherCallsPerMsg,
		r.ScriptCmdsPerMsg, r.P50Ms, r.P99Ms, r.CPUSecPer10k, r.MachineBusyPct, r.MachineCPUPerMsgUs, r.StealPct,
		r.AllocsPerMsg, r.AllocBytesPerMsg, r.PeakRSSMB, r.LoadAfter)
}

func printTable(w *os.File, rep report) {
	fmt.Fprintf(w, "dedupbench %s, %s, %d CPUs, %v messages per scenario, load average at end %s\n\n",
		rep.Started.Format(time.RFC3339), rep.GoVersion, rep.CPUs, rep.Options["msgs"], rep.LoadAtEnd)
	fmt.Fprintln(w, "| transport | dups | mode | msgs/s | Redis round trips/msg | top-level calls/msg | cmds in scripts/msg | Redis CPU µs/msg | latency p50 / p99 (at msgs/s) | CPU s/10k msgs | machine busy % (µs/msg) | peak RSS MB (backlog / whole) | load avg (before → after) |")
	fmt.Fprintln(w, "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|")
	for _, r := range rep.Results {
		if r.Err != "" {
			fmt.Fprintf(w, "| %s | %d%% | %s | failed: %s |||||||||\n", r.Transport, r.DupPct, r.Mode, r.Err)
			continue
		}
		lat := "–"
		if r.LatencyN > 0 {
			lat = fmt.Sprintf("%.2f / %.2f ms (%.0f)", r.P50Ms, r.P99Ms, r.LatencyRate)
		}
		machine := "–"
		if r.MachineBusyPct > 0 {
			machine = fmt.Sprintf("%.0f (%.1f)", r.MachineBusyPct, r.MachineCPUPerMsgUs)
		}
		fmt.Fprintf(w, "| %s | %d%% | %s | %.0f | %.4f | %.4f | %.2f | %.1f | %s | %.3f | %s | %.0f / %.0f | %s → %s |\n",
			r.Transport, r.DupPct, r.Mode, r.MsgsPerSec, r.TripsPerMsg, r.CallsPerMsg, r.ScriptCmdsPerMsg,
			r.RedisCPUPerMsgUs, lat, r.CPUSecPer10k, machine, r.PeakRSSBacklogMB, r.PeakRSSMB, r.LoadBefore, r.LoadAfter)
	}
	if len(rep.Ratios) > 0 {
		fmt.Fprintln(w)
		keys := make([]string, 0, len(rep.Ratios))
		for k := range rep.Ratios {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "- %s = %.2f\n", k, rep.Ratios[k])
		}
	}
	fmt.Fprintf(w, "\nPeak RSS (max over scenarios): %.0f MB. CPU and RSS are this process's, which includes the embedded NATS server and kfake unless --nats/--kafka are given.\n", rep.PeakRSSMax)
}

// newTransport starts the transport named by --transports.
func newTransport(ctx context.Context, b *bench, name string) (transport, error) {
	switch name {
	case "nats":
		return newNATS(ctx, b)
	case "kafka":
		return newKafka(ctx, b)
	}
	return nil, fmt.Errorf("--transports: unknown %q (nats, kafka)", name)
}
