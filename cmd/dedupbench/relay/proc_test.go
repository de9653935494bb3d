package main

import (
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
	if err != nil || m.busy != 160 || m.total != 1187 {
		t.Fatalf("parseMachineCPU = %+v, %v; want busy 160, total 1187", m, err)
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
