package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/dedupworker"

	"github.com/idemkit/dedupworker/bench/dedupbench/internal/benchutil"
	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/redisbackend"
)

// tsHeader carries the publish time (unix ns) of latency-phase messages.
const tsHeader = "Bench-Ts"

// keyHeader carries the idempotency key (the engine's default key source).
const keyHeader = "Idempotency-Key"

// retention of completed records: long enough for the run, short enough to
// leave a shared Redis clean if a run is interrupted.
const retention = 15 * time.Minute

// transport is one broker under test.
type transport interface {
	name() string
	// create makes a fresh stream or topic for scenario id.
	create(ctx context.Context, id string) error
	// publish sends one message per key; with rate > 0 paced at rate per
	// second and stamped with tsHeader, else as fast as possible.
	publish(ctx context.Context, id string, keys []string, rate float64) error
	// raw consumes and acks/commits, calling p.done for each message.
	raw(ctx context.Context, id string, p *progress) (stop func() error, err error)
	// feed consumes into jobs (the naive consumer) until stop is called.
	feed(ctx context.Context, id string, jobs chan<- job) (stop func() error, err error)
	// source is the transport's consumer.Source for the worker.
	source(id string, concurrency int) (consumer.Source, error)
	// destroy removes what create made.
	destroy(id string)
}

// job is one message handed to the naive consumer's goroutines.
type job struct {
	key     string
	payload []byte
	ts      string
	ack     func()
}

// progress counts settled messages and records latency.
type progress struct {
	n      atomic.Int64
	first  atomic.Int64 // unix ns of the first settled message
	target atomic.Int64
	reach  atomic.Int64 // unix ns when n reached target
	lat    latencies
	stages *stageTrace // the worker's, when the scenario is dedupworker
	// The machine's CPU counters when the first message settled and when
	// n reached target: the throughput window, without a Kafka group's
	// join or a worker's start.
	cpuFirst, cpuReach atomic.Pointer[machineCPU]

	mu     sync.Mutex
	waitN  atomic.Int64  // the count waitFor waits for
	waitCh chan struct{} // closed when n reaches waitN
}

func (p *progress) done(ts string) {
	now := time.Now().UnixNano()
	if p.first.CompareAndSwap(0, now) {
		p.cpuFirst.Store(readMachineCPU())
	}
	if ts != "" {
		p.lat.addFromHeader(ts)
	}
	n := p.n.Add(1)
	if n == p.target.Load() {
		p.reach.Store(now)
		p.cpuReach.Store(readMachineCPU())
	}
	if n == p.waitN.Load() {
		p.wake()
	}
}

func (p *progress) wake() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waitCh != nil {
		close(p.waitCh)
		p.waitCh = nil
	}
}

// waitFor waits until n messages settled, or the deadline.
func (p *progress) waitFor(ctx context.Context, n int64, within time.Duration) error {
	ch := make(chan struct{})
	p.mu.Lock()
	p.waitCh = ch
	p.waitN.Store(n)
	p.mu.Unlock()
	if p.n.Load() >= n { // reached before the channel was armed
		p.wake()
	}
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("only %d of %d messages settled within %s", p.n.Load(), n, within)
	}
}

func (b *bench) newStore(ns string) (*redisbackend.Store, error) {
	return redisbackend.New(b.rdb, redisbackend.Options{Namespace: ns})
}

// measured brackets a measured phase: process CPU, Redis calls, Redis's
// own counts.
type measured struct {
	b     *bench
	cpu   time.Duration
	cmds  int64
	trips int64
	rs    redisStats
	load  string
	ops   [3]int64
	heap  runtime.MemStats
}

func (b *bench) begin(ctx context.Context) (*measured, error) {
	// Hand freed memory back to the OS first, so the peak is this
	// scenario's and not the heap a previous one left behind.
	debug.FreeOSMemory()
	resetPeakRSS()
	m := &measured{b: b, load: benchutil.LoadAvg()}
	var err error
	if m.rs, err = readRedisStats(ctx, b.stats); err != nil {
		return nil, err
	}
	m.cmds, m.trips, m.cpu = b.hook.cmds.Load(), b.hook.trips.Load(), cpuTime()
	m.ops = [3]int64{b.ops.claim.Load(), b.ops.complete.Load(), b.ops.other.Load()}
	runtime.ReadMemStats(&m.heap)
	return m, nil
}

// end fills r's per-message figures for msgs messages.
func (m *measured) end(ctx context.Context, r *result, msgs int) {
	cpu := cpuTime() - m.cpu
	var heap runtime.MemStats
	runtime.ReadMemStats(&heap)
	cmds := m.b.hook.cmds.Load() - m.cmds
	trips := m.b.hook.trips.Load() - m.trips
	r.LoadBefore, r.LoadAfter = m.load, benchutil.LoadAvg()
	rs, err := readRedisStats(ctx, m.b.stats)
	f := float64(msgs)
	r.Msgs = msgs
	r.CPUSecPer10k = cpu.Seconds() / f * 1e4
	r.AllocsPerMsg = float64(heap.Mallocs-m.heap.Mallocs) / f
	r.AllocBytesPerMsg = float64(heap.TotalAlloc-m.heap.TotalAlloc) / f
	r.TripsPerMsg = float64(trips) / f
	r.CallsPerMsg = float64(cmds) / f
	r.ClaimCallsPerMsg = float64(m.b.ops.claim.Load()-m.ops[0]) / f
	r.CompleteCallsPerMsg = float64(m.b.ops.complete.Load()-m.ops[1]) / f
	r.OtherCallsPerMsg = float64(m.b.ops.other.Load()-m.ops[2]) / f
	if err == nil {
		total, byName := rs.delta(m.rs)
		r.ScriptCmdsPerMsg = max(0, float64(total-cmds)/f)
		r.RedisCmdsByName = map[string]float64{}
		for k, v := range byName {
			r.RedisCmdsByName[k] = float64(v) / f
		}
		r.RedisCPUPerMsgUs = (rs.cpu - m.rs.cpu) / f * 1e6
	}
	r.PeakRSSMB = float64(procStatus("VmHWM")) / (1 << 20)
	r.PeakRSSBacklogMB = r.PeakRSSMB
}

// runBroker runs one scenario of one transport: a backlog for throughput,
// then paced messages for latency.
func (b *bench) runBroker(ctx context.Context, t transport, mode string, dup int) (r result) {
	r = result{Transport: t.name(), Mode: mode, DupPct: dup}
	id := fmt.Sprintf("%s-%s-%s-d%d", b.run, t.name(), mode, dup)
	fail := func(err error) result {
		r.Err = err.Error()
		return r
	}
	if err := t.create(ctx, id); err != nil {
		return fail(err)
	}
	defer t.destroy(id)
	keys := plan(b.o.msgs, dup, id)
	if err := t.publish(ctx, id, keys, 0); err != nil {
		return fail(fmt.Errorf("publishing the backlog: %w", err))
	}
	ns := "dedupbench-" + id
	defer b.dropNamespace(ns)

	p := &progress{}
	if mode == "dedupworker" {
		p.stages = newStageTrace()
	}
	p.target.Store(int64(len(keys)))
	m, err := b.begin(ctx)
	if err != nil {
		return fail(err)
	}
	start := time.Now()
	var stop func() error
	switch mode {
	case "raw":
		stop, err = t.raw(ctx, id, p)
	case "naive":
		stop, err = b.naive(ctx, t, id, ns, p)
	case "dedupworker":
		stop, err = b.worker(ctx, t, id, ns, p)
	}
	if err != nil {
		return fail(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			if err := stop(); err != nil {
				log.Printf("%s: stopping: %v", id, err)
			}
		}
	}()
	if err := p.waitFor(ctx, int64(len(keys)), 5*time.Minute); err != nil {
		return fail(err)
	}
	// Throughput from the first settled message to the last: a Kafka
	// group's join is not the consumer's speed.
	first, last := p.first.Load(), p.reach.Load()
	r.Seconds = time.Duration(last - first).Seconds()
	if r.Seconds <= 0 {
		r.Seconds = time.Since(start).Seconds()
	}
	r.MsgsPerSec = float64(len(keys)-1) / r.Seconds
	m.end(ctx, &r, len(keys))
	if a, b := p.cpuFirst.Load(), p.cpuReach.Load(); a != nil && b != nil {
		r.MachineBusyPct, r.MachineCPUPerMsgUs, r.StealPct = b.since(*a, len(keys)-1)
	}
	if b.o.memProfile != "" {
		// The heap as the last GC of the backlog left it: what a worker
		// at full speed holds (the allocation profile at the end of the
		// run says what it churned through).
		if f, err := os.Create(b.o.memProfile + "." + id + ".inuse"); err == nil {
			_ = pprof.Lookup("heap").WriteTo(f, 0)
			_ = f.Close()
		}
	}

	if b.o.latency > 0 {
		rate := r.MsgsPerSec / 2
		if b.o.latencyRate > 0 {
			rate = b.o.latencyRate
		}
		n := max(200, int(rate*b.o.latency.Seconds()))
		lkeys := plan(n, dup, id+"-lat")
		want := int64(len(keys) + len(lkeys))
		if err := t.publish(ctx, id, lkeys, rate); err != nil {
			return fail(fmt.Errorf("latency phase: %w", err))
		}
		if err := p.waitFor(ctx, want, time.Minute); err != nil {
			return fail(fmt.Errorf("latency phase: %w", err))
		}
		ln, p50, p99 := p.lat.quantiles()
		r.LatencyRate, r.LatencyN = rate, ln
		r.P50Ms, r.P99Ms = ms(p50), ms(p99)
		if p.stages != nil {
			r.Stages = p.stages.quantiles()
			log.Printf("%s: latency by stage, p50/p99 ms: %s", id, formatStages(r.Stages))
		}
		r.PeakRSSMB = max(r.PeakRSSMB, float64(procStatus("VmHWM"))/(1<<20))
	}
	stopped = true
	if err := stop(); err != nil {
		return fail(fmt.Errorf("stopping: %w", err))
	}
	return r
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// worker starts the real Worker with the engine on redisbackend.
func (b *bench) worker(ctx context.Context, t transport, id, ns string, p *progress) (func() error, error) {
	src, err := t.source(id, b.o.concurrency)
	if err != nil {
		return nil, err
	}
	store, err := b.newStore(ns)
	if err != nil {
		return nil, err
	}
	w, err := dedupworker.NewWorker(store, dedupworker.Config{
		Hooks: []dedupworker.Hook{b.ops, settledCounter{p}}, ShutdownTimeout: 30 * time.Second,
		Wrap: []dedupworker.Wrapper{observe(p)},
	})
	if err != nil {
		_ = store.Close()
		return nil, err
	}
	st := p.stages
	noop := consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) ([]byte, error) {
		st.mark(m, func(t *stageTimes, now int64) { t.hand = now })
		return nil, nil
	})
	if err := w.Handle("bench", src, noop, dedupworker.WithConcurrency(b.o.concurrency), dedupworker.WithRetention(retention)); err != nil {
		_ = store.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	res := make(chan error, 1)
	go func() { res <- w.Run(rctx) }()
	return func() error {
		cancel()
		var err error
		select {
		case err = <-res:
		case <-time.After(time.Minute):
			err = fmt.Errorf("worker did not stop within a minute")
		}
		_ = store.Close()
		return err
	}, nil
}

// observe wraps the engine's Processor to record the publish→ack latency of
// stamped (latency-phase) messages and the stage times around Prepare.
// Settled deliveries are counted by settledCounter, a hook, rather than by
// observing every delivery (an Observation, a context value, the key's
// hash), which would cost the measured worker allocations a message that
// the naive consumer does not pay.
func observe(p *progress) consumer.ProcessorWrapper {
	return func(_ string, next consumer.Processor) consumer.Processor {
		return &observed{Processor: next, p: p}
	}
}

// observed is the engine's Processor with Prepare, Process and
// ProcessBatch observed; Batching is the engine's own.
type observed struct {
	consumer.Processor
	p *progress
}

// settledCounter counts the deliveries the engine acked (the hook is called
// after the ack): what the worker finished.
type settledCounter struct{ p *progress }

func (c settledCounter) OnOutcome(_, _ string, o consumer.Outcome) {
	if acked(o) {
		c.p.done("")
	}
}

// acked reports whether a delivery settled with o was acknowledged.
func acked(o consumer.Outcome) bool {
	switch o {
	case consumer.OutcomeProcessed, consumer.OutcomeDuplicate, consumer.OutcomeReclaimed,
		consumer.OutcomeLeaseLost, consumer.OutcomeMismatch:
		return true
	}
	return false
}

func (o *observed) Prepare(ctx context.Context, batch []consumer.Delivery) {
	st := o.p.stages
	for _, d := range batch {
		st.mark(d.Message(), func(t *stageTimes, now int64) { t.prep0 = now })
	}
	o.Processor.Prepare(ctx, batch)
	for _, d := range batch {
		st.mark(d.Message(), func(t *stageTimes, now int64) { t.prep1 = now })
	}
}

func (o *observed) Process(ctx context.Context, d consumer.Delivery) {
	ts := d.Message().Header.Get(tsHeader)
	if ts == "" {
		o.Processor.Process(ctx, d)
		return
	}
	st := o.p.stages
	st.mark(d.Message(), func(t *stageTimes, now int64) { t.proc0 = now })
	ctx, obs := consumer.WithObservation(ctx)
	o.Processor.Process(ctx, d)
	st.mark(d.Message(), func(t *stageTimes, now int64) { t.proc1 = now })
	if acked(obs.Outcome) {
		o.p.lat.addFromHeader(ts)
	}
}

// ProcessBatch observes each delivery of a run through Process when the
// engine takes runs one delivery at a time (the bench handler is not a
// batch handler), as the Kafka source hands them; a batching engine gets
// the run whole.
func (o *observed) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	if o.Processor.Batching() {
		o.Processor.ProcessBatch(ctx, ds)
		return
	}
	for _, d := range ds {
		o.Process(ctx, d)
	}
}

// naive is what a team writes by hand: a pool of goroutines, each claiming
// one key, running the handler and completing one key, with the project's
// own store.
func (b *bench) naive(ctx context.Context, t transport, id, ns string, p *progress) (func() error, error) {
	store, err := b.newStore(ns)
	if err != nil {
		return nil, err
	}
	jobs := make(chan job, 1024)
	stopFeed, err := t.feed(ctx, id, jobs)
	if err != nil {
		_ = store.Close()
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	for range b.o.concurrency {
		wg.Go(func() {
			for {
				select {
				case <-wctx.Done():
					return
				case j := <-jobs:
					naiveOne(wctx, store, "bench", j)
					p.done(j.ts)
				}
			}
		})
	}
	return func() error {
		err := stopFeed()
		cancel()
		wg.Wait()
		_ = store.Close()
		return err
	}, nil
}

func naiveOne(ctx context.Context, store *redisbackend.Store, scope string, j job) {
	fp := idempotency.Fingerprint(&consumer.Message{Payload: j.payload}, nil)
	req := []idempotency.ClaimRequest{{Key: scope + ":" + j.key, Fingerprint: fp, FingerprintVersion: idempotency.FingerprintVersion, Lease: 30 * time.Second}}
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := store.Claim(cctx, req)
		cancel()
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		switch res[0].Outcome {
		case idempotency.ClaimInFlight:
			time.Sleep(2 * time.Millisecond)
			continue
		case idempotency.ClaimNew, idempotency.ClaimReclaimed, idempotency.ClaimRecovered:
			// the no-op handler ran
			c := []idempotency.Completion{{Key: req[0].Key, Token: res[0].Claim.Token, Outcome: idempotency.RecordOutcomeOK, Retention: retention}}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := store.Complete(cctx, c)
			cancel()
			if err != nil {
				continue // a real consumer would nak; here: claim again
			}
		}
		j.ack()
		return
	}
}

// redisLimit drives the store's batch claim and complete directly, with
// flights batches in flight: no broker, Redis's ceiling.
func (b *bench) redisLimit(ctx context.Context, dup int) (r result) {
	r = result{Transport: "-", Mode: "redis-limit", DupPct: dup}
	id := fmt.Sprintf("%s-limit-d%d", b.run, dup)
	ns := "dedupbench-" + id
	defer b.dropNamespace(ns)
	store, err := b.newStore(ns)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer func() { _ = store.Close() }()
	keys := plan(b.o.msgs, dup, id)
	fps := make([]string, len(keys))
	for i, k := range keys {
		fps[i] = idempotency.Fingerprint(&consumer.Message{Payload: payload(k)}, nil)
	}
	m, err := b.begin(ctx)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	var next atomic.Int64
	var errs atomic.Int64
	start, cpu0 := time.Now(), readMachineCPU()
	var wg sync.WaitGroup
	for range b.o.flights {
		wg.Go(func() {
			reqs := make([]idempotency.ClaimRequest, 0, b.o.batch)
			cs := make([]idempotency.Completion, 0, b.o.batch)
			for {
				lo := int(next.Add(int64(b.o.batch))) - b.o.batch
				if lo >= len(keys) || ctx.Err() != nil {
					return
				}
				hi := min(lo+b.o.batch, len(keys))
				reqs, cs = reqs[:0], cs[:0]
				seen := map[string]bool{}
				for i := lo; i < hi; i++ {
					k := "bench:" + keys[i]
					if seen[k] {
						continue
					}
					seen[k] = true
					reqs = append(reqs, idempotency.ClaimRequest{Key: k, Fingerprint: fps[i], FingerprintVersion: idempotency.FingerprintVersion, Lease: 30 * time.Second})
				}
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				res, err := store.Claim(cctx, reqs)
				cancel()
				if err != nil {
					errs.Add(1)
					continue
				}
				for i, x := range res {
					if x.Outcome.Owned() {
						cs = append(cs, idempotency.Completion{Key: reqs[i].Key, Token: x.Claim.Token, Outcome: idempotency.RecordOutcomeOK, Retention: retention})
					}
				}
				if len(cs) > 0 {
					cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					if _, err := store.Complete(cctx, cs); err != nil {
						errs.Add(1)
					}
					cancel()
				}
			}
		})
	}
	wg.Wait()
	r.Seconds = time.Since(start).Seconds()
	r.MsgsPerSec = float64(len(keys)) / r.Seconds
	m.end(ctx, &r, len(keys))
	if cpu1 := readMachineCPU(); cpu0 != nil && cpu1 != nil {
		r.MachineBusyPct, r.MachineCPUPerMsgUs, r.StealPct = cpu1.since(*cpu0, len(keys))
	}
	if b.o.memProfile != "" {
		// The heap as the last GC of the backlog left it: what a worker
		// at full speed holds (the allocation profile at the end of the
		// run says what it churned through).
		if f, err := os.Create(b.o.memProfile + "." + id + ".inuse"); err == nil {
			_ = pprof.Lookup("heap").WriteTo(f, 0)
			_ = f.Close()
		}
	}
	if n := errs.Load(); n > 0 {
		r.Err = fmt.Sprintf("%d store calls failed", n)
	}
	return r
}
