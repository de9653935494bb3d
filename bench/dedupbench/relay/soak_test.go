package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

// A slice of what client_golang's Go and process collectors print, with
// labelled samples, a name that extends a wanted one, exponents and a
// timestamp.
const metricsText = `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 97
# HELP go_goroutines_peak not a real metric: a name that extends a wanted one
go_goroutines_peak 500
# HELP go_memstats_heap_inuse_bytes Number of heap bytes that are in use.
# TYPE go_memstats_heap_inuse_bytes gauge
go_memstats_heap_inuse_bytes 1.6777216e+07 1733070000000
go_memstats_heap_inuse_bytes_total{x="y"} 3
go_gc_duration_seconds{quantile="0.5"} 4.2e-05
dedup_messages_total{handler="relay",outcome="ok"} 1234
`

func TestParseMetricsTextReadsUnlabelledSamples(t *testing.T) {
	m, err := parseMetricsText(strings.NewReader(metricsText), heapMetric, goroutineMetric)
	if err != nil {
		t.Fatal(err)
	}
	if m[goroutineMetric] != 97 || m[heapMetric] != 16<<20 {
		t.Fatalf("goroutines %v, heap %v; want 97 and %d", m[goroutineMetric], m[heapMetric], 16<<20)
	}
	if len(m) != 2 {
		t.Fatalf("read %v, want only the two names asked for", m)
	}
}

func TestParseMetricsTextFailsOnAMissingOrBadSample(t *testing.T) {
	// Only a labelled sample of the name: not the unlabelled one asked for.
	_, err := parseMetricsText(strings.NewReader("dedup_messages_total{outcome=\"ok\"} 3\ngo_goroutines 5\n"), "dedup_messages_total", goroutineMetric)
	if err == nil || !strings.Contains(err.Error(), "dedup_messages_total") {
		t.Fatalf("err = %v, want one naming dedup_messages_total", err)
	}
	if _, err := parseMetricsText(strings.NewReader("go_goroutines many\n"), goroutineMetric); err == nil {
		t.Fatal("a value that is not a number parsed")
	}
}

func TestParseInfoInt(t *testing.T) {
	info := "# Memory\r\nused_memory:1048576\r\nused_memory_human:1.00M\r\nused_memory_rss:2000000\r\n"
	if n, err := parseInfoInt(info, "used_memory"); err != nil || n != 1<<20 {
		t.Fatalf("used_memory = %d, %v; want %d", n, err, 1<<20)
	}
	if _, err := parseInfoInt(info, "used_memory_peak"); err == nil {
		t.Fatal("a missing field parsed")
	}
}

func samplesEvery(d time.Duration, n int, f func(i int) soakSample) []soakSample {
	out := make([]soakSample, n)
	for i := range out {
		out[i] = f(i)
		out[i].At = (time.Duration(i+1) * d).Seconds()
	}
	return out
}

func TestFlatnessComparesTheFirstSampleAfterTheWarmupWithTheLast(t *testing.T) {
	// 30 s samples for 10 minutes: RSS high during the warm-up, then
	// growing 1 MB a minute; goroutines flat; p99 falling.
	s := samplesEvery(30*time.Second, 20, func(i int) soakSample {
		at := float64(i+1) * 0.5 // minutes
		rss := 40 + at
		if at < 2 {
			rss = 90
		}
		return soakSample{RSSMB: rss, HeapMB: 10, Goroutines: 100, P99Ms: 20 - at}
	})
	rows, from := flatness(s, 2*time.Minute)
	if from != 3 || s[from].At != 120 {
		t.Fatalf("first sample after the warm-up: index %d, want 3 (at 120 s)", from)
	}
	get := func(name string) flatRow {
		for _, r := range rows {
			if r.Metric == name {
				return r
			}
		}
		t.Fatalf("no %q row in %+v", name, rows)
		return flatRow{}
	}
	rss := get("relay RSS")
	if rss.First != 42 || rss.Last != 50 || rss.Min != 42 || rss.Max != 50 || math.Abs(rss.SlopePerMin-1) > 1e-9 {
		t.Fatalf("RSS row %+v: want first 42, last 50, min 42, max 50, slope 1 MB/min (the warm-up's 90 MB excluded)", rss)
	}
	if g := get("relay goroutines"); g.First != 100 || g.Last != 100 || g.SlopePerMin != 0 {
		t.Fatalf("goroutines row %+v: want flat at 100", g)
	}
	if p := get("latency p99"); p.First != 18 || p.Last != 10 || math.Abs(p.SlopePerMin+1) > 1e-9 {
		t.Fatalf("p99 row %+v: want 18 → 10, slope -1 ms/min", p)
	}
}

func TestFlatnessNeedsTwoSamplesAfterTheWarmup(t *testing.T) {
	s := samplesEvery(30*time.Second, 4, func(int) soakSample { return soakSample{RSSMB: 1} })
	if rows, from := flatness(s, 2*time.Minute); rows != nil || from != -1 {
		t.Fatalf("one sample after the warm-up gave rows %+v from %d", rows, from)
	}
	if rows, from := flatness(s, 3*time.Minute); rows != nil || from != -1 {
		t.Fatalf("no sample after the warm-up gave rows %+v from %d", rows, from)
	}
	if rows, from := flatness(s, 90*time.Second); len(rows) != len(soakMetrics) || from != 2 {
		t.Fatalf("two samples after the warm-up gave %d rows from %d", len(rows), from)
	}
}

func TestParseOptionsSoak(t *testing.T) {
	o, err := parseOptions([]string{"-soak", "10m", "-dups", "30,0", "-contenders", "raw"})
	if err != nil {
		t.Fatal(err)
	}
	if o.soak != 10*time.Minute || o.soakEvery != 30*time.Second || o.soakWarmup != 2*time.Minute || o.dups[0] != 30 {
		t.Fatalf("soak %v every %v warm-up %v dups %v", o.soak, o.soakEvery, o.soakWarmup, o.dups)
	}
	if len(o.contenders) != 1 || o.contenders[0] != "dedupworker" || len(o.scale) != 0 {
		t.Fatalf("a soak runs the dedupworker relay alone: contenders %v, scale %v", o.contenders, o.scale)
	}
	for _, args := range [][]string{
		{"-soak", "10s", "-soak-every", "20s"},
		{"-soak", "10s", "-soak-every", "0s"},
		{"-soak", "10s", "-dups", ""},
		{"-soak", "-1s"},
	} {
		if _, err := parseOptions(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
