package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"time"

	"github.com/idemkit/dedupworker/bench/dedupbench/internal/benchutil"
)

// soakSample is one line of the soak's report.
type soakSample struct {
	Elapsed    string             `json:"elapsed"`
	RSSMB      float64            `json:"rss_mb"`
	HeapMB     float64            `json:"heap_inuse_mb"`
	Goroutines int                `json:"goroutines"`
	Settled    map[string]int     `json:"settled"`
	P99Ms      map[string]float64 `json:"p99_ms"`
	Load       string             `json:"loadavg"`
}

// soak runs the worker on every transport for o.soak against loopback
// servers, publishing o.soakRate messages per second to each (with
// duplicates), and samples RSS and goroutines every 10 s.
func soak(ctx context.Context, o options) error {
	if o.soak > time.Hour {
		return fmt.Errorf("--soak %s: at most 1h", o.soak)
	}
	for _, a := range []string{o.redisURL, o.natsURL, o.kafka} {
		for _, addr := range benchutil.SplitList(a) {
			if !isLoopback(addr) {
				return fmt.Errorf("--soak runs against loopback servers only, not %s", addr)
			}
		}
	}
	b, err := newBench(ctx, o)
	if err != nil {
		return err
	}
	defer func() { _ = b.close() }()
	dup := 30
	if len(o.dups) > 0 {
		dup = o.dups[len(o.dups)-1]
	}
	log.Printf("soak: %s at %.0f msgs/s per transport, %d%% duplicates, load average %s", o.soak, o.soakRate, dup, benchutil.LoadAvg())

	type running struct {
		t    transport
		p    *progress
		sent int64
		stop func() error
	}
	var rs []*running
	for _, name := range o.transports {
		t, err := newTransport(ctx, b, name)
		if err != nil {
			return err
		}
		id := b.run + "-soak-" + name
		if err := t.create(ctx, id); err != nil {
			return err
		}
		defer t.destroy(id)
		ns := "dedupbench-" + id
		defer b.dropNamespace(ns)
		r := &running{t: t, p: &progress{}}
		if r.stop, err = b.worker(ctx, t, id, ns, r.p); err != nil {
			return err
		}
		rs = append(rs, r)
	}

	// Publishers: one-second chunks at the rate, duplicates within a chunk.
	pctx, stopPub := context.WithTimeout(ctx, o.soak)
	defer stopPub()
	var pubs sync.WaitGroup
	for _, r := range rs {
		id := b.run + "-soak-" + r.t.name()
		pubs.Go(func() {
			for chunk := 0; pctx.Err() == nil; chunk++ {
				keys := plan(max(2000, int(o.soakRate)), dup, id+"-"+strconv.Itoa(chunk))
				if err := r.t.publish(pctx, id, keys, o.soakRate); err != nil {
					if pctx.Err() == nil {
						log.Printf("soak: %s: publish: %v", r.t.name(), err)
					}
					return
				}
				r.sent += int64(len(keys))
			}
		})
	}

	began := time.Now()
	var samples []soakSample
	sample := func() {
		var mst runtime.MemStats
		runtime.ReadMemStats(&mst)
		s := soakSample{
			Elapsed: time.Since(began).Round(time.Second).String(),
			RSSMB:   float64(procStatus("VmRSS")) / (1 << 20), HeapMB: float64(mst.HeapInuse) / (1 << 20),
			Goroutines: runtime.NumGoroutine(), Settled: map[string]int{}, P99Ms: map[string]float64{}, Load: benchutil.LoadAvg(),
		}
		for _, r := range rs {
			s.Settled[r.t.name()] = int(r.p.n.Load())
			_, _, p99 := r.p.lat.take()
			s.P99Ms[r.t.name()] = ms(p99)
			if k, ok := r.t.(*kafkaTransport); ok && k.cluster != nil {
				k.cluster.ApplyRetention()
			}
		}
		samples = append(samples, s)
		log.Printf("soak %6s  rss %6.1f MB  heap %6.1f MB  goroutines %5d  settled %v  p99 ms %v  load %s",
			s.Elapsed, s.RSSMB, s.HeapMB, s.Goroutines, s.Settled, s.P99Ms, s.Load)
	}
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	sample()
loop:
	for {
		select {
		case <-pctx.Done():
			break loop
		case <-tick.C:
			sample()
		}
	}
	pubs.Wait()
	for _, r := range rs {
		if err := r.p.waitFor(context.WithoutCancel(ctx), r.sent, time.Minute); err != nil {
			log.Printf("soak: %s: draining: %v", r.t.name(), err)
		}
	}
	sample()
	if o.memProfile != "" {
		// The heap while everything still runs: what the soak holds.
		runtime.GC()
		if f, err := os.Create(o.memProfile + ".inuse"); err == nil {
			_ = pprof.Lookup("heap").WriteTo(f, 0)
			_ = f.Close()
		}
	}
	for _, r := range rs {
		if err := r.stop(); err != nil {
			log.Printf("soak: %s: stopping: %v", r.t.name(), err)
		}
	}
	fmt.Println()
	fmt.Println("| elapsed | RSS MB | heap in use MB | goroutines | settled | load avg |")
	fmt.Println("|---|---:|---:|---:|---|---|")
	for _, s := range samples {
		fmt.Printf("| %s | %.1f | %.1f | %d | %v | %s |\n", s.Elapsed, s.RSSMB, s.HeapMB, s.Goroutines, s.Settled, s.Load)
	}
	if o.jsonOut != "" {
		js, _ := json.MarshalIndent(samples, "", "  ")
		return os.WriteFile(o.jsonOut, append(js, '\n'), 0o644)
	}
	return nil
}
