package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/bench/internal/services"
)

// TestMain lets the test binary be the hand-written relays' child process,
// as the benchmark binary is (os.Executable is the test binary here).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "child" {
		if err := childMain(os.Args[2:]); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRelaySmoke runs a short benchmark against the real services: the
// raw, naive and dedupworker relays with -dups 30 on Kafka and NATS,
// the http action on Kafka, and two dedupworker processes on one group.
func TestRelaySmoke(t *testing.T) {
	redisURL := services.Redis(t)
	natsURL := services.NATS(t)
	brokers := services.Kafka(t)
	args := []string{
		"-msgs", "2000", "-dups", "30", "-latency", "500ms", "-scale", "2", "-src", "../../..",
		"-contenders", "raw,naive,dedupworker,dedupworker-http", "-timeout", "2m",
		"-redis", redisURL, "-nats", natsURL, "-kafka", strings.Join(brokers, ","),
	}
	rep, out, private := runRelay(t, args, 8*time.Minute)
	if len(rep.Results) != 2*4+2 {
		t.Fatalf("%d results, want %d", len(rep.Results), 2*4+2)
	}
	for _, r := range rep.Results {
		name := r.Transport + "/" + r.Contender
		if r.Err != "" {
			t.Errorf("%s x%d: %s", name, r.Procs, r.Err)
			continue
		}
		if r.MissingKeys != 0 || r.BadPayloads != 0 {
			t.Errorf("%s x%d: %d keys missing, %d unreadable outputs", name, r.Procs, r.MissingKeys, r.BadPayloads)
		}
		if r.MsgsPerSec <= 0 || r.ProcCPUUs <= 0 || r.PeakRSSMB <= 0 {
			t.Errorf("%s x%d: %.0f msgs/s, %.1f µs CPU/msg, %.0f MB: a measurement is missing", name, r.Procs, r.MsgsPerSec, r.ProcCPUUs, r.PeakRSSMB)
		}
		// The test services run on this host: their processes are found
		// and read.
		if r.BrokerCPUUs == nil || *r.BrokerCPUUs <= 0 || r.BrokerSyscalls == nil || *r.BrokerSyscalls <= 0 || r.BenchCPUUs <= 0 || r.WindowMachineCPUUs <= 0 {
			t.Errorf("%s x%d: broker CPU %s µs/msg (%s), broker syscalls %v, benchmark %.1f µs/msg, machine %.1f µs/msg: a measurement is missing",
				name, r.Procs, optUs(r.BrokerCPUUs), r.BrokerProcs, r.BrokerSyscalls, r.BenchCPUUs, r.WindowMachineCPUUs)
		}
		if r.Transport == "kafka" && (r.Contender == "raw" || r.Contender == "dedupworker") && r.OrderViolations != 0 {
			t.Errorf("%s x%d: %d per-partition order violations", name, r.Procs, r.OrderViolations)
		}
		// Only a single dedupworker process reports its local cache, and
		// with the backlog's duplicates far fewer than the cache's
		// default 10 000 entries, the cache answers some of them and never
		// more hits than duplicates.
		single := (r.Contender == "dedupworker" || r.Contender == "dedupworker-http") && r.Procs == 1
		if single != (r.AllocsPerMsg != nil && r.AllocBytesPerMsg != nil) {
			t.Errorf("%s x%d: allocations per message %v, %v; want them: %v", name, r.Procs, r.AllocsPerMsg, r.AllocBytesPerMsg, single)
		} else if single && (*r.AllocsPerMsg <= 0 || *r.AllocBytesPerMsg <= *r.AllocsPerMsg) {
			t.Errorf("%s: %.1f allocations of %.0f bytes per message; want more than 0, of more than a byte each", name, *r.AllocsPerMsg, *r.AllocBytesPerMsg)
		}
		if wantHits := single; wantHits != (r.LocalCacheHitShare != nil) {
			t.Errorf("%s x%d: local cache share %v, want one: %v", name, r.Procs, r.LocalCacheHitShare, wantHits)
		} else if wantHits && (*r.LocalCacheHitShare <= 0 || *r.LocalCacheHitShare > 1) {
			t.Errorf("%s: local cache answered %.2f of the duplicates, want (0, 1]", name, *r.LocalCacheHitShare)
		}
		switch r.Contender {
		case "raw":
			// No deduplication: every duplicate comes out again.
			if r.Repeats != r.Msgs-r.Distinct || (private && r.RoundTrips > 0.05) {
				t.Errorf("%s: %d repeats (want %d), %.3f Redis round trips/msg", name, r.Repeats, r.Msgs-r.Distinct, r.RoundTrips)
			}
		case "naive":
			// Two calls per distinct message, one per duplicate.
			if r.RoundTrips < 1 {
				t.Errorf("%s: %.3f Redis round trips/msg, want at least 1", name, r.RoundTrips)
			}
		}
		if !r.ScaleOut && r.LatencyN == 0 {
			t.Errorf("%s: no latency samples", name)
		}
		// Every relay works for the messages of the latency phase, and
		// so does Redis for those that call it.
		if !r.ScaleOut && (r.LatencyRelayCPUUs <= 0 || r.Contender != "raw" && r.Contender != "watermill" && r.LatencyRedisCPUUs <= 0) {
			t.Errorf("%s: latency phase relay CPU %.1f, Redis CPU %.1f µs/msg; want both above 0", name, r.LatencyRelayCPUUs, r.LatencyRedisCPUUs)
		}
	}
	for _, want := range []string{"msgs/s (30 % duplicates)", "Redis CPU, µs per message", "Scale-out", "| Kafka → Kafka |", "Where the machine's CPU goes", "Broker processes read", "At the -rate publish rate"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
}

// TestRelaySoakSmoke runs a soak of a few seconds on Kafka and NATS: every
// sample reads the relay's RSS, heap, goroutines, CPU and latency, every
// key comes out, Kafka keeps each partition's order, and the flatness
// table compares the samples after the warm-up.
func TestRelaySoakSmoke(t *testing.T) {
	redisURL := services.Redis(t)
	natsURL := services.NATS(t)
	brokers := services.Kafka(t)
	args := []string{
		"-soak", "6s", "-soak-every", "1s", "-soak-warmup", "2s", "-rate", "300", "-dups", "30", "-src", "../../..",
		"-redis", redisURL, "-nats", natsURL, "-kafka", strings.Join(brokers, ","),
	}
	rep, out, _ := runRelay(t, args, 5*time.Minute)
	if len(rep.Soaks) != 2 || len(rep.Results) != 0 {
		t.Fatalf("%d soaks and %d measurements, want 2 soaks only", len(rep.Soaks), len(rep.Results))
	}
	for _, r := range rep.Soaks {
		if r.Err != "" {
			t.Errorf("%s: %s", r.Transport, r.Err)
			continue
		}
		if len(r.Samples) != 6 {
			t.Errorf("%s: %d samples, want 6", r.Transport, len(r.Samples))
		}
		latencies, outputs := 0, 0
		cpuRead := false
		for _, s := range r.Samples {
			// A second's CPU is read in clock ticks: an interval in which
			// the relay waited (a fetch that expired) can be charged none.
			// The reader works when some interval has CPU.
			if s.Published <= 0 || s.RSSMB <= 0 || s.HeapMB <= 0 || s.Goroutines <= 0 || s.RelayCPUUs < 0 || s.RedisMemMB <= 0 {
				t.Errorf("%s at %.0f s: a measurement is missing: %+v", r.Transport, s.At, s)
			}
			cpuRead = cpuRead || s.RelayCPUUs > 0
			latencies, outputs = latencies+s.LatencyN, outputs+s.Outputs
		}
		if !cpuRead {
			t.Errorf("%s: no sample read the relay's CPU", r.Transport)
		}
		// Every output carries its publish time; an interval's latencies are
		// taken just after its output count, so they may hold a few more.
		if outputs == 0 || latencies < outputs {
			t.Errorf("%s: %d latency samples for the %d outputs of the intervals", r.Transport, latencies, outputs)
		}
		if r.Published != 1800 || r.Distinct != r.Published-r.Published*30/100 {
			t.Errorf("%s: %d published, %d distinct; want 1800 and 1260", r.Transport, r.Published, r.Distinct)
		}
		if r.MissingKeys != 0 || r.BadPayloads != 0 {
			t.Errorf("%s: %d keys missing, %d unreadable outputs", r.Transport, r.MissingKeys, r.BadPayloads)
		}
		if r.Transport == "kafka" && r.OrderViolations != 0 {
			t.Errorf("kafka: %d per-partition order violations", r.OrderViolations)
		}
		if len(r.Flatness) != len(soakMetrics) || r.FirstAt < 2 || r.PeakRSSMB <= 0 {
			t.Errorf("%s: %d flatness rows from %.0f s, peak RSS %.1f MB", r.Transport, len(r.Flatness), r.FirstAt, r.PeakRSSMB)
		}
	}
	for _, want := range []string{"Kafka → Kafka: dedupworker forward", "NATS → NATS: dedupworker forward", "| relay goroutines |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
}

// runRelay runs the benchmark with args within timeout, with a private Redis
// when redis-server is installed (private: then only this test's clients
// count in Redis's round trips), and returns its report and printed output.
func runRelay(t *testing.T, args []string, timeout time.Duration) (rep report, out *bytes.Buffer, private bool) {
	t.Helper()
	if bin, err := exec.LookPath("redis-server"); err == nil {
		args, private = append(args, "-redis-server", bin), true
	}
	o, err := parseOptions(args)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out = new(bytes.Buffer)
	rep, err = run(ctx, o, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	return rep, out, private
}
