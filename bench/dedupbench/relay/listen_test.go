package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestParseProcNetTCPKeepsListenSocketsOnly(t *testing.T) {
	txt := strings.Join([]string{
		"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
		// 127.0.0.1:9092 listening, and an accepted connection on that port.
		"   0: " + procHex(net.IPv4(127, 0, 0, 1).To4()) + ":2384 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 7050778 1 000000009d73e45e 100 0 0 10 0",
		"   1: " + procHex(net.IPv4(127, 0, 0, 1).To4()) + ":2384 " + procHex(net.IPv4(127, 0, 0, 1).To4()) + ":D31A 01 00000000:00000000 00:00000000 00000000     0        0 7050901 1 00000000ecfc3ac6 20 4 30 10 -1",
		// 0.0.0.0:2024.
		"   2: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 181 1 000000009d73e45e 100 0 0 10 0",
		// tcp6 lines: [::]:4222 and [::1]:6379 (addresses in the host's
		// byte order, as the kernel writes them).
		"   3: 00000000000000000000000000000000:107E 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5150 1 0000000000000000 100 0 0 10 0",
		"   4: " + procHex(net.IPv6loopback) + ":18EB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5151 1 0000000000000000 100 0 0 10 0",
		"",
	}, "\n")
	got, err := parseProcNetTCP(txt)
	if err != nil {
		t.Fatal(err)
	}
	want := []listenSocket{
		{net.IPv4(127, 0, 0, 1).To4(), 9092, 7050778},
		{net.IPv4zero.To4(), 2024, 181},
		{net.IPv6zero, 4222, 5150},
		{net.IPv6loopback, 6379, 5151},
	}
	if len(got) != len(want) {
		t.Fatalf("%d sockets, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if !got[i].ip.Equal(want[i].ip) || got[i].port != want[i].port || got[i].inode != want[i].inode {
			t.Errorf("socket %d = %v:%d inode %d, want %v:%d inode %d", i, got[i].ip, got[i].port, got[i].inode, want[i].ip, want[i].port, want[i].inode)
		}
	}
	loop := net.IPv4(127, 0, 0, 1)
	if !got[0].serves(loop, 9092) || got[0].serves(loop, 9093) || got[0].serves(net.IPv4(10, 0, 0, 1), 9092) {
		t.Error("a socket bound to 127.0.0.1:9092 serves another address or port, or not its own")
	}
	if !got[1].serves(net.IPv4(10, 0, 0, 1), 2024) || !got[2].serves(loop, 4222) {
		t.Error("a socket bound to every address does not serve one of them")
	}

	for _, bad := range []string{
		"header\n   0: 0100007F:2384 00000000:0000 0A 00000000:00000000\n",                                // too few fields
		"header\n   0: 0100007F2384 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 7 1\n",    // no colon
		"header\n   0: 0100007F:23G4 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 7 1\n",   // port not hex
		"header\n   0: 0100007F:2384 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 x 1\n",   // inode
		"header\n   0: 0100007F00:2384 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 7 1\n", // 5-byte address
	} {
		if _, err := parseProcNetTCP(bad); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
}

func TestListenerPIDFindsThisProcess(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			if addr != "127.0.0.1:0" {
				t.Logf("%s: %v (no IPv6 loopback here)", addr, err)
				continue
			}
			t.Fatal(err)
		}
		hp := ln.Addr().String()
		pid, err := listenerPID(context.Background(), hp)
		if err != nil || pid != os.Getpid() {
			t.Errorf("listenerPID(%s) = %d, %v; want this process, %d", hp, pid, err, os.Getpid())
		}
		bp := findBrokerProcs(context.Background(), []string{hp, hp})
		if bp.err != nil || !slices.Equal(bp.pids, []int{os.Getpid()}) || !strings.Contains(bp.desc, "pid ") {
			t.Errorf("findBrokerProcs(%s twice) = %+v; want this process once", hp, bp)
		}
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
		if pid, err := listenerPID(context.Background(), hp); err == nil {
			t.Errorf("after closing %s, listenerPID = %d, want an error", hp, pid)
		}
		// One of two addresses without a listener: the set is absent, not
		// a partial sum.
		ln2, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if bp := findBrokerProcs(context.Background(), []string{ln2.Addr().String(), hp}); bp.err == nil {
			t.Errorf("findBrokerProcs with %s closed = %+v, want an error", hp, bp)
		}
		_ = ln2.Close()
	}
}

func TestListenerPIDRefusesAnotherHost(t *testing.T) {
	// 192.0.2.0/24 is TEST-NET-1, on no interface of a test machine.
	_, err := listenerPID(context.Background(), "192.0.2.7:4222")
	if !errors.Is(err, errNotLocal) {
		t.Fatalf("listenerPID(192.0.2.7:4222) = %v, want errNotLocal", err)
	}
}

func TestNATSHostPorts(t *testing.T) {
	got, err := natsHostPorts([]string{"nats://127.0.0.1:4222", "127.0.0.1:4222", "nats://user:pw@localhost", "tls://[::1]:4333"})
	want := []string{"127.0.0.1:4222", "localhost:4222", "[::1]:4333"}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("natsHostPorts = %q, %v; want %q", got, err, want)
	}
}

// procHex writes ip as /proc/net/tcp(6) does: each 32-bit word of the address
// as a number in the host's byte order, in hexadecimal.
func procHex(ip net.IP) string {
	var b strings.Builder
	for w := 0; w < len(ip); w += 4 {
		fmt.Fprintf(&b, "%08X", binary.NativeEndian.Uint32(ip[w:]))
	}
	return b.String()
}
