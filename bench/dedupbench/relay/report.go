package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idemkit/dedupworker/bench/dedupbench/internal/benchutil"
)

var transportTitle = map[string]string{"kafka": "Kafka → Kafka", "nats": "NATS → NATS"}

// printReport writes one markdown table per target of issue 15, then every
// row.
func printReport(w io.Writer, rep report) {
	fmt.Fprintf(w, "\nrelay benchmark, %s, commit %s, %s, %d CPUs, %v messages per measurement, load average at end %s\n",
		rep.Started.Format(time.RFC3339), orDefault(rep.Commit, "?"), rep.GoVersion, rep.CPUs, rep.Options["msgs"], benchutil.LoadAvg())
	contenders := uniq(rep.Results, func(r result) string { return r.Contender }, func(r result) bool { return !r.ScaleOut })
	transports := uniq(rep.Results, func(r result) string { return r.Transport }, func(result) bool { return true })
	dups := uniqInt(rep.Results)
	dupTitle := strings.Trim(strings.ReplaceAll(fmt.Sprint(dups), " ", " % / "), "[]") + " %"

	table := func(title string, f func(r result) string) {
		fmt.Fprintf(w, "\n%s (%s duplicates)\n\n| | %s |\n|---|%s\n", title, dupTitle, strings.Join(contenders, " | "), strings.Repeat("---:|", len(contenders)))
		for _, t := range transports {
			cells := make([]string, len(contenders))
			for i, c := range contenders {
				var vs []string
				for _, d := range dups {
					r, ok := find(rep.Results, t, c, d, 1)
					switch {
					case !ok:
						vs = append(vs, "–")
					case r.Err != "":
						vs = append(vs, "failed")
					default:
						vs = append(vs, f(r))
					}
				}
				cells[i] = strings.Join(vs, " / ")
			}
			fmt.Fprintf(w, "| %s | %s |\n", orDefault(transportTitle[t], t), strings.Join(cells, " | "))
		}
	}
	table("msgs/s", func(r result) string { return fmt.Sprintf("%.0f", r.MsgsPerSec) })
	table("Redis CPU, µs per message", func(r result) string { return fmt.Sprintf("%.1f", r.RedisCPUUs) })
	table("Relay process CPU, µs per message", func(r result) string { return fmt.Sprintf("%.1f", r.ProcCPUUs) })
	table("Whole machine CPU, µs per message (busy %)", func(r result) string {
		return fmt.Sprintf("%.0f (%.0f %%)", r.MachineCPUUs, r.MachineBusy)
	})
	table("Broker processes' CPU (nats-server, Kafka JVMs), µs per message, from the relay's start", func(r result) string { return optUs(r.BrokerCPUUs) })
	table("Broker processes' CPU in the second before the relay starts (other clients, their own work), % of one CPU", func(r result) string {
		if r.BrokerBackgroundPct == nil {
			return "–"
		}
		return fmt.Sprintf("%.0f %%", *r.BrokerBackgroundPct)
	})
	table("Broker processes' CPU less that background over the window, µs per message (an estimate)", func(r result) string { return optUs(r.BrokerNetCPUUs) })
	table("Read and write system calls per message of the broker processes (and of the relay), from the relay's start", func(r result) string {
		if r.BrokerSyscalls == nil {
			return fmt.Sprintf("– (%.2f)", r.RelaySyscalls)
		}
		return fmt.Sprintf("%.2f (%.2f)", *r.BrokerSyscalls, r.RelaySyscalls)
	})
	table("Benchmark process CPU (its output reader), µs per message, from the relay's start", func(r result) string { return fmt.Sprintf("%.1f", r.BenchCPUUs) })
	table("Latency publish → output, p50 (p99), ms, at the -rate publish rate", func(r result) string {
		if r.LatencyN == 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f (p99 %.1f)", r.P50Ms, r.P99Ms)
	})
	// The latency phase's costs: one figure a cell, since the table
	// already writes one cell a duplicate share as "a / b".
	latencyTable := func(title string, f func(r result) string) {
		table(title, func(r result) string {
			if r.LatencyN == 0 {
				return "–"
			}
			return f(r)
		})
	}
	latencyTable("At the -rate publish rate (the latency phase): relay process CPU, µs per message", func(r result) string { return fmt.Sprintf("%.1f", r.LatencyRelayCPUUs) })
	latencyTable("At the -rate publish rate (the latency phase): Redis CPU, µs per message", func(r result) string { return fmt.Sprintf("%.1f", r.LatencyRedisCPUUs) })
	latencyTable("At the -rate publish rate (the latency phase): Redis round trips per message (commands per message)", func(r result) string {
		return fmt.Sprintf("%.2f (%.2f)", r.LatencyRoundTrips, r.LatencyCommands)
	})
	table("Redis round trips per message", func(r result) string { return fmt.Sprintf("%.3f", r.RoundTrips) })
	table("Redis commands per message (inside scripts too)", func(r result) string { return fmt.Sprintf("%.2f", r.Commands) })
	table("Duplicates the relay answered from its local cache, share of the backlog's duplicates", func(r result) string {
		if r.LocalCacheHitShare == nil {
			return "–"
		}
		return fmt.Sprintf("%.2f", *r.LocalCacheHitShare)
	})
	table("Heap allocations of the relay process per message, from its start (KB allocated)", func(r result) string {
		if r.AllocsPerMsg == nil || r.AllocBytesPerMsg == nil {
			return "–"
		}
		return fmt.Sprintf("%.1f (%.2f)", *r.AllocsPerMsg, *r.AllocBytesPerMsg/1024)
	})
	table("Peak RSS of the relay process, MB", func(r result) string { return fmt.Sprintf("%.0f", r.PeakRSSMB) })
	table("Correctness: missing keys, order violations, repeated outputs", func(r result) string {
		return fmt.Sprintf("%d, %d, %d", r.MissingKeys, r.OrderViolations, r.Repeats)
	})

	fmt.Fprintf(w, "\nWhere the machine's CPU goes from the relay's start to its last output, µs per message: relay + Redis + brokers + benchmark + other processes + kernel = machine (with Redis on this host); kernel is the work charged to no process, softirq among it\n\n")
	fmt.Fprintln(w, "| transport | contender | dups | relay | Redis | brokers | benchmark | other processes | kernel (softirq) | machine | steal |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rep.Results {
		if r.Err != "" || r.ScaleOut {
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %d %% | %.1f | %.1f | %s | %.1f | %.1f | %.1f (%.1f) | %.1f | %.1f |\n", orDefault(transportTitle[r.Transport], r.Transport), r.Contender, r.DupPct,
			r.ProcCPUUs, r.RedisCPUUs, optUs(r.BrokerCPUUs), r.BenchCPUUs, r.OtherProcsCPUUs, r.KernelCPUUs, r.SoftirqUs, r.WindowMachineCPUUs, r.StealUs)
	}
	var brokers []string
	for _, t := range transports {
		for _, r := range rep.Results {
			if r.Transport == t && r.BrokerProcs != "" {
				brokers = append(brokers, fmt.Sprintf("%s: %s", t, r.BrokerProcs))
				break
			}
		}
	}
	if len(brokers) > 0 {
		fmt.Fprintf(w, "\nBroker processes read (first measurement of each transport): %s\n", strings.Join(brokers, "; "))
	}

	var scaled []result
	for _, r := range rep.Results {
		if r.ScaleOut {
			scaled = append(scaled, r)
		}
	}
	if len(scaled) > 0 {
		fmt.Fprintf(w, "\nScale-out: dedupworker forward, 0 %% duplicates, N processes on one Kafka group / NATS durable\n\n")
		fmt.Fprintln(w, "| transport | processes | msgs/s | Redis CPU µs/msg | Redis round trips/msg | relay CPU µs/msg (all processes) | machine CPU µs/msg (busy %) | missing, order violations |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---|")
		for _, r := range scaled {
			if r.Err != "" {
				fmt.Fprintf(w, "| %s | %d | failed: %s ||||||\n", r.Transport, r.Procs, oneLine(r.Err))
				continue
			}
			fmt.Fprintf(w, "| %s | %d | %.0f | %.1f | %.3f | %.1f | %.0f (%.0f %%) | %d, %d |\n", orDefault(transportTitle[r.Transport], r.Transport),
				r.Procs, r.MsgsPerSec, r.RedisCPUUs, r.RoundTrips, r.ProcCPUUs, r.MachineCPUUs, r.MachineBusy, r.MissingKeys, r.OrderViolations)
		}
	}

	fmt.Fprintf(w, "\nEvery measurement\n\n| transport | contender | dups | procs | msgs/s | outputs (repeats) | Redis CPU µs/msg | relay CPU µs/msg | broker CPU µs/msg | bench CPU µs/msg | machine µs/msg (busy) | round trips/msg | commands/msg | p50 / p99 ms (at msgs/s) | RSS MB | missing | order violations |\n")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
	for _, r := range rep.Results {
		if r.Err != "" {
			fmt.Fprintf(w, "| %s | %s | %d %% | %d | failed: %s |||||||||||||\n", r.Transport, r.Contender, r.DupPct, r.Procs, oneLine(r.Err))
			continue
		}
		lat := "–"
		if r.LatencyN > 0 {
			lat = fmt.Sprintf("%.1f / %.1f (%.0f)", r.P50Ms, r.P99Ms, r.LatencyRate)
		}
		fmt.Fprintf(w, "| %s | %s | %d %% | %d | %.0f | %d (%d) | %.1f | %.1f | %s | %.1f | %.0f (%.0f %%) | %.3f | %.2f | %s | %.0f | %d | %d |\n",
			r.Transport, r.Contender, r.DupPct, r.Procs, r.MsgsPerSec, r.Outputs, r.Repeats, r.RedisCPUUs, r.ProcCPUUs, optUs(r.BrokerCPUUs), r.BenchCPUUs,
			r.MachineCPUUs, r.MachineBusy, r.RoundTrips, r.Commands, lat, r.PeakRSSMB, r.MissingKeys, r.OrderViolations)
	}
}

func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.ReplaceAll(s, "|", "\\|")
}

func find(rs []result, t, c string, d, procs int) (result, bool) {
	for _, r := range rs {
		if r.Transport == t && r.Contender == c && r.DupPct == d && r.Procs == procs && !r.ScaleOut {
			return r, true
		}
	}
	return result{}, false
}

func uniq(rs []result, key func(result) string, keep func(result) bool) []string {
	var out []string
	for _, r := range rs {
		if k := key(r); keep(r) && !has(out, k) {
			out = append(out, k)
		}
	}
	return out
}

func uniqInt(rs []result) []int {
	var out []int
	seen := map[int]bool{}
	for _, r := range rs {
		if !r.ScaleOut && !seen[r.DupPct] {
			seen[r.DupPct] = true
			out = append(out, r.DupPct)
		}
	}
	return out
}

// optUs formats an optional µs figure: "–" when absent.
func optUs(v *float64) string {
	if v == nil {
		return "–"
	}
	return fmt.Sprintf("%.1f", *v)
}
