package main

import (
	"bufio"
	"context"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// countHook counts what a go-redis client sends: every top-level command
// (EVALSHA/EVAL included; the commands a script runs inside Redis are not
// seen here) and every round trip (a pipeline is one).
type countHook struct {
	cmds  atomic.Int64
	trips atomic.Int64
}

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.cmds.Add(1)
		h.trips.Add(1)
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.cmds.Add(int64(len(cmds)))
		h.trips.Add(1)
		return next(ctx, cmds)
	}
}

// redisStats is a snapshot of what Redis itself counted: commands per name
// (INFO commandstats, which in Redis 7 also counts commands run inside
// scripts) and the server's CPU time.
type redisStats struct {
	calls map[string]int64
	cpu   float64 // used_cpu_user + used_cpu_sys, seconds
}

func readRedisStats(ctx context.Context, c *redis.Client) (redisStats, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	txt, err := c.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return redisStats{}, err
	}
	st := redisStats{calls: map[string]int64{}}
	sc := bufio.NewScanner(strings.NewReader(txt))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "cmdstat_"):
			name, rest, _ := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
			for f := range strings.SplitSeq(rest, ",") {
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					st.calls[name] = n
				}
			}
		case strings.HasPrefix(line, "used_cpu_user:"), strings.HasPrefix(line, "used_cpu_sys:"):
			_, v, _ := strings.Cut(line, ":")
			f, _ := strconv.ParseFloat(v, 64)
			st.cpu += f
		}
	}
	return st, nil
}

// delta returns the commands Redis ran between a and b, leaving out the
// INFO calls that took the snapshots.
func (b redisStats) delta(a redisStats) (total int64, byName map[string]int64) {
	byName = map[string]int64{}
	for k, v := range b.calls {
		if d := v - a.calls[k]; d > 0 && k != "info" {
			byName[k] = d
			total += d
		}
	}
	return total, byName
}

// cpuTime returns this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineCPU is the first line of /proc/stat: the CPU time of every process
// on the machine (Redis, the brokers, this process and anything else), in
// clock ticks.
type machineCPU struct {
	busy, idle, steal uint64
}

// readMachineCPU returns the machine's CPU counters, or nil where
// /proc/stat cannot be read.
func readMachineCPU() *machineCPU {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return nil
	}
	var v [8]uint64 // user nice system idle iowait irq softirq steal
	for i := range v {
		v[i], _ = strconv.ParseUint(f[i+1], 10, 64)
	}
	return &machineCPU{
		busy:  v[0] + v[1] + v[2] + v[5] + v[6],
		idle:  v[3] + v[4],
		steal: v[7],
	}
}

// since returns, between a and c, the share of the machine's CPU time that
// was busy and that the hypervisor took (steal), in percent, and the busy
// CPU time per message in µs.
func (c machineCPU) since(a machineCPU, msgs int) (busyPct, usPerMsg, stealPct float64) {
	busy, total := float64(c.busy-a.busy), float64(c.busy+c.idle+c.steal-a.busy-a.idle-a.steal)
	if total <= 0 || msgs <= 0 {
		return 0, 0, 0
	}
	const tick = 1e6 / 100 // µs; USER_HZ is 100 on Linux
	return 100 * busy / total, busy * tick / float64(msgs), 100 * float64(c.steal-a.steal) / total
}

// resetPeakRSS resets VmHWM (Linux: "5" to /proc/self/clear_refs) so the
// next peakRSS reads the peak of one scenario. It reports whether it could.
func resetPeakRSS() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// procStatus returns a field of /proc/self/status in bytes (VmHWM, VmRSS),
// or falls back to rusage's maxrss for VmHWM.
func procStatus(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				v = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB"))
				n, _ := strconv.ParseInt(v, 10, 64)
				return n * 1024
			}
		}
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Maxrss * 1024
}

// latencies collects publish→ack durations.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// addFromHeader records now − the publish timestamp in v (unix ns), when v
// holds one.
func (l *latencies) addFromHeader(v string) {
	if v == "" {
		return
	}
	ns, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return
	}
	l.add(time.Since(time.Unix(0, ns)))
}

func (l *latencies) quantiles() (n int, p50, p99 time.Duration) {
	l.mu.Lock()
	s := slices.Clone(l.d)
	l.mu.Unlock()
	return quantiles(s)
}

// take returns the quantiles of what was collected and forgets it.
func (l *latencies) take() (n int, p50, p99 time.Duration) {
	l.mu.Lock()
	s := l.d
	l.d = nil
	l.mu.Unlock()
	return quantiles(s)
}

func quantiles(s []time.Duration) (n int, p50, p99 time.Duration) {
	if len(s) == 0 {
		return 0, 0, 0
	}
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return len(s), q(0.50), q(0.99)
}

// isLoopback reports whether host:port (or a URL's host) is a loopback
// address.
func isLoopback(hostport string) bool {
	if i := strings.Index(hostport, "://"); i >= 0 {
		hostport = hostport[i+3:]
	}
	if i := strings.LastIndex(hostport, "@"); i >= 0 {
		hostport = hostport[i+1:]
	}
	if i := strings.IndexAny(hostport, "/?"); i >= 0 {
		hostport = hostport[:i]
	}
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// storeCalls counts the engine's store calls by operation
// (consumer.HookStoreCall).
type storeCalls struct {
	claim, complete, other atomic.Int64
}

func (c *storeCalls) OnStoreCall(op string, _ time.Duration, _ error) {
	switch op {
	case "claim":
		c.claim.Add(1)
	case "complete":
		c.complete.Add(1)
	default:
		c.other.Add(1)
	}
}
