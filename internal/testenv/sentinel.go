package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The local Sentinel deployment of .ci/redis-sentinel.sh.
const (
	localSentinelMaster = "dedup"
)

var (
	localSentinelAddrs = []string{"127.0.0.1:26390", "127.0.0.1:26391", "127.0.0.1:26392"}
	localSentinelData  = []string{"127.0.0.1:6390", "127.0.0.1:6391"}

	sentinelOnce sync.Once
	sentinelSet  *Sentinel
	sentinelWhy  string
)

// Sentinel is a Redis primary with a replica, watched by Sentinels (SPEC
// §10, §11.1).
type Sentinel struct {
	// Master is the name the Sentinels monitor the primary under.
	Master string
	// Addrs are the Sentinels.
	Addrs []string
	// Data are the data nodes, primary and replica, in no set order.
	Data []string
	dir  string
}

// RedisSentinel returns the Sentinel deployment: $REDIS_SENTINEL_ADDRS
// (comma-separated) and $REDIS_SENTINEL_MASTER when set, else the local one
// (sentinels 127.0.0.1:26390-26392, master "dedup"). It must name a primary
// with at least one connected replica; otherwise the test is skipped, or
// failed under DEDUP_REQUIRE_SERVICES=1.
func RedisSentinel(t testing.TB) *Sentinel {
	t.Helper()
	sentinelOnce.Do(func() {
		s := &Sentinel{Master: localSentinelMaster, Addrs: localSentinelAddrs, Data: localSentinelData, dir: sentinelDir()}
		hint := "; run .ci/redis-sentinel.sh or set REDIS_SENTINEL_ADDRS"
		if v := os.Getenv("REDIS_SENTINEL_ADDRS"); v != "" {
			s.Addrs, s.Data, hint = splitAddrs(v), nil, ""
		}
		if v := os.Getenv("REDIS_SENTINEL_MASTER"); v != "" {
			s.Master = v
		}
		sentinelSet = s
		if err := s.healthy(context.Background()); err != nil {
			sentinelWhy = "sentinel " + strings.Join(s.Addrs, ",") + ": " + err.Error() + hint
		}
	})
	if sentinelWhy != "" {
		Unavailable(t, "redis sentinel", sentinelWhy)
	}
	return sentinelSet
}

func sentinelDir() string {
	if d := os.Getenv("DEDUP_SENTINEL_DIR"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "dedup-redis-sentinel")
}

// Primary asks the Sentinels for the current primary's address.
func (s *Sentinel) Primary(ctx context.Context) (string, error) {
	var last error
	for _, a := range s.Addrs {
		c := redis.NewSentinelClient(&redis.Options{Addr: a, DialTimeout: redisProbe, MaxRetries: -1})
		cctx, cancel := context.WithTimeout(ctx, redisProbe)
		hp, err := c.GetMasterAddrByName(cctx, s.Master).Result()
		cancel()
		_ = c.Close()
		if err == nil && len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1]), nil
		}
		last = err
	}
	return "", fmt.Errorf("no sentinel names a primary for %q: %v", s.Master, last)
}

// healthy: the Sentinels agree on a primary that answers and has a
// connected replica.
func (s *Sentinel) healthy(ctx context.Context) error {
	p, err := s.Primary(ctx)
	if err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: p, DialTimeout: redisProbe, MaxRetries: -1})
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, redisProbe)
	defer cancel()
	info, err := c.Info(cctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("primary %s: %v", p, err)
	}
	if !strings.Contains(info, "role:master") {
		return fmt.Errorf("%s is named primary but is not one", p)
	}
	if !strings.Contains(info, "connected_slaves:") || strings.Contains(info, "connected_slaves:0") {
		return fmt.Errorf("primary %s has no connected replica", p)
	}
	return nil
}

// WaitHealthy waits up to d for a primary with a connected replica, as
// after a failover and the old primary's return.
func (s *Sentinel) WaitHealthy(t testing.TB, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := s.healthy(context.Background())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: sentinel deployment not healthy after %v: %v", d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// KillPrimary kills the current primary with SIGKILL (the data nodes must
// be the local ones, whose pids .ci/redis-sentinel.sh records) and returns
// its address; RestartNode brings it back, as a replica.
func (s *Sentinel) KillPrimary(t testing.TB) string {
	t.Helper()
	p, err := s.Primary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.kill(p); err != nil {
		t.Fatal(err)
	}
	return p
}

func (s *Sentinel) kill(addr string) error {
	_, port, _ := net.SplitHostPort(addr)
	b, err := os.ReadFile(filepath.Join(s.dir, port, "redis.pid"))
	if err != nil {
		return fmt.Errorf("testenv: pid of redis %s: %v (the deployment must be the one .ci/redis-sentinel.sh started)", addr, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("testenv: pid of redis %s: %v", addr, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("testenv: killing redis %s (pid %d): %v", addr, pid, err)
	}
	for i := 0; syscall.Kill(pid, 0) == nil; i++ {
		if i > 500 {
			return fmt.Errorf("testenv: redis %s (pid %d) still runs 10s after SIGKILL", addr, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// RestartNode starts the data node at addr again; the Sentinels make it a
// replica of the current primary.
func (s *Sentinel) RestartNode(addr string) error {
	_, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("bash", filepath.Join(s.dir, port, "start.sh")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("testenv: restarting redis %s: %v: %s", addr, err, out)
	}
	return nil
}

// Client is a failover client on the deployment, closed when the test ends.
func (s *Sentinel) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Master, SentinelAddrs: s.Addrs})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
