package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/dedupworker/bench/dedupbench/internal/benchutil"
)

// A soak (-soak D) runs the dedupworker forward relay, one process, on
// each transport for D while publishing at -rate with the first -dups
// share of duplicates, and samples it every -soak-every: the relay's RSS
// (/proc/<pid>/status VmRSS), its CPU per message published in the
// interval, its Go heap in use and goroutines (its own /metrics), Redis's
// used_memory and CPU per message, and the publish → output latency of the
// interval's outputs. At the end it checks that every distinct key came
// out and, on Kafka, in input order per partition, and it compares the
// first sample after -soak-warmup with the last.

// soakSample is what one interval of a soak measured.
type soakSample struct {
	// At is the end of the interval, in seconds since publishing began.
	At float64 `json:"at_s"`
	// Published counts the input messages published in the interval,
	// Outputs what came out in it.
	Published int `json:"published"`
	Outputs   int `json:"outputs"`
	// RSSMB is the relay's VmRSS at the end of the interval; HeapMB and
	// Goroutines are go_memstats_heap_inuse_bytes and go_goroutines from
	// its /metrics.
	RSSMB      float64 `json:"rss_mb"`
	HeapMB     float64 `json:"heap_inuse_mb"`
	Goroutines float64 `json:"goroutines"`
	// RelayCPUUs and RedisCPUUs are the interval's CPU of the relay process
	// and of Redis per message published in it, in µs; RoundTrips is
	// Redis's total_reads_processed delta per published message.
	RelayCPUUs float64 `json:"relay_cpu_us_per_msg"`
	RedisCPUUs float64 `json:"redis_cpu_us_per_msg"`
	RoundTrips float64 `json:"redis_round_trips_per_msg"`
	// RedisMemMB is Redis's used_memory at the end of the interval.
	RedisMemMB float64 `json:"redis_used_memory_mb"`
	// LatencyN outputs came out in the interval with a publish time;
	// P50Ms and P99Ms are their publish → output latency.
	LatencyN int     `json:"latency_samples"`
	P50Ms    float64 `json:"latency_p50_ms"`
	P99Ms    float64 `json:"latency_p99_ms"`
	// Load is /proc/loadavg's 1-minute figure at the end of the interval.
	Load string `json:"load_avg"`
}

// flatRow compares one metric's first sample at or after the warm-up with
// the last sample.
type flatRow struct {
	Metric string  `json:"metric"`
	Unit   string  `json:"unit"`
	First  float64 `json:"first"`
	Last   float64 `json:"last"`
	// Min and Max span the samples from the first after the warm-up on.
	Min float64 `json:"min"`
	Max float64 `json:"max"`
	// SlopePerMin is the least-squares slope over those samples, in the
	// metric's unit per minute.
	SlopePerMin float64 `json:"slope_per_min"`
}

// soakResult is one soak: one transport, its samples and its checks.
type soakResult struct {
	Transport  string  `json:"transport"`
	DupPct     int     `json:"dup_pct"`
	Duration   string  `json:"duration"`
	Every      string  `json:"every"`
	Warmup     string  `json:"warmup"`
	Rate       float64 `json:"rate_achieved"`
	Published  int     `json:"published"`
	Distinct   int     `json:"distinct_keys"`
	Outputs    int     `json:"outputs"`
	Repeats    int     `json:"repeats"`
	DrainSec   float64 `json:"drain_s"`
	PeakRSSMB  float64 `json:"peak_rss_mb"`
	FirstAt    float64 `json:"flat_first_at_s"`
	LastAt     float64 `json:"flat_last_at_s"`
	LoadBefore string  `json:"load_avg_before"`
	LoadAfter  string  `json:"load_avg_after"`
	// Correctness over the whole soak.
	MissingKeys     int          `json:"missing_keys"`
	OrderViolations int          `json:"order_violations"`
	BadPayloads     int          `json:"bad_payloads"`
	Samples         []soakSample `json:"samples"`
	Flatness        []flatRow    `json:"flatness"`
	Err             string       `json:"error,omitempty"`
}

// soakMetrics are the series of a sample the flatness table compares.
var soakMetrics = []struct {
	name, unit string
	value      func(soakSample) float64
}{
	{"relay RSS", "MB", func(s soakSample) float64 { return s.RSSMB }},
	{"relay Go heap in use", "MB", func(s soakSample) float64 { return s.HeapMB }},
	{"relay goroutines", "", func(s soakSample) float64 { return s.Goroutines }},
	{"latency p99", "ms", func(s soakSample) float64 { return s.P99Ms }},
	{"latency p50", "ms", func(s soakSample) float64 { return s.P50Ms }},
	{"relay CPU per message", "µs", func(s soakSample) float64 { return s.RelayCPUUs }},
	{"Redis CPU per message", "µs", func(s soakSample) float64 { return s.RedisCPUUs }},
	{"Redis used_memory", "MB", func(s soakSample) float64 { return s.RedisMemMB }},
}

// flatness compares, per metric, the first sample taken at or after warmup
// with the last one. It returns no rows, and the index -1, when no sample
// was taken after the warm-up or only one was.
func flatness(samples []soakSample, warmup time.Duration) ([]flatRow, int) {
	from := -1
	for i, s := range samples {
		if s.At >= warmup.Seconds() {
			from = i
			break
		}
	}
	if from < 0 || from == len(samples)-1 {
		return nil, -1
	}
	after := samples[from:]
	rows := make([]flatRow, 0, len(soakMetrics))
	for _, m := range soakMetrics {
		r := flatRow{Metric: m.name, Unit: m.unit, First: m.value(after[0]), Last: m.value(after[len(after)-1]),
			Min: math.Inf(1), Max: math.Inf(-1)}
		xs := make([]float64, len(after))
		ys := make([]float64, len(after))
		for i, s := range after {
			v := m.value(s)
			r.Min, r.Max = math.Min(r.Min, v), math.Max(r.Max, v)
			xs[i], ys[i] = s.At/60, v
		}
		r.SlopePerMin = slope(xs, ys)
		rows = append(rows, r)
	}
	return rows, from
}

// slope returns the least-squares slope of ys over xs; 0 for fewer than
// two distinct xs.
func slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	var sx, sy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
	}
	mx, my := sx/n, sy/n
	var num, den float64
	for i := range xs {
		num += (xs[i] - mx) * (ys[i] - my)
		den += (xs[i] - mx) * (xs[i] - mx)
	}
	if den == 0 {
		return 0
	}
	return num / den
}

// parseMetricsText reads the unlabelled samples named in names from a
// Prometheus text exposition. A name that is missing is an error, so that
// a renamed metric does not read as zero.
func parseMetricsText(r io.Reader, names ...string) (map[string]float64, error) {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	out := make(map[string]float64, len(names))
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		// name value [timestamp]; a labelled sample has '{' after its name.
		f := strings.Fields(line)
		if len(f) < 2 || !want[f[0]] {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return nil, fmt.Errorf("/metrics %s: value %q: %w", f[0], f[1], err)
		}
		out[f[0]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("/metrics: %w", err)
	}
	var missing []string
	for _, n := range names {
		if _, ok := out[n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("/metrics has no unlabelled %s", strings.Join(missing, ", "))
	}
	return out, nil
}

const (
	heapMetric      = "go_memstats_heap_inuse_bytes"
	goroutineMetric = "go_goroutines"
	// cacheHitsMetric counts the claims the relay's local cache answered
	// DUPLICATE (internal/app).
	cacheHitsMetric = "dedup_local_cache_hits_total"
	// mallocsMetric and allocBytesMetric count the relay's heap
	// allocations and their bytes since it started.
	mallocsMetric    = "go_memstats_mallocs_total"
	allocBytesMetric = "go_memstats_alloc_bytes_total"
)

// scrapeMetrics reads the relay's heap in use and goroutines from
// http://addr/metrics within 5 s.
func scrapeMetrics(ctx context.Context, hc *http.Client, addr string) (heap, goroutines float64, err error) {
	m, err := scrapeSamples(ctx, hc, addr, heapMetric, goroutineMetric)
	if err != nil {
		return 0, 0, err
	}
	return m[heapMetric], m[goroutineMetric], nil
}

// scrapeSamples reads the unlabelled samples named in names from
// http://addr/metrics within 5 s.
func scrapeSamples(ctx context.Context, hc *http.Client, addr string, names ...string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("relay /metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("relay /metrics: %s", resp.Status)
	}
	return parseMetricsText(resp.Body, names...)
}

// waitReady polls http://addr/readyz until it answers 200, the relay
// exits, or timeout passes.
func waitReady(ctx context.Context, hc *http.Client, addr string, procs children, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+addr+"/readyz", nil)
		if err != nil {
			cancel()
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				cancel()
				return nil
			}
			err = fmt.Errorf("/readyz: %s", resp.Status)
		}
		cancel()
		last = err
		if err := procs.exited(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the relay is not ready at http://%s/readyz after %v: %w", addr, timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// readRedisUsedMemory returns INFO memory's used_memory in bytes.
func readRedisUsedMemory(ctx context.Context, c *redis.Client) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	txt, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO memory: %w", err)
	}
	return parseInfoInt(txt, "used_memory")
}

// parseInfoInt returns the integer field key of an INFO reply.
func parseInfoInt(txt, key string) (int64, error) {
	for line := range strings.SplitSeq(txt, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("redis INFO %s: %q", key, v)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("redis INFO has no %s", key)
}

// freePort returns a loopback host:port nothing listens on now.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// runSoak soaks the dedupworker relay on transport.
func (b *bench) runSoak(ctx context.Context, transport string) (res soakResult) {
	sc := scenario{Transport: transport, Contender: "dedupworker", DupPct: b.o.dups[0], Procs: 1, Soak: true}
	res = soakResult{Transport: transport, DupPct: sc.DupPct, Duration: b.o.soak.String(), Every: b.o.soakEvery.String(),
		Warmup: b.o.soakWarmup.String(), LoadBefore: benchutil.LoadAvg()}
	if err := b.soak(ctx, sc, &res); err != nil {
		res.Err = err.Error()
	}
	res.LoadAfter = benchutil.LoadAvg()
	return res
}

func (b *bench) soak(ctx context.Context, sc scenario, res *soakResult) error {
	id := sc.id(b.run)
	parts := b.o.partitions
	if sc.Transport == "nats" {
		parts = 1
	}
	plan := makePlan(max(1, int(b.o.rate*b.o.soak.Seconds())), sc.DupPct, parts, "k"+id)
	res.Distinct = distinct(plan)

	rec := newRecorder(nil)
	var cleanups []func() error
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			if cerr := cleanups[i](); cerr != nil {
				log.Printf("%s: cleanup: %v", id, cerr)
			}
		}
	}()
	ep, opened, err := b.openEndpoints(ctx, sc, id, rec, nil)
	cleanups = append(cleanups, opened...)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() error { return b.dropRedisKeys(id) })

	addr, err := freePort()
	if err != nil {
		return err
	}
	ep.metricsAddr = addr
	procs, err := b.startContender(sc, id, ep)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() error {
		if p, err := procs.peakRSS(); err == nil {
			res.PeakRSSMB = float64(p) / (1 << 20)
		}
		return procs.stop(20 * time.Second)
	})
	relay := procs[0]
	hc := &http.Client{Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	if err := waitReady(ctx, hc, addr, procs, 60*time.Second); err != nil {
		return err
	}

	// The publisher runs for the whole soak; its owner is this function,
	// which cancels it on an early return and waits for it.
	var published atomic.Int64
	pctx, cancelPub := context.WithCancel(ctx)
	type pubResult struct {
		rate float64
		err  error
	}
	pubDone := make(chan pubResult, 1)
	go func() {
		rate, err := b.publishSoak(pctx, sc.Transport, ep, plan, &published)
		pubDone <- pubResult{rate, err}
	}()
	var pub *pubResult
	defer func() {
		cancelPub()
		if pub == nil {
			<-pubDone
		}
	}()

	type counters struct {
		published int64
		outputs   int
		relayCPU  time.Duration
		redis     redisStats
	}
	read := func() (counters, error) {
		c := counters{published: published.Load(), outputs: rec.snapshot().Total}
		var err1, err2 error
		c.relayCPU, err1 = procCPU(relay.pid())
		c.redis, err2 = readRedisStats(ctx, b.stats)
		return c, errors.Join(err1, err2)
	}
	start := time.Now()
	prev, err := read()
	if err != nil {
		return err
	}
	b.logProgress("soak %s: %s at %.0f msgs/s, %d %% duplicates, a sample every %s, load average %s",
		sc.Transport, b.o.soak, b.o.rate, sc.DupPct, b.o.soakEvery, res.LoadBefore)
	for i := 1; time.Duration(i)*b.o.soakEvery <= b.o.soak; i++ {
		t := time.NewTimer(time.Until(start.Add(time.Duration(i) * b.o.soakEvery)))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case r := <-pubDone:
			t.Stop()
			pub = &r
			if r.err != nil {
				return r.err
			}
			// Publishing ended a little before the last sample is due.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Until(start.Add(time.Duration(i) * b.o.soakEvery))):
			}
		case <-t.C:
		}
		if err := procs.exited(); err != nil {
			return err
		}
		cur, err := read()
		if err != nil {
			return err
		}
		s := soakSample{At: time.Since(start).Seconds(), Published: int(cur.published - prev.published),
			Outputs: cur.outputs - prev.outputs, Load: strings.Fields(benchutil.LoadAvg())[0]}
		rss, err := procRSS(relay.pid())
		if err != nil {
			return err
		}
		s.RSSMB = float64(rss) / (1 << 20)
		heap, gr, err := scrapeMetrics(ctx, hc, addr)
		if err != nil {
			return err
		}
		s.HeapMB, s.Goroutines = heap/(1<<20), gr
		mem, err := readRedisUsedMemory(ctx, b.stats)
		if err != nil {
			return err
		}
		s.RedisMemMB = float64(mem) / (1 << 20)
		if n := float64(s.Published); n > 0 {
			s.RelayCPUUs = float64((cur.relayCPU - prev.relayCPU).Microseconds()) / n
			s.RedisCPUUs = float64((cur.redis.cpu - prev.redis.cpu).Microseconds()) / n
			// Less this sampler's own INFO calls: stats+cpu and memory.
			s.RoundTrips = float64(cur.redis.reads-prev.redis.reads-2) / n
		}
		lat := rec.takeLatencies()
		s.LatencyN = len(lat)
		s.P50Ms = float64(quantile(lat, 0.50).Microseconds()) / 1000
		s.P99Ms = float64(quantile(lat, 0.99).Microseconds()) / 1000
		res.Samples = append(res.Samples, s)
		b.logProgress("soak %s %4.0fs: %d in, %d out, RSS %.1f MB, heap %.1f MB, %.0f goroutines, relay %.1f µs/msg, redis %.1f µs/msg, %.1f MB, p50 %.1f ms, p99 %.1f ms, load %s",
			sc.Transport, s.At, s.Published, s.Outputs, s.RSSMB, s.HeapMB, s.Goroutines, s.RelayCPUUs, s.RedisCPUUs, s.RedisMemMB, s.P50Ms, s.P99Ms, s.Load)
		prev = cur
	}
	if pub == nil {
		select {
		case r := <-pubDone:
			pub = &r
		case <-ctx.Done():
			return ctx.Err()
		}
		if pub.err != nil {
			return pub.err
		}
	}
	res.Rate, res.Published = pub.rate, len(plan)

	// The drain: every distinct key out, or a deadline.
	drainStart := time.Now()
	deadline := drainStart.Add(60 * time.Second)
	for rec.snapshot().Distinct < res.Distinct && time.Now().Before(deadline) {
		if err := procs.exited(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	res.DrainSec = time.Since(drainStart).Seconds()
	snap := rec.snapshot()
	res.Outputs, res.Repeats = snap.Total, snap.Total-snap.Distinct
	res.MissingKeys = rec.missing(plan)
	res.OrderViolations, res.BadPayloads = snap.Violations, snap.Bad
	var from int
	res.Flatness, from = flatness(res.Samples, b.o.soakWarmup)
	if from >= 0 {
		res.FirstAt, res.LastAt = res.Samples[from].At, res.Samples[len(res.Samples)-1].At
	}
	return nil
}

// procRSS returns VmRSS of process pid in bytes.
func procRSS(pid int) (int64, error) {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseStatusField(string(st), "VmRSS")
}

// publishSoak publishes plan to the input at -rate, each message stamped
// with its publish time, counting what it has handed to the client in
// published, and returns the rate achieved.
func (b *bench) publishSoak(ctx context.Context, transport string, ep endpoints, plan []input, published *atomic.Int64) (float64, error) {
	switch transport {
	case "kafka":
		var achieved float64
		err := b.kafka.produceAll(ctx, ep.inTopic, func(produce func(*kgo.Record)) error {
			var err error
			achieved, err = pace(ctx, len(plan), b.o.rate, func(from, to int) error {
				now := time.Now()
				for _, in := range plan[from:to] {
					produce(kafkaRecord(in, now))
				}
				published.Store(int64(to))
				return nil
			})
			return err
		})
		return achieved, err
	case "nats":
		achieved, err := pace(ctx, len(plan), b.o.rate, func(from, to int) error {
			now := time.Now()
			msgs := make([]*nats.Msg, 0, to-from)
			for _, in := range plan[from:to] {
				msgs = append(msgs, natsMessage(ep.inSubject, in, now))
			}
			for _, m := range msgs {
				if _, err := b.nats.js.PublishMsgAsync(m); err != nil {
					return fmt.Errorf("nats publish %s: %w", ep.inSubject, err)
				}
			}
			published.Store(int64(to))
			return nil
		})
		if err != nil {
			return 0, err
		}
		return achieved, b.nats.publish(ctx, nil)
	default:
		return 0, fmt.Errorf("-transports: unknown %q (kafka, nats)", transport)
	}
}

// printSoakReport writes each soak's checks, its flatness table and its
// samples.
func printSoakReport(w io.Writer, rep report) {
	fmt.Fprintf(w, "\nrelay soak, %s, commit %s, %s, %d CPUs, load average at end %s\n",
		rep.Started.Format(time.RFC3339), orDefault(rep.Commit, "?"), rep.GoVersion, rep.CPUs, benchutil.LoadAvg())
	for _, r := range rep.Soaks {
		title := orDefault(transportTitle[r.Transport], r.Transport)
		if r.Err != "" {
			fmt.Fprintf(w, "\n%s soak FAILED after %d samples: %s\n", title, len(r.Samples), r.Err)
		}
		fmt.Fprintf(w, "\n%s: dedupworker forward, %s at %.0f msgs/s achieved, %d %% duplicates, load average %s before, %s after\n",
			title, r.Duration, r.Rate, r.DupPct, r.LoadBefore, r.LoadAfter)
		fmt.Fprintf(w, "%d published, %d distinct keys, %d outputs (%d repeats), drained %.1f s after publishing; missing keys %d, order violations %d, unreadable outputs %d; peak RSS %.1f MB\n",
			r.Published, r.Distinct, r.Outputs, r.Repeats, r.DrainSec, r.MissingKeys, r.OrderViolations, r.BadPayloads, r.PeakRSSMB)
		if len(r.Flatness) > 0 {
			fmt.Fprintf(w, "\nFlatness: the first sample after the %s warm-up (%.0f s) against the last (%.0f s)\n\n", r.Warmup, r.FirstAt, r.LastAt)
			fmt.Fprintln(w, "| metric | first | last | last − first | min – max | least-squares slope per minute |")
			fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
			for _, f := range r.Flatness {
				u := ""
				if f.Unit != "" {
					u = " " + f.Unit
				}
				fmt.Fprintf(w, "| %s | %s%s | %s%s | %+.*f%s | %s – %s | %+.*f%s |\n", f.Metric,
					fmtFig(f.First), u, fmtFig(f.Last), u, decimals(f.Last-f.First), f.Last-f.First, u,
					fmtFig(f.Min), fmtFig(f.Max), decimals(f.SlopePerMin)+1, f.SlopePerMin, u)
			}
		} else {
			fmt.Fprintf(w, "\nFlatness: fewer than two samples after the %s warm-up\n", r.Warmup)
		}
		fmt.Fprintln(w, "\n| at s | in | out | RSS MB | heap MB | goroutines | relay CPU µs/msg | Redis CPU µs/msg | Redis trips/msg | Redis MB | p50 ms | p99 ms | load |")
		fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, s := range r.Samples {
			fmt.Fprintf(w, "| %.0f | %d | %d | %.1f | %.1f | %.0f | %.1f | %.1f | %.3f | %.1f | %.1f | %.1f | %s |\n",
				s.At, s.Published, s.Outputs, s.RSSMB, s.HeapMB, s.Goroutines, s.RelayCPUUs, s.RedisCPUUs, s.RoundTrips, s.RedisMemMB, s.P50Ms, s.P99Ms, s.Load)
		}
	}
}

// fmtFig prints v with one decimal, or none from 100 on.
func fmtFig(v float64) string { return strconv.FormatFloat(v, 'f', decimals(v), 64) }

func decimals(v float64) int {
	if math.Abs(v) >= 100 {
		return 0
	}
	return 1
}
