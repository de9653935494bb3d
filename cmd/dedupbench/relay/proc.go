package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// clockTick is the unit of /proc's CPU times: USER_HZ is 100 on Linux.
const clockTick = 10 * time.Millisecond

// procCPU returns the user+system CPU time process pid has used, from
// /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseProcStat(string(b))
}

// parseProcStat reads utime and stime (fields 14 and 15) of a
// /proc/<pid>/stat line. The command name (field 2) is in parentheses and
// may hold spaces, so the fields are counted after its closing one.
func parseProcStat(s string) (time.Duration, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/<pid>/stat: no command name in %q", s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): utime is field 14, f[11].
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/<pid>/stat: %d fields after the command name, want at least 13", len(f))
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/<pid>/stat: utime %q, stime %q", f[11], f[12])
	}
	return time.Duration(u+st) * clockTick, nil
}

// procPeakRSS returns VmHWM of process pid in bytes.
func procPeakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseStatusField(string(b), "VmHWM")
}

func parseStatusField(s, field string) (int64, error) {
	for line := range strings.SplitSeq(s, "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			v = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB"))
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/<pid>/status %s: %q", field, v)
			}
			return n * 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/<pid>/status has no %s", field)
}

// machineCPU holds the first line of /proc/stat: the CPU time of every
// process on the machine, in clock ticks.
type machineCPU struct{ busy, total uint64 }

func readMachineCPU() (machineCPU, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return parseMachineCPU(line)
}

// parseMachineCPU reads "cpu user nice system idle iowait irq softirq
// steal ...": busy is user+nice+system+irq+softirq, total adds idle, iowait
// and steal.
func parseMachineCPU(line string) (machineCPU, error) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return machineCPU{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var v [8]uint64
	for i := range v {
		n, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return machineCPU{}, fmt.Errorf("/proc/stat: field %d: %q", i+1, f[i+1])
		}
		v[i] = n
	}
	busy := v[0] + v[1] + v[2] + v[5] + v[6]
	return machineCPU{busy: busy, total: busy + v[3] + v[4] + v[7]}, nil
}

// redisStats is what one INFO returns that the benchmark needs.
type redisStats struct {
	cpu      time.Duration // used_cpu_user + used_cpu_sys
	reads    int64         // total_reads_processed: one per request burst a client sends
	commands int64         // total_commands_processed, commands run inside scripts included
}

func readRedisStats(ctx context.Context, c *redis.Client) (redisStats, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	txt, err := c.Info(ctx, "stats", "cpu").Result()
	if err != nil {
		return redisStats{}, fmt.Errorf("redis INFO: %w", err)
	}
	return parseRedisInfo(txt)
}

func parseRedisInfo(txt string) (redisStats, error) {
	var st redisStats
	var have int
	sc := bufio.NewScanner(strings.NewReader(txt))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_cpu_user", "used_cpu_sys":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return st, fmt.Errorf("redis INFO %s: %q", k, v)
			}
			st.cpu += time.Duration(f * float64(time.Second))
			have++
		case "total_reads_processed", "total_commands_processed":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return st, fmt.Errorf("redis INFO %s: %q", k, v)
			}
			if k == "total_reads_processed" {
				st.reads = n
			} else {
				st.commands = n
			}
			have++
		}
	}
	if have != 4 {
		return st, fmt.Errorf("redis INFO lacks used_cpu_user, used_cpu_sys, total_reads_processed or total_commands_processed (Redis ≥ 6.2 has them)")
	}
	return st, nil
}
