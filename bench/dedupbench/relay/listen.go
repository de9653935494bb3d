package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// errNotLocal says a broker address is not one of this host's: its
// process's CPU cannot be read here.
var errNotLocal = errors.New("not an address of this host")

// listenSocket is one TCP socket in LISTEN state of /proc/net/tcp(6).
type listenSocket struct {
	ip    net.IP
	port  int
	inode uint64
}

// parseProcNetTCP returns the LISTEN sockets (state 0A) of the text of
// /proc/net/tcp or /proc/net/tcp6. Each line is "sl local rem st tx:rx
// tr:when retrnsmt uid timeout inode ...", local being ADDR:PORT in hex:
// the port big-endian, the address as 32-bit words each printed in the
// host's byte order.
func parseProcNetTCP(txt string) ([]listenSocket, error) {
	var out []listenSocket
	for i, line := range strings.Split(txt, "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) == 0 {
			continue // the header, or the last newline
		}
		if len(f) < 10 {
			return nil, fmt.Errorf("/proc/net/tcp line %d: %d fields, want at least 10", i, len(f))
		}
		if f[3] != "0A" {
			continue
		}
		addr, port, ok := strings.Cut(f[1], ":")
		raw, err := hex.DecodeString(addr)
		if !ok || err != nil || (len(raw) != 4 && len(raw) != 16) {
			return nil, fmt.Errorf("/proc/net/tcp line %d: local address %q", i, f[1])
		}
		p, err := strconv.ParseUint(port, 16, 16)
		if err != nil {
			return nil, fmt.Errorf("/proc/net/tcp line %d: local port %q", i, port)
		}
		inode, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("/proc/net/tcp line %d: inode %q", i, f[9])
		}
		ip := make(net.IP, len(raw))
		for w := 0; w < len(raw); w += 4 {
			binary.NativeEndian.PutUint32(ip[w:], binary.BigEndian.Uint32(raw[w:]))
		}
		out = append(out, listenSocket{ip: ip, port: int(p), inode: inode})
	}
	return out, nil
}

// serves reports whether a connection to ip:port reaches s: same port, and
// s bound to ip or to every address (0.0.0.0, ::; an IPv6 socket bound to
// :: takes IPv4 connections too unless v6only).
func (s listenSocket) serves(ip net.IP, port int) bool {
	return s.port == port && (s.ip.IsUnspecified() || s.ip.Equal(ip))
}

// socketOwners returns the pids under procRoot whose open files
// (/proc/<pid>/fd) include one of the sockets inodes, sorted. Processes
// that end or whose fds cannot be read while it looks are skipped.
func socketOwners(procRoot string, inodes []uint64) ([]int, error) {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	want := make(map[string]bool, len(inodes))
	for _, n := range inodes {
		want["socket:["+strconv.FormatUint(n, 10)+"]"] = true
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		dir := filepath.Join(procRoot, e.Name(), "fd")
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && want[l] {
				pids = append(pids, pid)
				break
			}
		}
	}
	slices.Sort(pids)
	return pids, nil
}

// localIPs resolves host and returns its addresses when every one is this
// host's (a loopback address or one of an interface's), else errNotLocal.
func localIPs(ctx context.Context, host string) ([]net.IP, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", host, err)
	}
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var ips []net.IP
	for _, a := range addrs {
		local := a.IP.IsLoopback()
		for _, ia := range ifAddrs {
			if n, ok := ia.(*net.IPNet); ok && n.IP.Equal(a.IP) {
				local = true
			}
		}
		if !local {
			return nil, fmt.Errorf("%s (%s): %w", host, a.IP, errNotLocal)
		}
		ips = append(ips, a.IP)
	}
	return ips, nil
}

// listenerPID returns the pid of the process of this host that listens on
// hostport (host:port), found from the LISTEN sockets of /proc/net/tcp and
// tcp6 and the socket inodes of /proc/<pid>/fd. The error wraps
// errNotLocal when host is not this host's.
func listenerPID(ctx context.Context, hostport string) (int, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return 0, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return 0, fmt.Errorf("%s: port %q", hostport, port)
	}
	ips, err := localIPs(ctx, host)
	if err != nil {
		return 0, err
	}
	var inodes []uint64
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(file)
		if errors.Is(err, os.ErrNotExist) {
			continue // no IPv6
		}
		if err != nil {
			return 0, err
		}
		socks, err := parseProcNetTCP(string(b))
		if err != nil {
			return 0, fmt.Errorf("%s: %w", file, err)
		}
		for _, s := range socks {
			for _, ip := range ips {
				if s.serves(ip, p) && s.inode != 0 {
					inodes = append(inodes, s.inode)
					break
				}
			}
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("%s: no process of this host listens there", hostport)
	}
	pids, err := socketOwners("/proc", inodes)
	if err != nil {
		return 0, err
	}
	switch len(pids) {
	case 0:
		return 0, fmt.Errorf("%s: its listening socket is in no readable /proc/<pid>/fd (another user's process?)", hostport)
	case 1:
		return pids[0], nil
	default:
		return 0, fmt.Errorf("%s: processes %v share its listening socket", hostport, pids)
	}
}

// natsHostPorts returns the host:port of every server in urls, each a
// nats:// URL or a host:port (4222 when it names no port).
func natsHostPorts(urls []string) ([]string, error) {
	var out []string
	for _, u := range urls {
		if !strings.Contains(u, "://") {
			u = "nats://" + u
		}
		pu, err := url.Parse(u)
		if err != nil {
			return nil, fmt.Errorf("-nats %q: %w", u, err)
		}
		hp := pu.Host
		if pu.Port() == "" {
			hp = net.JoinHostPort(pu.Hostname(), "4222")
		}
		if !slices.Contains(out, hp) {
			out = append(out, hp)
		}
	}
	return out, nil
}

// brokerProcs is the broker processes of one transport whose CPU a
// measurement reads, or why there are none.
type brokerProcs struct {
	pids []int
	desc string // "nats-server pid 4242", "java pids 1, 2, 3"
	err  error  // why the column is absent
}

// findBrokerProcs looks up the process listening on each of hostports.
// When one is not found (not this host's, or unreadable) the whole set is
// absent: a sum over some of a cluster's brokers would read as all of it.
func findBrokerProcs(ctx context.Context, hostports []string) brokerProcs {
	var bp brokerProcs
	names := map[string][]string{}
	var order []string
	for _, hp := range hostports {
		pid, err := listenerPID(ctx, hp)
		if err != nil {
			return brokerProcs{err: err}
		}
		if slices.Contains(bp.pids, pid) {
			continue
		}
		bp.pids = append(bp.pids, pid)
		name := "?"
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil {
			name = strings.TrimSpace(string(b))
		}
		if _, ok := names[name]; !ok {
			order = append(order, name)
		}
		names[name] = append(names[name], strconv.Itoa(pid))
	}
	var parts []string
	for _, n := range order {
		word := "pid"
		if len(names[n]) > 1 {
			word = "pids"
		}
		parts = append(parts, fmt.Sprintf("%s %s %s", n, word, strings.Join(names[n], ", ")))
	}
	bp.desc = strings.Join(parts, "; ")
	return bp
}
