package memlimit

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tree writes files (path → content) under a new root and returns it.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const (
	mib       = 1 << 20
	v1NoLimit = "9223372036854771712\n"
)

func TestLimit(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		want  int64
		where string // the file that set it, under the root
	}{
		{"v2, the container's own limit", map[string]string{
			"proc/self/cgroup":                           "0::/kubepods/pod1/ctr\n",
			"sys/fs/cgroup/cgroup.controllers":           "cpu memory pids\n",
			"sys/fs/cgroup/kubepods/memory.max":          "max\n",
			"sys/fs/cgroup/kubepods/pod1/memory.max":     "536870912\n",
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": "268435456\n",
		}, 256 * mib, "sys/fs/cgroup/kubepods/pod1/ctr/memory.max"},
		{"v2, an ancestor's smaller limit", map[string]string{
			"proc/self/cgroup":                           "0::/kubepods/pod1/ctr\n",
			"sys/fs/cgroup/cgroup.controllers":           "memory\n",
			"sys/fs/cgroup/kubepods/pod1/memory.max":     "209715200\n",
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": "max\n",
		}, 200 * mib, "sys/fs/cgroup/kubepods/pod1/memory.max"},
		{"v2 in a cgroup namespace", map[string]string{
			"proc/self/cgroup":                 "0::/\n",
			"sys/fs/cgroup/cgroup.controllers": "memory\n",
			"sys/fs/cgroup/memory.max":         "1073741824\n",
		}, 1024 * mib, "sys/fs/cgroup/memory.max"},
		{"v2 without a limit", map[string]string{
			"proc/self/cgroup":                    "0::/user.slice\n",
			"sys/fs/cgroup/cgroup.controllers":    "memory\n",
			"sys/fs/cgroup/user.slice/memory.max": "max\n",
		}, 0, ""},
		{"v1, the host's path", map[string]string{
			"proc/self/cgroup":                                      "12:pids:/docker/abc\n4:cpu,memory:/docker/abc\n0::/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes":            v1NoLimit,
			"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "134217728\n",
		}, 128 * mib, "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"},
		{"v1, the container's cgroup at the mount's root", map[string]string{
			"proc/self/cgroup":                           "4:memory:/docker/abc\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "134217728\n",
		}, 128 * mib, "sys/fs/cgroup/memory/memory.limit_in_bytes"},
		{"v1 without a limit", map[string]string{
			"proc/self/cgroup":                                         "4:memory:/process_api/x\n0::/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes":               v1NoLimit,
			"sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": v1NoLimit,
		}, 0, ""},
		{"no /proc", map[string]string{}, 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := tree(t, c.files)
			got, where, err := Limit(root)
			if err != nil {
				t.Fatal(err)
			}
			wantWhere := ""
			if c.where != "" {
				wantWhere = filepath.Join(root, c.where)
			}
			if got != c.want || where != wantWhere {
				t.Errorf("Limit = %d from %q, want %d from %q", got, where, c.want, wantWhere)
			}
		})
	}
}

// TestLimitUnreadable: a limit file that holds no byte count is an error
// naming the file.
func TestLimitUnreadable(t *testing.T) {
	root := tree(t, map[string]string{
		"proc/self/cgroup":                 "0::/\n",
		"sys/fs/cgroup/cgroup.controllers": "memory\n",
		"sys/fs/cgroup/memory.max":         "lots\n",
	})
	_, _, err := Limit(root)
	if err == nil || !strings.Contains(err.Error(), "memory.max") || !strings.Contains(err.Error(), `"lots"`) {
		t.Fatalf("Limit = %v, want an error naming memory.max and its content", err)
	}
}

func TestApply(t *testing.T) {
	limited := map[string]string{
		"proc/self/cgroup":                 "0::/\n",
		"sys/fs/cgroup/cgroup.controllers": "memory\n",
		"sys/fs/cgroup/memory.max":         "268435456\n",
	}
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	cases := []struct {
		name    string
		files   map[string]string
		getenv  func(string) string
		want    int64 // what is set; 0: SetMemoryLimit is not called
		logSays string
	}{
		{"a cgroup limit", limited, env(), 256 * mib * 9 / 10, "go_limit_bytes=241591910"},
		{"GOMEMLIMIT wins", limited, env("GOMEMLIMIT", "100MiB"), 0, "GOMEMLIMIT=100MiB"},
		{"no limit", map[string]string{}, env(), 0, ""},
		{"an unreadable limit", map[string]string{
			"proc/self/cgroup":                 "0::/\n",
			"sys/fs/cgroup/cgroup.controllers": "memory\n",
			"sys/fs/cgroup/memory.max":         "?\n",
		}, env(), 0, "could not be read"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			var set int64
			got := apply(log, tree(t, c.files), c.getenv, func(n int64) int64 { set = n; return 0 })
			if got != c.want || set != c.want {
				t.Errorf("apply returned %d and set %d, want %d", got, set, c.want)
			}
			if c.logSays == "" && logs.Len() > 0 {
				t.Errorf("logged %q, want nothing", logs.String())
			}
			if !strings.Contains(logs.String(), c.logSays) {
				t.Errorf("logged %q, want it to say %q", logs.String(), c.logSays)
			}
		})
	}
}
