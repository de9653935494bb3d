package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// latencySeqBase offsets the sequence numbers of the latency phase's
// messages past the backlog's, so that the order check spans both phases.
const latencySeqBase = 1 << 30

// scenario is one measurement: one contender (with procs processes) on
// one transport at one duplicate share.
type scenario struct {
	Transport, Contender string
	DupPct, Procs        int
	Latency              bool // run the latency phase after the backlog
	ScaleOut             bool
	Soak                 bool // a soak (soak.go), not a backlog
}

func (s scenario) id(run string) string {
	kind := "m"
	switch {
	case s.ScaleOut:
		kind = "s"
	case s.Soak:
		kind = "k"
	}
	return fmt.Sprintf("rb%s-%s-%s-%s%d-x%d", run, s.Transport, s.Contender, kind, s.DupPct, s.Procs)
}

// result is one row: what a scenario measured.
type result struct {
	Transport string `json:"transport"`
	Contender string `json:"contender"`
	DupPct    int    `json:"dup_pct"`
	Procs     int    `json:"processes"`
	// ScaleOut marks the scale-out measurements (no latency phase).
	ScaleOut bool `json:"scale_out"`
	// Msgs is the backlog's input messages, Distinct its distinct keys.
	Msgs     int `json:"msgs"`
	Distinct int `json:"distinct_keys"`
	// Outputs counts what came out for the backlog; Repeats is Outputs
	// less the distinct keys output.
	Outputs    int     `json:"outputs"`
	Repeats    int     `json:"repeats"`
	Seconds    float64 `json:"seconds_first_to_last_output"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	// Per input message of the backlog, in µs: Redis's used_cpu_user +
	// used_cpu_sys delta, the relay processes' utime+stime, and every
	// process of the machine (/proc/stat) between the first and the last
	// output.
	RedisCPUUs   float64 `json:"redis_cpu_us_per_msg"`
	ProcCPUUs    float64 `json:"relay_cpu_us_per_msg"`
	MachineCPUUs float64 `json:"machine_cpu_us_per_msg"`
	MachineBusy  float64 `json:"machine_busy_pct"`
	// The relay's window, from just before the relay processes start to the
	// last output of the backlog, per input message in µs: the CPU of the
	// broker processes serving the transport (nats-server, the Kafka
	// JVMs), absent when one of them is not a process of this host
	// (BrokerProcs then says why); of the benchmark's own process (the
	// output reader: the backlog is published before the window); of the
	// whole machine over the same window (WindowMachineCPUUs, not
	// MachineCPUUs's first-to-last output) and its softirq part; of every
	// other process of the machine (OtherProcsCPUUs: other helpers, the go
	// tool, ...; from /proc/<pid>/stat, reaped children included); and
	// KernelCPUUs, the machine's less every process's: the kernel's work
	// charged to no process. Relay + Redis + brokers + benchmark + other
	// processes + kernel is the machine's when Redis runs on this host
	// (RedisLocal).
	BrokerCPUUs *float64 `json:"broker_cpu_us_per_msg,omitempty"`
	// BrokerSyscalls and RelaySyscalls are the read and write system calls
	// (/proc/<pid>/io syscr + syscw) per input message of the broker
	// processes and of the relay processes over the relay's window: how
	// many messages each socket read and write carries.
	BrokerSyscalls *float64 `json:"broker_syscalls_per_msg,omitempty"`
	// BrokerBackgroundPct is the brokers' CPU, in % of one CPU, over the
	// brokerBackgroundFor before the relay starts: what other clients and
	// the brokers' own work add to BrokerCPUUs at that rate.
	BrokerBackgroundPct *float64 `json:"broker_background_cpu_pct,omitempty"`
	// BrokerNetCPUUs is BrokerCPUUs less that rate over the window
	// (WindowSeconds): an estimate of the brokers' work for this relay,
	// as good as the background's rate is steady.
	BrokerNetCPUUs     *float64 `json:"broker_net_cpu_us_per_msg,omitempty"`
	WindowSeconds      float64  `json:"window_seconds"`
	RelaySyscalls      float64  `json:"relay_syscalls_per_msg"`
	BrokerProcs        string   `json:"broker_processes"`
	BenchCPUUs         float64  `json:"bench_cpu_us_per_msg"`
	WindowMachineCPUUs float64  `json:"window_machine_cpu_us_per_msg"`
	SoftirqUs          float64  `json:"window_softirq_us_per_msg"`
	StealUs            float64  `json:"window_steal_us_per_msg"`
	OtherProcsCPUUs    float64  `json:"other_processes_cpu_us_per_msg"`
	KernelCPUUs        float64  `json:"kernel_cpu_us_per_msg"`
	RedisLocal         bool     `json:"redis_local"`
	// RoundTrips is Redis's total_reads_processed delta per message (one
	// read per request burst a client sends: a pipeline or a script call
	// is one); Commands is total_commands_processed, those run inside
	// scripts included.
	RoundTrips float64 `json:"redis_round_trips_per_msg"`
	Commands   float64 `json:"redis_commands_per_msg"`
	// LocalCacheHitShare is the share of the backlog's duplicates that a
	// single dedupworker process answered from its local cache
	// (redis.local_cache): its dedup_local_cache_hits_total at the end of
	// the backlog ÷ the backlog's duplicates. Nil for the other contenders,
	// the scale-out and a backlog without duplicates.
	LocalCacheHitShare *float64 `json:"local_cache_hits_per_duplicate,omitempty"`
	// AllocsPerMsg and AllocBytesPerMsg are the heap allocations, and
	// their bytes, of a single dedupworker process from its start to the
	// backlog's end, per message (go_memstats_mallocs_total and
	// go_memstats_alloc_bytes_total of its /metrics; start-up's count
	// too). Unlike CPU time, they do not move with the load of the
	// machine, so they tell two builds' work apart where CPU time cannot.
	// Nil for the other contenders and the scale-out.
	AllocsPerMsg     *float64 `json:"relay_allocs_per_msg,omitempty"`
	AllocBytesPerMsg *float64 `json:"relay_alloc_bytes_per_msg,omitempty"`
	PeakRSSMB        float64  `json:"peak_rss_mb"`
	// The latency phase: LatencyN messages published at LatencyRate per
	// second after the backlog, publish → output.
	LatencyRate float64 `json:"latency_rate,omitempty"`
	LatencyN    int     `json:"latency_samples,omitempty"`
	P50Ms       float64 `json:"latency_p50_ms,omitempty"`
	P99Ms       float64 `json:"latency_p99_ms,omitempty"`
	// LatencyRelayCPUUs and LatencyRedisCPUUs are the relay processes'
	// and Redis's CPU per message of the latency phase, from its first
	// publish to its last output: what a message costs at a steady rate,
	// where runs are short and the relay's idle work (fetch polls,
	// heartbeats) is shared by fewer messages than in a backlog.
	LatencyRelayCPUUs float64 `json:"latency_relay_cpu_us_per_msg,omitempty"`
	LatencyRedisCPUUs float64 `json:"latency_redis_cpu_us_per_msg,omitempty"`
	// LatencyRoundTrips and LatencyCommands are RoundTrips and Commands
	// of the latency phase.
	LatencyRoundTrips float64 `json:"latency_redis_round_trips_per_msg,omitempty"`
	LatencyCommands   float64 `json:"latency_redis_commands_per_msg,omitempty"`
	// Correctness over both phases.
	MissingKeys     int    `json:"missing_keys"`
	OrderViolations int    `json:"order_violations"`
	BadPayloads     int    `json:"bad_payloads"`
	Err             string `json:"error,omitempty"`
}

// bench holds what every scenario shares.
type bench struct {
	o           options
	run         string
	self        string // this binary, for the hand-written relays
	workerBin   string
	wmBin       string
	tmp         string
	stats       *redis.Client
	nats        *natsAdmin
	kafka       kafkaAdmin
	logProgress func(format string, args ...any)
}

// endpoints are the names one scenario creates and deletes.
type endpoints struct {
	inTopic, outTopic     string // Kafka
	inStream, outStream   string // NATS
	inSubject, outSubject string
	group                 string
	httpURL               string
	metricsAddr           string // the dedupworker's /metrics server; "" for none
}

func (b *bench) runScenario(ctx context.Context, sc scenario) (res result) {
	res = result{Transport: sc.Transport, Contender: sc.Contender, DupPct: sc.DupPct, Procs: sc.Procs, ScaleOut: sc.ScaleOut}
	err := b.measure(ctx, sc, &res)
	if err != nil {
		res.Err = err.Error()
	}
	return res
}

func (b *bench) measure(ctx context.Context, sc scenario, res *result) (err error) {
	id := sc.id(b.run)
	parts := b.o.partitions
	if sc.Transport == "nats" {
		parts = 1
	}
	plan := makePlan(b.o.msgs, sc.DupPct, parts, "k"+id)
	padPlan(plan, b.o.pad)
	var latPlan []input
	if sc.Latency && b.o.latency > 0 {
		latPlan = makePlan(max(1, int(b.o.rate*b.o.latency.Seconds())), 0, parts, "L"+id)
		for i := range latPlan {
			latPlan[i].Seq += latencySeqBase
		}
	}
	res.Msgs, res.Distinct = len(plan), distinct(plan)

	var m0 machineCPU
	var m0err error
	rec := newRecorder(func() { m0, m0err = readMachineCPU() })
	var cleanups []func() error
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			if cerr := cleanups[i](); cerr != nil {
				log.Printf("%s: cleanup: %v", id, cerr)
			}
		}
	}()

	ep, opened, err := b.openEndpoints(ctx, sc, id, rec, plan)
	cleanups = append(cleanups, opened...)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() error { return b.dropRedisKeys(id) })

	bp := b.brokerProcs(ctx, sc.Transport)
	res.BrokerProcs = bp.desc
	if bp.err != nil {
		res.BrokerProcs = "absent: " + bp.err.Error()
	}
	if bp.err == nil {
		// What the brokers do without this relay (other clients, their own
		// timers and flushes) counts in their CPU over the window too.
		pct, err := backgroundPct(ctx, bp.pids, brokerBackgroundFor)
		if err != nil {
			return fmt.Errorf("broker: %w", err)
		}
		res.BrokerBackgroundPct = &pct
	}
	r0, err := readRedisStats(ctx, b.stats)
	if err != nil {
		return err
	}
	redisPID, redisErr := b.redisPID(ctx)
	w0, err := readWindow()
	if err != nil {
		return err
	}
	windowStart := time.Now()
	var bsys0 uint64
	if bp.err == nil {
		if bsys0, err = syscalls(bp.pids); err != nil {
			return fmt.Errorf("broker: %w", err)
		}
	}
	// A single dedupworker process serves its /metrics, so that its
	// allocations, and the share of duplicates its local cache answered,
	// can be read at the backlog's end.
	scrape := strings.HasPrefix(sc.Contender, "dedupworker") && sc.Procs == 1
	countHits := scrape && res.Msgs > res.Distinct
	if scrape {
		if ep.metricsAddr, err = freePort(); err != nil {
			return err
		}
	}
	procs, err := b.startContender(sc, id, ep)
	if err != nil {
		return err
	}
	var peak int64
	cleanups = append(cleanups, func() error {
		if p, err := procs.peakRSS(); err == nil {
			peak = p
		}
		res.PeakRSSMB = float64(peak) / (1 << 20)
		return procs.stop(20 * time.Second)
	})

	// The backlog: done when every distinct key came out and, for a relay
	// that forwards duplicates too, every message; or when nothing more
	// came for a while after every distinct key did.
	expect := res.Distinct
	if sc.Contender == "raw" {
		expect = res.Msgs
	}
	deadline := time.Now().Add(b.o.timeout)
	var s snapshot
	for {
		s = rec.snapshot()
		if s.Distinct >= res.Distinct && (s.Total >= expect || time.Since(s.LastAt) > b.o.quiet) {
			break
		}
		if err := procs.exited(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %d of %d distinct keys output (%d messages); raise -timeout if the relay is only slow", b.o.timeout, s.Distinct, res.Distinct, s.Total)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	cpu1, cerr := procs.cpu()
	var pids []int
	for _, c := range procs {
		pids = append(pids, c.pid())
	}
	rsys, rserr := syscalls(pids)
	var bsys1 uint64
	var bserr error
	if bp.err == nil {
		bsys1, bserr = syscalls(bp.pids)
	}
	w1, werr := readWindow()
	res.WindowSeconds = time.Since(windowStart).Seconds()
	m1 := w1.machine
	r1, rerr := readRedisStats(ctx, b.stats)
	if err := errors.Join(cerr, rserr, bserr, werr, m0err, rerr); err != nil {
		return err
	}
	n := float64(res.Msgs)
	if scrape {
		names := []string{mallocsMetric, allocBytesMetric}
		if countHits {
			names = append(names, cacheHitsMetric)
		}
		m, err := scrapeSamples(ctx, &http.Client{Timeout: 5 * time.Second}, ep.metricsAddr, names...)
		if err != nil {
			return err
		}
		allocs, bytes := m[mallocsMetric]/n, m[allocBytesMetric]/n
		res.AllocsPerMsg, res.AllocBytesPerMsg = &allocs, &bytes
		if countHits {
			share := m[cacheHitsMetric] / float64(res.Msgs-res.Distinct)
			res.LocalCacheHitShare = &share
		}
	}
	res.Outputs, res.Repeats = s.Total, s.Total-s.Distinct
	res.Seconds = s.LastAt.Sub(s.FirstAt).Seconds()
	if res.Seconds > 0 {
		res.MsgsPerSec = float64(s.Total) / res.Seconds
	}
	res.ProcCPUUs = float64(cpu1.Microseconds()) / n
	res.RedisCPUUs = float64((r1.cpu - r0.cpu).Microseconds()) / n
	res.RoundTrips = float64(r1.reads-r0.reads-1) / n // less the INFO that read r1
	res.Commands = float64(r1.commands-r0.commands-1) / n
	if d := m1.total - m0.total; d > 0 {
		busy := m1.busy - m0.busy
		res.MachineBusy = 100 * float64(busy) / float64(d)
		res.MachineCPUUs = float64(time.Duration(busy)*clockTick/time.Microsecond) / n
	}
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	ticks := func(t uint64) float64 { return us(time.Duration(t) * clockTick) }
	self, serr := ownCPU(w0, w1, []int{os.Getpid()})
	if serr != nil {
		return serr
	}
	res.BenchCPUUs = us(self)
	res.WindowMachineCPUUs = ticks(w1.machine.busy - w0.machine.busy)
	res.SoftirqUs = ticks(w1.machine.softirq - w0.machine.softirq)
	res.StealUs = ticks(w1.machine.steal - w0.machine.steal)
	res.RelaySyscalls = float64(rsys) / n
	known := append([]int{os.Getpid()}, pids...)
	if bp.err == nil {
		sys := float64(bsys1-bsys0) / n
		res.BrokerSyscalls = &sys
		d, err := ownCPU(w0, w1, bp.pids)
		if err != nil {
			return fmt.Errorf("broker: %w", err)
		}
		v := us(d)
		res.BrokerCPUUs = &v
		if res.BrokerBackgroundPct != nil {
			net := v - *res.BrokerBackgroundPct/100*res.WindowSeconds*1e6/n
			res.BrokerNetCPUUs = &net
		}
		known = append(known, bp.pids...)
	}
	res.RedisLocal = redisErr == nil
	if res.RedisLocal {
		known = append(known, redisPID)
	}
	all, part := processesCPU(w0.procs, w1.procs, known)
	res.OtherProcsCPUUs = us(all - part)
	res.KernelCPUUs = res.WindowMachineCPUUs - us(all)
	b.logProgress("%-5s %-16s dup=%2d%% x%d backlog: %.0f msgs/s, redis %.1f µs/msg, relay %.1f µs/msg, broker %s µs/msg, bench %.1f µs/msg, machine %.1f µs/msg (%.0f%% busy), %.4f trips/msg",
		sc.Transport, sc.Contender, sc.DupPct, sc.Procs, res.MsgsPerSec, res.RedisCPUUs, res.ProcCPUUs, optUs(res.BrokerCPUUs), res.BenchCPUUs, res.MachineCPUUs, res.MachineBusy, res.RoundTrips)

	if len(latPlan) > 0 {
		rec.takeLatencies()
		lcpu0, cerr := procs.cpu()
		lr0, rerr := readRedisStats(ctx, b.stats)
		if err := errors.Join(cerr, rerr); err != nil {
			return err
		}
		var rate float64
		switch sc.Transport {
		case "kafka":
			rate, err = b.kafka.publishPaced(ctx, ep.inTopic, latPlan, b.o.rate)
		case "nats":
			rate, err = b.nats.publishPaced(ctx, ep.inSubject, latPlan, b.o.rate)
		}
		if err != nil {
			return err
		}
		want := res.Distinct + len(latPlan)
		deadline := time.Now().Add(30 * time.Second)
		for rec.snapshot().Distinct < want && time.Now().Before(deadline) {
			if err := procs.exited(); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
		lcpu1, cerr := procs.cpu()
		lr1, rerr := readRedisStats(ctx, b.stats)
		if err := errors.Join(cerr, rerr); err != nil {
			return err
		}
		ln := float64(len(latPlan))
		res.LatencyRelayCPUUs = float64((lcpu1 - lcpu0).Microseconds()) / ln
		res.LatencyRedisCPUUs = float64((lr1.cpu - lr0.cpu).Microseconds()) / ln
		res.LatencyRoundTrips = float64(lr1.reads-lr0.reads-1) / ln // less the INFO that read lr1
		res.LatencyCommands = float64(lr1.commands-lr0.commands-1) / ln
		lat := rec.takeLatencies()
		res.LatencyRate, res.LatencyN = rate, len(lat)
		res.P50Ms = float64(quantile(lat, 0.50).Microseconds()) / 1000
		res.P99Ms = float64(quantile(lat, 0.99).Microseconds()) / 1000
	}
	s = rec.snapshot()
	res.MissingKeys = rec.missing(plan) + rec.missing(latPlan)
	res.OrderViolations, res.BadPayloads = s.Violations, s.Bad
	return nil
}

// window is what the relay's window reads at its start and end besides
// the relay and Redis: every process's CPU times and the machine's.
type window struct {
	procs   map[int]procTimes
	machine machineCPU
}

func readWindow() (window, error) {
	ps, err := allProcTimes("/proc")
	m, merr := readMachineCPU()
	return window{procs: ps, machine: m}, errors.Join(err, merr)
}

// brokerBackgroundFor is how long the brokers' CPU is read before the
// relay starts.
const brokerBackgroundFor = time.Second

// backgroundPct returns the CPU pids use over d from now, in % of one CPU.
func backgroundPct(ctx context.Context, pids []int, d time.Duration) (float64, error) {
	w0, err := readWindow()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-t.C:
	}
	w1, err := readWindow()
	if err != nil {
		return 0, err
	}
	cpu, err := ownCPU(w0, w1, pids)
	if err != nil {
		return 0, err
	}
	return 100 * cpu.Seconds() / time.Since(start).Seconds(), nil
}

// ownCPU returns the CPU pids used (utime+stime) from w0 to w1; a pid
// missing at either end is an error (a broker restarted meanwhile).
func ownCPU(w0, w1 window, pids []int) (time.Duration, error) {
	var d time.Duration
	for _, pid := range pids {
		a, ok0 := w0.procs[pid]
		b, ok1 := w1.procs[pid]
		if !ok0 || !ok1 {
			return 0, fmt.Errorf("process %d ended or started during the measurement", pid)
		}
		d += b.own - a.own
	}
	return d, nil
}

// redisPID returns the pid of the Redis server of -redis (or
// -redis-server) when it runs on this host.
func (b *bench) redisPID(ctx context.Context) (int, error) {
	opt, err := redis.ParseURL(b.o.redisURL)
	if err != nil {
		return 0, err
	}
	return listenerPID(ctx, opt.Addr)
}

// brokerProcs finds the processes of this host that serve transport: the
// nats-server of every -nats URL and server the connection learnt, or the
// Kafka broker of every address the cluster's metadata lists. It looks
// them up for each measurement, so that a restarted broker's new pid is
// the one read.
func (b *bench) brokerProcs(ctx context.Context, transport string) brokerProcs {
	var addrs []string
	var err error
	switch transport {
	case "nats":
		addrs, err = natsHostPorts(append(strings.Split(b.o.natsURL, ","), b.nats.nc.Servers()...))
	case "kafka":
		addrs, err = b.kafka.brokerAddrs(ctx)
	default:
		err = fmt.Errorf("-transports: unknown %q", transport)
	}
	if err != nil {
		return brokerProcs{err: err}
	}
	return findBrokerProcs(ctx, addrs)
}

// openEndpoints creates what scenario id reads from and writes to: the
// http action's server, the input and output topics or streams, the
// backlog published to the input, and the reader of the output into rec.
// The cleanups it returns undo what was created, also when it fails.
func (b *bench) openEndpoints(ctx context.Context, sc scenario, id string, rec *recorder, backlog []input) (ep endpoints, cleanups []func() error, err error) {
	ep = endpoints{group: id}
	// The output side first, then the input, then the backlog.
	if sc.Contender == "dedupworker-http" {
		stop, url, err := serveHTTP(rec)
		if err != nil {
			return ep, cleanups, err
		}
		cleanups = append(cleanups, stop)
		ep.httpURL = url
	}
	switch sc.Transport {
	case "kafka":
		ep.inTopic, ep.outTopic = id+"-in", id+"-out"
		topics := []string{ep.inTopic}
		if ep.httpURL == "" {
			topics = append(topics, ep.outTopic)
		}
		if err := b.kafka.create(ctx, b.o.partitions, topics...); err != nil {
			return ep, cleanups, err
		}
		cleanups = append(cleanups, func() error { return b.kafka.delete(topics...) })
		if err := b.kafka.publishBacklog(ctx, ep.inTopic, backlog); err != nil {
			return ep, cleanups, err
		}
		if ep.httpURL == "" {
			stop, err := readKafkaOutput(ctx, b.o.brokers, ep.outTopic, b.o.partitions, rec)
			if err != nil {
				return ep, cleanups, err
			}
			cleanups = append(cleanups, func() error { stop(); return nil })
		}
	case "nats":
		name := strings.ToUpper(strings.ReplaceAll(id, "-", "_"))
		ep.inStream, ep.outStream = name+"_IN", name+"_OUT"
		ep.inSubject, ep.outSubject = strings.ReplaceAll(id, "-", ".")+".in", strings.ReplaceAll(id, "-", ".")+".out"
		if err := b.nats.createStream(ctx, ep.inStream, ep.inSubject); err != nil {
			return ep, cleanups, err
		}
		streams := []string{ep.inStream}
		cleanups = append(cleanups, func() error { return b.nats.deleteStreams(streams...) })
		if ep.httpURL == "" {
			if err := b.nats.createStream(ctx, ep.outStream, ep.outSubject); err != nil {
				return ep, cleanups, err
			}
			streams = append(streams, ep.outStream)
		}
		if err := b.nats.publishBacklog(ctx, ep.inSubject, backlog); err != nil {
			return ep, cleanups, err
		}
		if ep.httpURL == "" {
			stop, err := b.nats.readNATSOutput(ctx, ep.outStream, rec)
			if err != nil {
				return ep, cleanups, err
			}
			cleanups = append(cleanups, func() error { stop(); return nil })
		}
	default:
		return ep, cleanups, fmt.Errorf("-transports: unknown %q (kafka, nats)", sc.Transport)
	}
	return ep, cleanups, nil
}

// startContender starts sc.Procs processes of the contender.
func (b *bench) startContender(sc scenario, id string, ep endpoints) (children, error) {
	var procs children
	for i := range sc.Procs {
		name := fmt.Sprintf("%s#%d", sc.Contender, i)
		var argv []string
		switch sc.Contender {
		case "raw", "naive":
			argv = []string{b.self, "child", "-mode", sc.Contender, "-transport", sc.Transport,
				"-brokers", strings.Join(b.o.brokers, ","), "-nats", b.o.natsURL, "-redis", b.o.redisURL,
				"-ns", id, "-group", ep.group, "-concurrency", strconv.Itoa(b.o.concurrency), "-lease", b.o.lease.String()}
			argv = append(argv, b.o.rawFlags...)
			if sc.Transport == "kafka" {
				argv = append(argv, "-in", ep.inTopic, "-out", ep.outTopic)
			} else {
				argv = append(argv, "-in", ep.inStream, "-out", ep.outSubject)
			}
		case "watermill":
			argv = []string{b.wmBin, "-transport", sc.Transport, "-brokers", strings.Join(b.o.brokers, ","),
				"-nats", b.o.natsURL, "-group", ep.group}
			if sc.Transport == "kafka" {
				argv = append(argv, "-in", ep.inTopic, "-out", ep.outTopic)
			} else {
				argv = append(argv, "-in", ep.inSubject, "-out", ep.outSubject)
			}
		case "dedupworker", "dedupworker-http":
			// One config for all the processes, written before the first
			// starts: a file rewritten while another process reads it
			// would be read empty.
			if i == 0 {
				if err := b.writeWorkerConfig(sc, id, ep); err != nil {
					return nil, err
				}
			}
			path := filepath.Join(b.tmp, id+".yaml")
			argv = []string{b.workerBin, "run", "-c", path}
		default:
			return nil, fmt.Errorf("-contenders: unknown %q (raw, naive, watermill, dedupworker, dedupworker-http)", sc.Contender)
		}
		c, err := startChild(name, argv, nil)
		if err != nil {
			_ = procs.stop(time.Second)
			return nil, err
		}
		procs = append(procs, c)
	}
	return procs, nil
}

// writeWorkerConfig writes the dedupworker config of scenario id to
// <tmp>/<id>.yaml.
func (b *bench) writeWorkerConfig(sc scenario, id string, ep endpoints) error {
	spec := workerSpec{
		RedisURL: b.o.redisURL, Namespace: id, Concurrency: b.o.concurrency, Lease: b.o.lease,
		HTTPURL: ep.httpURL, MetricsAddr: ep.metricsAddr, LocalCacheEntries: b.o.localCacheEntries,
	}
	if sc.Transport == "kafka" {
		spec.Brokers, spec.InTopic, spec.Group, spec.Isolation = b.o.brokers, ep.inTopic, ep.group, b.o.kafkaIsolation
		if ep.httpURL == "" {
			spec.OutTopic = ep.outTopic
		}
	} else {
		spec.NATSURL, spec.InStream, spec.Consumer = b.o.natsURL, ep.inStream, ep.group
		if ep.httpURL == "" {
			spec.OutSubject = ep.outSubject
		}
	}
	y, err := workerYAML(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(b.tmp, id+".yaml"), []byte(y), 0o600)
}

// serveHTTP runs the http action's target: every request body is an
// output. It returns a function that stops the server and its URL.
func serveHTTP(rec *recorder) (func() error, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			rec.add(0, body, r.Header.Get(tsHeader), time.Now())
			w.WriteHeader(http.StatusOK)
		}),
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	stop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := srv.Shutdown(ctx)
		if serr := <-done; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		return err
	}
	return stop, "http://" + ln.Addr().String() + "/", nil
}

// dropRedisKeys deletes the keys of a scenario's namespace (SCAN + UNLINK).
func (b *bench) dropRedisKeys(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	it := b.stats.Scan(ctx, 0, "*"+id+"*", 1000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := b.stats.Unlink(ctx, batch...).Err()
		batch = batch[:0]
		return err
	}
	for it.Next(ctx) {
		batch = append(batch, it.Val())
		if len(batch) == 1000 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return errors.Join(it.Err(), flush())
}
