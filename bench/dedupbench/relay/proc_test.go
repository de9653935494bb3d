package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseProcStatCountsAfterTheCommandName(t *testing.T) {
	// A command name with spaces and a parenthesis, as /proc allows.
	line := "4242 (my (odd) relay) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 37 0 0 20 0 9 0 12345 1000000 500 18446744073709551615"
	got, err := parseProcStat(line)
	if err != nil || got != 287*clockTick {
		t.Fatalf("parseProcStat = %v, %v; want %v", got, err, 287*clockTick)
	}
	if _, err := parseProcStat("4242 (x) S 1 2"); err == nil {
		t.Fatal("a short stat line parsed")
	}
}

func TestParseStatusField(t *testing.T) {
	s := "Name:\trelay\nVmPeak:\t  900000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40000 kB\n"
	if n, err := parseStatusField(s, "VmHWM"); err != nil || n != 51200*1024 {
		t.Fatalf("VmHWM = %d, %v", n, err)
	}
	if _, err := parseStatusField(s, "VmSwap"); err == nil {
		t.Fatal("a missing field parsed")
	}
}

func TestParseMachineCPU(t *testing.T) {
	m, err := parseMachineCPU("cpu  100 5 50 1000 20 3 2 7 0 0")
	if err != nil || m.busy != 160 || m.total != 1187 || m.softirq != 2 || m.steal != 7 {
		t.Fatalf("parseMachineCPU = %+v, %v; want busy 160, total 1187, softirq 2, steal 7", m, err)
	}
	if _, err := parseMachineCPU("cpu0 1 2 3"); err == nil {
		t.Fatal("a per-CPU or short line parsed")
	}
}

func TestParseRedisInfo(t *testing.T) {
	txt := strings.Join([]string{
		"# Stats", "total_commands_processed:12345", "total_reads_processed:678",
		"# CPU", "used_cpu_sys:1.500000", "used_cpu_user:2.250000", "used_cpu_sys_children:9.0", "",
	}, "\r\n")
	st, err := parseRedisInfo(txt)
	if err != nil || st.commands != 12345 || st.reads != 678 || st.cpu != 3750*time.Millisecond {
		t.Fatalf("parseRedisInfo = %+v, %v", st, err)
	}
	if _, err := parseRedisInfo("# CPU\r\nused_cpu_sys:1.0\r\n"); err == nil {
		t.Fatal("INFO without the stats fields parsed")
	}
}

func TestParseProcTimesReadsOwnAndReapedChildren(t *testing.T) {
	line := "4242 (sh) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 37 400 13 20 0 9 0"
	got, err := parseProcTimes(line)
	if err != nil || got.own != 287*clockTick || got.reaped != 413*clockTick {
		t.Fatalf("parseProcTimes = %+v, %v; want own %v, reaped %v", got, err, 287*clockTick, 413*clockTick)
	}
	if _, err := parseProcTimes("4242 (sh) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 37 400"); err == nil {
		t.Fatal("a line without cstime parsed")
	}
}

func TestProcessesCPUCountsAReapedChildOnce(t *testing.T) {
	tk := func(n int) time.Duration { return time.Duration(n) * clockTick }
	a := map[int]procTimes{1: {own: tk(10)}, 2: {own: tk(5)}, 7: {own: tk(100)}}
	// 2 used 3 more ticks, ended and was reaped by 1 (which used 2 more);
	// 3 started; 7 used 1.
	b := map[int]procTimes{1: {own: tk(12), reaped: tk(8)}, 3: {own: tk(4)}, 7: {own: tk(101)}}
	all, part := processesCPU(a, b, []int{7})
	if all != tk(3+2+4+1) || part != tk(1) {
		t.Fatalf("processesCPU = %v, %v; want %v, %v", all, part, tk(10), tk(1))
	}
}

func TestAllProcTimesSeesThisProcessWork(t *testing.T) {
	before, err := allProcTimes("/proc")
	if err != nil {
		t.Fatal(err)
	}
	me := os.Getpid()
	if _, ok := before[me]; !ok || len(before) < 2 {
		t.Fatalf("allProcTimes has %d processes, this one (%d) among them: %v", len(before), me, ok)
	}
	// Work until this process's CPU time, as allProcTimes reads it, grew
	// by a tick.
	deadline := time.Now().Add(10 * time.Second)
	x := 1.0
	for {
		for range 1_000_000 {
			x = x*1.0000001 + 1e-9
		}
		now, err := allProcTimes("/proc")
		if err != nil {
			t.Fatal(err)
		}
		if now[me].own > before[me].own {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s of work and this process's CPU time stays %v (x=%v)", now[me].own, x)
		}
	}
}

func TestParseProcIO(t *testing.T) {
	s := "rchar: 1063339406\nwchar: 1655186818\nsyscr: 126917\nsyscw: 2992646\nread_bytes: 61440\n"
	if r, w, err := parseProcIO(s); err != nil || r != 126917 || w != 2992646 {
		t.Fatalf("parseProcIO = %d, %d, %v", r, w, err)
	}
	if _, _, err := parseProcIO("rchar: 1\nsyscr: 2\n"); err == nil {
		t.Fatal("io without syscw parsed")
	}
	// This process's own: a write it makes counts.
	before, err := syscalls([]int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(t.TempDir(), "io")
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := f.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	_ = f.Close()
	if after, err := syscalls([]int{os.Getpid()}); err != nil || after < before+10 {
		t.Fatalf("after 10 writes: %d system calls, %v; before %d", after, err, before)
	}
}
