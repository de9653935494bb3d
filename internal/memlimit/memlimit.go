package memlimit

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// shareTenths is how many tenths of the container's limit the Go runtime
// may use; the rest is for what the runtime does not count (the kernel's socket
// buffers and page cache charged to the container) and for overshoot
// while the collector catches up.
const shareTenths = 9

// unlimited is where a cgroup v1 limit means no limit: the kernel writes
// the largest page-aligned int64 there.
const unlimited = 1 << 62

// Apply sets the runtime's memory limit to nine tenths of the cgroup's memory
// limit, unless GOMEMLIMIT is set or no limit is found, and logs what it
// did. It returns the limit it set, or 0.
func Apply(log *slog.Logger) int64 {
	return apply(log, "/", os.Getenv, debug.SetMemoryLimit)
}

func apply(log *slog.Logger, root string, getenv func(string) string, set func(int64) int64) int64 {
	if v := getenv("GOMEMLIMIT"); v != "" {
		log.Info("memory limit: GOMEMLIMIT is set, the cgroup's limit is not read", "GOMEMLIMIT", v)
		return 0
	}
	limit, where, err := Limit(root)
	switch {
	case err != nil:
		log.Warn("memory limit: the cgroup's limit could not be read; the Go runtime has none", "err", err)
		return 0
	case limit == 0:
		return 0
	}
	soft := limit/10*shareTenths + limit%10*shareTenths/10 // limit × 9/10 without overflow
	set(soft)
	log.Info("memory limit: the Go runtime's soft limit is set below the cgroup's",
		"cgroup_limit_bytes", limit, "go_limit_bytes", soft, "cgroup", where)
	return soft
}

// Limit returns the memory limit in bytes of the cgroup the process runs in
// under root ("/" but in tests), the smallest of its own and its
// ancestors', and the file that set it; 0 when there is none. It reads
// cgroup v2 (the unified hierarchy) and falls back to v1's memory
// controller.
func Limit(root string) (int64, string, error) {
	v2, v1, err := ownCgroups(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, "", nil // not Linux, or no /proc
		}
		return 0, "", err
	}
	base := filepath.Join(root, "sys/fs/cgroup")
	if v2 != "" {
		if _, err := os.Stat(filepath.Join(base, "cgroup.controllers")); err == nil {
			return smallest(base, v2, "memory.max")
		}
	}
	if v1 != "" {
		// Without a cgroup namespace the path is the host's, and a
		// container sees its own cgroup at the mount's root.
		mount := filepath.Join(base, "memory")
		if n, where, err := smallest(mount, v1, "memory.limit_in_bytes"); err != nil || n > 0 {
			return n, where, err
		}
		return smallest(mount, "/", "memory.limit_in_bytes")
	}
	return 0, "", nil
}

// ownCgroups reads the process's cgroup paths from /proc/self/cgroup: the
// unified hierarchy's ("0::/path") and the v1 memory controller's.
func ownCgroups(path string) (v2, v1 string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		id, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		controllers, p, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		if id == "0" && controllers == "" {
			v2 = p
			continue
		}
		for _, c := range strings.Split(controllers, ",") {
			if c == "memory" {
				v1 = p
			}
		}
	}
	return v2, v1, sc.Err()
}

// smallest returns the smallest limit in file of the cgroup at path under
// base and of each of its ancestors up to base; 0 when none has one.
func smallest(base, path, file string) (int64, string, error) {
	var best int64
	var where string
	dir := filepath.Join(base, filepath.Clean("/"+path))
	for {
		n, err := readLimit(filepath.Join(dir, file))
		if err != nil {
			return 0, "", err
		}
		if n > 0 && (best == 0 || n < best) {
			best, where = n, filepath.Join(dir, file)
		}
		if dir == base || !strings.HasPrefix(dir, base) {
			return best, where, nil
		}
		dir = filepath.Dir(dir)
	}
}

// readLimit reads one limit file: 0 for "max", for a v1 limit that means
// none, and for a file that is not there (the root cgroup has none).
func readLimit(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a byte count", path, s)
	}
	if n <= 0 || n >= unlimited {
		return 0, nil
	}
	return n, nil
}
