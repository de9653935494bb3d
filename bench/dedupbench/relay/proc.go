package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// parseProcStat reads utime and stime of a /proc/<pid>/stat line.
func parseProcStat(s string) (time.Duration, error) {
	t, err := parseProcTimes(s)
	return t.own, err
}

// procTimes are a process's CPU times: its own (utime+stime, every thread
// of it) and its reaped children's (cutime+cstime: the CPU of the children
// it waited for, theirs included).
type procTimes struct{ own, reaped time.Duration }

// parseProcTimes reads utime, stime, cutime and cstime (fields 14 to 17) of
// a /proc/<pid>/stat line. The command name (field 2) is in parentheses
// and may hold spaces, so the fields are counted after its closing one.
func parseProcTimes(s string) (procTimes, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procTimes{}, fmt.Errorf("/proc/<pid>/stat: no command name in %q", s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): utime is field 14, f[11].
	if len(f) < 15 {
		return procTimes{}, fmt.Errorf("/proc/<pid>/stat: %d fields after the command name, want at least 15", len(f))
	}
	var v [4]uint64
	for j := range v {
		n, err := strconv.ParseUint(f[11+j], 10, 64)
		if err != nil {
			return procTimes{}, fmt.Errorf("/proc/<pid>/stat: field %d: %q", 14+j, f[11+j])
		}
		v[j] = n
	}
	return procTimes{own: time.Duration(v[0]+v[1]) * clockTick, reaped: time.Duration(v[2]+v[3]) * clockTick}, nil
}

// allProcTimes returns the procTimes of every process under procRoot by
// pid; a process that ends while it reads is left out.
func allProcTimes(procRoot string) (map[int]procTimes, error) {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	out := make(map[int]procTimes, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "stat"))
		if err != nil {
			continue
		}
		t, err := parseProcTimes(string(b))
		if err != nil {
			return nil, fmt.Errorf("%s/%d: %w", procRoot, pid, err)
		}
		out[pid] = t
	}
	return out, nil
}

// processesCPU returns the CPU every process used from a to b, and the
// part of it of the pids in some. A process's own and reaped times are
// summed: one that ends between a and b is in its parent's reaped time at
// b, once its parent waited for it, so it counts for its whole life less
// what a held of it. A process started after a counts from zero.
func processesCPU(a, b map[int]procTimes, some []int) (all, part time.Duration) {
	sum := func(m map[int]procTimes, pick func(int) bool) time.Duration {
		var d time.Duration
		for pid, t := range m {
			if pick(pid) {
				d += t.own + t.reaped
			}
		}
		return d
	}
	every := func(int) bool { return true }
	in := func(pid int) bool { return slices.Contains(some, pid) }
	return sum(b, every) - sum(a, every), sum(b, in) - sum(a, in)
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
// process on the machine, in clock ticks. softirq is the part of busy the
// kernel spent in software interrupts (loopback TCP's receive side among
// them), which it charges to no process when it accounts IRQ time apart;
// steal is the time the hypervisor ran something else while a CPU had work,
// which is not busy.
type machineCPU struct{ busy, total, softirq, steal uint64 }

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
	return machineCPU{busy: busy, total: busy + v[3] + v[4] + v[7], softirq: v[6], steal: v[7]}, nil
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

// procIO returns the read and write system calls process pid has made
// (syscr, syscw of /proc/<pid>/io: read, readv, recvmsg, ... and write,
// writev, sendmsg, ...; poll and futex calls are in neither).
func procIO(pid int) (reads, writes uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseProcIO(string(b))
}

func parseProcIO(s string) (reads, writes uint64, err error) {
	var have int
	for line := range strings.SplitSeq(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "syscr" && k != "syscw") {
			continue
		}
		n, perr := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if perr != nil {
			return 0, 0, fmt.Errorf("/proc/<pid>/io %s: %q", k, v)
		}
		if k == "syscr" {
			reads = n
		} else {
			writes = n
		}
		have++
	}
	if have != 2 {
		return 0, 0, fmt.Errorf("/proc/<pid>/io lacks syscr or syscw")
	}
	return reads, writes, nil
}

// syscalls returns the read and write system calls of pids so far.
func syscalls(pids []int) (uint64, error) {
	var sum uint64
	for _, pid := range pids {
		r, w, err := procIO(pid)
		if err != nil {
			return 0, fmt.Errorf("process %d: %w", pid, err)
		}
		sum += r + w
	}
	return sum, nil
}
